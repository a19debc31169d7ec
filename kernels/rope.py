"""QKV post-processing, CPU twin of rope.cu: bias, per-head q/k RMSNorm, rotary embedding, paged KV-cache write.

The T rows of a step are flat over its sequences. Token t sits at position p = positions[t] and owns cache slot
s = slot_mapping[t] (block_id * block_size + offset, chosen by the engine's block manager). With the fused
projection row qkv[t] = [q heads | k heads | v heads]:
    q head h:  v = q slice (+ bias); if q_norm: v = rmsnorm(v) * q_norm;  q_out[t, h]   = rotate(v, p)
    k head j:  v = k slice (+ bias); if k_norm: v = rmsnorm(v) * k_norm;  k_cache[s, j] = rotate(v, p)
    v head j:  v = v slice (+ bias);                                     v_cache[s, j] = v
s < 0 marks a padding row: its q is still written (the row exists in q_out), its K/V are not.
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
        c, s = cos[p, i], sin[p, i]
        x1, x2 = buf[i], buf[i + half]
        dst[i] = x1 * c - x2 * s
        dst[i + half] = x2 * c + x1 * s


@njit(cache=True, nogil=True)
def _rope_qkv(qkv, bias, has_bias, q_norm, has_qn, k_norm, has_kn, eps, cos, sin, positions, slot_mapping,
              n_heads, n_kv_heads, q_out, k_cache, v_cache):
    """Returns the first token whose position is outside the rope table or whose slot is past the cache (nothing
    is written then: numba does not bounds-check), else -1."""
    T = qkv.shape[0]
    D = q_out.shape[2]
    for t in range(T):
        if positions[t] < 0 or positions[t] >= cos.shape[0] or slot_mapping[t] >= k_cache.shape[0]:
            return t
    buf = np.empty(D, np.float32)
    for t in range(T):
        p, s = positions[t], slot_mapping[t]
        for h in range(n_heads):
            _load_head(qkv, t, h * D, bias, has_bias, q_norm, has_qn, eps, buf)
            _rotate_into(buf, cos, sin, p, q_out[t, h])
        if s < 0:
            continue
        for j in range(n_kv_heads):
            _load_head(qkv, t, (n_heads + j) * D, bias, has_bias, k_norm, has_kn, eps, buf)
            _rotate_into(buf, cos, sin, p, k_cache[s, j])
        voff = (n_heads + n_kv_heads) * D
        for j in range(n_kv_heads):  # V: bias only, loaded straight into the cache
            _load_head(qkv, t, voff + j * D, bias, has_bias, k_norm, False, eps, v_cache[s, j])
    return -1


_EMPTY = np.zeros(0, np.float32)  # stands in for None (numba handles Optional arrays poorly)


def rope_qkv(qkv: np.ndarray, bias, q_norm, k_norm, eps: float, cos: np.ndarray, sin: np.ndarray,
             positions: np.ndarray, slot_mapping: np.ndarray, n_heads: int, n_kv_heads: int, q_out: np.ndarray,
             k_cache: np.ndarray, v_cache: np.ndarray) -> None:
    """qkv: float32[T, (Hq+2Hkv)*D]; bias: float32[(Hq+2Hkv)*D] or None; q_norm, k_norm: float32[D] or None;
    cos, sin: float32[max_positions, D/2]; positions, slot_mapping: int32[T]; q_out: float32[T, Hq, D];
    k_cache, v_cache: float32[num_slots, Hkv, D] (only slots slot_mapping[t] >= 0 are written)."""
    T, width = qkv.shape
    D = q_out.shape[2]
    for name, a, dt in (("qkv", qkv, np.float32), ("q_out", q_out, np.float32), ("k_cache", k_cache, np.float32),
                        ("v_cache", v_cache, np.float32), ("cos", cos, np.float32), ("sin", sin, np.float32),
                        ("positions", positions, np.int32), ("slot_mapping", slot_mapping, np.int32)):
        if a.dtype != dt:
            raise ValueError(f"rope_qkv: {name} dtype {a.dtype} != {np.dtype(dt)}")
    if width != (n_heads + 2 * n_kv_heads) * D or D % 2:
        raise ValueError(f"rope_qkv: qkv width {width} != (Hq={n_heads} + 2*Hkv={n_kv_heads}) * D={D}")
    if q_out.shape != (T, n_heads, D) or k_cache.ndim != 3 or k_cache.shape[1:] != (n_kv_heads, D) \
            or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_qkv: q_out {q_out.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    if positions.shape != (T,) or slot_mapping.shape != (T,):
        raise ValueError(f"rope_qkv: positions {positions.shape} / slot_mapping {slot_mapping.shape} != ({T},)")
    if cos.ndim != 2 or cos.shape[1] != D // 2 or sin.shape != cos.shape:
        raise ValueError(f"rope_qkv: cos {cos.shape} / sin {sin.shape} must be [max_positions, D/2={D // 2}]")
    for name, a, n in (("bias", bias, width), ("q_norm", q_norm, D), ("k_norm", k_norm, D)):
        if a is not None and (a.shape != (n,) or a.dtype != np.float32):
            raise ValueError(f"rope_qkv: {name} {a.dtype}{a.shape} != float32[{n}]")
    bad = _rope_qkv(qkv, _EMPTY if bias is None else bias, bias is not None,
                    _EMPTY if q_norm is None else q_norm, q_norm is not None,
                    _EMPTY if k_norm is None else k_norm, k_norm is not None,
                    float(eps), cos, sin, positions, slot_mapping, int(n_heads), int(n_kv_heads), q_out, k_cache,
                    v_cache)
    if bad >= 0:
        raise ValueError(f"rope_qkv: token {bad}: position {positions[bad]} outside the rope table of "
                         f"{cos.shape[0]} or slot {slot_mapping[bad]} outside the cache of {k_cache.shape[0]} slots")
