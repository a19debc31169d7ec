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
// Work split: a (token, head) item is 64-512 bytes, too little for a warp of 2-byte accesses (one warp an item with
// 2-byte loads took 22.8 us a layer for a 4,096-token prefill of the 0.5B shape on an H100, 4x its bytes' time;
// experiments/NOTEBOOK.md, session 17). So a lane owns runs of V consecutive pairs (i, i + D/2): it loads and
// stores a run of each half as one vector (16 bytes at V = 8 in 16-bit) and rotates with no data from other lanes.
// `lpi` lanes (a power of two, <= 32) take one item, 32 / lpi items a warp; the per-head norm (Qwen3) sums over those
// lanes. KR: runs a lane, ceil(D/2 / V / lpi), 1 where lpi takes them all (D 64 and 128 at V = 8), at most 2 (4 at
// V = 1, D 256). The launcher picks V, lpi and KR (rope_layout in toolkit/backends/cuda_kernels.py): the widest run
// every pointer's alignment allows, narrowed for a small step so that its items still spread over enough warps
// (a decode step of one token runs as the old one-warp-an-item split: V = 1 at D 64).
//
// Layout (row-major): qkv T[T, (Hq+2Hkv)*D]; bias T[(Hq+2Hkv)*D] or nullptr; q_norm, k_norm T[D] or nullptr;
// cos, sin float[P, D/2]; positions, slot_mapping int[T]; q_out T[T, Hq, D]; k_cache, v_cache T[num_slots, Hkv, D].
// Launch: block 128 threads = 4 warps, grid ceil(T*(Hq+2Hkv) / (4 * 32/lpi)).
#include "dtype.cuh"
#include "pdl.cuh"
#include "rope.cuh"

// B bytes as one load/store: V elements of T.
template <int B> struct Raw;
template <> struct Raw<2> { using t = unsigned short; };
template <> struct Raw<4> { using t = unsigned int; };
template <> struct Raw<8> { using t = uint2; };
template <> struct Raw<16> { using t = uint4; };
template <typename T, int V> union Run { typename Raw<V * sizeof(T)>::t u; T e[V]; };

template <typename T, int V>
__device__ __forceinline__ Run<T, V> load_run(const T* p) {
    Run<T, V> r;
    r.u = *reinterpret_cast<const typename Raw<V * sizeof(T)>::t*>(p);
    return r;
}

// V fp32 table entries (cos or sin) from a row of D/2: float4 loads where V is a multiple of 4 (the row and the run
// are then 16-byte aligned: V divides D/2).
template <int V>
__device__ __forceinline__ void load_table(const float* p, float (&out)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            const float4 f = reinterpret_cast<const float4*>(p)[q];
            out[4 * q] = f.x; out[4 * q + 1] = f.y; out[4 * q + 2] = f.z; out[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < V; e++) out[e] = p[e];
    }
}

