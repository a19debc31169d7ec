// sampler.cu -- the sampler's kernels: Gumbel-max sampling (greedy rows in the same launch), the FP32 copy of the
// logits, and the processing of that copy (sparse adds, penalties, temperature + min_p, top-k + top-p), plus
// logprobs. The CPU twin is kernels/sampler.py (same semantics, same Philox stream); toolkit/sampler/ drives them.
//
//   logits [R, V] (T = float | __half | __nv_bfloat16, upcast in registers)
//     -> to_fp32 -> x f32[R, V] -> add_entries (bias) -> apply_penalties -> add_entries (bans, -inf)
//     -> temperature_max + min_p_mask -> top_k_top_p -> gumbel_sample -> out int32[R]
//   logits (raw) -> logprobs -> top ids / logprobs, the sampled token's logprob and rank
//
// Gumbel noise: Philox4x32-10 (Salmon et al. 2011), key = the request seed (lo, hi words). Token v's 32-bit word
// is (b << 24) | (f >> 8): b = byte v & 3 of word (v >> 2) & 3 of the "coarse" call, counter (v >> 4, pos, 1, 0),
// so one call gives the top 8 bits of 16 consecutive tokens; f = word v & 3 of the "fine" call, counter
// (v >> 2, pos, 0, 0), one call per 4 tokens. u = ((word >> 9) + 0.5) * 2^-23, exact in fp32 and inside
// [2^-24, 1 - 2^-24] (a 24-bit version, (w>>8)+0.5, needs 25 significant bits: it rounds, and its top value rounds
// to u = 1, g = -inf); g = -log(-log1p(-u)). So g lies in [-2.82, 16.64], and g <= -log(u): once a real key L is
// known (each warp of gumbel_sample first computes the key of its largest x/T), a token with x/T + G_MAX < L needs no Philox
// call, and one with u > exp(x/T - L + d) cannot win and needs no logarithms (d covers every rounding, so the
// skip is exact). Most tokens are far below L, so their bound on u is tiny and the coarse byte alone (one call
// per 16 tokens) rules them out: a far token's byte passes with odds 1/256, so ~1 group of 4 in 64 needs its
// fine call.
//
// top_k_top_p and filter_sample follow one threshold rule (section 6, and kernels/sampler.py's docstring): top-k
// keeps every value >= the k-th largest (ties kept); top-p keeps the survivors whose fixed-point mass strictly
// above is < top_p * their total. The thresholds come from radix selects over order keys, never a sort: on a
// 16-bit row's histogram (the fast path), or on a candidate list gathered after a coarse histogram (the fp32 route).

// Workspaces (ws, counters, rowmax) hold one entry per row, start at zero, and the kernels leave them zeroed
// (the last block of a row resets them), so any launch can be captured in a CUDA graph and replayed.
#include "dtype.cuh"

constexpr int ROW_CHUNK = 4096;      // fp32 values per block of the temperature / min_p kernels
constexpr int SEL_THREADS = 1024;    // top_k_top_p and logprobs: one block per row
constexpr int CAND_CAP = 2048;       // top-k candidates sorted in shared memory
#define G_MAX 17.0f                  // above any computed Gumbel noise

// ---- shared helpers -------------------------------------------------------------------------------------------
// Choosing the best (value, index) candidate: NaN beats every number (a NaN logit must surface as an error,
// never hide behind a real token), and among equal values the lowest index wins (torch.argmax's and NumPy's
// rule). `pack` turns a candidate into a 64-bit key whose unsigned order is `better`'s order, so blocks can
// merge with one atomicMax; it is never 0, so 0 means "nothing yet" in a zeroed workspace.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

// High word: the value's bits mapped to an unsigned order (NaN above +inf); low word: ~index.
__device__ __forceinline__ unsigned long long pack(float v, int i) {
    unsigned u = __float_as_uint(v);
    u = isnan(v) ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)(~i);
}

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, unsigned k0, unsigned k1) {
#pragma unroll
    for (int i = 0; i < 10; i++) {
        const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c;
}

__device__ __forceinline__ float gumbel_u(float u) { return -logf(-log1pf(-u)); }
__device__ __forceinline__ float gumbel(unsigned w) {
    return gumbel_u(((float)(w >> 9) + 0.5f) * 1.1920928955078125e-07f);  // u = ((w >> 9) + 0.5) * 2^-23
}

// Order-preserving uint32 key of a float (-0 folded onto +0, so key order == float order for numbers).
__device__ __forceinline__ unsigned ord_key(float v) {
    unsigned u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}


// Four consecutive values 4g..4g+3 of a row as fp32; past the end -> -inf. `vec`: V % 4 == 0 and the row is
// aligned to 4 elements, so one 16-byte (fp32) or 8-byte (16-bit) load serves them.
template <typename T> union Quad { uint2 u; T e[4]; };
template <typename T>
__device__ __forceinline__ void load4(const T* row, int g, int V, bool vec, float (&a)[4]) {
    const int i = 4 * g;
    if (vec && i < V) {
        if constexpr (sizeof(T) == 4) {
            const float4 v = *reinterpret_cast<const float4*>(row + i);
            a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
        } else {
            Quad<T> q;
            q.u = *reinterpret_cast<const uint2*>(row + i);
#pragma unroll
            for (int k = 0; k < 4; k++) a[k] = to_f32(q.e[k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) a[k] = i + k < V ? to_f32(row[i + k]) : NEG_INF;
    }
}

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024). `tmp` holds 32 entries; returned to every thread.
template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, A* tmp, Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();  // tmp may still be read by a previous call
    if (lane == 0) tmp[warp] = v;
    __syncthreads();
    v = tmp[0];
    for (int w = 1; w < nw; w++) v = op(v, tmp[w]);
    return v;
}
// Inclusive sum over the lanes of a full warp: lane l gets v of lanes 0..l.
template <typename A>
__device__ __forceinline__ A warp_incl_sum(A v, int lane) {
    for (int o = 1; o < 32; o <<= 1) {
        const A n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}
// Exclusive scan over threads in threadIdx order; `total` = the block's sum.
template <typename A>
__device__ __forceinline__ A block_excl_scan(A v, A* tmp, A& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const A inc = warp_incl_sum(v, lane);
    A exc = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) exc = A(0);
    __syncthreads();
    if (lane == 31) tmp[warp] = inc;
    __syncthreads();
    A off = A(0);
    total = A(0);
    for (int w = 0; w < nw; w++) {
        if (w < warp) off += tmp[w];
        total += tmp[w];
    }
    return off + exc;
}

// ---- 1. gumbel_sample ---------------------------------------------------------------------------------------
// out[r] = argmax_v(T == 0 ? x_v : x_v / T + g(seed, pos, v)); -1 for a row holding a NaN; rows with T < 0 are
// filter_sample's. A race over the row with no barrier inside its loop. Grid: R * S blocks of GS_THREADS threads
// (S chosen by the host so the grid is one wave); block s of row r takes the chunks [s * nc / S, (s + 1) * nc / S)
// of the row's nc = ceil(V / 16) chunks of 16 consecutive tokens (a chunk is one coarse Philox call), CPT chunks a
// thread per step, loaded at the end of the step before (into the same registers, as soon as that step's values
// are dead, so the loads fly during the next step's row_L read and coarse calls): no registers hold two
// steps' values (a double buffer spilled at 3 blocks an SM and was 2 us slower at T = 1, B = 128), and the 24 warps
// of an SM keep the loads in flight. No values are parked in shared memory, and no block waits at a barrier with
// nothing in flight.
// (experiments/NOTEBOOK.md has the earlier kernels and their timings.)
// Per chunk a thread keeps only its largest raw value cm (paired max instructions for 16-bit types; x / T is
// increasing in x, and cm / T enters only the bounds):
//   greedy rows: the thread's largest value and the first chunk holding it; at the end each warp finds the first
//     index of its largest value (one chunk read again, from L2); random rows keep the largest value only;
//   random rows: L, the largest exact key known, a real token's, so the winner's key is >= L: first the key of
//     each warp's largest value in the first step (found in registers; one barrier shares the best of them: each
//     warp going on with its own key instead was 2 us slower at B = 128), then
//     the keys the fine calls compute, shared with the row's other blocks through row_L[r] (read at the top of a
//     step, while its loads fly). A chunk with cm / T + G_MAX < L is skipped; otherwise its coarse call gives the top
//     byte of each token's word, and a group of 4 whose bytes all lie above the chunk's bound (from
//     exp(cm / T - L + d)) cannot win. The rest (~1.8% of groups at B = 128) join the warp's queue in shared
//     memory with their 4 raw values, each lane in its own slots; the warp drains them, a group a lane, before a
//     step that could overflow a lane and at the end (at B = 128 nearly always only then), and publishes its best key.
// A warp whose largest value is NaN contributes NaN, which beats every key: out = -1 (greedy rows: with its first
// index; random rows: any index).
// The block's best (key, index) merges into ws[r] by one packed 64-bit atomicMax; the row's last block writes out
// and resets ws[r], counters[r] and row_L[r] for the next launch.
// Tokens of a thread ascend in (step, j), so a strict `>` keeps the first chunk among equal values.
constexpr int GS_THREADS = 256;  // gumbel_sample block
// GS_BLOCKS: the blocks per SM that gumbel_sample's __launch_bounds__ asks the registers to allow (3: 85 registers
// a thread; it uses 77; 2 was 0.5 us slower at B = 128 and 1 us faster at B = 32, 4 slower); the host sizes S from
// it (cuda_sampler.py: GS_BLOCKS).
constexpr int GS_BLOCKS = 3;
// A warp's queue of groups for fine calls: `slots` entries a lane, each lane appending to its own (no ballots a
// step); a step of up to CPT chunks adds <= 4 * CPT a lane, and the warp drains before a step that would overflow a
// lane (at B = 128 ~1.1 entries a lane in a warp's life, so nearly always once, at the end).
template <int CPT> struct GsQueue { static constexpr int slots = 4 * CPT + 1; };
__device__ __forceinline__ float max_nan(float a, float b) {  // max that propagates NaN (sm_80+)
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ float exact_key(float v, float u) { return v + gumbel_u(u); }

__device__ __forceinline__ unsigned sel4(uint4 w, int q) { return q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w; }
// Token v's word from its coarse word cw (v's byte is byte v & 3) and its fine word f (see the top).
__device__ __forceinline__ unsigned noise_word(unsigned cw, unsigned f, int b) {
    return (((cw >> (8 * b)) & 0xffu) << 24) | (f >> 8);
}
__device__ __forceinline__ uint4 coarse_call(int v, unsigned pos, unsigned k0, unsigned k1) {
    return philox4x32_10(make_uint4((unsigned)v >> 4, pos, 1u, 0u), k0, k1);
}
__device__ __forceinline__ uint4 fine_call(int v, unsigned pos, unsigned k0, unsigned k1) {
    return philox4x32_10(make_uint4((unsigned)v >> 2, pos, 0u, 0u), k0, k1);
}
// A word's uniform u = ((w >> 9) + 0.5) * 2^-23, from the bits ((w >> 9) | 1.0f) - (1 - 2^-24) (exact: Sterbenz).
__device__ __forceinline__ float word_u(unsigned w) { return __uint_as_float((w >> 9) | 0x3f800000u) - 0.99999994f; }
__device__ __forceinline__ unsigned token_word(int i, unsigned pos, unsigned k0, unsigned k1) {  // token i's word
    return noise_word(sel4(coarse_call(i, pos, k0, k1), (i >> 2) & 3), sel4(fine_call(i, pos, k0, k1), i & 3), i & 3);
}

// The fine stage of the group of 4 tokens i0..i0+3 (i0 % 4 == 0; xr their raw values, cw their coarse word): one
// Philox call, then per token the exact test u <= exp(x + c) and, for the rare token that passes, its exact key.
// The test takes x as xr * rt (within 2 ulp of xr / T: c's margin covers it); only a key divides (as the twin does).
__device__ __forceinline__ void fine_group(int i0, unsigned cw, const float (&xr)[4], float rt, float t, bool div,
                                           float c, unsigned pos, unsigned k0, unsigned k1, float& best, int& best_i) {
    const uint4 f = fine_call(i0, pos, k0, k1);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float u = word_u(noise_word(cw, sel4(f, q), q));
        if (u > __expf(xr[q] * rt + c)) continue;  // false for NaN (L = inf): then computed
        const float k = exact_key(div ? xr[q] / t : xr[q], u);
        if (better(k, i0 + q, best, best_i)) { best = k; best_i = i0 + q; }
    }
}

// A 16-byte load kept where it is written (asm volatile): the next step's loads go out ahead of the next step's
// row_L read and coarse calls, not at their first use.
__device__ __forceinline__ uint4 ld_early(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };
// The largest of a chunk's 16 values (its LPC 16-byte pieces), NaN-propagating, as fp32: for 16-bit types 7 paired
// max instructions and one conversion, where a test per value costs several.
template <typename T, int LPC>
__device__ __forceinline__ float chunk_max(const uint4 (&u)[LPC]) {
    if constexpr (sizeof(T) == 4) {
        float m = NEG_INF;
#pragma unroll
        for (int l = 0; l < LPC; l++)
            m = max_nan(max_nan(m, max_nan(__uint_as_float(u[l].x), __uint_as_float(u[l].y))),
                        max_nan(__uint_as_float(u[l].z), __uint_as_float(u[l].w)));
        return m;
    } else {
        union { uint4 u; typename Pair<T>::type p[4]; } x, y;
        x.u = u[0];
        y.u = u[1];
        const auto p = __hmax2_nan(__hmax2_nan(__hmax2_nan(x.p[0], x.p[1]), __hmax2_nan(x.p[2], x.p[3])),
                                   __hmax2_nan(__hmax2_nan(y.p[0], y.p[1]), __hmax2_nan(y.p[2], y.p[3])));
        union { typename Pair<T>::type p; T e[2]; } h;
        h.p = p;
        return max_nan(to_f32(h.e[0]), to_f32(h.e[1]));
    }
}
__device__ __forceinline__ unsigned long long pack_folded(float v, int i) { return pack(v == 0.f ? 0.f : v, i); }

// A queued group of 4 tokens: its first token, its coarse word and its 4 raw values (kept, so a drain reads shared
// memory only: reading them again from L2 put ~1 us of latency on each drain, the last one in the kernel's tail).
// (Queueing whole chunks instead, a lane's chunk stored as held, cut the appends' selects but left a drain a loop
// over each chunk's groups: 4 us slower at B = 32.)
template <typename T> struct GroupRaw { using type = uint2; };  // 4 x 16 bits
template <> struct GroupRaw<float> { using type = uint4; };
template <typename T> struct QEntry { unsigned i0, cw; typename GroupRaw<T>::type raw; };
// Group g (0..3) of a chunk held as LPC 16-byte pieces, by selects (a dynamic index would spill to local memory).
template <typename T, int LPC>
__device__ __forceinline__ typename GroupRaw<T>::type group_raw(const uint4 (&u)[LPC], int g) {
    if constexpr (sizeof(T) == 4) {
        return g == 0 ? u[0] : g == 1 ? u[1] : g == 2 ? u[2] : u[3];
    } else {
        const uint4 w = g < 2 ? u[0] : u[1];
        return (g & 1) ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
    }
}
template <typename T>
__device__ __forceinline__ float raw_value(const typename GroupRaw<T>::type& raw, int z) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(sel4(raw, z));
    } else {
        const unsigned w = z < 2 ? raw.x : raw.y;
        union { unsigned short b; T e; } h;
        h.b = (unsigned short)(w >> (16 * (z & 1)));
        return to_f32(h.e);
    }
}

