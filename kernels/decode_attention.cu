// decode_attention.cu -- one new query per head attending keys 0..length-1 of the KV cache (a decode step),
// split over the sequence ("flash-decoding") so that a handful of heads still fills the GPU.
//     out[h] = softmax(scale * q[h] . K[kvh]^T) . V[kvh],  kvh = h / (Hq / Hkv),  length = start_pos[0] + 1
// start_pos is read on the device, so a captured CUDA graph replays correctly at every length.
//
// Layout: q T[Hq, D]; k_cache, v_cache T[Hkv, S, D]; out T[Hq, D]. Workspace (fp32, preallocated by the
// wrapper): ws_ml[Hq, n_splits, 2] = (running max in log2 units, sum of exps), ws_acc[Hq, n_splits, D] =
// unnormalised partial output.
//
// Kernel 1 (decode_attention_partial<T, D>): grid (Hkv * ceil(G / 8), n_splits), block 128 (4 warps).
//   A block owns up to 8 q heads of one GQA group, so every K/V byte is read once for the whole group.
//   The keys 0..length-1 are divided evenly over the splits (chunk = ceil(length / n_splits), rounded up to a
//   tile); splits past the end write an empty partial (max -inf, sum 0). A block sweeps its chunk in tiles:
//     - LPK lanes share one key row, each reading a 16-byte chunk (D=64 bf16: 8 lanes/key, 4 keys per warp);
//       key group kg = warp * KPW + lane / LPK reads keys tile + j * KPG + kg, j < 4 (coalesced rows).
//       K and V of the tile are loaded together up front so both DRAM round trips overlap.
//     - scores: per-lane partial dot products, reduced over the LPK lanes with xor shuffles -> smem s_p.
//     - one warp per head turns the tile's scores into p = 2^(s - m_new) and updates (m, l) in smem.
//     - every thread rescales its accumulators by alpha = 2^(m_old - m_new) and adds p * v for its keys.
//   Threads keep partial sums over different keys; they are added once at the end (shuffles, then smem).
// Kernel 2 (decode_attention_combine<T>): grid (Hq), block 128: merges the splits' partials with weights
//   2^(m_s - M), skipping empty splits, and writes out[h] in T.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes as one uint4 (load) or VEC elements; a union keeps the elements in registers.
template <typename T> union Chunk { uint4 u; T e[16 / sizeof(T)]; };

constexpr int MAXG = 8;        // q heads per block; a larger GQA group is spread over several blocks
constexpr int KPT = 4;         // keys per thread per tile
constexpr int MAX_SPLITS = 1024;

template <typename T, int D>
struct Shape {
    static constexpr int VEC = 16 / sizeof(T);      // elements per 16-byte chunk
    static constexpr int CH = D / VEC;              // chunks per key row
    static constexpr int LPK = CH < 32 ? CH : 32;   // lanes per key row
    static constexpr int NV = CH / LPK;             // chunks per lane per key (2 only for fp32 D=256)
    static constexpr int KPW = 32 / LPK;            // keys per warp step
    static constexpr int KPG = 4 * KPW;             // key groups in the block = keys per block step
    static constexpr int KT = KPG * KPT;            // keys per tile (64 for D=64 bf16)
    static_assert(D % VEC == 0 && (CH <= 32 ? 32 % CH == 0 : CH % 32 == 0), "unsupported head dim");
};

