"""The sampler's ops, CPU twin of sampler.cu: same semantics, same Philox stream. These functions are also the
reference the tests (and toolkit.sampling.filtered_probs) use.

    logits [R, V] fp32 -> to_fp32 (a copy) -> add_entries (bias) -> apply_penalties -> add_entries (bans)
        -> temperature_min_p -> top_k_top_p -> gumbel_sample -> out int32[R]
    raw logits -> logprobs -> top ids / logprobs, the sampled token's logprob and rank

Gumbel noise for token v of a request at position pos: Philox4x32-10 with key (seed_lo, seed_hi). Token v's 32-bit
word is (b << 24) | (f >> 8), b = byte v & 3 of word (v >> 2) & 3 of the coarse call (counter (v >> 4, pos, 1, 0):
16 tokens' top bytes), f = word v & 3 of the fine call (counter (v >> 2, pos, 0, 0)); the kernel rules most tokens
out from the coarse byte alone. u = ((word >> 9) + 0.5) * 2^-23 (exact in fp32, in [2^-24, 1 - 2^-24]);
g = -log(-log1p(-u)) in fp32. The sampled token is argmax_v(x_v / T + g_v) (T = 0: argmax x_v, no noise); a row
with a NaN gives -1. Noise is only computed where it can matter: g lies in [-2.82, 16.64] and g <= -log(u), so
once a real key B is known, a token with x/T + G_MAX < B needs no Philox call and one with u > exp(x/T - B + d)
no logarithms (d covers the rounding, so both skips are exact).

top_k_top_p: top-k keeps every value >= the k-th largest (ties kept); top-p then keeps token v of the survivors
iff the softmax mass of the survivors strictly greater than x_v is < top_p (boundary token and its ties kept, the
max always). Partition-based: no full sort of the vocabulary (top-p sorts only a top set whose mass reaches p).
"""
import numpy as np
from numba import njit, prange

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
G_MAX, G_MIN = np.float32(17.0), np.float32(-3.0)  # bounds of every computed Gumbel noise value
_U32 = np.uint64(0xFFFFFFFF)
_INV23 = np.float32(2.0 ** -23)
NEG_INF = np.float32(-np.inf)


# ---- Philox and the Gumbel noise ---------------------------------------------------------------------------
def philox4x32_10(counter, key) -> np.ndarray:
    """Vectorised Philox4x32-10: counter uint32[..., 4], key uint32[..., 2] (broadcast) -> uint32[..., 4]."""
    c = [np.asarray(counter, np.uint64)[..., i] for i in range(4)]
    k0, k1 = (np.asarray(key, np.uint64)[..., i] for i in range(2))
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
        k0, k1 = (k0 + np.uint64(W0)) & _U32, (k1 + np.uint64(W1)) & _U32
    return np.stack(np.broadcast_arrays(*c), axis=-1).astype(np.uint32)


def uniform_from_word(w) -> np.ndarray:
    return ((np.asarray(w, np.uint32) >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * _INV23


def noise_words(seed: int, pos: int, tokens) -> np.ndarray:
    """uint32 Philox word of each token id (vectorised NumPy): coarse byte on top of the fine word (see the top)."""
    v = np.asarray(tokens, np.int64)
    key = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], np.uint64)

    def word(counter0, counter2, q):
        ctr = np.zeros(v.shape + (4,), np.uint64)
        ctr[..., 0], ctr[..., 1], ctr[..., 2] = counter0, np.uint32(pos & 0xFFFFFFFF), counter2
        return np.take_along_axis(philox4x32_10(ctr, key), q[..., None], axis=-1)[..., 0].astype(np.uint64)
    coarse, fine = word(v >> 4, 1, (v >> 2) & 3), word(v >> 2, 0, v & 3)
    byte = (coarse >> (np.uint64(8) * (v & 3).astype(np.uint64))) & np.uint64(0xFF)
    return ((byte << np.uint64(24)) | (fine >> np.uint64(8))).astype(np.uint32)


