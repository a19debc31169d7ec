// rope.cu -- post-process the fused QKV projection of T tokens: bias, optional per-head q/k RMSNorm (Qwen3),
// rotary embedding (HF "rotate_half" pairs (i, i + D/2)), and the write of K/V into the paged cache.
// Token t sits at position p = positions[t] and owns cache slot s = slot_mapping[t] (both read on the device,
// so a captured step replays with new values):
//     q head h: v = qkv[t, h*D:(h+1)*D] (+bias); [v = rmsnorm(v) * q_norm];  q_out[t, h]   = rotate(v, p)
//     k head j: same at column (Hq + j)*D with k_norm;                       k_cache[s, j] = rotate(v, p)
//     v head j: v = qkv[t, (Hq+Hkv+j)*D ...] (+bias);                        v_cache[s, j] = v
//     rotate: out[i] = x[i]*c - x[i+D/2]*s,  out[i+D/2] = x[i+D/2]*c + x[i]*s,  c = cos[p, i], s = sin[p, i]
// s < 0 marks a padding row (a CUDA-graph batch padded to its bucket): q is written, K/V are not. A position
// outside the rope table skips every write of its row and a slot >= num_slots skips the K/V writes, so a bad
// input gives wrong numbers but never a write out of bounds.
// Rounding for 16-bit T follows HF: the bias add is rounded to T (it is part of the Linear output), the
// normalised value is rounded to T before the weight multiply and again after it; the rotation runs in fp32
// with fp32 tables and is rounded once.
//
// Layout (row-major): qkv T[T, (Hq+2Hkv)*D]; bias T[(Hq+2Hkv)*D] or nullptr; q_norm, k_norm T[D] or nullptr;
// cos, sin float[P, D/2]; positions, slot_mapping int[T]; q_out T[T, Hq, D]; k_cache, v_cache T[num_slots, Hkv, D].
// Launch: block 128 threads = 4 warps, one warp per (token, head) item, grid ceil(T*(Hq+2Hkv) / 4); the warp's
// steps are in rope.cuh (shared with gemm_skinny.cu's RoPE epilogue). A decode step of one token
// is 18 warps in 5 blocks.
#include "dtype.cuh"
#include "pdl.cuh"
#include "rope.cuh"

template <typename T>
__global__ void __launch_bounds__(128)
rope_qkv(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ q_norm,
         const T* __restrict__ k_norm, float eps, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
         const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n_tokens, int Hq, int Hkv,
         int D, int n_pos, int num_slots, T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    const int NH = Hq + 2 * Hkv;
    const int item = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (item >= n_tokens * NH) return;  // whole warp leaves together: no barrier below, only warp shuffles
    const int t = item / NH, head = item % NH;
    const int half = D / 2;
    const int col = head * D;  // column of this head in the fused row (and in the bias)
    // Issued before the row loads, consumed after them: the three global round trips overlap.
    const int p = positions[t];
    const int slot = head >= Hq ? slot_mapping[t] : 0;
    float x1[MAX_PAIRS], x2[MAX_PAIRS];
    rope_load(qkv + (size_t)t * NH * D + col, bias, col, half, lane, x1, x2);
    if ((unsigned)p >= (unsigned)n_pos) return;                              // outside the rope table
    if (head >= Hq && (unsigned)slot >= (unsigned)num_slots) return;         // padding row (or bad slot): no K/V

    if (head >= Hq + Hkv) {  // v head: straight to the cache, no norm, no rotation
        rope_store(v_cache + ((size_t)slot * Hkv + (head - Hq - Hkv)) * D, half, lane, x1, x2);
        return;
    }
    const bool is_q = head < Hq;
    const T* norm = is_q ? q_norm : k_norm;
    if (norm) rope_norm(norm, eps, D, lane, x1, x2);
    rope_rotate(cos_t + (size_t)p * half, sin_t + (size_t)p * half, half, lane, x1, x2);
    rope_store(is_q ? q_out + ((size_t)t * Hq + head) * D : k_cache + ((size_t)slot * Hkv + (head - Hq)) * D, half,
               lane, x1, x2);
}

#define ROPE_INSTANCE(T)                                                                                      \
    template __global__ void rope_qkv<T>(const T*, const T*, const T*, const T*, float, const float*,         \
                                         const float*, const int*, const int*, int, int, int, int, int, int,  \
                                         T*, T*, T*);
ROPE_INSTANCE(float)
ROPE_INSTANCE(__half)
ROPE_INSTANCE(__nv_bfloat16)