template <typename T, int CPT>
__global__ void __launch_bounds__(GS_THREADS, GS_BLOCKS)
gumbel_sample(const T* __restrict__ logits, int V, int S, const float* __restrict__ temperature,
              const unsigned* __restrict__ seeds, const int* __restrict__ positions,
              unsigned long long* __restrict__ ws, unsigned* __restrict__ row_L, unsigned* __restrict__ counters,
              int* __restrict__ out) {
    constexpr int LPC = sizeof(T), VE = 16 / sizeof(T), STEP = GS_THREADS * CPT, NW = GS_THREADS / 32;
    constexpr int QS = GsQueue<CPT>::slots;
    // Random rows: each warp's queue of the groups of 4 whose coarse bytes could not rule them out, and the ord_key
    // of the largest exact key known to the block (0: none yet).
    __shared__ QEntry<T> s_q[NW][QS * 32];  // entry (slot, lane) at slot * 32 + lane
    __shared__ unsigned s_pre[NW][32];      // a drain's inclusive prefix sums of the lanes' counts
    __shared__ unsigned s_L;
    __shared__ unsigned long long s_key[NW];
    const int r = blockIdx.x / S, s = blockIdx.x % S, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nc = (V + 15) >> 4, c0 = (int)((long long)nc * s / S), c1 = (int)((long long)nc * (s + 1) / S);
    const int steps = (c1 - c0 + STEP - 1) / STEP;
    const T* row = logits + (size_t)r * V;
    const bool vec = ((size_t)V * sizeof(T)) % 16 == 0 && reinterpret_cast<size_t>(logits) % 16 == 0;
    auto chunk_of = [&](int k, int j) { return c0 + k * STEP + j * GS_THREADS + (int)threadIdx.x; };
    auto load = [&](int k, uint4 (&b)[CPT][LPC]) {
#pragma unroll
        for (int j = 0; j < CPT; j++) {
            const int c = chunk_of(k, j);
            if (vec && c < c1 && 16 * c + 16 <= V) {
#pragma unroll
                for (int l = 0; l < LPC; l++) b[j][l] = ld_early(reinterpret_cast<const uint4*>(row + 16 * c) + l);
            } else {  // past the block's chunks, or the row's last chunk partly past its end: -inf
#pragma unroll
                for (int l = 0; l < LPC; l++) {
                    Chunk<T> h;
#pragma unroll
                    for (int e = 0; e < VE; e++) {
                        const int i = 16 * c + l * VE + e;
                        h.e[e] = c < c1 && i < V ? row[i] : from_f32<T>(NEG_INF);
                    }
                    b[j][l] = h.u;
                }
            }
        }
    };
    uint4 cur[CPT][LPC];
    const float t = temperature[r];
    const unsigned k0 = seeds[2 * r], k1 = seeds[2 * r + 1], pos = (unsigned)positions[r];
    // A fast-path row with processing is filter_sample's (no block of the row counts in ws). Its launch reads no
    // logits: issuing the first loads before this test cost an all-filtered launch 0.6 us and bought nothing.
    if (t < 0.f) return;
    load(0, cur);
    const bool greedy = !(t > 0.f), div = !greedy && t != 1.f;
    auto value = [&](float raw) { return div ? raw / t : raw; };  // division: T = 1, 0.5 exact
    // The loop tracks raw values (x / T is increasing in x) and scales a chunk's maximum by 1 / T for the bounds
    // only, where an error of an ulp or two is far inside their margins; exact values (x / T, as the twin divides)
    // are computed only for the keys.
    const float rt = div ? 1.f / t : 1.f;
    auto warp_max = [&](float v) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    };
    // The first index of the warp's largest raw value wm (NaN: its first NaN) over its lanes, each lane's m held
    // first by chunk mc; the chunk is read again (from L2) by the lanes that hold wm.
    auto warp_first = [&](float m, int mc, float wm) {
        int first = 0x7fffffff;
        if (mc >= 0 && (isnan(wm) ? isnan(m) : m == wm && wm > NEG_INF))
#pragma unroll
            for (int e = 15; e >= 0; e--) {
                const int i = 16 * mc + e;
                if (i < V) {
                    const float v = to_f32(row[i]);
                    if (isnan(wm) ? isnan(v) : v == wm) first = i;
                }
            }
        return (int)__reduce_min_sync(0xffffffffu, (unsigned)first);
    };

    QEntry<T>* q = s_q[warp];
    if (threadIdx.x == 0) s_L = 0u;
    __syncthreads();  // while the first loads are in flight
    float m = NEG_INF, best = NEG_INF, L = NEG_INF;
    int mc = -1, best_i = 0x7fffffff;
    unsigned gL = 0u;  // lane 0: row_L[r] as read at the top of the step (the row's other blocks' best keys)
    unsigned mine = 0u;  // the lane's queued entries
    // A better L for the block and the row's other blocks (one 32-bit atomicMax each; the global one is a
    // fire-and-forget reduction).
    auto publish = [&](float k) {
        const unsigned o = ord_key(k);
        atomicMax(&s_L, o);
        atomicMax(row_L + r, o);
    };
    // The fine calls of the warp's queued groups, a group a lane (from shared memory only): the lanes' entries are
    // numbered in (lane, slot) order by a prefix sum, and entry b's owner found by a 5-step search; then the
    // warp's best key is published.
    auto drain = [&]() {
        const unsigned incl = warp_incl_sum(mine, lane);
        const unsigned total = __shfl_sync(0xffffffffu, incl, 31);
        s_pre[warp][lane] = incl;
        __syncwarp();  // the other lanes' entries and sums are visible
        for (unsigned b = lane; b < total; b += 32) {
            int o = 0;  // the first lane whose inclusive sum exceeds b
#pragma unroll
            for (int w = 16; w > 0; w >>= 1)
                if (s_pre[warp][o + w - 1] <= b) o += w;
            const QEntry<T> e = q[(b - (o ? s_pre[warp][o - 1] : 0u)) * 32 + o];
            float xr[4], xm = NEG_INF;
#pragma unroll
            for (int z = 0; z < 4; z++) {
                xr[z] = raw_value<T>(e.raw, z);  // past the row's end: -inf, as loaded
                xm = fmaxf(xm, xr[z]);
            }
            xm *= rt;
            // as for the chunk (below), with the current L and the group's own largest value (a product with 1 / T)
            const float c = 1e-4f + 1e-3f + 1e-5f * (1.04f * fabsf(xm) + 2.f * fabsf(L) + G_MAX) - L;
            fine_group((int)e.i0, e.cw, xr, rt, t, div, c, pos, k0, k1, best, best_i);
        }
        __syncwarp();  // every entry and sum read before the next ones are written
        mine = 0u;
        const float lw = warp_max(best);
        if (lane == 0 && lw > L) publish(lw);
        L = fmaxf(L, lw);
    };
    for (int k = 0; k < steps; k++) {
        // the row's other blocks' best key, read while the step's loads fly so that one wait covers both (read in
        // the middle of a step, the loop's branch waited for it); a relaxed load at GPU scope, not a volatile one
        if (!greedy && k > 0 && lane == 0)
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gL) : "l"(row_L + r));
        float cm[CPT];  // raw