def gumbel_noise(seed: int, pos: int, tokens) -> np.ndarray:
    """float32 noise g(seed, pos, v) for the given token ids (vectorised NumPy; the reference for the kernel)."""
    return gumbel_from_uniform(uniform_from_word(noise_words(seed, pos, tokens)))


def gumbel_from_uniform(u) -> np.ndarray:
    """g = -log(-log1p(-u)), each step rounded to fp32 (as logf / log1pf do on the GPU, up to their last ulp)."""
    t = (-np.log1p(-np.asarray(u, np.float64))).astype(np.float32)
    return (-np.log(t.astype(np.float64))).astype(np.float32)


@njit(cache=True, nogil=True)
def _philox(c0, c1, c2, k0, k1):
    """Scalar Philox4x32-10 with counter (c0, c1, c2, 0); everything in uint64 lanes masked to 32 bits."""
    m0, m1, w0, w1, mask, s = np.uint64(M0), np.uint64(M1), np.uint64(W0), np.uint64(W1), np.uint64(0xFFFFFFFF), \
        np.uint64(32)
    c3 = np.uint64(0)
    for _ in range(10):
        p0 = m0 * c0
        p1 = m1 * c2
        c0, c1, c2, c3 = ((p1 >> s) ^ c1 ^ k0), p1 & mask, ((p0 >> s) ^ c3 ^ k1), p0 & mask
        k0 = (k0 + w0) & mask
        k1 = (k1 + w1) & mask
    return c0, c1, c2, c3


@njit(cache=True, nogil=True)
def _gumbel(word):
    u = (np.float32(word >> np.uint64(9)) + np.float32(0.5)) * np.float32(2.0 ** -23)
    t = np.float32(-np.log1p(-np.float64(u)))
    return np.float32(-np.log(np.float64(t)))


@njit(cache=True, nogil=True)
def _pick(w0, w1, w2, w3, q):
    return w0 if q == 0 else w1 if q == 1 else w2 if q == 2 else w3


@njit(cache=True, nogil=True)
def _word(coarse, fine, i):
    """Token i's word from its coarse word (word (i >> 2) & 3 of the coarse call) and its fine word."""
    byte = (coarse >> np.uint64(8 * (i & 3))) & np.uint64(0xFF)
    return (byte << np.uint64(24)) | (fine >> np.uint64(8))


@njit(cache=True, nogil=True)
def _noise(i, pos, k0, k1):
    c0, c1, c2, c3 = _philox(np.uint64(i >> 4), pos, np.uint64(1), k0, k1)
    f0, f1, f2, f3 = _philox(np.uint64(i >> 2), pos, np.uint64(0), k0, k1)
    return _word(_pick(c0, c1, c2, c3, (i >> 2) & 3), _pick(f0, f1, f2, f3, i & 3), i)


# log(b / 256) less a margin of 1e-9, for each top byte b of a word: a token's u is >= b / 256, so a log bound
# below this entry means u exceeds the bound (exactly: the margin covers the rounding of log).
_LOG_BYTE = np.concatenate([[-np.inf], np.log(np.arange(1, 256) / 256.0) - 1e-9])


