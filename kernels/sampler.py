"""The sampler's ops, CPU twin of sampler.cu: same semantics, same Philox stream, the same threshold rule.

    slow path: logits [R, V] -> to_fp32 (a copy) -> add_entries (bias) -> apply_penalties -> add_entries (bans)
        -> temperature_min_p -> top_k_top_p -> gumbel_sample -> out int32[R]
    fast path: logits [R, V] -> filter_sample (rows with sample_temp < 0; history, thresholds and Gumbel-max read
        the logits in place) + gumbel_sample (the other rows) -> out int32[R]
    raw logits -> logprobs -> top ids / logprobs, the sampled token's logprob and rank

Gumbel noise for token v of a request at position pos: Philox4x32-10 with key (seed_lo, seed_hi). Token v's 32-bit
word is (b << 24) | (f >> 8), b = byte v & 3 of word (v >> 2) & 3 of the coarse call (counter (v >> 4, pos, 1, 0):
16 tokens' top bytes), f = word v & 3 of the fine call (counter (v >> 2, pos, 0, 0)); the kernel rules most tokens
out from the coarse byte alone. u = ((word >> 9) + 0.5) * 2^-23 (exact in fp32, in [2^-24, 1 - 2^-24]);
g = -log(-log1p(-u)) in fp32. The sampled token is argmax_v(x_v / T + g_v) (T = 0: argmax x_v, no noise); a row
with a NaN gives -1. Noise is only computed where it can matter: g lies in [-2.82, 16.64] and g <= -log(u), so
once a real key B is known, a token with x/T + G_MAX < B needs no Philox call and one with u > exp(x/T - B + d)
no logarithms (d covers the rounding, so both skips are exact).

THE RULE (both paths, CPU and GPU; the fast path and the FP32 path give the same token for the same seed):
  y_v    the adjusted logit: the raw logit, or for a "history" token (one a row's logit bias, penalties or bans
         name) x + bias, then the penalties, then + -inf for a ban, in fp32, in that order. The fast path keeps the
         history as a short per-row list of (token, y) and reads every other token's logit in place.
  z_v    y_v / T in fp32 (T not in {0, 1}; else y_v). M = max z. A row holding a NaN samples -1, unfiltered.
  min-p  keep z >= M + logf(min_p).
  top-k  keep z >= the k-th largest z (ties kept).
  top-p  over the survivors of min-p and top-k, weights W_v = fixed(z_v) = 2^32 if z_v == M, 0 if z_v - M < -25
         (exp(-25) * 2^32 < 1/2), else rint(expf(z_v - M) * 2^32), an integer: sums are exact and independent of
         their order (histogram bins, parallel reductions). S = sum of W over the survivors. Keep v iff
         A_v = sum of W_u over survivors with z_u > z_v satisfies double(A_v) < double(top_p) * double(S). So the
         max is always kept and ties at the boundary are kept together.
  sample Gumbel-max over the kept tokens (the others are -inf), ties to the lowest index.
Every filter keeps an upper set {z >= tau}. The FP32 path finds tau on z; the fast path on the 32-bit order keys of
y (radix select, 8-bit digits, counts for top-k, W for top-p), then tau = y*/T: z = y/T is monotone, so the k-th
largest z is the k-th largest y divided by T, and the smallest kept z for top-p is y*/T, y* the smallest survivor
y with mass strictly above it (in y) < top_p * S (a z-tie of distinct y's is kept or dropped whole either way).
"""
import functools

import numpy as np
from numba import njit, prange

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
G_MAX, G_MIN = np.float32(17.0), np.float32(-3.0)  # bounds of every computed Gumbel noise value
NEG_INF = np.float32(-np.inf)
W_ONE = 2.0 ** 32  # the fixed-point weight of the max (top-p masses)
W_FLOOR = np.float32(-25.0)  # z - M below this has weight 0 (exactly: rint(exp(-25) * 2^32) = 0)
HIST_CAP = 2048  # history entries sampler.cu keeps in shared memory (a longer history: its global workspace)
VOCAB_CAP = 1 << 18  # vocabulary the fast path's history bitmap covers (sampler.cu, shared memory)