#pragma unroll
        for (int j = 0; j < CPT; j++) {
            cm[j] = chunk_max<T, LPC>(cur[j]);
            if (!greedy)  // random rows need no index with m: their NaN samples -1, whatever its index
                m = max_nan(m, cm[j]);
            else if (isnan(cm[j]) ? !isnan(m) : cm[j] > m) {
                m = cm[j];
                mc = chunk_of(k, j);
            }
        }
        if (!greedy) {
            if (k == 0) {  // the first bound: the key of a token holding the warp's largest value (found in the
                           // lowest lane's registers, by raw compares); the block keeps the best (a NaN warp makes
                           // none: it merges NaN at the end, which wins anyway)
                const float wm = warp_max(m);
                const unsigned holders = __ballot_sync(0xffffffffu, m == wm && wm > NEG_INF);
                if (holders && lane == __ffs(holders) - 1) {
                    int i = 0x7fffffff;
#pragma unroll
                    for (int j = CPT - 1; j >= 0; j--)
#pragma unroll
                        for (int l = LPC - 1; l >= 0; l--) {
                            Chunk<T> h;
                            h.u = cur[j][l];
#pragma unroll
                            for (int e = VE - 1; e >= 0; e--)
                                if (to_f32(h.e[e]) == wm) i = 16 * chunk_of(0, j) + l * VE + e;
                        }
                    best = value(wm) + gumbel(token_word(i, pos, k0, k1));
                    best_i = i;
                    publish(best);
                }
                __syncthreads();
            }
            const unsigned sl = max(*(volatile unsigned*)&s_L, __shfl_sync(0xffffffffu, gL, 0));
            L = fmaxf(L, sl ? key_float(sl) : NEG_INF);
            // The coarse calls of the step's chunks, outside any per-chunk branch, so that their CPT independent
            // Philox chains interleave (in a branch each, one chain's ~100 cycles of latency followed the other's);
            // a warp none of whose chunks can hold a winner makes none.
            bool live[CPT], any = false;
#pragma unroll
            for (int j = 0; j < CPT; j++) {  // else NaN, all -inf, or no token reaches L
                live[j] = cm[j] > NEG_INF && cm[j] * rt + G_MAX >= L;
                any |= live[j];
            }
            uint4 cw4[CPT] = {};  // zero where no call is made: no group of a dead chunk passes (n = 0 below)
            if (__any_sync(0xffffffffu, any)) {
#pragma unroll
                for (int j = 0; j < CPT; j++) cw4[j] = coarse_call(16 * chunk_of(k, j), pos, k0, k1);
            }
            // D covers the rounding of g, of the fast exp and of the sums (1e-4 is a factor 1.0001), for every
            // token that can win (x >= L - G_MAX and x <= cm, so |x| <= |cm| + |L| + G_MAX), and cm's own (a product
            // with 1 / T: within 2 ulp of x / T): a skipped token surely has key < L, and each skip is exact. With
            // cs = cm / T: c = 1e-4 + 1e-3 + 1e-5 (|cs| + 2 |L| + G_MAX) + 4e-7 |cs| - L, so cs + c =
            // cs + 1.04e-5 |cs| + cL, cL the step's part; in log2 units, two FMAs from cm.
            const float cL2 = (1.1e-3f + 1e-5f * (2.f * fabsf(L) + G_MAX) - L) * 1.44269504f;
            const float r2 = rt * 1.44269504f, rk2 = 1.04e-5f * r2;
            unsigned pend[CPT], cnt = 0;  // each chunk's groups to queue (bit g: its tokens 4g .. 4g + 3)
#pragma unroll
            for (int j = 0; j < CPT; j++) {
                // One bound for the chunk: u <= exp(x + c) <= exp(cs + c) = thr implies w <= W, where
                // W = (floor-ish(thr * 2^23) << 9) | 511 comes from the bits of thr + 1 (rounded to nearest, so its
                // mantissa is >= thr * 2^23 - 1/2 >= the k = w >> 9 of any u = (k + 1/2) 2^-23 <= thr). A token
                // whose coarse byte is > W >> 24 has w > W; a group passes if one of its bytes is < n = (W >> 24) + 1,
                // found for n <= 128 with the bit trick (cw - n * 0x01010101) & ~cw & 0x80808080 (exact for a test
                // of "any": a borrow only starts at a byte that is really below n). A group that passes joins the
                // warp's queue (rare: ~1.6% of groups once L is large). t1 < 2; NaN (L = -inf): every group passes;
                // a dead chunk (not live) gets n = 0, which no byte is below.
                float e;
                asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(fabsf(cm[j]), rk2, fmaf(cm[j], r2, cL2))));
                const float t1 = fminf(e, 0.99999988f) + 1.0f;
                const unsigned n = live[j] ? ((__float_as_uint(t1) >> 15) & 0xffu) + 1u : 0u;
                pend[j] = 0;
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    const unsigned cw = sel4(cw4[j], g);
                    // bitwise, not ||: the short circuit cost a branch a chunk
                    pend[j] |= (unsigned)((n > 128u) | (((cw - n * 0x01010101u) & ~cw & 0x80808080u) != 0u)) << g;
                }
                cnt += __popc(pend[j]);
            }
            // each lane appends to its own slots (one vote a step, where 4 ballots and their sums gave each lane an
            // offset in a shared list); a lane that could overflow drains the warp first
            if (__any_sync(0xffffffffu, mine + cnt > (unsigned)QS)) drain();
#pragma unroll
            for (int j = 0; j < CPT; j++)
                for (unsigned p = pend[j]; p; p &= p - 1) {
                    const int g = __ffs(p) - 1;
                    q[mine++ * 32 + lane] = QEntry<T>{(unsigned)(16 * chunk_of(k, j) + 4 * g), sel4(cw4[j], g),
                                                      group_raw<T, LPC>(cur[j], g)};
                }
        }
        // The next step's loads go out as soon as this step's values are dead (before the end's drain, and the next
        // step's row_L read and coarse calls, which need no value): the same registers, some latency covered.
        if (k + 1 < steps) load(k + 1, cur);
    }
    if (!greedy && __any_sync(0xffffffffu, mine)) drain();

    // Merge: greedy rows and NaN warps the first index of the warp's largest value, random rows the best key;
    // then the block's best, and the row's in ws[r] by one packed 64-bit atomicMax a block.
    const float wm = warp_max(m);
    unsigned long long key = 0;
    if (greedy) {
        const int i = warp_first(m, mc, wm);
        if (i < V) key = pack_folded(wm, i);
    } else if (isnan(wm)) {
        key = pack(wm, 0);  // any index: a row holding a NaN samples -1
    } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (better(v, i, best, best_i)) { best = v; best_i = i; }
        }
        if (best_i < V && best > NEG_INF) key = pack_folded(best, best_i);
    }
    if (lane == 0) s_key[warp] = key;
    __syncthreads();
    if (threadIdx.x != 0) return;
#pragma unroll
    for (int w = 1; w < NW; w++) key = max(key, s_key[w]);
    if (key) atomicMax(ws + r, key);
    __threadfence();
    if (atomicAdd(counters + r, 1u) == (unsigned)S - 1) {
        const unsigned long long kr = atomicExch(ws + r, 0ull);  // read and reset for the next launch
        counters[r] = 0;
        row_L[r] = 0u;  // every block of the row has counted itself: none reads or raises it again this launch
        out[r] = !kr ? 0 : (kr >> 32) == 0xffffffffull ? -1 : (int)~(unsigned)kr;
    }
}

// ---- 2. to_fp32 ------------------------------------------------------------------------------------------------
// out[i] = float(in[i]) over n elements; 4 per thread per step of a grid-stride loop.
template <typename T>
__global__ void __launch_bounds__(256)
to_fp32(const T* __restrict__ in, float* __restrict__ out, long long n) {
    const bool vec = n % 4 == 0 && reinterpret_cast<size_t>(in) % (4 * sizeof(T)) == 0 &&
                     reinterpret_cast<size_t>(out) % 16 == 0;
    const long long groups = (n + 3) / 4;
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;
         g += (long long)gridDim.x * blockDim.x) {
        if (vec) {
            float a[4];
            load4(in + 4 * g, 0, 4, true, a);
            *reinterpret_cast<float4*>(out + 4 * g) = make_float4(a[0], a[1], a[2], a[3]);
        } else {
            for (long long i = 4 * g; i < min(4 * g + 4, n); i++) out[i] = to_f32(in[i]);
        }
    }
}

// ---- 3. add_entries / 4. apply_penalties -------------------------------------------------------------------
// CSR over rows: row r owns entries offsets[r] .. offsets[r+1]-1 (tokens unique within a row). One block per
// row loops over its entries, so the grid does not depend on the entry count (graph-capturable). Tokens outside
// [0, V) are skipped.
template <typename F>  // F = float only (a template so CuPy looks every kernel up the same way)
__global__ void __launch_bounds__(128)
add_entries(F* __restrict__ x, int V, const int* __restrict__ offsets, const int* __restrict__ tokens,
            const float* __restrict__ values) {
    const int r = blockIdx.x;
    float* row = x + (size_t)r * V;
    for (int e = offsets[r] + threadIdx.x; e < offsets[r + 1]; e += blockDim.x) {
        const int t = tokens[e];
        if ((unsigned)t < (unsigned)V) row[t] += values[e];
    }
}

// vLLM's order: sign-aware repetition penalty, then frequency (x -= f * count), then presence (x -= p).
// __fmul_rn keeps f * count a rounded product (no FMA contraction), as NumPy computes it.
template <typename F>  // F = float only (a template so CuPy looks every kernel up the same way)
__global__ void __launch_bounds__(128)
apply_penalties(F* __restrict__ x, int V, const int* __restrict__ offsets, const int* __restrict__ tokens,
                const int* __restrict__ counts, const float* __restrict__ rep, const float* __restrict__ freq,
                const float* __restrict__ pres) {
    const int r = blockIdx.x;
    float* row = x + (size_t)r * V;
    const float rp = rep[r], f = freq[r], p = pres[r];
    for (int e = offsets[r] + threadIdx.x; e < offsets[r + 1]; e += blockDim.x) {
        const int t = tokens[e];
        if ((unsigned)t >= (unsigned)V) continue;
        const int c = counts[e];
        float v = row[t];
        if (rp != 1.f) v = v > 0.f ? v / rp : __fmul_rn(v, rp);
        v = v - __fmul_rn(f, (float)c);
        if (c > 0) v = v - p;
        row[t] = v;
    }
}

// ---- 5. temperature + min_p ------------------------------------------------------------------------------------
// temperature_max: rows with T not in {0, 1}: x /= T; rows with min_p > 0 (T != 0) also fold their block max into
// rowmax[r] (an order-preserving key). min_p_mask then sets x < max + log(min_p) to -inf, and the last block of
// the row resets rowmax[r] and counters[r]. Grid (ceil(V / ROW_CHUNK), R), block 256.
template <typename F>  // F = float only (a template so CuPy looks every kernel up the same way)
__global__ void __launch_bounds__(256)
temperature_max(F* __restrict__ x, int V, const float* __restrict__ temperature,
                const float* __restrict__ min_p, unsigned* __restrict__ rowmax) {
    __shared__ float s_red[32];
    const int r = blockIdx.y;
    const float t = temperature[r];
    const bool div = t != 1.f, mp = min_p[r] > 0.f;
    if (t == 0.f || (!div && !mp)) return;
    float* row = x + (size_t)r * V;
    const bool vec = V % 4 == 0 && reinterpret_cast<size_t>(x) % 16 == 0;
    const int g0 = blockIdx.x * (ROW_CHUNK / 4), g1 = min(g0 + ROW_CHUNK / 4, (V + 3) / 4);
    float m = NEG_INF;
    for (int g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
        float a[4];
        load4(row, g, V, vec, a);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (div) a[k] = a[k] / t;
            m = fmaxf(m, a[k]);
        }
        if (!div) continue;
        if (vec) *reinterpret_cast<float4*>(row + 4 * g) = make_float4(a[0], a[1], a[2], a[3]);
        else
            for (int k = 0; k < 4; k++) if (4 * g + k < V) row[4 * g + k] = a[k];
    }
    if (!mp) return;
    m = block_reduce(m, s_red, [](float p, float q) { return fmaxf(p, q); });
    if (threadIdx.x == 0) atomicMax(rowmax + r, ord_key(m));
}

