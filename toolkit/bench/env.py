"""What a benchmark ran on: versions, the device, and the memory-bandwidth roofline.

Decode at small batch reads every weight once per step, so its ceiling is HBM
bandwidth. The peak is computed from the memory clock and bus width the driver
reports (two transfers per clock: HBM and GDDR are double data rate), which for
an H100 SXM gives the datasheet's 3.35 TB/s. On the CPU there is no roofline.
"""
import platform
import subprocess

import numpy as np


def environment(backend_name: str) -> dict:
    env = {"python": platform.python_version(), "numpy": np.__version__, "backend": backend_name}
    if backend_name == "cuda":
        import cupy as cp

        rt = cp.cuda.runtime
        env["gpu"] = rt.getDeviceProperties(0)["name"].decode()
        env["cupy"] = cp.__version__
        env["cuda_runtime"] = rt.runtimeGetVersion()
        env["cuda_driver_api"] = rt.driverGetVersion()
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            env["driver"] = "unknown (no nvidia-smi)"
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def peak_gbps(backend_name: str, override: float | None) -> tuple[float | None, str]:
    """(peak HBM GB/s or None, where it came from)."""
    if override:
        return override, "--peak-gbps"
    if backend_name != "cuda":
        return None, "none on the CPU"
    try:
        import cupy as cp

        rt = cp.cuda.runtime
        clock_khz = rt.deviceGetAttribute(rt.cudaDevAttrMemoryClockRate, 0)
        bus_bits = rt.deviceGetAttribute(rt.cudaDevAttrGlobalMemoryBusWidth, 0)
    except Exception as e:  # an attribute a future driver drops: say so, and go on without a roofline
        return None, f"unknown ({type(e).__name__}: {e}); pass --peak-gbps"
    if not clock_khz or not bus_bits:
        return None, "unknown (driver reports no memory clock); pass --peak-gbps"
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, f"{clock_khz / 1e3:.0f} MHz x {bus_bits} bit x 2"
