"""Kernels: one CUDA C source (<op>.cu) and one CPU twin (<op>.py) per op family."""
import os

# Numba's default threading layer is GNU OpenMP, whose idle threads spin-wait: on a 2-vCPU box that made every
# small `prange` call cost ~8 ms instead of ~15 us. The policy is read when libgomp loads (lazily, on the first
# parallel call), so setting it here, before any CPU twin runs, is early enough. setdefault: a user's choice wins.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