template <typename T, int D>
__global__ void __launch_bounds__(128)
decode_attention_partial(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                         const int* __restrict__ start_pos, float scale_log2, int Hq, int Hkv, int S,
                         int n_splits, float* __restrict__ ws_ml, float* __restrict__ ws_acc) {
    using Sh = Shape<T, D>;
    constexpr int VEC = Sh::VEC, LPK = Sh::LPK, NV = Sh::NV, KPW = Sh::KPW, KPG = Sh::KPG, KT = Sh::KT;
    const int G = Hq / Hkv, n_hg = (G + MAXG - 1) / MAXG;
    const int kvh = blockIdx.x / n_hg, hg = blockIdx.x % n_hg;
    const int h0 = kvh * G + hg * MAXG;                // first q head of this block
    const int Gb = min(MAXG, G - hg * MAXG);           // q heads in this block (uniform: guards never diverge)
    const int split = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    const int length = min(start_pos[0] + 1, S);
    int chunk = (length + n_splits - 1) / n_splits;
    chunk = (chunk + KT - 1) / KT * KT;
    const int k_begin = split * chunk, k_end = min(k_begin + chunk, length);
    if (k_begin >= k_end) {  // nothing here: an empty partial the combine kernel skips
        if (tid < Gb) {
            ws_ml[2 * ((size_t)(h0 + tid) * n_splits + split)] = NEG_INF;
            ws_ml[2 * ((size_t)(h0 + tid) * n_splits + split) + 1] = 0.0f;
        }
        return;
    }

    const int slice = lane % LPK;              // this lane reads chunks slice, slice + LPK, ... of a row
    const int kg = warp * KPW + lane / LPK;    // key group

    // q slices in registers, pre-scaled by scale * log2(e) so that exp2f gives the softmax weights.
    float qf[MAXG][NV * VEC], acc[MAXG][NV * VEC];
#pragma unroll
    for (int g = 0; g < MAXG; g++)
#pragma unroll
        for (int v = 0; v < NV; v++) {
            Chunk<T> c;
            c.u = make_uint4(0, 0, 0, 0);
            if (g < Gb) c.u = *reinterpret_cast<const uint4*>(q + (size_t)(h0 + g) * D + (v * LPK + slice) * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++) { qf[g][v * VEC + e] = to_f32(c.e[e]) * scale_log2; acc[g][v * VEC + e] = 0.0f; }
        }

    __shared__ float s_p[MAXG][KT];                    // scores, then probabilities, of the current tile
    __shared__ float s_m[MAXG], s_l[MAXG], s_alpha[MAXG];
    __shared__ float s_red[4][MAXG][D];                // final cross-warp reduction
    if (tid < MAXG) { s_m[tid] = NEG_INF; s_l[tid] = 0.0f; }

    const T* kb = k_cache + (size_t)kvh * S * D;
    const T* vb = v_cache + (size_t)kvh * S * D;
    for (int kt0 = k_begin; kt0 < k_end; kt0 += KT) {
        Chunk<T> kc[KPT][NV], vc[KPT][NV];
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int key = kt0 + j * KPG + kg;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                // Keys past the chunk read as zeros: their p is 0 and 0 * 0 never makes a NaN.
                kc[j][v].u = vc[j][v].u = make_uint4(0, 0, 0, 0);
                if (key < k_end) {
                    const size_t off = (size_t)key * D + (v * LPK + slice) * VEC;
                    kc[j][v].u = *reinterpret_cast<const uint4*>(kb + off);
                    vc[j][v].u = *reinterpret_cast<const uint4*>(vb + off);
                }
            }
        }
        // Scores (log2 units) into s_p; the LPK lanes of a key sum their partial dots with xor shuffles.
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const bool valid = kt0 + j * KPG + kg < k_end;
#pragma unroll
            for (int g = 0; g < MAXG; g++) {
                if (g < Gb) {
                    float s = 0.0f;
#pragma unroll
                    for (int v = 0; v < NV; v++)
#pragma unroll
                        for (int e = 0; e < VEC; e++) s += qf[g][v * VEC + e] * to_f32(kc[j][v].e[e]);
#pragma unroll
                    for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    if (slice == 0) s_p[g][j * KPG + kg] = valid ? s : NEG_INF;
                }
            }
        }
        __syncthreads();
        // Online softmax statistics: one warp per head. The tile's first key is valid, so m_new is finite.
        for (int g = warp; g < Gb; g += 4) {
            float mx = NEG_INF;
            for (int k = lane; k < KT; k += 32) mx = fmaxf(mx, s_p[g][k]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = s_m[g], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int k = lane; k < KT; k += 32) { const float p = exp2f(s_p[g][k] - m_new); s_p[g][k] = p; sum += p; }
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                const float alpha = exp2f(m_old - m_new);  // m_old = -inf on the first tile: alpha = 0
                s_alpha[g] = alpha;
                s_l[g] = s_l[g] * alpha + sum;
                s_m[g] = m_new;
            }
        }
        __syncthreads();
        // acc = acc * alpha + sum_j p_j * v_j over this thread's keys.
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g < Gb) {
                const float alpha = s_alpha[g];
#pragma unroll
                for (int x = 0; x < NV * VEC; x++) acc[g][x] *= alpha;
#pragma unroll
                for (int j = 0; j < KPT; j++) {
                    const float p = s_p[g][j * KPG + kg];
#pragma unroll
                    for (int v = 0; v < NV; v++)
#pragma unroll
                        for (int e = 0; e < VEC; e++) acc[g][v * VEC + e] += p * to_f32(vc[j][v].e[e]);
                }
            }
        }
        __syncthreads();  // s_p is overwritten by the next tile
    }

    // Lanes with the same slice hold sums over different keys: add them within the warp, then across warps.
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g < Gb) {
#pragma unroll
            for (int x = 0; x < NV * VEC; x++)
#pragma unroll
                for (int o = LPK; o < 32; o <<= 1) acc[g][x] += __shfl_xor_sync(0xffffffffu, acc[g][x], o);
            if (lane < LPK)
#pragma unroll
                for (int v = 0; v < NV; v++)
#pragma unroll
                    for (int e = 0; e < VEC; e++) s_red[warp][g][(v * LPK + slice) * VEC + e] = acc[g][v * VEC + e];
        }
    }
    __syncthreads();
    for (int i = tid; i < Gb * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        ws_acc[((size_t)(h0 + g) * n_splits + split) * D + d] = s_red[0][g][d] + s_red[1][g][d] + s_red[2][g][d] + s_red[3][g][d];
    }
    if (tid < Gb) {
        ws_ml[2 * ((size_t)(h0 + tid) * n_splits + split)] = s_m[tid];
        ws_ml[2 * ((size_t)(h0 + tid) * n_splits + split) + 1] = s_l[tid];
    }
}

