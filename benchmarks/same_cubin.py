"""Does an edit to a kernel change its machine code? Compile kernels/<op>.cu at a git revision and in the working tree
with NVRTC for sm_90 (the options of tests/test_cuda_compile.py, every name expression the wrapper uses) and compare
the cubins byte for byte. No GPU needed.

Where they are identical, what the GPU measured on that revision holds for the edit: a refactor (a helper function,
comments, whitespace) checked this way needs no new device time.

    python benchmarks/same_cubin.py OP REV      e.g. python benchmarks/same_cubin.py decode_attention_tc 964d0a5
"""
import hashlib
import re
import subprocess
import sys

import cuda.pathfinder as pf
from cupy_backends.cuda.libs import nvrtc

from toolkit.backends.cuda_kernels import CTYPES, KERNEL_DIR, OPTIONS, kernel_names


def source_at(rev, name: str) -> str:
    """kernels/<name> at git revision rev (None: the working tree)."""
    if rev is None:
        return (KERNEL_DIR / name).read_text()
    return subprocess.run(["git", "show", f"{rev}:kernels/{name}"], check=True, capture_output=True, text=True).stdout


def cubin(op: str, rev) -> bytes:
    """The .cu with its local headers pasted in, as cuda_kernels.kernel_source does, but all taken at rev."""
    src = re.sub(r'^#include "([\w.]+\.cuh)"$', lambda m: source_at(rev, m.group(1)), source_at(rev, f"{op}.cu"),
                 flags=re.MULTILINE)
    base = ["-arch=sm_90", f"-I{pf.find_nvidia_header_directory('cudart')}", "-ftz=true",
            "--device-as-default-execution-space", *OPTIONS]
    prog = nvrtc.createProgram(src, f"{op}.cu", (), ())
    try:
        for n in sorted({n for ct in CTYPES.values() for n in kernel_names(op, ct)}):
            nvrtc.addNameExpression(prog, n)
        nvrtc.compileProgram(prog, base)
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def main() -> int:
    op, rev = sys.argv[1], sys.argv[2]
    a, b = cubin(op, rev), cubin(op, None)
    digest = lambda c: hashlib.sha1(c).hexdigest()[:12]  # noqa: E731
    print(f"{op}: {rev} {len(a)} bytes {digest(a)}, working tree {len(b)} bytes {digest(b)}: "
          f"{'IDENTICAL' if a == b else 'DIFFERENT'}")
    return 0 if a == b else 1


if __name__ == "__main__":
    sys.exit(main())
