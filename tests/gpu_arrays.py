"""Host <-> device arrays in a compute dtype, for the GPU tests (imported only where CuPy is)."""
import ml_dtypes
import numpy as np


def rounded(x, dtype):
    """fp32 host copy of x as the device holds it in `dtype`."""
    x = np.asarray(x, np.float32)
    if dtype == "float32":
        return x.copy()
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).astype(np.float32)


def dev(x, dtype):
    """Host fp32 -> device array in the storage type (bf16 as uint16 bits)."""
    import cupy as cp

    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        return cp.asarray(x.astype(ml_dtypes.bfloat16).view(np.uint16))
    return cp.asarray(x.astype(np.float16 if dtype == "float16" else np.float32))