// Reduce over the block (blockDim a multiple of 32); every thread gets the result. `scratch` holds 32 floats.
template <bool MAX>
__device__ float block_reduce(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) { const float w = __shfl_xor_sync(0xffffffffu, v, o); v = MAX ? fmaxf(v, w) : v + w; }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : (MAX ? NEG_INF : 0.0f);
    for (int o = 16; o > 0; o >>= 1) { const float w = __shfl_xor_sync(0xffffffffu, v, o); v = MAX ? fmaxf(v, w) : v + w; }
    return v;
}

template <typename T>
__global__ void __launch_bounds__(128)
decode_attention_combine(const float* __restrict__ ws_ml, const float* __restrict__ ws_acc, int n_splits, int D,
                         T* __restrict__ out) {
    __shared__ float s_w[MAX_SPLITS];
    __shared__ float s_scratch[2][32];
    const int h = blockIdx.x, tid = threadIdx.x;
    const float* ml = ws_ml + (size_t)h * n_splits * 2;
    float mx = NEG_INF;
    for (int s = tid; s < n_splits; s += blockDim.x) if (ml[2 * s + 1] > 0.0f) mx = fmaxf(mx, ml[2 * s]);
    mx = block_reduce<true>(mx, s_scratch[0]);
    float l = 0.0f;
    for (int s = tid; s < n_splits; s += blockDim.x) {
        const float w = ml[2 * s + 1] > 0.0f ? exp2f(ml[2 * s] - mx) : 0.0f;
        s_w[s] = w;
        l += w * ml[2 * s + 1];
    }
    const float inv = 1.0f / block_reduce<false>(l, s_scratch[1]);  // its barrier also publishes s_w
    const float* acc = ws_acc + (size_t)h * n_splits * D;
    for (int d = tid; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float w = s_w[s];
            if (w != 0.0f) o += w * acc[(size_t)s * D + d];  // empty splits' acc was never written: skip it
        }
        out[(size_t)h * D + d] = from_f32<T>(o * inv);
    }
}

#define DECODE_INSTANCE(T, D)                                                                                 \
    template __global__ void decode_attention_partial<T, D>(const T*, const T*, const T*, const int*, float,   \
                                                            int, int, int, int, float*, float*);
#define COMBINE_INSTANCE(T) \
    template __global__ void decode_attention_combine<T>(const float*, const float*, int, int, T*);
DECODE_INSTANCE(float, 64) DECODE_INSTANCE(float, 128) DECODE_INSTANCE(float, 256)
DECODE_INSTANCE(__half, 64) DECODE_INSTANCE(__half, 128) DECODE_INSTANCE(__half, 256)
DECODE_INSTANCE(__nv_bfloat16, 64) DECODE_INSTANCE(__nv_bfloat16, 128) DECODE_INSTANCE(__nv_bfloat16, 256)
COMBINE_INSTANCE(float) COMBINE_INSTANCE(__half) COMBINE_INSTANCE(__nv_bfloat16)
