"""QKV post-processing, CPU twin of rope.cu: bias, per-head q/k RMSNorm, rotary embedding, KV-cache write.

For token t at position p = start_pos + t, with the fused projection row qkv[t] = [q heads | k heads | v heads]:
    q head h:  v = q slice (+ bias); if q_norm: v = rmsnorm(v) * q_norm;  q_out[t, h]   = rotate(v, p)
    k head j:  v = k slice (+ bias); if k_norm: v = rmsnorm(v) * k_norm;  k_cache[j, p] = rotate(v, p)
    v head j:  v = v slice (+ bias);                                     v_cache[j, p] = v
rotate() is HF's "rotate_half" convention: the pairs are (i, i + D/2), not adjacent elements:
    out[i]       = x[i] * cos[p, i] - x[i + D/2] * sin[p, i]
    out[i + D/2] = x[i + D/2] * cos[p, i] + x[i] * sin[p, i]        for i < D/2
One fused loop reads each projection value once and writes it straight to its final place (q buffer or cache).
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _load_head(qkv, t, off, bias, has_bias, norm, has_norm, eps, buf):
    """buf[:] = qkv[t, off:off+D] (+ bias), then optionally RMS-normalised over D and scaled by `norm`."""
    D = buf.shape[0]
    for i in range(D):
        v = qkv[t, off + i]
        if has_bias:
            v += bias[off + i]
        buf[i] = v
    if has_norm:
        ss = 0.0
        for i in range(D):
            ss += np.float64(buf[i]) * np.float64(buf[i])
        inv = np.float32(1.0 / np.sqrt(ss / D + eps))
        for i in range(D):
            buf[i] = norm[i] * (buf[i] * inv)


@njit(cache=True, nogil=True)
def _rotate_into(buf, cos, sin, p, dst):
    half = buf.shape[0] // 2
    for i in range(half):
        c = cos[p, i]
        s = sin[p, i]
        x1 = buf[i]
        x2 = buf[i + half]
        dst[i] = x1 * c - x2 * s
        dst[i + half] = x2 * c + x1 * s


@njit(cache=True, nogil=True)
def _rope_qkv(qkv, bias, has_bias, q_norm, has_qn, k_norm, has_kn, eps, cos, sin, start_pos,
              n_heads, n_kv_heads, q_out, k_cache, v_cache):
    T = qkv.shape[0]
    D = q_out.shape[2]
    buf = np.empty(D, np.float32)
    for t in range(T):
        p = start_pos + t
        for h in range(n_heads):
            _load_head(qkv, t, h * D, bias, has_bias, q_norm, has_qn, eps, buf)
            _rotate_into(buf, cos, sin, p, q_out[t, h])
        for j in range(n_kv_heads):
            _load_head(qkv, t, (n_heads + j) * D, bias, has_bias, k_norm, has_kn, eps, buf)
            _rotate_into(buf, cos, sin, p, k_cache[j, p])
        voff = (n_heads + n_kv_heads) * D
        for j in range(n_kv_heads):
            for i in range(D):
                v = qkv[t, voff + j * D + i]
                if has_bias:
                    v += bias[voff + j * D + i]
                v_cache[j, p, i] = v


_EMPTY = np.zeros(0, np.float32)  # stands in for None (numba handles Optional arrays poorly)


def rope_qkv(qkv: np.ndarray, bias, q_norm, k_norm, eps: float, cos: np.ndarray, sin: np.ndarray, start_pos: int,
             n_heads: int, n_kv_heads: int, q_out: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> None:
    """qkv: float32[T, (Hq+2Hkv)*D]; bias: float32[(Hq+2Hkv)*D] or None; q_norm, k_norm: float32[D] or None;
    cos, sin: float32[S, D/2]; q_out: float32[T, Hq, D]; k_cache, v_cache: float32[Hkv, S, D] (rows
    start_pos..start_pos+T-1 are written)."""
    T, width = qkv.shape
    D = q_out.shape[2]
    S = k_cache.shape[1]
    if width != (n_heads + 2 * n_kv_heads) * D or D % 2:
        raise ValueError(f"rope_qkv: qkv width {width} != (Hq={n_heads} + 2*Hkv={n_kv_heads}) * D={D}")
    if q_out.shape != (T, n_heads, D) or k_cache.shape != (n_kv_heads, S, D) or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_qkv: q_out {q_out.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    if start_pos < 0 or start_pos + T > min(S, cos.shape[0]) or cos.shape[1] != D // 2 or sin.shape != cos.shape:
        raise ValueError(f"rope_qkv: positions {start_pos}..{start_pos + T} exceed cache {S} / rope table {cos.shape}")
    for name, a, n in (("bias", bias, width), ("q_norm", q_norm, D), ("k_norm", k_norm, D)):
        if a is not None and a.shape != (n,):
            raise ValueError(f"rope_qkv: {name} shape {a.shape} != ({n},)")
    _rope_qkv(qkv, _EMPTY if bias is None else bias, bias is not None,
              _EMPTY if q_norm is None else q_norm, q_norm is not None,
              _EMPTY if k_norm is None else k_norm, k_norm is not None,
              float(eps), cos, sin, int(start_pos), int(n_heads), int(n_kv_heads), q_out, k_cache, v_cache)
