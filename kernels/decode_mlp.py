"""CPU twin of decode_mlp.cu: the MLP block of a batch-1 decode step as one op.

    h = h + attn;  x = RMSNorm(h) * norm_w;  act = silu(x Wg^T) * (x Wu^T);  h = h + act Wd^T

On the GPU this is one persistent kernel (the down projection's weights copied to shared memory while the gate_up
rows stream, one grid barrier between); here it is the unfused twins in the unfused model's order, so the CPU
backend runs Model.forward's `mlp_kernel` branch with the same arithmetic as its plain branch.
"""
import numpy as np

from .gemv import gemv_swiglu
from .rmsnorm import add_rmsnorm


def decode_mlp(attn: np.ndarray, h: np.ndarray, norm_w: np.ndarray, eps: float, w_gate_up: np.ndarray,
               w_down: np.ndarray, act: np.ndarray) -> None:
    """h float32[1, H] in place (both residual adds); attn [1, H]; w_gate_up [2I, H]; w_down [H, I]; act [1, I]
    (scratch, written)."""
    H, I = h.shape[-1], w_down.shape[1]
    if (h.shape != (1, H) or attn.shape != (1, H) or norm_w.shape != (H,) or w_gate_up.shape != (2 * I, H)
            or w_down.shape != (H, I) or act.shape != (1, I)):
        raise ValueError(f"decode_mlp: h {h.shape}, attn {attn.shape}, norm_w {norm_w.shape}, w_gate_up "
                         f"{w_gate_up.shape}, w_down {w_down.shape}, act {act.shape} (one row)")
    x = np.empty_like(h)
    add_rmsnorm(attn, h, norm_w, eps, x)
    gemv_swiglu(x, w_gate_up, act)
    h += act @ w_down.T