template <typename F>  // F = float only (a template so CuPy looks every kernel up the same way)
__global__ void __launch_bounds__(256)
min_p_mask(F* __restrict__ x, int V, const float* __restrict__ temperature, const float* __restrict__ min_p,
           unsigned* __restrict__ rowmax, unsigned* __restrict__ counters) {
    const int r = blockIdx.y;
    const float mp = min_p[r];
    if (temperature[r] == 0.f || !(mp > 0.f)) return;
    const unsigned key = rowmax[r];
    const float thr = (key ? key_float(key) : NEG_INF) + logf(mp);
    float* row = x + (size_t)r * V;
    const bool vec = V % 4 == 0 && reinterpret_cast<size_t>(x) % 16 == 0;
    const int g0 = blockIdx.x * (ROW_CHUNK / 4), g1 = min(g0 + ROW_CHUNK / 4, (V + 3) / 4);
    for (int g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
        float a[4];
        load4(row, g, V, vec, a);
        bool changed = false;
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (a[k] < thr) { a[k] = NEG_INF; changed = true; }
        if (!changed) continue;
        if (vec) *reinterpret_cast<float4*>(row + 4 * g) = make_float4(a[0], a[1], a[2], a[3]);
        else
            for (int k = 0; k < 4; k++) if (4 * g + k < V) row[4 * g + k] = a[k];
    }
    __syncthreads();  // every thread has read rowmax[r] before this block is counted
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(counters + r, 1u) == gridDim.x - 1) { rowmax[r] = 0; counters[r] = 0; }
    }
}

// ---- the logprobs kernel's shared memory and row loop ------------------------------------------------------------
struct SelSmem {
    unsigned cand[CAND_CAP];
    unsigned u32[32];
    float f32[32];
    unsigned aux;
};

// fn(i, value) over the row, 16-byte loads where the row allows.
template <typename T, typename F>
__device__ __forceinline__ void for_row(const T* row, int V, F fn) {
    const bool vec = V % 4 == 0 && reinterpret_cast<size_t>(row) % (4 * sizeof(T)) == 0;
    for (int g = threadIdx.x; g < (V + 3) / 4; g += blockDim.x) {
        float a[4];
        load4(row, g, V, vec, a);
#pragma unroll
        for (int k = 0; k < 4; k++) if (4 * g + k < V) fn(4 * g + k, a[k]);
    }
}

// ---- 6. the threshold rule: top_k_top_p (FP32 path) and filter_sample (fast path) -------------------------------
// THE RULE (kernels/sampler.py's docstring has it in full; both paths follow it, so they give the same token for
// the same seed): y = the adjusted logit (history tokens: + bias, penalties, + -inf bans, fp32, in that order),
// z = y / T, M = max z; min-p keeps z >= M + logf(min_p); top-k keeps z >= the k-th largest z (ties kept);
// top-p keeps, among those survivors, z_v whose mass strictly above, A_v, has double(A_v) < double(top_p) *
// double(S), with integer weights W(z) = 2^32 at the max, 0 below M - 25, else rint(expf(z - M) * 2^32): integer
// sums do not depend on their order, so histogram bins and parallel reductions give the same S as any other sum.
// A radix select over the 32-bit order keys of y (8-bit digits from the top; counts for top-k, W for top-p) finds
// the k-th largest y, or y* (the smallest survivor with mass above < target); tau = y / T, and the row keeps
// z >= tau. The FP32 path runs it on its processed copy (y = z, T = 1, no history); the fast path on the model's
// logits in place, with its history in shared memory (a bitmap of the vocabulary marks those tokens, which the row
// scans skip). For bf16 logits the key's low 16 bits are fixed by its top 16 (0 for positive values, 0xffff for
// negative ones), so levels 2 and 3 need no row pass: the bin is one value (the "group") plus history entries.
constexpr int FILTER_THREADS = 1024;
constexpr int HIST_CAP = 2048;   // kernels/sampler.py: HIST_CAP (history entries a row may hold)
constexpr int NB = 256;          // 8-bit digits

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

struct FilterSmem {
    unsigned cnt[NB], rc[NB];        // per-digit counts; rc: select_key, the row's own (no history) of the last
                                     // row level; select_key16, the history's
    unsigned long long ms[NB];       // per-digit W sums
    unsigned long long best;         // packed (key, ~index) of the best candidate (max pass, sample pass)
    unsigned long long sel_above;
    unsigned long long tot;          // select_key, mass: the W-mass of its level 0 (every survivor it saw)
    unsigned kmn[NB], kmx[NB];       // select_key16: per digit, the least and the largest bin key counted
    unsigned sel, nh, nan, nq, nl, klo, khi;
    int kmax;
    float M, L;
};

__device__ __forceinline__ unsigned long long weight(float z, float M) {
    if (z == M) return 1ull << 32;
    const float d = z - M;
    return d >= -25.f ? __float2ull_rn(expf(d) * 4294967296.f) : 0ull;
}
// Key of a candidate (value, index): value order (-0 folded onto +0), then the lowest index.
__device__ __forceinline__ unsigned long long cand_key(float v, int i) {
    return ((unsigned long long)ord_key(v) << 32) | (unsigned)(~i);
}

// fn(valid, i, value) over the row's tokens, by every thread the same number of times (warp-uniform, so fn may
// use warp intrinsics); `bits` (or null): tokens whose bit is set are history, valid = false for them. U loads
// of 4 values (16 bytes for fp32) in flight per thread: one load at a time leaves a pass latency-bound.
constexpr int SCAN_LOADS = 4;
template <int U = SCAN_LOADS, typename T, typename F>
__device__ __forceinline__ void scan_row(const T* row, int V, const unsigned* bits, F fn) {
    const bool vec = V % 4 == 0 && reinterpret_cast<size_t>(row) % (4 * sizeof(T)) == 0;
    const int G = (V + 3) / 4;
    for (int g0 = threadIdx.x; g0 - (int)threadIdx.x < G; g0 += U * blockDim.x) {
        float a[U][4];
#pragma unroll
        for (int j = 0; j < U; j++) load4(row, g0 + j * blockDim.x, V, vec, a[j]);  // past the end: -inf
#pragma unroll
        for (int j = 0; j < U; j++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int i = 4 * (g0 + j * blockDim.x) + q;
                fn(i < V && !(bits && (bits[i >> 5] >> (i & 31) & 1u)), i, a[j][q]);
            }
        }
    }
}

// Add (count, W) to digit d, warp-aggregated: the lanes holding the same digit sum first, one atomic per digit;
// `also` (or null): a second per-digit count of the same entries.
__device__ __forceinline__ void hist_add(bool valid, unsigned d, unsigned long long w, bool mass, FilterSmem& s,
                                         unsigned* also = nullptr) {
    const unsigned peers = __match_any_sync(0xffffffffu, valid ? d : NB);
    if (!valid) return;
    const bool leader = (threadIdx.x & 31) == (unsigned)(__ffs(peers) - 1);
    if (mass) {  // W <= 2^32: 16-bit halves sum over 32 lanes without overflow
        const unsigned hi = __reduce_add_sync(peers, (unsigned)(w >> 16)), lo = __reduce_add_sync(peers, (unsigned)(w & 0xffffu));
        if (leader && (hi | lo)) atomicAdd(&s.ms[d], ((unsigned long long)hi << 16) + lo);
    }
    if (leader) atomicAdd(&s.cnt[d], (unsigned)__popc(peers));
    if (leader && also) atomicAdd(also + d, (unsigned)__popc(peers));
}

// The W-mass of every digit, summed by warp 0: pick_digit, the one reader of the target, runs there (every thread
// summing all 256 was 8,192 broadcast loads a block). Integer sums: the same total in any order.
__device__ __forceinline__ unsigned long long digit_mass(const FilterSmem& s) {
    unsigned long long m = 0;
    for (int b = threadIdx.x; b < NB; b += 32) m += s.ms[b];
    for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
    return m;
}

// Warp 0 picks the digit (see the rule): counts: where the count from the top reaches k; mass: the lowest
// non-empty digit whose mass above is < target. Lane l holds digits 255 - 8l .. 248 - 8l. s.sel, s.sel_above.
__device__ void pick_digit(FilterSmem& s, bool mass, unsigned long long above, unsigned k, double target) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned long long loc = 0;
        for (int j = 0; j < 8; j++) loc += mass ? s.ms[NB - 1 - 8 * lane - j] : s.cnt[NB - 1 - 8 * lane - j];
        const unsigned long long inc = warp_incl_sum(loc, lane);
        unsigned long long run = above + inc - loc;
        int found = -1;
        unsigned long long fa = 0;
        for (int j = 0; j < 8; j++) {
            const int b = NB - 1 - 8 * lane - j;
            if (mass) {
                if (s.cnt[b] && (double)run < target) { found = b; fa = run; }
                run += s.ms[b];
            } else {
                if (found < 0 && run + s.cnt[b] >= k) { found = b; fa = run; }
                run += s.cnt[b];
            }
        }
        const unsigned has = __ballot_sync(0xffffffffu, found >= 0);
        const int src = has ? (mass ? 31 - __clz(has) : __ffs(has) - 1) : 0;  // mass: the lowest digit; count: the first
        const int f = __shfl_sync(0xffffffffu, found, src);
        const unsigned long long a = __shfl_sync(0xffffffffu, fa, src);
        if (lane == 0) { s.sel = f < 0 ? 0u : (unsigned)f; s.sel_above = f < 0 ? above : a; }
    }
    __syncthreads();
}

// The radix select: returns the 32-bit key of the k-th largest y (mass false) or of y* (mass true: survivors are
// z >= c, target = p * S). hist: nh history tokens/values (shared memory) and their bitmap, or none.
// RL: the levels that scan the row (default: 2 for bf16, else 4); 0 selects over the entries hy alone (the fp32
// route's candidate list). S: the survivors' W-mass when the entries do not hold every survivor (0: their own).
template <typename T, int RL = -1>
__device__ unsigned select_key(const T* row, int V, const unsigned* bits, const int* htok, const float* hy, int nh,
                               float t, bool div, float c, float M, bool mass, unsigned k, float p, FilterSmem& s,
                               unsigned long long S = 0) {
    constexpr int ROW_LEVELS = RL >= 0 ? RL : IsBf16<T>::value ? 2 : 4;
    unsigned prefix = 0, pmask = 0, group_n = 0;
    unsigned long long above = 0;
    double target = 0.0;
    for (int level = 0; level < 4; level++) {
        const int shift = 24 - 8 * level;
        for (int b = threadIdx.x; b < NB; b += blockDim.x) { s.cnt[b] = 0; s.ms[b] = 0; }
        __syncthreads();
        auto add = [&](bool valid, float y) {  // one token of value y, if it matches the prefix (and survives)
            const unsigned key = ord_key(y);
            valid = valid && (key & pmask) == prefix;
            unsigned long long w = 0;
            if (valid && mass) {
                const float z = div ? y / t : y;
                valid = z >= c;
                w = valid ? weight(z, M) : 0ull;
            }
            hist_add(valid, (key >> shift) & (NB - 1), w, mass, s);
        };
        if (level < ROW_LEVELS) {
            scan_row(row, V, bits, [&](bool valid, int, float y) { add(valid, y); });
            __syncthreads();
            for (int b = threadIdx.x; b < NB; b += blockDim.x) s.rc[b] = s.cnt[b];
        } else if (threadIdx.x == 0 && group_n) {  // the bf16 group: group_n equal values of key (prefix, low bits)
            const unsigned key = (prefix & 0xffff0000u) | ((prefix & 0x80000000u) ? 0u : 0xffffu);
            const float y = key_float(key), z = div ? y / t : y;
            if ((key & pmask) == prefix && (!mass || z >= c)) {
                s.cnt[(key >> shift) & (NB - 1)] += group_n;
                if (mass) s.ms[(key >> shift) & (NB - 1)] += group_n * weight(z, M);
            }
        }
        __syncthreads();
        for (int h0 = 0; h0 < nh; h0 += blockDim.x) {  // history entries, warp-uniform
            const int h = h0 + threadIdx.x;
            add(h < nh, h < nh ? hy[h] : 0.f);
        }
        __syncthreads();
        if (mass && level == 0 && threadIdx.x < 32) {
            const unsigned long long tot = digit_mass(s);
            target = (double)p * (double)(S ? S : tot);
            if (threadIdx.x == 0) s.tot = tot;
        }
        pick_digit(s, mass, above, k, target);
        const unsigned d = s.sel;
        above = s.sel_above;
        if (level == ROW_LEVELS - 1) group_n = s.rc[d];
        prefix |= d << shift;
        pmask |= (NB - 1u) << shift;
        __syncthreads();
    }
    return prefix;
}

