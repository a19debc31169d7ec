"""Every kernels/*.cu compiles for sm_90 with NVRTC, with the wrapper's template instantiations, without spills.

Runs without a GPU (CI): NVRTC from the nvidia-cuda-nvrtc wheel compiles straight to a cubin and ptxas checks
the inline PTX (mma.sync, ldmatrix, cp.async). Options mirror what cupy.RawModule passes on the H200
(-std=c++17 from the wrapper; -ftz=true and --device-as-default-execution-space from CuPy itself).
Skips cleanly where the NVRTC or CUDA-header wheels are absent.
"""
import pathlib
import re

import pytest

from toolkit.backends.cuda_kernels import (CTYPES, KERNEL_DIR, OPTIONS, WG_BLOCKS_PER_SM, kernel_names,
                                           kernel_source, sm90a_kernel_names)

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
try:
    import cuda.pathfinder as pf

    nvrtc.getVersion()
    INC = pf.find_nvidia_header_directory("cudart")
    if INC is None:
        raise RuntimeError("CUDA runtime headers not found")
except Exception as e:  # no wheel, no libnvrtc, no headers
    pytest.skip(f"NVRTC not available: {e}", allow_module_level=True)

BASE = ["-arch=sm_90", f"-I{INC}", "-ftz=true", "--device-as-default-execution-space", *OPTIONS]
SOURCES = sorted(KERNEL_DIR.glob("*.cu"))


def compile_cu(path: pathlib.Path, extra=(), names=()):
    """Compile one file; returns (cubin, log, {name expression: lowered name}). Fails the test with the log."""
    source = kernel_source(path.stem) if path.parent == KERNEL_DIR else path.read_text()
    prog = nvrtc.createProgram(source, path.name, (), ())
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, BASE + list(extra))
        except nvrtc.NVRTCError:
            pytest.fail(f"{path.name} failed to compile:\n{nvrtc.getProgramLog(prog)}", pytrace=False)
        lowered = {n: nvrtc.getLoweredName(prog, n) for n in names}
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog), lowered
    finally:
        nvrtc.destroyProgram(prog)


def test_every_op_has_a_source():
    assert {p.stem for p in SOURCES} >= {"embedding", "rmsnorm", "rope", "activation", "prefill_attention",
                                        "decode_attention", "sampler"}


@pytest.mark.parametrize("cu", SOURCES, ids=lambda p: p.name)
def test_compiles_for_sm90(cu):
    # Every dtype's name expressions in one program: each must resolve to a kernel in the cubin.
    names = sorted({n for ct in CTYPES.values() for n in kernel_names(cu.stem, ct)})
    cubin, log, lowered = compile_cu(cu, ["-Xptxas=-v", "-Xptxas=-warn-spills"], names)
    assert cubin[:4] == b"\x7fELF"
    for name, low in lowered.items():
        assert low.encode() in cubin, f"{cu.name}: {name} ({low}) missing from the cubin"
    # Hot kernels must keep everything in registers: a spill is local-memory traffic in every launch.
    spills = [line for line in log.splitlines()
              if "spill" in line and not re.search(r"\b0 bytes spill stores, 0 bytes spill loads", line)]
    assert not spills, f"{cu.name}: register spills\n" + "\n".join(spills)
    # (the -v report, shown with pytest -s, gives registers and shared memory per kernel)
    print(f"\n{cu.name}:\n" + "\n".join(line for line in log.splitlines() if "Used" in line))


def test_broken_kernel_reports_compiler_log(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(pytest.fail.Exception, match="undefined_name"):
        compile_cu(bad)


@pytest.mark.parametrize("op", [p.stem for p in SOURCES if any(sm90a_kernel_names(p.stem, ct) for ct in CTYPES.values())])
def test_sm90a_kernels_compile_with_wgmma(op):
    """The Hopper kernels (wgmma) of an op, built as the wrapper builds them on an sm_90 GPU: our -arch=sm_90a, then
    the -arch=sm_90 CuPy appends. They must come out as the real kernel, not the __trap() an sm_90 build gets (a few
    registers), and without spills."""
    names = sorted({n for ct in CTYPES.values() for n in sm90a_kernel_names(op, ct)})
    cubin, log, lowered = compile_cu(KERNEL_DIR / f"{op}.cu", ["-arch=sm_90a", "-arch=sm_90", "-Xptxas=-v",
                                                              "-Xptxas=-warn-spills"], names)
    regs, fn = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        fn = m.group(1) if m else fn
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            regs[fn] = int(m.group(1))
        assert "spill" not in line or re.search(r"\b0 bytes spill stores, 0 bytes spill loads", line), line
        assert "serialized" not in line, f"ptxas could not pipeline the wgmma instructions: {line}"
    for name, low in lowered.items():
        # (a plain sm_90 build of these kernels is their empty #else: 4 registers; gemm_wg_swiglu_t's narrowest
        # wgmma build uses 40-odd)
        assert regs.get(low, 0) > 24, f"{name}: {regs.get(low)} registers, so not the wgmma build"
        # The host sizes prefill_attention_wg's key splits from its resident blocks an SM (WG_BLOCKS_PER_SM): at
        # head dim 64 two, which 256 threads a block get only within 128 registers a thread.
        m = re.match(r"prefill_attention_wg<\w+, (\d+),", name)
        if m:
            most = 65536 // (256 * WG_BLOCKS_PER_SM[int(m.group(1))])
            assert regs[low] <= most, f"{name}: {regs[low]} registers, more than {most}: fewer blocks an SM"