# ---- Philox and the Gumbel noise ---------------------------------------------------------------------------
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
def _word(coarse, fine, i):
    """Token i's word from its coarse word (word (i >> 2) & 3 of the coarse call) and its fine word."""
    byte = (coarse >> np.uint64(8 * (i & 3))) & np.uint64(0xFF)
    return (byte << np.uint64(24)) | (fine >> np.uint64(8))


@njit(cache=True, nogil=True)
def _noise(i, pos, k0, k1):
    return _word(_philox(np.uint64(i >> 4), pos, np.uint64(1), k0, k1)[(i >> 2) & 3],
                 _philox(np.uint64(i >> 2), pos, np.uint64(0), k0, k1)[i & 3], i)


# log(b / 256) less a margin of 1e-9, for each top byte b of a word: a token's u is >= b / 256, so a log bound
# below this entry means u exceeds the bound (exactly: the margin covers the rounding of log).
_LOG_BYTE = np.concatenate([[-np.inf], np.log(np.arange(1, 256) / 256.0) - 1e-9])
_NO_TOK, _NO_VAL = np.zeros(0, np.int64), np.zeros(0, np.float32)  # an empty history (the FP32 path's rows)


@njit(cache=True, nogil=True)
def _sample_row(x, ht, hy, t, tau, k0, k1, pos):
    """One row: argmax_v(z_v + g_v) over z_v >= tau (see the top); z from x, or from hy for the sorted history
    tokens ht. x float32[V]. The FP32 path passes an empty history and tau = -inf."""
    V, nh = x.shape[0], ht.shape[0]
    greedy = not (t > np.float32(0.0))
    div = (not greedy) and t != np.float32(1.0)
    m = np.float32(-np.inf)
    bi = 0
    j = 0
    for i in range(V):
        a = x[i]
        if j < nh and ht[j] == i:
            a = hy[j]
            j += 1
        if div:
            a = a / t
        if a != a:
            return -1
        if a < tau:
            a = NEG_INF
        if a > m:
            m = a
            bi = i
    if greedy:
        return bi
    # The key of the largest z is a real key: the winner's key is >= it, so a token needs no Philox call if
    # z + G_MAX is below the best key so far, and no logarithms if u > exp(z - best + d) (g <= -log u; d covers
    # the rounding), exactly as in the kernel. Both skips only drop tokens whose key is surely below the best.
    best = m + _gumbel(_noise(bi, pos, k0, k1))
    last_c = last_f = -1
    zero = np.uint64(0)
    c = f = (zero, zero, zero, zero)
    j = 0
    for i in range(V):
        a = x[i]
        if j < nh and ht[j] == i:
            a = hy[j]
            j += 1
        if div:
            a = a / t
        if a < tau:
            a = NEG_INF
        if a + np.float32(17.0) < best:
            continue
        if i >> 4 != last_c:
            c = _philox(np.uint64(i >> 4), pos, np.uint64(1), k0, k1)
            last_c = i >> 4
        cw = c[(i >> 2) & 3]
        af, bf = np.float64(a), np.float64(best)
        lthr = af - bf + 1e-3 + 1e-5 * (abs(af) + abs(bf))  # log of the bound on u
        if lthr < _LOG_BYTE[(cw >> np.uint64(8 * (i & 3))) & np.uint64(0xFF)]:
            continue  # u >= (top byte) / 256 > the bound: no fine call (as the kernel's coarse test)
        if i >> 2 != last_f:
            f = _philox(np.uint64(i >> 2), pos, np.uint64(0), k0, k1)
            last_f = i >> 2
        w = _word(cw, f[i & 3], i)
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
        if temperature[r] < 0:  # a fast-path row with processing: filter_sample's
            continue
        out[r] = _sample_row(logits[r], _NO_TOK, _NO_VAL, temperature[r], NEG_INF, np.uint64(seeds[r, 0]),
                             np.uint64(seeds[r, 1]), np.uint64(np.uint32(positions[r])))