// The row's threshold tau (keep z >= tau), given M (max z, a number or +inf) and the min-p cut c (or -inf);
// sel(c, mass, k) is a select_key over the row (its rows or its histogram, see select_key16).
template <typename S>
__device__ float threshold(S sel, int V, float t, unsigned k, float p, float c) {
    const bool div = t != 1.f;
    if (k > 0 && k < (unsigned)V) {
        const float yk = key_float(sel(c, false, k));
        c = fmaxf(c, div ? yk / t : yk);
    }
    if (p < 1.f) {
        const float ys = key_float(sel(c, true, 0u));
        c = fmaxf(c, div ? ys / t : ys);
    }
    return c;
}
template <typename T>
__device__ float threshold(const T* row, int V, const unsigned* bits, const int* htok, const float* hy, int nh,
                           float t, unsigned k, float p, float c, float M, FilterSmem& s) {
    const bool div = t != 1.f;
    return threshold([&](float cc, bool mass, unsigned kk) {
        return select_key(row, V, bits, htok, hy, nh, t, div, cc, M, mass, kk, p, s);
    }, V, t, k, p, c);
}

// ---- the 16-bit fast path (bf16 / fp16 logits): one pass builds the row's full histogram -------------------
// A 16-bit logit has 65,536 possible values, so a count per value (packed two to a 32-bit word: 128 KB of shared
// memory) holds everything the selects need: the counts, and the masses as count * W(value), exact integers. The
// row is read once, for that histogram and each 16-token chunk's largest value; the draw screens chunks by those
// maxima and reads back only the few groups its coarse noise cannot rule out. Every select level scans histogram
// bins, never the row: the bins whose 32-bit key matches the level's prefix are one interval of 16-bit keys (the
// map is monotone), bounded by the least and largest key counted for the digit picked. A value held by 65,536 or
// more tokens would overflow its 16-bit count: the decoded total then falls short of the row's token count, and
// the row takes the general route (select_key over the row).
__device__ __forceinline__ unsigned key16(unsigned u) {  // order key of 16 raw bits; -0 folded onto +0
    return u == 0x8000u ? 0x8000u : (u & 0x8000u) ? (~u & 0xffffu) : (u | 0x8000u);
}
template <typename T>
__device__ __forceinline__ float val16(unsigned k) {  // the value whose key16 is k
    union { unsigned short u; T t; } c;
    c.u = (unsigned short)((k & 0x8000u) ? (k & 0x7fffu) : (~k & 0xffffu));
    return to_f32(c.t);
}
template <typename T>
__device__ __forceinline__ unsigned key16_of(float v) {
    union { unsigned short u; T t; } c;
    c.t = from_f32<T>(v);
    return key16(c.u);
}
__device__ __forceinline__ unsigned bin_count(const unsigned* hist, unsigned k) {
    return (hist[k >> 1] >> ((k & 1u) << 4)) & 0xffffu;
}

// The raw 16 bits of the largest of two 16-byte chunks' 16 values: 8 paired max instructions, where a test per
// value costs several.
template <typename T>
__device__ __forceinline__ unsigned short chunk_max16(uint4 a, uint4 b) {
    union { uint4 u; typename Pair<T>::type p[4]; } x, y;
    x.u = a;
    y.u = b;
    const auto m = __hmax2(__hmax2(__hmax2(x.p[0], x.p[1]), __hmax2(x.p[2], x.p[3])),
                           __hmax2(__hmax2(y.p[0], y.p[1]), __hmax2(y.p[2], y.p[3])));
    union { typename Pair<T>::type p; T e[2]; } h;
    h.p = m;
    union { T t; unsigned short u; } r;
    r.t = __hmax(h.e[0], h.e[1]);
    return r.u;
}

// The first 16-bit key k in [lo, 65536) with pred(k) (pred false then true over that interval), or 65536, found by
// the 32 lanes of the calling warp together: each round tests 32 evenly spaced keys and keeps the stretch between
// the last false and the first true, so 4-5 rounds resolve 16 bits where one thread's bisection took 16
// dependent steps (the draw's least winning key).
template <typename P>
__device__ __forceinline__ unsigned lower_bound16(unsigned lo, P pred) {
    const unsigned lane = threadIdx.x & 31;
    unsigned hi = 0x10000u;  // the answer lies in [lo, hi]; hi is 65536 or a key where pred holds
    while (lo < hi) {
        const unsigned q = lo + (unsigned)(((hi - lo) * (lane + 1ull)) >> 5);  // lane 31: hi itself
        const unsigned t = __ballot_sync(0xffffffffu, q >= hi || pred(q));
        const int j = __ffs(t) - 1;  // >= 0: lane 31 always votes true
        const unsigned qj = __shfl_sync(0xffffffffu, q, j), qp = __shfl_sync(0xffffffffu, q, j > 0 ? j - 1 : 0);
        lo = j > 0 ? qp + 1 : lo;
        hi = qj;
    }
    return lo;
}

// Add a run of bins (count n, mass m, least and largest key lo, hi) to digit d, by a warp: lanes holding the same
// digit sum first (all of them, the level-0 case: a warp's 256 consecutive keys share their top 8 bits), one
// atomic per digit. A mass (n * W summed, < 2^51) is summed in three 16-bit parts, each exact in 32 bits.
__device__ __forceinline__ void bin_add(bool valid, unsigned d, unsigned n, unsigned long long m, unsigned lo,
                                        unsigned hi, bool mass, FilterSmem& s) {
    const unsigned any = __ballot_sync(0xffffffffu, valid);
    if (!any) return;
    const unsigned d0 = __shfl_sync(0xffffffffu, d, __ffs(any) - 1);
    const bool one = __all_sync(0xffffffffu, !valid || d == d0);
    const unsigned peers = one ? 0xffffffffu : __match_any_sync(0xffffffffu, valid ? d : NB);
    const unsigned cn = __reduce_add_sync(peers, valid ? n : 0u);
    const unsigned mn = __reduce_min_sync(peers, valid ? lo : 0xffffffffu), mx = __reduce_max_sync(peers, valid ? hi : 0u);
    unsigned long long cm = 0;
    if (mass) {
        if (!valid) m = 0;
        cm = ((unsigned long long)__reduce_add_sync(peers, (unsigned)(m >> 32)) << 32) +
             ((unsigned long long)__reduce_add_sync(peers, (unsigned)(m >> 16) & 0xffffu) << 16) +
             __reduce_add_sync(peers, (unsigned)m & 0xffffu);
    }
    if ((threadIdx.x & 31) == (unsigned)(__ffs(peers) - 1) && (one || valid)) {
        const unsigned dd = one ? d0 : d;
        atomicAdd(&s.cnt[dd], cn);
        atomicMin(&s.kmn[dd], mn);
        atomicMax(&s.kmx[dd], mx);
        if (cm) atomicAdd(&s.ms[dd], cm);
    }
}

// select_key's twin over the histogram: the same levels, digits and picks, so the same key. Level 0 scans every
// key from -inf's up (below it lie NaN bins, absent from a row that gets here); each later level scans only the
// keys between the least and the largest counted bin of the digit picked (kmn, kmx), so no level searches for
// its interval. It stops once that digit holds one bin key and no history entry: the levels left would pick
// that key's digits one by one (the count select reaches k inside the prefix; the mass select's one non-empty
// digit has the prefix's mass above, below the target), so that key is the answer.
template <typename T>
__device__ unsigned select_key16(const unsigned* hist, unsigned kneg, const float* hy, int nh, float t, bool div,
                                 float c, float M, bool mass, unsigned k, float p, FilterSmem& s) {
    unsigned prefix = 0, pmask = 0, lo = kneg, hi = 0x10000u;  // [lo, hi): the bin keys the level scans
    unsigned long long above = 0;
    double target = 0.0;
    for (int level = 0; level < 4; level++) {
        const int shift = 24 - 8 * level;
        for (int b = threadIdx.x; b < NB; b += blockDim.x) {
            s.cnt[b] = 0; s.ms[b] = 0; s.rc[b] = 0; s.kmn[b] = 0xffffffffu; s.kmx[b] = 0;
        }
        __syncthreads();
        auto bin = [&](unsigned kk, unsigned n, unsigned& d, unsigned long long& m) {  // false: not counted
            const float y = val16<T>(kk), z = div ? y / t : y;
            if (mass && !(z >= c)) return false;
            d = (ord_key(y) >> shift) & (NB - 1);
            m = mass ? (unsigned long long)n * weight(z, M) : 0ull;
            return true;
        };
        if (level == 0) {
            // 16-byte words of 8 keys strided over the block, from a multiple of 256 keys, so a warp's keys share
            // one digit. A thread sums its keys of the first digit it meets into one run (bin_add, warp-uniform);
            // keys of another digit (rare here) go straight to their atomics.
            const uint4* h4 = reinterpret_cast<const uint4*>(hist);
            for (unsigned u = (lo >> 3 & ~31u) + threadIdx.x; (u & ~31u) << 3 < hi; u += blockDim.x) {
                const uint4 hw = u << 3 < hi ? h4[u] : make_uint4(0u, 0u, 0u, 0u);
                if (!__any_sync(0xffffffffu, hw.x | hw.y | hw.z | hw.w)) continue;
                const unsigned w[4] = {hw.x, hw.y, hw.z, hw.w};
                unsigned rd = NB, rn = 0, rlo = 0, rhi = 0, d;
                unsigned long long rm = 0, m;
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    const unsigned kk = 8 * u + q, n = (w[q >> 1] >> (16 * (q & 1))) & 0xffffu;
                    if (!n || kk < lo || kk >= hi || !bin(kk, n, d, m)) continue;
                    if (rd == NB || d == rd) {
                        if (rd == NB) { rd = d; rlo = kk; }
                        rn += n; rm += m; rhi = kk;
                    } else {
                        atomicAdd(&s.cnt[d], n);
                        atomicMin(&s.kmn[d], kk);
                        atomicMax(&s.kmx[d], kk);
                        if (m) atomicAdd(&s.ms[d], m);
                    }
                }
                bin_add(rd != NB, rd, rn, rm, rlo, rhi, mass, s);
            }
        } else {
            // A key a thread, straight to its digit's atomics: here the digits change from key to key, so the
            // lanes' addresses differ, and bin_add's warp collectives over 32 one-lane groups serialise (a level
            // took 5-14 µs with them, dev/profile_filter.py).
            for (unsigned kk = lo + threadIdx.x; lo < hi && kk < hi; kk += blockDim.x) {
                const unsigned n = bin_count(hist, kk);
                unsigned d;
                unsigned long long m;
                if (!n || !bin(kk, n, d, m)) continue;
                atomicAdd(&s.cnt[d], n);
                atomicMin(&s.kmn[d], kk);
                atomicMax(&s.kmx[d], kk);
                if (m) atomicAdd(&s.ms[d], m);
            }
        }
        __syncthreads();
        for (int h0 = 0; h0 < nh; h0 += blockDim.x) {  // history entries, as in select_key; also counted in rc
            const int h = h0 + threadIdx.x;
            const float y = h < nh ? hy[h] : 0.f;
            const unsigned key = ord_key(y);
            bool valid = h < nh && (key & pmask) == prefix;
            unsigned long long w = 0;
            if (valid && mass) {
                const float z = div ? y / t : y;
                valid = z >= c;
                w = valid ? weight(z, M) : 0ull;
            }
            hist_add(valid, (key >> shift) & (NB - 1), w, mass, s, s.rc);
        }
        __syncthreads();
        if (mass && level == 0 && threadIdx.x < 32) target = (double)p * (double)digit_mass(s);
        pick_digit(s, mass, above, k, target);
        const unsigned d = s.sel;
        above = s.sel_above;
        const bool only = s.cnt[d] > 0 && s.rc[d] == 0 && s.kmn[d] == s.kmx[d];
        lo = s.kmn[d];
        hi = s.kmx[d] + 1;  // no bin counted: kmn > kmx, an empty interval
        prefix |= d << shift;
        pmask |= (NB - 1u) << shift;
        __syncthreads();
        if (only) return ord_key(val16<T>(lo));
    }
    return prefix;
}

