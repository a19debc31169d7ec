"""dev/prefill_attention.py is what a GPU session runs first for the Hopper prefill attention: its wgmma probes and
the kernel's other tile sizes must compile for sm_90a as the script builds them (a compile error there would cost a
device call), and its host-side helpers must be right. NVRTC only, no GPU; skips where NVRTC is absent."""
import numpy as np
import pytest

from tests.dev import load_dev_script


def load():
    return load_dev_script("prefill_attention")


def nvrtc_compile(source, names, options):
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        import cuda.pathfinder as pf

        nvrtc.getVersion()
        inc = pf.find_nvidia_header_directory("cudart")
        assert inc is not None
    except Exception as e:  # no wheel, no libnvrtc, no headers
        pytest.skip(f"NVRTC not available: {e}")
    prog = nvrtc.createProgram(source, "dev.cu", (), ())
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, list(options) + [f"-I{inc}", "-arch=sm_90"])  # CuPy's own -arch comes last
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(prog), pytrace=False)
        return {n: nvrtc.getLoweredName(prog, n) for n in names}
    finally:
        nvrtc.destroyProgram(prog)


def test_probes_compile_for_sm90a():
    import toolkit.backends.cuda_kernels as ck

    mod = load()
    lowered = nvrtc_compile(ck.inline_headers(mod.PROBE_SRC), mod.PROBE_NAMES, mod.OPTIONS)
    assert set(lowered) == set(mod.PROBE_NAMES)


@pytest.mark.parametrize("variant", ["wg", "wgp", "wgpp", "wgt", "wgtp", "wgtpp", "wgtf"])
def test_every_tile_size_compiles_for_sm90a(variant):
    """The product's kernel and each dev variant (appended to the op's source), at every tile size the script
    times."""
    mod = load()
    template, targs = mod.VARIANTS[variant][:2]
    names = [f"{template}<__nv_bfloat16, {d}, {bn}{targs}>" for d in (64, 128) for bn in (64, 128)]
    assert len(nvrtc_compile(mod.variant_source(variant), names, mod.OPTIONS)) == 4


def test_bf16_rounding_and_flop_count():
    mod = load()
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 1e-3], np.float32)
    bits, vals = mod.bf16_bits(x)
    # 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0); 1 + 3*2^-8 rounds up.
    assert vals[0] == 1.0 and vals[1] == 1.0 and vals[2] == np.float32(1.0 + 4 * 2 ** -8) and vals[3] == -2.5
    assert abs(vals[4] - 1e-3) <= 1e-3 * 2 ** -8 and bits.dtype == np.uint16
    # 2 queries, no prefix: 1 + 2 keys; 4 flops a key a dim a head (QK^T and PV, a multiply-add each).
    assert mod.causal_tflops(1e6, hq=1, d=1, prefix=0, tokens=2) == pytest.approx(4 * 3 / 1e12)
    assert mod.causal_tflops(1e6, hq=2, d=64, prefix=10, tokens=2) == pytest.approx(4 * 64 * 2 * 23 / 1e12)


def test_paged_case_poisons_the_slots_no_key_owns():
    """The bf16 cache holds NaN wherever no key of the sequence lives (its last block's tail, the spare blocks), so
    a kernel that reads them into its output shows it; every key's slot holds its finite value."""
    mod = load()
    table, (qb, kb, vb), (qf, kf, vf) = mod.paged_case(2, 1, 64, 5, 30, np.random.default_rng(0))
    bs, n_keys = mod.BS, 35
    keys = np.arange(n_keys)
    owned = table[0, keys // bs] * bs + keys % bs
    assert (kb[owned] != 0x7FC0).all() and (vb[owned] != 0x7FC0).all()
    rest = np.setdiff1d(np.arange(kb.shape[0]), owned)
    assert len(rest) == kb.shape[0] - n_keys and (kb[rest] == 0x7FC0).all() and (vb[rest] == 0x7FC0).all()
    as_f32 = (vb[rest].astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(as_f32).all() and np.isfinite(vf).all() and qb.shape == (30, 2, 64)
