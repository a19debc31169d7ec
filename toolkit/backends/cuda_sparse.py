"""Launchers of the sparse prefill kernels (kernels/sparse_prefill.cu, kernels/combine.cu) on CuPy arrays.

Every launch is a few host checks plus one kernel on the current stream: no host synchronisation and no
allocation (toolkit/sparse.py owns the workspaces and passes them in), so a step using them can be captured.
The host ints that shape a launch (rows, N, M, max_query_len) come from the step's host-side lengths.
"""
from kernels.sparse_attention_tc import UNION_CAP

from .cuda_kernels import TC_HEAD_DIMS, _f32, _i32

SA_HEAD_DIMS = (8, 16, 32, 64, 128)
SA_MAXG, SA_KCAP = 16, 512


def _smem_attention(D: int, GM: int) -> int:
    return (GM * D + 4 * GM * 32 + 4 * GM * (D + 2)) * 4 + SA_KCAP * 4


class CudaSparse:
    def __init__(self, kernels):
        self.k = kernels  # CudaKernels: dtype, ctype, module cache

    def compress_keys(self, k_cache, block_tables, seq_lens, block_size, R, kbar):
        B, N, Hkv, D = kbar.shape
        if not B or not N:
            return
        f = self.k._fn("sparse_prefill", f"sparse_compress_keys<{self.k.ctype}>")
        f((N, B), (Hkv * D,), (k_cache, block_tables, _i32(block_tables.shape[1]), seq_lens, _i32(block_size),
                               _i32(k_cache.shape[0] // block_size), _i32(R), _i32(N), _i32(Hkv), _i32(D), kbar))

    def query_means(self, q, qsl, seq_lens, Q, r0, qbar, max_tiles):
        rows, Hkv, D = qbar.shape
        B = seq_lens.shape[0]
        if rows and B:
            f = self.k._fn("sparse_prefill", f"sparse_query_means<{self.k.ctype}>")
            f((max_tiles, B, -(-Hkv * D // 32)), (32, 8), (q, qsl, _i32(B), seq_lens, _i32(Q), _i32(r0), _i32(rows),
                                                          _i32(q.shape[1]), _i32(Hkv), _i32(D), qbar))

    def scores(self, qbar, kbar, qsl, seq_lens, R, Q, r0, out, max_tiles):
        rows, N = out.shape
        B, _, Hkv, D = kbar.shape
        if not rows or not N:
            return
        smem = (32 + 64) * (D + 1) * 4
        f = self.k._fn("sparse_prefill", "sparse_scores", smem)
        f((-(-max_tiles // 32), -(-N // 64), B), (256,),
          (qbar, kbar, qsl, _i32(B), seq_lens, _i32(R), _i32(Q), _i32(r0), _i32(rows), _i32(N), _i32(Hkv), _i32(D),
           out), shared_mem=smem)

    def topk(self, scores, qsl, seq_lens, R, K, Q, r0, topk, rows):
        """Tile rows r0 .. r0+rows-1 (scores [rows, N], or None when every query row is short)."""
        B = seq_lens.shape[0]
        N, scores = (1, topk) if scores is None else (scores.shape[1], scores)
        if rows:
            self.k._fn("sparse_prefill", "sparse_topk")((rows,), (512,), (
                scores, _i32(N), qsl, _i32(B), seq_lens, _i32(R), _i32(K), _i32(Q), _i32(r0), _i32(rows), topk))

    def gather_lens(self, qsl, seq_lens, W, out):
        B = seq_lens.shape[0]
        if B:
            f = self.k._fn("combine", "prefill_gather_lens")
            f((-(-B // 128),), (128,), (qsl, seq_lens, _i32(B), _i32(W), out))

    def combine(self, topk, qsl, seq_lens, gather_lens, W, R, K, M, N, out, lens, workers=None):
        """combine_topk_swa_indices into out [T, Kc] and lens [T]: a warp a row (combine_flat_warp, what the engine
        runs), or with `workers` vLLM's persistent layout, `workers` blocks a request (combine_persistent; bench
        sparse compares 128 and 256)."""
        T, Kc = out.shape
        B = seq_lens.shape[0]
        if topk.ndim != 2 or topk.shape[0] < T or topk.strides[1] != 4 or Kc % 128 or Kc < K + W:
            raise ValueError(f"combine_topk_swa_indices: topk {topk.shape}, out {out.shape}, K={K}, W={W}")
        if not T:
            return
        args = (topk, _i32(topk.strides[0] // 4), _i32(topk.shape[1]), qsl, _i32(B), seq_lens, gather_lens, _i32(T),
                _i32(W), _i32(R), _i32(K), _i32(M), _i32(N), _i32(Kc), out, lens)
        if workers is None:
            self.k._fn("combine", "combine_flat_warp")((-(-T // 4),), (128,), args)
        else:
            self.k._fn("combine", "combine_persistent")((workers, B), (128,), args)

    def attention(self, q, k_cache, v_cache, block_tables, qsl, seq_lens, combined, lens, M, N, W, R, block_size,
                  scale, out):
        T, Kc = combined.shape
        Hq, D = q.shape[1:]
        Hkv = k_cache.shape[1]
        if D not in SA_HEAD_DIMS or Hq // Hkv > SA_MAXG:
            raise ValueError(f"sparse_attention: head dim {D} (supported {SA_HEAD_DIMS}), group {Hq // Hkv} "
                             f"(at most {SA_MAXG})")
        if not T:
            return
        GM = 8 if Hq // Hkv <= 8 else 16
        smem = _smem_attention(D, GM)
        f = self.k._fn("sparse_prefill", f"sparse_attention<{self.k.ctype}, {D}, {GM}>", smem)
        f((T, Hkv), (128,), (q, k_cache, v_cache, block_tables, _i32(block_tables.shape[1]), qsl,
                             _i32(seq_lens.shape[0]), seq_lens, combined, _i32(Kc), lens, _i32(M), _i32(N), _i32(W),
                             _i32(R), _i32(block_size), _i32(k_cache.shape[0] // block_size), _f32(scale), _i32(Hq),
                             _i32(Hkv), out), shared_mem=smem)

    # -- the tensor-core route (kernels/sparse_attention_tc.cu): tile unions, then attention per tile ----------
    def tile_union(self, qsl, seq_lens, combined, lens, M, N, W, R, K, Q, ublk, umask, ucount):
        B = seq_lens.shape[0]
        tiles, cap = ublk.shape[0] // max(B, 1), ublk.shape[1]
        if not B or not tiles or combined.shape[0] == 0:
            return
        smem = min(max(N, 1), UNION_CAP) * 8
        f = self.k._fn("sparse_attention_tc", "sparse_tile_union", smem)
        f((tiles, B), (256,), (qsl, seq_lens, combined, _i32(combined.shape[1]), lens, _i32(M), _i32(N), _i32(W),
                               _i32(R), _i32(K), _i32(Q), _i32(tiles), _i32(cap), ublk, umask, ucount), shared_mem=smem)

    def attention_tiled(self, q, k_cache, v_cache, block_tables, qsl, seq_lens, ublk, umask, ucount, W, R, K,
                        block_size, scale, out):
        B = seq_lens.shape[0]
        Hq, D = q.shape[1:]
        Hkv = k_cache.shape[1]
        if self.k.dtype == "float32" or D not in TC_HEAD_DIMS or Hq % Hkv:
            raise ValueError(f"sparse_attention_tiled: {self.k.dtype}, head dim {D} (16-bit types, head dim in "
                             f"{TC_HEAD_DIMS}), {Hq} q heads / {Hkv} kv heads")
        tiles, cap = ublk.shape[0] // max(B, 1), ublk.shape[1]
        if not B or not tiles:
            return
        smem = 5 * 64 * (D + 8) * self.k.itemsize  # Q + double-buffered K and V, rows padded by 8
        f = self.k._fn("sparse_attention_tc", f"sparse_attention_tc<{self.k.ctype}, {D}>", smem)
        f((Hq, B, tiles), (128,), (q, k_cache, v_cache, block_tables, _i32(block_tables.shape[1]), qsl, seq_lens,
                                   ublk, umask, ucount, _i32(tiles), _i32(cap), _i32(W), _i32(R), _i32(K),
                                   _i32(block_size), _i32(k_cache.shape[0] // block_size), _f32(scale), _i32(Hq),
                                   _i32(Hkv), out), shared_mem=smem)