// ---- the fp32 route (fp32 logits, the FP32 path's copy, and 16-bit rows whose histogram overflowed) -----------
// Pass 1 (row_max) finds the max and a coarse histogram: the count of each CBITS-bit prefix of the 32-bit order
// key (sign, exponent, 3 mantissa bits). Every filter keeps an upper set, so the tokens whose prefix is at or above
// a bin `blo` hold everything the selects need whenever
//   top-k: blo = the bin of the k-th largest y, so the list holds the top k (and every survivor z >= y_k / T);
//   top-p alone: blo = the lowest bin whose tokens from the top fit the list; y* is in the list iff the list's
//     W-mass G reaches the target p * S (a token below the list has mass above it >= G), S from pass 2's sums;
// pass 2 (gather) copies those tokens, (y, index), into shared memory (CAND_MAX of them), and the radix selects
// run on that list (select_key with no row level): the same digits and picks on the same keys, so the same tau.
// Where the list cannot be used (over CAND_MAX tokens, G short of the target, or a division's rounding letting a
// token below the list survive), the general route runs select_key over the row: slower, the same tau. Rows:
// FP32 path: pass 1, pass 2, then the mask pass (3 row passes); fast path on fp32 logits: pass 1, pass 2, and the
// Gumbel draw over the list (2 row passes; min-p alone, or the general route: the draw scans the row).
constexpr int CBITS = 12, CBINS = 1 << CBITS, CSHIFT = 32 - CBITS;
constexpr int CAND_MAX = 14336;  // list entries: the histogram + (value, index) pairs fill 2^15 words (128 KB)
constexpr unsigned NEG_KEY = 0x007fffffu;  // ord_key(-inf); its bin holds -inf alone (lower bins: NaNs)
static_assert(CBINS + 2 * CAND_MAX == 0x8000, "the list's shared memory is the 16-bit histogram's");
static_assert(CBINS == 4 * FILTER_THREADS, "reach: four bins a thread");

// The largest y of the row and history as a candidate key (lowest index among equals); s.nan: a NaN was seen.
// ch (or null): also the coarse histogram of the order keys (see above).
template <typename T>
__device__ void row_max(const T* row, int V, const unsigned* bits, const float* hy, const int* htok, int nh,
                        FilterSmem& s, unsigned* ch = nullptr) {
    if (threadIdx.x == 0) { s.best = 0; s.nan = 0; }
    if (ch) for (int b = threadIdx.x; b < CBINS; b += blockDim.x) ch[b] = 0;
    __syncthreads();
    unsigned long long b = 0;
    bool nan = false;
    unsigned ninf = 0;  // -inf tokens (min-p's masked ones: often most of the row) are counted in registers
    auto add = [&](int i, float y) {
        nan |= isnan(y);
        b = max(b, cand_key(y, i));
        if (ch) {
            const unsigned key = ord_key(y);
            if (key == NEG_KEY) ninf++; else atomicAdd(ch + (key >> CSHIFT), 1u);
        }
    };
    scan_row(row, V, bits, [&](bool valid, int i, float y) { if (valid) add(i, y); });
    for (int h = threadIdx.x; h < nh; h += blockDim.x) add(htok[h], hy[h]);
    for (int o = 16; o > 0; o >>= 1) {
        b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
        ninf += __shfl_xor_sync(0xffffffffu, ninf, o);
    }
    if (__any_sync(0xffffffffu, nan) && (threadIdx.x & 31) == 0) s.nan = 1;
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&s.best, b);
        if (ch && ninf) atomicAdd(ch + (NEG_KEY >> CSHIFT), ninf);
    }
    __syncthreads();
}

// row_max out of line, for filter_sample on fp32 logits: inlined, its registers overflow the kernel's 64.
template <typename T>
__device__ __noinline__ void row_max_apart(const T* row, int V, const unsigned* bits, const float* hy, const int* htok,
                                           int nh, FilterSmem& s, unsigned* ch) {
    row_max(row, V, bits, hy, htok, nh, s, ch);
}

// The highest bin b where the count cumulated from the top bin reaches n: s.sel = b (CBINS if the total is below n),
// s.klo = the count of bins >= b.
__device__ void reach(const unsigned* ch, unsigned n, FilterSmem& s) {
    const int b0 = CBINS - 1 - 4 * threadIdx.x;  // this thread's 4 bins, descending
    unsigned loc = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) loc += ch[b0 - j];
    unsigned total;
    unsigned run = block_excl_scan(loc, s.cnt, total);
    if (threadIdx.x == 0) s.sel = CBINS;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned next = run + ch[b0 - j];
        if (run < n && next >= n) { s.sel = b0 - j; s.klo = next; }  // one thread, one bin
        run = next;
    }
    __syncthreads();
}

// Pass 2: the tokens (row and history) whose bin is >= blo, as (y, index) into (ly, li), s.nl of them (at most
// CAND_MAX by pass 1's counts); with sum_w, returns S, the W-mass of the row's survivors z >= c (else 0).
template <typename T>
__device__ unsigned long long gather(const T* row, int V, const unsigned* bits, const int* htok, const float* hy,
                                     int nh, unsigned blo, bool sum_w, float t, bool div, float c, float M, float* ly,
                                     int* li, FilterSmem& s) {
    if (threadIdx.x == 0) s.nl = 0;
    __syncthreads();
    const unsigned lane = threadIdx.x & 31;
    unsigned long long w = 0;
    auto add = [&](bool valid, int i, float y) {  // warp-uniform: one shared atomic per warp that has takers
        if (valid && sum_w) {
            const float z = div ? y / t : y;
            if (z >= c) w += weight(z, M);
        }
        const bool take = valid && (ord_key(y) >> CSHIFT) >= blo;
        const unsigned m = __ballot_sync(0xffffffffu, take);
        if (!m) return;
        unsigned base = 0;
        if (lane == (unsigned)(__ffs(m) - 1)) base = atomicAdd(&s.nl, (unsigned)__popc(m));
        base = __shfl_sync(0xffffffffu, base, __ffs(m) - 1) + __popc(m & ((1u << lane) - 1));
        if (take && base < CAND_MAX) { ly[base] = y; li[base] = i; }
    };
    scan_row(row, V, bits, add);
    for (int h0 = 0; h0 < nh; h0 += blockDim.x) {
        const int h = h0 + threadIdx.x;
        add(h < nh, h < nh ? htok[h] : 0, h < nh ? hy[h] : 0.f);
    }
    w = block_reduce(w, s.ms, [](unsigned long long a, unsigned long long b2) { return a + b2; });
    __syncthreads();  // every thread has read s.ms (the reduction's scratch) before a select clears it
    return w;
}

// The row's tau by the list (see above; ch: pass 1's histogram), or false where the list cannot be used: then the
// caller runs the general route. listed: every survivor z >= tau is in the list (ly, li: s.nl entries), so the
// draw may run over it alone.
template <typename T>
__device__ __noinline__ bool threshold_list(const T* row, int V, const unsigned* bits, const int* htok, const float* hy, int nh,
                               float t, unsigned k, float p, float M, const unsigned* ch, float* ly, int* li,
                               FilterSmem& s, float& tau, bool& listed) {
    const bool div = t != 1.f, pon = p < 1.f;
    bool kon = k > 0 && k < (unsigned)V;
    listed = false;
    unsigned blo = 0;
    if (kon) {
        reach(ch, k, s);
        blo = s.sel;
        kon = blo != (NEG_KEY >> CSHIFT);  // the k-th largest is -inf: top-k keeps every token
        if (kon && s.klo > CAND_MAX) return false;
    }
    if (!kon) {
        if (!pon) return true;
        reach(ch, CAND_MAX + 1, s);
        blo = s.sel == CBINS ? 0 : s.sel + 1;
    }
    // pass 2; top-k bounds the survivors to the list, so S only matters for top-p alone
    const unsigned long long S = gather(row, V, bits, htok, hy, nh, blo, !kon, t, div, tau, M, ly, li, s);
    const int n = (int)s.nl;
    const float ync = blo ? key_float((blo << CSHIFT) - 1) : NEG_INF;  // the largest y below the list
    auto outside = [&](float cc) { return blo > 0 && (div ? ync / t : ync) >= cc; };  // may it survive z >= cc?
    auto sel = [&](float cc, bool mass, unsigned kk) {
        return key_float(select_key<T, 0>(row, V, bits, li, ly, n, t, div, cc, M, mass, kk, p, s, S));
    };
    float c = tau;
    if (kon) {
        const float yk = sel(c, false, k);
        c = fmaxf(c, div ? yk / t : yk);
    }
    if (pon) {
        if (kon && outside(c)) return false;  // a division's tie below the list: S would miss it
        const float ys = sel(c, true, 0u);
        if (!kon && (double)s.tot < (double)p * (double)S) return false;  // y* may lie below the list
        c = fmaxf(c, div ? ys / t : ys);
    }
    listed = !outside(c);
    tau = c;
    return true;
}