template <typename T, int V, int KR>
__global__ void __launch_bounds__(128)
rope_qkv(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ q_norm,
         const T* __restrict__ k_norm, float eps, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
         const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n_tokens, int Hq, int Hkv,
         int D, int n_pos, int num_slots, int lpi, T* __restrict__ q_out, T* __restrict__ k_cache,
         T* __restrict__ v_cache) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    const int NH = Hq + 2 * Hkv, half = D / 2, lane = threadIdx.x & 31;
    const int lsh = __ffs(lpi) - 1;  // lpi is a power of two: shifts, not divisions (a decode step is latency)
    const int ipw = 32 >> lsh, sub = lane >> lsh, gl = lane & (lpi - 1);  // item of the warp, lane of the item
    const int item = (blockIdx.x * 4 + (threadIdx.x >> 5)) * ipw + sub;
    if (sub >= ipw || item >= n_tokens * NH) return;  // an item's lanes leave together: shuffles stay within them
    const unsigned group = lpi == 32 ? 0xffffffffu : ((1u << lpi) - 1) << (sub * lpi);
    const int t = item / NH, head = item % NH;
    const int col = head * D;  // column of this head in the fused row (and in the bias)
    // Issued before the row loads, consumed after them: the global round trips overlap.
    const int p = positions[t];
    const int slot = head >= Hq ? slot_mapping[t] : 0;
    float x1[KR][V], x2[KR][V];  // pairs (i, i + D/2), i = (gl + lpi k) V + e; runs past D/2 hold 0
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const int i = (gl + lpi * k) * V;
#pragma unroll
        for (int e = 0; e < V; e++) x1[k][e] = x2[k][e] = 0.0f;
        if (i < half) {
            const Run<T, V> a = load_run<T, V>(qkv + (size_t)t * NH * D + col + i);
            const Run<T, V> b = load_run<T, V>(qkv + (size_t)t * NH * D + col + half + i);
            if (bias) {  // rounded to T: HF's Linear output
                const Run<T, V> ba = load_run<T, V>(bias + col + i), bb = load_run<T, V>(bias + col + half + i);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    x1[k][e] = rnd<T>(to_f32(a.e[e]) + to_f32(ba.e[e]));
                    x2[k][e] = rnd<T>(to_f32(b.e[e]) + to_f32(bb.e[e]));
                }
            } else {
#pragma unroll
                for (int e = 0; e < V; e++) { x1[k][e] = to_f32(a.e[e]); x2[k][e] = to_f32(b.e[e]); }
            }
        }
    }
    if ((unsigned)p >= (unsigned)n_pos) return;                              // outside the rope table
    if (head >= Hq && (unsigned)slot >= (unsigned)num_slots) return;         // padding row (or bad slot): no K/V

    T* dst;
    if (head >= Hq + Hkv) {  // v head: straight to the cache, no norm, no rotation
        dst = v_cache + ((size_t)slot * Hkv + (head - Hq - Hkv)) * D;
    } else {
        const T* norm = head < Hq ? q_norm : k_norm;
        if (norm) {  // per-head RMSNorm over D (Qwen3), fp32 statistics over the item's lanes
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < KR; k++)
#pragma unroll
                for (int e = 0; e < V; e++) ss += x1[k][e] * x1[k][e] + x2[k][e] * x2[k][e];  // unused runs are 0
            for (int o = lpi / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(group, ss, o);
            const float inv = rsqrtf(ss / (float)D + eps);
#pragma unroll
            for (int k = 0; k < KR; k++) {
                const int i = (gl + lpi * k) * V;
                if (i < half)
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        x1[k][e] = rnd<T>(to_f32(norm[i + e]) * rnd<T>(x1[k][e] * inv));
                        x2[k][e] = rnd<T>(to_f32(norm[i + e + half]) * rnd<T>(x2[k][e] * inv));
                    }
            }
        }
#pragma unroll
        for (int k = 0; k < KR; k++) {
            const int i = (gl + lpi * k) * V;
            if (i < half) {
                float c[V], sn[V];
                load_table<V>(cos_t + (size_t)p * half + i, c);
                load_table<V>(sin_t + (size_t)p * half + i, sn);
#pragma unroll
                for (int e = 0; e < V; e++) rope_pair(x1[k][e], x2[k][e], c[e], sn[e]);
            }
        }
        dst = head < Hq ? q_out + ((size_t)t * Hq + head) * D : k_cache + ((size_t)slot * Hkv + (head - Hq)) * D;
    }
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const int i = (gl + lpi * k) * V;
        if (i < half) {
            Run<T, V> a, b;
#pragma unroll
            for (int e = 0; e < V; e++) { a.e[e] = from_f32<T>(x1[k][e]); b.e[e] = from_f32<T>(x2[k][e]); }
            *reinterpret_cast<typename Raw<V * sizeof(T)>::t*>(dst + i) = a.u;
            *reinterpret_cast<typename Raw<V * sizeof(T)>::t*>(dst + half + i) = b.u;
        }
    }
}

#define ROPE_INSTANCE(T, V, KR)                                                                               \
    template __global__ void rope_qkv<T, V, KR>(const T*, const T*, const T*, const T*, float, const float*,  \
                                                const float*, const int*, const int*, int, int, int, int, int, \
                                                int, int, T*, T*, T*);
// Every (V, KR) rope_layout picks: V = 16 bytes / sizeof(T) down to 1; KR 1 or 2, and 4 at V = 1 (D 256).
#define ROPE_INSTANCES(T)                                                                                     \
    ROPE_INSTANCE(T, 1, 1) ROPE_INSTANCE(T, 1, 2) ROPE_INSTANCE(T, 1, 4) ROPE_INSTANCE(T, 2, 1)               \
    ROPE_INSTANCE(T, 2, 2) ROPE_INSTANCE(T, 4, 1) ROPE_INSTANCE(T, 4, 2)
ROPE_INSTANCES(float)
ROPE_INSTANCES(__half)
ROPE_INSTANCES(__nv_bfloat16)
ROPE_INSTANCE(__half, 8, 1)
ROPE_INSTANCE(__half, 8, 2)
ROPE_INSTANCE(__nv_bfloat16, 8, 1)
ROPE_INSTANCE(__nv_bfloat16, 8, 2)