@njit(cache=True, nogil=True)
def _sample_row(x, t, k0, k1, pos):
    """One row of gumbel_sample: see the module docstring. x float32[V]."""
    V = x.shape[0]
    greedy = not (t > np.float32(0.0))
    div = (not greedy) and t != np.float32(1.0)
    m = np.float32(-np.inf)
    bi = 0
    for i in range(V):
        a = x[i] / t if div else x[i]
        if a != a:
            return -1
        if a > m:
            m = a
            bi = i
    if greedy:
        return bi
    # The key of the largest x/T is a real key: the winner's key is >= it, so a token needs no Philox call if
    # x/T + G_MAX is below the best key so far, and no logarithms if u > exp(x/T - best + d) (g <= -log u; d covers
    # the rounding), exactly as in the kernel. Both skips only drop tokens whose key is surely below the best.
    best = m + _gumbel(_noise(bi, pos, k0, k1))
    last_c = last_f = -1
    c0 = c1 = c2 = c3 = f0 = f1 = f2 = f3 = np.uint64(0)
    for i in range(V):
        a = x[i] / t if div else x[i]
        if a + np.float32(17.0) < best:
            continue
        if i >> 4 != last_c:
            c0, c1, c2, c3 = _philox(np.uint64(i >> 4), pos, np.uint64(1), k0, k1)
            last_c = i >> 4
        cw = _pick(c0, c1, c2, c3, (i >> 2) & 3)
        af, bf = np.float64(a), np.float64(best)
        lthr = af - bf + 1e-3 + 1e-5 * (abs(af) + abs(bf))  # log of the bound on u
        if lthr < _LOG_BYTE[(cw >> np.uint64(8 * (i & 3))) & np.uint64(0xFF)]:
            continue  # u >= (top byte) / 256 > the bound: no fine call (as the kernel's coarse test)
        if i >> 2 != last_f:
            f0, f1, f2, f3 = _philox(np.uint64(i >> 2), pos, np.uint64(0), k0, k1)
            last_f = i >> 2
        w = _word(cw, _pick(f0, f1, f2, f3, i & 3), i)
        u = (np.float64(w >> np.uint64(9)) + 0.5) * 2.0 ** -23
        if u > np.exp(lthr):
            continue
        key = a + _gumbel(w)
        if key > best or (key == best and i < bi):
            best = key
            bi = i
    return bi


@njit(cache=True, nogil=True, parallel=True)
def _sample_rows(logits, temperature, seeds, positions, out):
    for r in prange(logits.shape[0]):
        out[r] = _sample_row(logits[r], temperature[r], np.uint64(seeds[r, 0]), np.uint64(seeds[r, 1]),
                             np.uint64(np.uint32(positions[r])))


# ---- the ops ----------------------------------------------------------------------------------------------------
def gumbel_sample(logits, temperature, seeds, positions, out):
    """out int32[R] = argmax_v(x_v / T + g(seed, pos, v)) per row (T == 0: plain argmax); -1 for a NaN row.
    logits float32[R, V], temperature f32[R], seeds uint32[R, 2] (lo, hi), positions int32[R]."""
    _sample_rows(np.ascontiguousarray(logits, np.float32), np.asarray(temperature, np.float32),
                 np.asarray(seeds, np.uint32), np.asarray(positions, np.int32), out)


def to_fp32(logits, out):
    out[...] = logits


def _csr_rows(offsets):
    off = np.asarray(offsets, np.int64)
    n = int(off[-1]) - int(off[0])
    return np.repeat(np.arange(off.size - 1), np.diff(off)), slice(int(off[0]), int(off[0]) + n)


def add_entries(x, offsets, tokens, values):
    """x[r, tokens[e]] += values[e] for e in offsets[r] .. offsets[r+1]-1 (tokens unique within a row; ids outside
    [0, V) are skipped, as on the GPU)."""
    rows, sl = _csr_rows(offsets)
    tok = np.asarray(tokens[sl], np.int64)
    ok = (tok >= 0) & (tok < x.shape[1])
    x[rows[ok], tok[ok]] += np.asarray(values[sl], np.float32)[ok]


def apply_penalties(x, offsets, tokens, counts, rep, freq, pres):
    """Per CSR entry (token, output count) of row r, in vLLM's order: repetition (x > 0 ? x / rep : x * rep, when
    rep != 1), then x -= freq * count, then x -= pres * (count > 0). fp32 arithmetic throughout."""
    rows, sl = _csr_rows(offsets)
    tok = np.asarray(tokens[sl], np.int64)
    ok = (tok >= 0) & (tok < x.shape[1])
    rows, tok, cnt = rows[ok], tok[ok], np.asarray(counts[sl], np.int32)[ok]
    rp, f, p = (np.asarray(a, np.float32)[rows] for a in (rep, freq, pres))
    v = x[rows, tok]
    v = np.where(rp != 1, np.where(v > 0, v / rp, v * rp), v)
    v = v - f * cnt.astype(np.float32)
    v = np.where(cnt > 0, v - p, v)
    x[rows, tok] = v