// FP32 path: in place on the processed copy x (z values); rows with top-k and top-p both off return at once.
// Dynamic shared memory: the list (CBINS + 2 * CAND_MAX words).
template <typename F>  // F = float only (a template so CuPy looks every kernel up the same way)
__global__ void __launch_bounds__(FILTER_THREADS)
top_k_top_p(F* __restrict__ x, int V, const int* __restrict__ top_k, const float* __restrict__ top_p) {
    __shared__ FilterSmem s;
    extern __shared__ unsigned dyn[];
    const int r = blockIdx.x, k = top_k[r];
    const float p = top_p[r];
    if (!(k > 0 && k < V) && !(p < 1.f)) return;
    float* row = x + (size_t)r * V;
    unsigned* ch = dyn;
    float* ly = reinterpret_cast<float*>(ch + CBINS);
    int* li = reinterpret_cast<int*>(ly + CAND_MAX);
    row_max(row, V, nullptr, nullptr, nullptr, 0, s, ch);
    const float M = key_float((unsigned)(s.best >> 32));
    if (s.nan || !(M > NEG_INF)) return;  // a NaN row samples -1; an all -inf row has nothing to mask
    bool listed;
    float tau = NEG_INF;
    if (!threshold_list(row, V, nullptr, nullptr, nullptr, 0, 1.f, (unsigned)max(k, 0), p, M, ch, ly, li, s, tau,
                        listed))
        tau = threshold(row, V, nullptr, nullptr, nullptr, 0, 1.f, (unsigned)max(k, 0), p, NEG_INF, M, s);
    if (!(tau > NEG_INF)) return;
    // the mask pass: SCAN_LOADS 16-byte loads in flight per thread; a quad is stored only if it changed
    if (V % 4 == 0 && reinterpret_cast<size_t>(row) % 16 == 0) {
        float4* q4 = reinterpret_cast<float4*>(row);
        const int G = V / 4;
        for (int g0 = threadIdx.x; g0 < G; g0 += SCAN_LOADS * blockDim.x) {
            float4 a[SCAN_LOADS];
#pragma unroll
            for (int j = 0; j < SCAN_LOADS; j++) if (g0 + j * (int)blockDim.x < G) a[j] = q4[g0 + j * blockDim.x];
#pragma unroll
            for (int j = 0; j < SCAN_LOADS; j++) {
                const int g = g0 + j * blockDim.x;
                if (g >= G) break;
                float4 v = a[j];
                const bool ch4 = v.x < tau || v.y < tau || v.z < tau || v.w < tau;
                if (v.x < tau) v.x = NEG_INF;
                if (v.y < tau) v.y = NEG_INF;
                if (v.z < tau) v.z = NEG_INF;
                if (v.w < tau) v.w = NEG_INF;
                if (ch4) q4[g] = v;
            }
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (row[i] < tau) row[i] = NEG_INF;
    }
}

// Binary search of token t in the sorted tokens[lo, hi): its index, or -1.
__device__ __forceinline__ int find_token(const int* tokens, int lo, int end, int t) {
    int hi = end;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (tokens[mid] < t) lo = mid + 1; else hi = mid;
    }
    return lo < end && tokens[lo] == t ? lo : -1;
}

// Fast path: one block per row; rows with sample_temp >= 0 are gumbel_sample's and return at once. Dynamic shared
// memory: the history bitmap ((V + 127) / 128 16-byte words), HIST_CAP tokens and HIST_CAP values (a longer
// history: the global workspace ws_tok / ws_val), the 16-bit histogram (or the fp32 route's list), then each
// chunk of 16 tokens' largest 16-bit value.
//   1. history: every token the row's bias / penalty / ban entries name (CSR rows sorted by token), once, with its
//      adjusted value y, in the slow path's fp32 operations and order (add_entries, apply_penalties);
//   2. the max (and its lowest index: the greedy answer; NaN -> -1), then min-p's cut and the radix selects;
//   3. Gumbel-max over the survivors z >= tau: L = the max token's key bounds the winner's key from below, so a
//      token with z + G_MAX < L needs no noise; the rest get their Philox word and exact key z + g, as in
//      gumbel_sample, and the best (key, lowest index) wins.
template <typename T>
__global__ void __launch_bounds__(FILTER_THREADS)
filter_sample(const T* __restrict__ logits, int V, const float* __restrict__ temperature,
              const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
              const float* __restrict__ rep, const float* __restrict__ freq, const float* __restrict__ pres,
              const float* __restrict__ sample_temp, const unsigned* __restrict__ seeds,
              const int* __restrict__ positions, const int* __restrict__ bias_off, const int* __restrict__ bias_tok,
              const float* __restrict__ bias_val, const int* __restrict__ pen_off, const int* __restrict__ pen_tok,
              const int* __restrict__ pen_cnt, const int* __restrict__ ban_off, const int* __restrict__ ban_tok,
              const float* __restrict__ ban_val, int* __restrict__ ws_tok, float* __restrict__ ws_val,
              int* __restrict__ out) {
    __shared__ FilterSmem s;
    extern __shared__ unsigned dyn[];
    const int r = blockIdx.x;
    if (!(sample_temp[r] < 0.f)) return;
    const int words = (V + 127) / 128 * 4;  // whole 16-byte words, so the histogram after it is 16-byte aligned
    unsigned* bits = dyn;
    const int b0 = bias_off[r], b1 = bias_off[r + 1], p0 = pen_off[r], p1 = pen_off[r + 1];
    const int n0 = ban_off[r], n1 = ban_off[r + 1];
    // A history longer than shared memory holds (HIST_CAP entries) goes to the row's own stretch of the global
    // workspace (its entries of the three lists start at b0 + p0 + n0 there): read at every select level from
    // L1/L2, so that row pays for its length and no other row does.
    const int cap = max(HIST_CAP, (b1 - b0) + (p1 - p0) + (n1 - n0));
    int* const htok_smem = reinterpret_cast<int*>(dyn + words);
    float* const hy_smem = reinterpret_cast<float*>(htok_smem + HIST_CAP);
    int* htok = cap > HIST_CAP ? ws_tok + (b0 + p0 + n0) : htok_smem;
    float* hy = cap > HIST_CAP ? ws_val + (b0 + p0 + n0) : hy_smem;
    const T* row = logits + (size_t)r * V;
    const float t = temperature[r];

    // 1. history
    for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0;
    if (threadIdx.x == 0) s.nh = 0;
    __syncthreads();
    const float rp = rep[r], fq = freq[r], pr = pres[r];
    for (int e = b0 + threadIdx.x; e < b1 + (p1 - p0) + (n1 - n0); e += blockDim.x) {
        // entry e of the three lists in turn; a token is owned by the first list that names it. An entry's own
        // list needs no search (each search is ~8 dependent global loads: most of this stage's time)
        const int own = e < b1 ? 0 : e < b1 + (p1 - p0) ? 1 : 2;
        const int tk = own == 0 ? bias_tok[e] : own == 1 ? pen_tok[e - b1 + p0] : ban_tok[e - b1 - (p1 - p0) + n0];
        if ((unsigned)tk >= (unsigned)V) continue;
        const int eb = own == 0 ? e : find_token(bias_tok, b0, b1, tk);
        if (own > 0 && eb >= 0) continue;
        const int ep = own == 1 ? e - b1 + p0 : find_token(pen_tok, p0, p1, tk);
        if (own > 1 && ep >= 0) continue;
        float y = to_f32(row[tk]);
        if (eb >= 0) y += bias_val[eb];
        if (ep >= 0) {
            const int cn = pen_cnt[ep];
            if (rp != 1.f) y = y > 0.f ? y / rp : __fmul_rn(y, rp);
            y = y - __fmul_rn(fq, (float)cn);
            if (cn > 0) y = y - pr;
        }
        const int en = own == 2 ? e - b1 - (p1 - p0) + n0 : find_token(ban_tok, n0, n1, tk);
        if (en >= 0) y += ban_val[en];
        const unsigned slot = atomicAdd(&s.nh, 1u);
        if (slot < (unsigned)cap) {  // always: the row's entries number at most cap
            htok[slot] = tk;
            hy[slot] = y;
            atomicOr(bits + (tk >> 5), 1u << (tk & 31));
        }
    }
    __syncthreads();
    const int nh = min((int)s.nh, cap);

    // 2. max, cut, thresholds. 16-bit logits: one pass builds the row's histogram and finds the max (section 6b).
    unsigned* hist = reinterpret_cast<unsigned*>(hy_smem + HIST_CAP);  // 16-bit logits: 2^15 words, then the queue
    unsigned short* cmax = reinterpret_cast<unsigned short*>(hist + 0x8000);  // 16-bit: each chunk's largest
    const unsigned short* rb = reinterpret_cast<const unsigned short*>(row);
    bool h16 = false;
    unsigned kneg = 0;  // key16 of -inf (keys below it are NaNs)
    if constexpr (sizeof(T) == 2) {
        const unsigned kpos = key16_of<T>(-NEG_INF);
        kneg = key16_of<T>(NEG_INF);
        for (int w = threadIdx.x; w < 0x8000; w += blockDim.x) hist[w] = 0;
        if (threadIdx.x == 0) { s.best = 0; s.nan = 0; s.nq = 0; s.kmax = -1; }
        __syncthreads();
        // One pass: each thread takes chunks of 16 tokens (two 16-byte loads; a second chunk in flight spilled
        // registers, which tests/kernels/test_cuda_compile.py forbids), counts every
        // value in the histogram and keeps the chunk's largest raw value in cmax (the draw's bounds and the max's
        // index come from there, so no later pass reads the whole row). Keys of a word's two values at once:
        // k = u ^ 0x8000 (positive) or u ^ 0xffff (negative) in each half. -0 lands in bin 0x7fff, next to +0's: its
        // value converts to -0.f, whose 32-bit key (ord_key) is +0's, so the selects count it with +0.
        const int G = (V + 15) / 16;
        const bool vec = V % 16 == 0 && reinterpret_cast<size_t>(rb) % 16 == 0;
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            uint4 c0 = make_uint4(0u, 0u, 0u, 0u), c1 = c0;
            if (vec) {
                const uint4* p16 = reinterpret_cast<const uint4*>(rb) + 2 * g;
                c0 = p16[0];
                c1 = p16[1];
            }
            const unsigned hb = nh > 0 ? (bits[g >> 1] >> ((g & 1) * 16)) & 0xffffu : 0u;
            if (vec) {
                cmax[g] = chunk_max16<T>(c0, c1);
                const unsigned w[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    const unsigned k2 = w[q] ^ ((((w[q] & 0x80008000u) >> 15) * 0x7fffu) | 0x80008000u);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const unsigned k = h ? k2 >> 16 : k2 & 0xffffu;
                        if (!((hb >> (2 * q + h)) & 1u)) atomicAdd(hist + (k >> 1), 1u << ((k & 1u) << 4));
                    }
                }
            } else {  // the row's end, or an unaligned row: one value at a time
                int ak = -1;
                unsigned short mu = 0;
                for (int i = 16 * g; i < min(16 * g + 16, V); i++) {
                    const unsigned u = rb[i], k = key16(u);
                    if ((int)k > ak) { ak = (int)k; mu = (unsigned short)u; }
                    if (!((hb >> (i & 15)) & 1u)) atomicAdd(hist + (k >> 1), 1u << ((k & 1u) << 4));
                }
                cmax[g] = mu;
            }
        }
        __syncthreads();
        unsigned tot = 0;
        int km = -1;  // the largest key of the row (history aside)
        bool nan = false;
        for (int w = threadIdx.x; w < 0x8000; w += blockDim.x) {
            const unsigned hw = hist[w];
            if (!hw) continue;
            tot += (hw & 0xffffu) + (hw >> 16);
            km = (hw >> 16) ? (2 * w + 1 == 0x7fff ? 0x8000 : 2 * w + 1) : 2 * w;  // -0's bin is +0's key
            nan |= ((hw & 0xffffu) && (2u * w < kneg || 2u * w > kpos)) || ((hw >> 16) && (2u * w + 1 < kneg || 2u * w + 1 > kpos));
        }
        unsigned long long b = 0;
        for (int h = threadIdx.x; h < nh; h += blockDim.x) { nan |= isnan(hy[h]); b = max(b, cand_key(hy[h], htok[h])); }
        for (int o = 16; o > 0; o >>= 1) {
            b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
            tot += __shfl_xor_sync(0xffffffffu, tot, o);
            km = max(km, __shfl_xor_sync(0xffffffffu, km, o));
        }
        if (__any_sync(0xffffffffu, nan) && (threadIdx.x & 31) == 0) s.nan = 1;
        if ((threadIdx.x & 31) == 0) { atomicMax(&s.best, b); atomicAdd(&s.nq, tot); atomicMax(&s.kmax, km); }
        __syncthreads();
        h16 = s.nq == (unsigned)(V - nh);  // else a count overflowed: the general route
        // The max's lowest index: only chunks whose largest raw value reaches the max key can hold it (usually
        // one); each such chunk's first holder, merged by cand_key (the larger key is the lower index). Tracking
        // each thread's best chunk inside the pass instead cost it 5 µs (dev/profile_filter.py).
        const int kM = s.kmax;
        if (h16 && kM >= 0)
            for (int g = threadIdx.x; g < G; g += blockDim.x) {
                if ((int)key16(cmax[g]) < kM) continue;
                const unsigned hb = nh > 0 ? (bits[g >> 1] >> ((g & 1) * 16)) & 0xffffu : 0u;
                for (int i = 16 * g; i < min(16 * g + 16, V); i++)
                    if (!((hb >> (i & 15)) & 1u) && (int)key16(rb[i]) == kM) {
                        atomicMax(&s.best, cand_key(val16<T>((unsigned)kM), i));
                        break;
                    }
            }
        __syncthreads();
    }
    // fp32 logits: the fp32 route, its coarse histogram and list in the same memory (see threshold_list); a 16-bit
    // row whose histogram overflowed (65,536 equal values: a list would not hold them) takes the general route
    unsigned* ch = hist;
    float* ly = reinterpret_cast<float*>(ch + CBINS);
    int* li = reinterpret_cast<int*>(ly + CAND_MAX);
    const bool lists = sizeof(T) == 4 && t > 0.f && ((top_k[r] > 0 && top_k[r] < V) || top_p[r] < 1.f);
    if constexpr (sizeof(T) == 4) row_max_apart(row, V, bits, hy, htok, nh, s, lists ? ch : nullptr);
    else if (!h16) row_max(row, V, bits, hy, htok, nh, s);
    if (s.nan) { if (threadIdx.x == 0) out[r] = -1; return; }
    const unsigned long long mk = s.best;
    const float My = key_float((unsigned)(mk >> 32));
    const int iM = (int)~(unsigned)mk;
    const bool greedy = !(t > 0.f), div = !greedy && t != 1.f;
    if (greedy || !(My > NEG_INF)) { if (threadIdx.x == 0) out[r] = My > NEG_INF ? iM : 0; return; }
    const float M = div ? My / t : My, mp = min_p[r], p = top_p[r];
    const unsigned k = (unsigned)max(top_k[r], 0);
    float tau = mp > 0.f ? M + logf(mp) : NEG_INF;
    if constexpr (sizeof(T) == 2)
        if (h16)
            tau = threshold([&](float cc, bool mass, unsigned kk) {
                return select_key16<T>(hist, kneg, hy, nh, t, div, cc, M, mass, kk, p, s);
            }, V, t, k, p, tau);
    bool listed = false;
    if (!h16) {
        bool done = false;
        if constexpr (sizeof(T) == 4)
            done = lists && threshold_list(row, V, bits, htok, hy, nh, t, k, p, M, ch, ly, li, s, tau, listed);
        if (!done) tau = threshold(row, V, bits, htok, hy, nh, t, k, p, tau, M, s);
    }

    // 3. Gumbel-max over the survivors
    const unsigned k0 = seeds[2 * r], k1 = seeds[2 * r + 1], pos = (unsigned)positions[r];
    auto key_of = [&](int i, float z) {
        return z + gumbel(token_word(i, pos, k0, k1));
    };
    const float L = key_of(iM, M);
    auto can_win = [&](float y) {
        const float z = div ? y / t : y;
        return !(z < tau || z + G_MAX < L);
    };
    __syncthreads();  // every thread has read s.best (the max): a row without a select has had no barrier since
    if (threadIdx.x < 32) {
        // 16-bit logits: the least key that can win (can_win is monotone in the value, and false below it)
        const unsigned kmin = h16 ? lower_bound16(kneg, [&](unsigned q) { return can_win(val16<T>(q)); }) : 0u;
        if (threadIdx.x == 0) { s.best = cand_key(L, iM); s.nq = 0; s.klo = kmin; }
    }
    __syncthreads();
    unsigned long long b = 0;
    auto consider = [&](int i, float y) {
        if (!can_win(y)) return;
        const float z = div ? y / t : y;
        b = max(b, cand_key(key_of(i, z), i));
    };
    // the draw's lists: the fp32 route's list (16-bit rows: the queued groups below), then the history unless
    // the list holds it
    const int* di = li;
    const float* dv = ly;
    int dn = listed ? (int)s.nl : 0;
    if (h16) {
        // As gumbel_sample does: per chunk of 16 tokens that holds a value above the least that can win, one
        // coarse Philox call gives the top 8 bits of each token's noise word, and a group of 4 whose bytes all
        // rule out u <= exp(z - L + d) (d: every rounding, so each skip is exact) cannot win. The other groups
        // are queued (the histogram is done with: its memory holds the queue) and get their fine call and exact
        // keys spread over every thread, not divergently inside the row's loop. Under top-p 0.95 thousands of
        // tokens can win; ~1.6% of their groups are queued where most lie far below L.
        if constexpr (sizeof(T) == 2) {
            constexpr unsigned QCAP = 0x4000;  // coarse word qw and first token qi of each queued group
            unsigned* qw = hist;
            int* qi = reinterpret_cast<int*>(hist + QCAP);
            const float ymin = s.klo < 0x10000u ? val16<T>(s.klo) : -NEG_INF;  // the row holds no NaN here
            const float cL = 1e-4f + 1e-3f + 1e-5f * (fabsf(M) + 2.f * fabsf(L) + G_MAX) - L;
            auto fine = [&](unsigned cw, int i0) {  // the group's fine call, then each token's exact test and key
                const uint4 f = fine_call(i0, pos, k0, k1);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int i = i0 + j;
                    if (i >= V || (nh > 0 && ((bits[i >> 5] >> (i & 31)) & 1u))) continue;
                    const float y = to_f32(row[i]), z = div ? y / t : y;
                    if (!(z >= tau)) continue;
                    const float u = word_u(noise_word(cw, sel4(f, j), j));
                    if (u > __expf(z + cL)) continue;
                    b = max(b, cand_key(exact_key(z, u), i));
                }
            };
            for (int g = threadIdx.x; g < (V + 15) / 16; g += blockDim.x) {
                const float cm = val16<T>(key16(cmax[g]));  // the histogram pass's chunk maxima: no row read
                if (!(cm >= ymin)) continue;
                const uint4 cw4 = coarse_call(16 * g, pos, k0, k1);
                // the chunk's bound u <= exp(z + cL) <= thr, as bytes: gumbel_sample's step 3 has the derivation
                const float t1 = fminf(__expf((div ? cm / t : cm) + cL), 0.99999988f) + 1.0f;
                const unsigned n = (((__float_as_uint(t1) & 0x7fffffu) << 9) >> 24) + 1u;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const unsigned cw = sel4(cw4, j);
                    if (n <= 128u && !((cw - n * 0x01010101u) & ~cw & 0x80808080u)) continue;
                    const unsigned slot = atomicAdd(&s.nq, 1u);
                    if (slot < QCAP) { qw[slot] = cw; qi[slot] = 16 * g + 4 * j; } else fine(cw, 16 * g + 4 * j);
                }
            }
            __syncthreads();
            for (int j = threadIdx.x; j < (int)min(s.nq, QCAP); j += blockDim.x) fine(qw[j], qi[j]);
        }
    } else if (!listed) {
        // one load in flight: the draw's Philox state fills the registers (min-p alone, or the general route)
        scan_row<1>(row, V, bits, [&](bool valid, int i, float y) { if (valid) consider(i, y); });
    }
    const int nx = dn + (listed ? 0 : nh);
    for (int j = threadIdx.x; j < nx; j += blockDim.x) consider(j < dn ? di[j] : htok[j - dn], j < dn ? dv[j] : hy[j - dn]);
    for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&s.best, b);
    __syncthreads();
    if (threadIdx.x == 0) out[r] = (int)~(unsigned)s.best;
}

