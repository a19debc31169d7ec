"""Pick the backend: CUDA when a GPU is usable, else the CPU, and say why.

The probe runs once, lazily (not at import), because importing cupy and
touching the driver costs time and fails in several distinct ways on machines
without a GPU (no cupy, no driver, no device, no NVRTC); each failure becomes a
one-line reason instead of a crash.
"""
import functools
import os


@functools.lru_cache(maxsize=1)
def probe_gpu() -> tuple[bool, str]:
    if os.environ.get("TOOLKIT_BACKEND") == "cpu":
        return False, "forced by TOOLKIT_BACKEND=cpu"
    try:
        import cupy as cp
    except Exception as e:  # not installed, or a broken install
        return False, f"cupy unavailable ({type(e).__name__}: {e})"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        # CuPy names the CUDA error, which reads like a broken install; say what it means in plain words.
        status = getattr(e, "status", None)
        if status == 35:  # cudaErrorInsufficientDriver: also what a machine without any NVIDIA driver reports
            return False, "no NVIDIA driver found (or one too old for CUDA 13)"
        if status == 100:  # cudaErrorNoDevice
            return False, "no NVIDIA GPU found"
        return False, f"no usable CUDA device ({e})"
    if n == 0:
        return False, "no NVIDIA GPU found"
    try:
        cp.cuda.nvrtc.getVersion()  # NVRTC missing -> RuntimeError at first compile otherwise
        (cp.arange(4, dtype=cp.float32) * 2).sum().item()  # alloc + compile + launch + sync
    except Exception as e:
        return False, f"CUDA present but unusable ({type(e).__name__}: {e})"
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return True, f"{name}, compute capability {cp.cuda.Device(0).compute_capability}"


def resolve_device(requested: str) -> tuple[str, str]:
    """Map --device auto|cuda|cpu to a concrete backend name and a reason line."""
    from toolkit.errors import ToolkitError

    if requested == "cpu":
        return "cpu", "CPU backend (requested)"
    if requested not in ("auto", "cuda"):
        raise ToolkitError(f"unknown device {requested!r} (choose auto, cuda or cpu)")
    ok, why = probe_gpu()
    if requested == "cuda" and not ok:
        raise ToolkitError(f"--device cuda: {why}")
    return ("cuda", f"CUDA backend: {why}") if ok else ("cpu", f"CPU backend: {why}")


def free_memory(backend_name: str) -> int:
    """Bytes free: on the GPU (cudaMemGetInfo), else the machine's available RAM."""
    if backend_name == "cuda":
        import cupy as cp

        return cp.cuda.runtime.memGetInfo()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