def temperature_min_p(x, temperature, min_p):
    """Rows with T not in {0, 1}: x /= T; then rows with min_p > 0 (T != 0): x < max + log(min_p) -> -inf."""
    for r in range(x.shape[0]):
        t, mp = np.float32(temperature[r]), np.float32(min_p[r])
        if t == 0:
            continue
        if t != 1:
            np.divide(x[r], t, out=x[r])
        if mp > 0:
            thr = np.fmax.reduce(x[r]) + np.log(mp)  # fmax skips NaN, as fmaxf does
            x[r][x[r] < thr] = NEG_INF


def _top_p_threshold(row, keep, M, p):
    """The value tau: survivors (row[keep]) >= tau are the smallest top set whose mass reaches p (see top)."""
    vals = row[keep] if keep is not None else row
    w = np.where(vals == M, np.float32(1), np.exp(vals - M))  # M may be +inf
    target = p * w.sum(dtype=np.float64)
    m = min(vals.size, 256)
    while True:  # the top m values by partition, doubled until their mass reaches the target
        top = vals if m >= vals.size else vals[np.argpartition(vals, vals.size - m)[vals.size - m:]]
        top = np.sort(top)[::-1]
        wt = np.where(top == M, np.float32(1), np.exp(top - M))
        cum = np.cumsum(wt, dtype=np.float64)
        if cum[-1] >= target or m >= vals.size:
            i = int(np.searchsorted(cum, target))  # first index whose inclusive mass reaches the target
            return top[min(i, top.size - 1)]
        m *= 4


def top_k_top_p(x, top_k, top_p):
    """In place on fp32 x [R, V]: top_k int32[R] (<= 0 or >= V: off), top_p f32[R] (1: off); see the docstring."""
    V = x.shape[1]
    for r in range(x.shape[0]):
        k, p = int(top_k[r]), np.float32(top_p[r])
        kon, pon = 0 < k < V, p < 1
        if not (kon or pon):
            continue
        row = x[r]
        M = row.max()
        if not M > NEG_INF:  # all -inf (nothing to mask) or a NaN row (sampling reports it)
            continue
        thr = NEG_INF
        if kon:
            thr = np.partition(row, V - k)[V - k]
        if pon:
            thr = max(thr, _top_p_threshold(row, row >= thr if kon else None, M, p))
        row[row < thr] = NEG_INF


def logprobs(logits, sampled, n, top_ids, top_lp, sampled_lp, sampled_rank):
    """From raw logits [R, V]: top_ids int32[R, n] (largest first, ties -> lower id), top_lp f32[R, n],
    sampled_lp f32[R] = log-softmax at sampled[r], sampled_rank int32[R] = count(x >= x[sampled]). Rows with
    sampled < 0 get NaN / 0 for the sampled token."""
    x = np.asarray(logits, np.float32)
    R, V = x.shape
    for r in range(R):
        row = x[r]
        M = np.fmax.reduce(row)
        logS = np.float32(np.log(np.exp(row - M).sum(dtype=np.float64)))
        s = int(sampled[r])
        xs = row[s] if 0 <= s < V else np.float32(np.nan)
        sampled_lp[r] = xs - M - logS
        sampled_rank[r] = int(np.count_nonzero(row >= xs))
        if n <= 0:
            continue
        nn = min(n, V)
        kth = np.partition(row, V - nn)[V - nn]
        cand = np.flatnonzero(row >= kth)
        top = cand[np.lexsort((cand, -row[cand]))[:nn]]
        top_ids[r, :nn] = top
        top_lp[r, :nn] = row[top] - M - logS
        top_ids[r, nn:], top_lp[r, nn:] = -1, NEG_INF


def softmax_rows(x) -> np.ndarray:
    """float64 softmax of each row of x [R, V] (-inf -> probability 0)."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