// ---- 7. logprobs -------------------------------------------------------------------------------------------------
// One block of 1024 threads per row of the raw logits: max M, S = sum exp(x - M), lp(id) = x[id] - M - log S;
// rank = count(x >= x[sampled]); the n largest (ties -> lower id) via select_key's count select for the n-th key,
// then the keys above it plus the lowest-id ties, sorted by thread 0.
template <typename T>
__global__ void __launch_bounds__(SEL_THREADS)
logprobs(const T* __restrict__ logits, int V, const int* __restrict__ sampled, int n, int* __restrict__ top_ids,
         float* __restrict__ top_lp, float* __restrict__ sampled_lp, int* __restrict__ sampled_rank) {
    __shared__ SelSmem s;
    __shared__ FilterSmem fs;
    __shared__ int s_ids[32];
    const int r = blockIdx.x;
    const T* row = logits + (size_t)r * V;
    float m = NEG_INF;
    for_row(row, V, [&](int, float v) { m = fmaxf(m, v); });
    const float M = block_reduce(m, s.f32, [](float a, float b) { return fmaxf(a, b); });
    const int sid = sampled[r];
    const float xs = (unsigned)sid < (unsigned)V ? to_f32(row[sid]) : __int_as_float(0x7fc00000);
    float sum = 0.f;
    unsigned ge = 0;
    for_row(row, V, [&](int, float v) { sum += expf(v - M); ge += v >= xs; });
    const float S = block_reduce(sum, s.f32, [](float a, float b) { return a + b; });
    const unsigned rank = block_reduce(ge, s.u32, [](unsigned a, unsigned b) { return a + b; });
    const float logS = logf(S);
    if (threadIdx.x == 0) { sampled_lp[r] = xs - M - logS; sampled_rank[r] = (int)rank; }
    if (n <= 0) return;
    const int nn = min(n, V);
    // the nn-th largest key: the threshold rule's count select (section 6), its one radix select
    const unsigned kth = select_key(row, V, nullptr, nullptr, nullptr, 0, 1.f, false, NEG_INF, M, false, (unsigned)nn,
                                    1.f, fs);
    // Keys above kth (fewer than nn) in any order, then ties in index order until nn are held.
    if (threadIdx.x == 0) s.aux = 0;
    __syncthreads();
    for_row(row, V, [&](int i, float v) {
        if (ord_key(v) > kth) { const unsigned slot = atomicAdd(&s.aux, 1u); s.cand[slot] = i; }
    });
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < V && (int)s.aux < nn; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const bool tie = i < V && ord_key(to_f32(row[i])) == kth;
        const unsigned bal = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) s_ids[warp] = __popc(bal);
        __syncthreads();
        int before = s.aux;
        for (int w = 0; w < warp; w++) before += s_ids[w];
        before += __popc(bal & ((1u << lane) - 1));
        __syncthreads();
        if (tie && before < nn) s.cand[before] = i;
        if (threadIdx.x == 0) {
            int tot = 0;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) tot += s_ids[w];
            s.aux = min(s.aux + tot, (unsigned)nn);
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    // Insertion sort of the nn ids by (value desc, id asc).
    for (int a = 1; a < nn; a++) {
        const int id = s.cand[a];
        const unsigned kk = ord_key(to_f32(row[id]));
        int b = a - 1;
        while (b >= 0) {
            const int ob = s.cand[b];
            const unsigned ok = ord_key(to_f32(row[ob]));
            if (ok > kk || (ok == kk && ob < id)) break;
            s.cand[b + 1] = ob;
            b--;
        }
        s.cand[b + 1] = id;
    }
    for (int j = 0; j < n; j++) {
        const bool ok = j < nn;
        const int id = ok ? (int)s.cand[j] : -1;
        top_ids[(size_t)r * n + j] = id;
        top_lp[(size_t)r * n + j] = ok ? to_f32(row[id]) - M - logS : NEG_INF;
    }
}