# ---- the threshold rule (see the top) ---------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _okey(u):
    """Order-preserving key (int64 in [0, 2^32)) of float32 bits u; -0 folded onto +0 (as sampler.cu's ord_key)."""
    u = np.int64(u)
    if u == 0x80000000:
        u = 0
    return (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000


@njit(cache=True, nogil=True)
def _key_float(k):
    bits = k & 0x7FFFFFFF if k & 0x80000000 else (~k) & 0xFFFFFFFF
    return np.array([bits], np.uint32).view(np.float32)[0]


@njit(cache=True, nogil=True)
def _weight(z, M):
    """The fixed-point top-p weight of z, given the row's max M (see the top)."""
    if z == M:
        return np.int64(4294967296)
    d = z - M
    if not d >= W_FLOOR:
        return np.int64(0)
    return np.int64(np.rint(np.float64(np.float32(np.exp(d))) * W_ONE))


@njit(cache=True, nogil=True)
def _minp_cut(M, mp):
    return M + np.float32(np.log(mp))


@njit(cache=True, nogil=True)
def _select(x, ht, hy, t, div, c, M, k, p, mass):
    """Radix select over the order keys of y (x, or hy at the history tokens ht), 8-bit digits from the top:
    mass False: the k-th largest y (counts over every token); True: y*, the smallest y among the survivors
    (z >= c) whose W-mass strictly above it is < p * S. Returns that y."""
    V, nh = x.shape[0], ht.shape[0]
    xu, hu = x.view(np.uint32), hy.view(np.uint32)
    prefix = pmask = above = 0
    target = 0.0
    for level in range(4):
        shift = 24 - 8 * level
        cnt = np.zeros(256, np.int64)
        ms = np.zeros(256, np.int64)
        j = 0
        for i in range(V):
            y, u = x[i], xu[i]
            if j < nh and ht[j] == i:
                y, u = hy[j], hu[j]
                j += 1
            key = _okey(u)
            if key & pmask != prefix:
                continue
            d = (key >> shift) & 255
            if mass:
                z = y / t if div else y
                if not z >= c:
                    continue
                ms[d] += _weight(z, M)
            cnt[d] += 1
        if mass and level == 0:
            target = np.float64(p) * np.float64(ms.sum())
        sel, sel_above = 0, above
        for d in range(255, -1, -1):
            if mass:  # the lowest non-empty digit whose mass above stays under the target
                if cnt[d] == 0:
                    continue
                if not np.float64(above) < target:
                    break
                sel, sel_above = d, above
                above += ms[d]
            else:  # the digit where the count from the top reaches k
                if above + cnt[d] >= k:
                    sel, sel_above = d, above
                    break
                above += cnt[d]
        above = sel_above
        prefix |= sel << shift
        pmask |= 255 << shift
    return _key_float(prefix)


@njit(cache=True, nogil=True)
def _threshold(x, ht, hy, t, k, p, mp):
    """tau: the row keeps z >= tau (-inf: no filter, a greedy or NaN row, or one of only -inf)."""
    V = x.shape[0]
    kon, pon, mon = 0 < k < V, p < np.float32(1.0), mp > np.float32(0.0)
    if not (t > np.float32(0.0)) or not (kon or pon or mon):
        return NEG_INF
    div = t != np.float32(1.0)
    My = NEG_INF
    j, nh = 0, ht.shape[0]
    for i in range(V):
        y = x[i]
        if j < nh and ht[j] == i:
            y = hy[j]
            j += 1
        if y != y:
            return NEG_INF
        My = max(My, y)
    M = My / t if div else My
    if not M > NEG_INF:
        return NEG_INF
    c = _minp_cut(M, mp) if mon else NEG_INF
    if kon:
        yk = _select(x, ht, hy, t, div, c, M, k, p, False)
        c = max(c, yk / t if div else yk)
    if pon:
        ys = _select(x, ht, hy, t, div, c, M, k, p, True)
        c = max(c, ys / t if div else ys)
    return c


@njit(cache=True, nogil=True)
def _history(x, r, boff, btok, bval, poff, ptok, pcnt, noff, ntok, nval, rp, f, pp):
    """Row r's history: the tokens its bias, penalty and ban entries name, sorted, once each (a merge of the three
    sorted CSR rows), and their adjusted values y, in the slow path's order and fp32 arithmetic (add_entries,
    apply_penalties)."""
    V = x.shape[0]
    ib, ie, ip, pe, jn, ne = boff[r], boff[r + 1], poff[r], poff[r + 1], noff[r], noff[r + 1]
    ht = np.empty(ie - ib + pe - ip + ne - jn, np.int64)
    hy = np.empty(ht.shape[0], np.float32)
    n = 0
    while ib < ie or ip < pe or jn < ne:
        big = V + 1  # past every list's end
        tok = min(btok[ib] if ib < ie else big, ptok[ip] if ip < pe else big, ntok[jn] if jn < ne else big)
        y = x[tok] if 0 <= tok < V else np.float32(0.0)
        if ib < ie and btok[ib] == tok:
            y = y + bval[ib]
            ib += 1
        if ip < pe and ptok[ip] == tok:
            cnt = pcnt[ip]
            if rp != np.float32(1.0):
                y = y / rp if y > np.float32(0.0) else y * rp
            y = y - f * np.float32(cnt)
            if cnt > 0:
                y = y - pp
            ip += 1
        if jn < ne and ntok[jn] == tok:
            y = y + nval[jn]
            jn += 1
        if 0 <= tok < V:  # ids outside the vocabulary are skipped, as on the slow path
            ht[n] = tok
            hy[n] = y
            n += 1
    return ht[:n], hy[:n]


@njit(cache=True, nogil=True, parallel=True)
def _filter_rows(x, temperature, top_k, top_p, min_p, rep, freq, pres, sample_temp, seeds, positions, boff, btok,
                 bval, poff, ptok, pcnt, noff, ntok, nval, out):
    for r in prange(x.shape[0]):
        if sample_temp[r] >= 0:  # a row without processing: gumbel_sample's
            continue
        ht, hy = _history(x[r], r, boff, btok, bval, poff, ptok, pcnt, noff, ntok, nval, rep[r], freq[r], pres[r])
        t = temperature[r]
        tau = _threshold(x[r], ht, hy, t, top_k[r], top_p[r], min_p[r])
        out[r] = _sample_row(x[r], ht, hy, t, tau, np.uint64(seeds[r, 0]), np.uint64(seeds[r, 1]),
                             np.uint64(np.uint32(positions[r])))


@njit(cache=True, nogil=True, parallel=True)
def _temperature_min_p(x, temperature, min_p):
    for r in prange(x.shape[0]):
        t, mp = temperature[r], min_p[r]
        if t == 0:
            continue
        row = x[r]
        M = NEG_INF
        for i in range(row.shape[0]):
            if t != 1:
                row[i] = row[i] / t
            if row[i] > M:  # NaN skipped, as fmaxf does
                M = row[i]
        if mp > 0:
            cut = _minp_cut(M, mp)
            for i in range(row.shape[0]):
                if row[i] < cut:
                    row[i] = NEG_INF


@njit(cache=True, nogil=True, parallel=True)
def _top_k_top_p(x, top_k, top_p):
    for r in prange(x.shape[0]):
        tau = _threshold(x[r], _NO_TOK, _NO_VAL, np.float32(1.0), top_k[r], top_p[r], np.float32(0.0))
        if tau > NEG_INF:
            row = x[r]
            for i in range(row.shape[0]):
                if row[i] < tau:
                    row[i] = NEG_INF


# ---- the ops ----------------------------------------------------------------------------------------------------
_f32 = functools.partial(np.ascontiguousarray, dtype=np.float32)
_i32 = functools.partial(np.ascontiguousarray, dtype=np.int32)


def gumbel_sample(logits, temperature, seeds, positions, out):
    """out int32[R] = argmax_v(x_v / T + g(seed, pos, v)) per row (T == 0: plain argmax); -1 for a NaN row; rows
    with T < 0 are left to filter_sample. logits float32[R, V], temperature f32[R], seeds uint32[R, 2] (lo, hi),
    positions int32[R]."""
    _sample_rows(_f32(logits), _f32(temperature), np.asarray(seeds, np.uint32), _i32(positions), out)


def filter_sample(logits, temperature, top_k, top_p, min_p, rep, freq, pres, sample_temp, seeds, positions,
                  bias_off, bias_tok, bias_val, pen_off, pen_tok, pen_cnt, ban_off, ban_tok, ban_val, ws_tok, ws_val,
                  out):
    """The fast path's processing rows (sample_temp < 0): out[r] from the logits as they are (see the top); each
    CSR row's tokens sorted. ws_tok / ws_val: sampler.cu's workspace for long histories (unused here)."""
    _filter_rows(_f32(logits), _f32(temperature), _i32(top_k), _f32(top_p), _f32(min_p), _f32(rep), _f32(freq),
                 _f32(pres), _f32(sample_temp), np.asarray(seeds, np.uint32), _i32(positions), _i32(bias_off),
                 _i32(bias_tok), _f32(bias_val), _i32(pen_off), _i32(pen_tok), _i32(pen_cnt), _i32(ban_off),
                 _i32(ban_tok), _f32(ban_val), out)


def to_fp32(logits, out):
    out[...] = logits


def _csr_entries(x, offsets, tokens):
    """(row, token, entry index) of each CSR entry whose token is in [0, V): ids outside are skipped, as on the GPU."""
    off = np.asarray(offsets, np.int64)
    rows = np.repeat(np.arange(off.size - 1), np.diff(off))
    e = np.arange(off[0], off[-1])
    tok = np.asarray(tokens[e], np.int64)
    ok = (tok >= 0) & (tok < x.shape[1])
    return rows[ok], tok[ok], e[ok]


def add_entries(x, offsets, tokens, values):
    """x[r, tokens[e]] += values[e] for e in offsets[r] .. offsets[r+1]-1 (tokens unique within a row)."""
    rows, tok, e = _csr_entries(x, offsets, tokens)
    x[rows, tok] += np.asarray(values, np.float32)[e]


def apply_penalties(x, offsets, tokens, counts, rep, freq, pres):
    """Per CSR entry (token, output count) of row r, in vLLM's order: repetition (x > 0 ? x / rep : x * rep, when
    rep != 1), then x -= freq * count, then x -= pres * (count > 0). fp32 arithmetic throughout."""
    rows, tok, e = _csr_entries(x, offsets, tokens)
    cnt = np.asarray(counts, np.int32)[e]
    rp, f, p = (np.asarray(a, np.float32)[rows] for a in (rep, freq, pres))
    v = x[rows, tok]
    with np.errstate(over="ignore"):  # np.where computes both branches: v * rp of a huge positive v is dropped
        v = np.where(rp != 1, np.where(v > 0, v / rp, v * rp), v)
    v = v - f * cnt.astype(np.float32)
    v = np.where(cnt > 0, v - p, v)
    x[rows, tok] = v


def temperature_min_p(x, temperature, min_p):
    """Rows with T not in {0, 1}: x /= T; then rows with min_p > 0 (T != 0): x < max + log(min_p) -> -inf."""
    _temperature_min_p(x, _f32(temperature), _f32(min_p))


def top_k_top_p(x, top_k, top_p):
    """In place on fp32 x [R, V]: top_k int32[R] (<= 0 or >= V: off), top_p f32[R] (1: off); the rule at the top."""
    _top_k_top_p(x, _i32(top_k), _f32(top_p))


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


