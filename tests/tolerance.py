"""Tolerances derived from an op's arithmetic (accumulation length, dtype), never tuned to one machine's rounding.

The model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 2-3): every float32 operation
returns the exact result of its rounded operands times (1 + d), |d| <= u = 2**-24 (round to nearest). A sum or dot
product of K terms, in ANY order or blocking (BLAS kernels, SIMD lanes, split K, FMA or not, numba's reassoc), is
then within gamma_K = K u / (1 - K u) times the sum of the terms' magnitudes of the exact value (each term goes
through at most K roundings: its product and K - 1 additions). Hence:
  * a float32 result against a float64 reference: one such error (orders=1; float64's own is 2**29 times smaller);
  * two float32 implementations that round differently (another order, another kernel): up to two (orders=2).
Library transcendentals are not correctly rounded: NumPy validates float32 exp within 3 ulp, exp2, cos and sin
within 2 (numpy/_core/tests/data/umath-validation-set-*.csv); glibc's expf is within 1 ulp; 1 ulp <= 2u relative.
Every bound here is first order (terms in u**2, about K**2 u**2, are dropped: far below the kept terms at these K)
and returned in float64. A bound from here is a worst case, not a typical error: the test data's real errors sit
far below it, and a wrong term or index (errors of order the values themselves) sits far above it.
"""
import numpy as np

U32 = 2.0 ** -24  # float32 unit roundoff
U64 = 2.0 ** -53  # float64 unit roundoff
EXP32 = 3 * 2 * U32  # float32 exp / exp2: 3 ulp, relative


def gamma(n, u=U32):
    """Higham's gamma_n = n u / (1 - n u): the relative error of n chained roundings."""
    return n * u / (1 - n * u)


def sum_bound(terms_abs_sum, K, orders=1, u=U32):
    """|computed - exact| of a sum of K terms (each possibly a rounded product) in any order: orders * gamma_K *
    sum of the terms' magnitudes (terms_abs_sum, scalar or elementwise)."""
    return orders * gamma(K, u) * np.asarray(terms_abs_sum, np.float64)


def gemm_bound(x, w, orders=1, u=U32):
    """Elementwise bound on |x @ w.T computed - exact| for x [..., K], w [N, K]: orders * gamma_K * (|x| @ |w|.T)."""
    x64, w64 = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64))
    return sum_bound(x64 @ w64.T, x64.shape[-1], orders, u)


def rmsnorm_bound(r, w, eps, dr=0.0):
    """Elementwise bound on |rmsnorm twin - exact| for out = w * (r * inv), inv = 1 / sqrt(mean(r^2) + eps), r the
    exact residual [..., H] (float64) and dr an elementwise bound on the error of the residual the twin normalised.
    The twin sums squares in float64 (negligible), rounds inv to float32 (u) and takes two float32 products (2u):
    3u |out|. An error dr in r moves out_i by |w_i| inv (dr_i + |r_i| |d rms| / rms) with |d rms| <= ||dr||_2 /
    sqrt(H) (rms = sqrt(mean(r^2) + eps) is 1/sqrt(H) times a 2-norm of r)."""
    r = np.asarray(r, np.float64)
    H = r.shape[-1]
    rms = np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + eps)
    dr = np.broadcast_to(np.asarray(dr, np.float64), r.shape)
    drms = np.sqrt(np.sum(dr * dr, axis=-1, keepdims=True) / H)
    return np.abs(w) / rms * (dr + np.abs(r) * drms / rms) + 3 * U32 * np.abs(w * r / rms)


def silu_mul_bound(g, up, dg=0.0, dup=0.0):
    """Elementwise bound on |silu(g) * up computed in float32 - exact| (kernels/activation.py: g / (1 + exp(-g)) *
    up), g and up exact (float64), dg and dup bounds on the errors of the float32 g and up the twin was given.
    Own rounding: exp (EXP32, scaled by e/(1+e) <= 1), the add, the division and the product: EXP32 + 3u, relative.
    An error dg moves silu by silu'(g) dg, |silu'(g)| = |s (1 + g (1 - s))| <= 1.1 (s = sigmoid(g)); dup moves
    out by |silu(g)| dup. Where exp(-g) overflows (g < -88.7) the twin returns -0: |silu(g)| < 89 e^-88.7 < 3e-37
    of |up| lost, the absolute term."""
    g, up = np.asarray(g, np.float64), np.asarray(up, np.float64)
    s = 1.0 / (1.0 + np.exp(-g))
    silu = g * s
    return ((EXP32 + 3 * U32) * np.abs(silu * up) + np.abs(s * (1 + g * (1 - s))) * dg * np.abs(up)
            + np.abs(silu) * dup + 3e-37 * np.abs(up))


def rope_bound(x, dx, c, s):
    """Elementwise bound on |rotate_half RoPE computed in float32 - exact| for x [..., D] (exact, float64), dx a
    bound on the error of the float32 x the twin rotated, c, s the float32 cos / sin tables gathered to [..., D/2]
    (the reference uses the same tables): out_i = x_i c - x_j s, two products and an add (gamma_2 of
    |x_i c| + |x_j s|), and dx carried through: |c| dx_i + |s| dx_j."""
    x, dx = np.asarray(x, np.float64), np.broadcast_to(np.asarray(dx, np.float64), np.shape(x))
    c, s = np.abs(np.asarray(c, np.float64)), np.abs(np.asarray(s, np.float64))
    half = x.shape[-1] // 2
    xa, xb, da, db = np.abs(x[..., :half]), np.abs(x[..., half:]), dx[..., :half], dx[..., half:]
    return np.concatenate([c * da + s * db + gamma(2) * (xa * c + xb * s),
                           c * db + s * da + gamma(2) * (xb * c + xa * s)], -1)


def attention_bound(D, L, S, v_max, orders=1, tile=16):
    """Bound on |softmax(s) V computed in float32 - exact| for one query over L keys of head size D, any order,
    tiling and online (flash) rescaling, s_j = scale * q . k_j.
    S: an upper bound of scale * |q| . |k_j| over the keys (e.g. scale * max ||q||_2 * max ||k||_2); v_max: max |v|.
    tile: the fewest keys between two online-softmax rescales (16: decode_attention_tc's warp slice; 32 and 64
    elsewhere; the per-query sparse twin has none), so a weight passes through at most R = ceil(L / tile) + 2
    rescale factors (+ 2: the warp and split merges).
    Each weight p_j = exp(s_j - m) carries a relative error of at most
        e_w = u (D + 2) S       the score: a D-term dot product and its scale (log2 e folded in: one more)
            + u 2 S             s_j - m rounded, |s_j - m| <= 2 S
            + u 2 S             the rescale exponents m_old - m_new rounded: they telescope to <= 2 S
            + (R + 1)(EXP32 + u)  its own exp, then up to R rescale factors (an exp and a product each).
    out = sum_j w_j v_j with w_j = p_j / sum p: a common factor cancels, so the weights move out by <= 2 e_w v_max;
    the numerator and the denominator are sums of L terms (p_j <= 1 with the max's p = 1): gamma_L v_max each; the
    division: u v_max."""
    R = -(-L // tile) + 2
    e_w = U32 * (D + 6) * S + (R + 1) * (EXP32 + U32)
    return orders * v_max * (2 * e_w + 2 * gamma(L) + U32)


def attention_bound_for(q, k_cache, v_cache, seq_lens, scale, orders=1, tile=16):
    """attention_bound over a whole batch: D from q, L the longest sequence, S = scale * max ||q||_2 * max ||k||_2
    (Cauchy-Schwarz: >= scale * |q| . |k| for every pair), v_max = max |v| (NaN slots, outside every sequence,
    skipped; q rows outside the batch only make S larger)."""
    finite_max = lambda a: float(np.max(a[np.isfinite(a)], initial=0.0))  # 0 where no sequence has a key
    qn = np.linalg.norm(np.asarray(q, np.float64), axis=-1)
    kn = np.linalg.norm(np.asarray(k_cache, np.float64), axis=-1)
    S = abs(scale) * finite_max(qn) * finite_max(kn)
    v_max = finite_max(np.abs(np.asarray(v_cache, np.float64)))
    return attention_bound(q.shape[-1], max(int(np.max(seq_lens)), 1), S, v_max, orders, tile)


def log_softmax_bound(x):
    """Bound on |log_softmax(x)_i computed - exact| for every i, over one row x (float32, V entries), as
    kernels/sampler.py's logprobs and the like compute it: d = x - M in float32 (u |d|), exp in float32 (EXP32 +
    u |d| relative), the sum in float64 (negligible), log in float64 and rounded to float32 (u log V), then
    (x_i - M) - logS in float32 (u |d_i| + u |result|). With W = M - min x (the widest d) and logS <= log V:
    u (3 W + 2 log V) + EXP32."""
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    W, V = x.max() - x.min(), x.size
    return U32 * (3 * W + 2 * np.log(V)) + EXP32


def model_path_length(cfg, T):
    """The summed accumulation lengths on one logit's path through the decoder, T keys of attention: per layer the
    input norm (H squares), the qkv projection (H), the attention score (D) and its weighted sum over T keys, the o
    projection (Hq * D), the post-attention norm (H), gate_up (H) and down (I); then the final norm (H) and the
    lm_head (H)."""
    H, D, Hq, I = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.intermediate_size
    return cfg.num_layers * (4 * H + D + T + Hq * D + I) + 2 * H


def model_bound(cfg, T, logits_max, orders=2):
    """|logits - logits'| for two float32 runs of the same model that round differently (orders=2), or one run
    against an exact reference (orders=1): orders * k_path * u * max|logits|.
    A first-order error model, not a proof: every accumulation on the path (model_path_length) adds at most
    gamma_K relative error to its output, and these relative errors are carried to the logits at unit gain (the
    RMSNorms rescale every layer's input to unit size, so a relative error neither grows nor shrinks through them;
    softmax and SiLU have gains of order one at the fixtures' values). Measured on the fixtures' GPU plans on the
    CPU twins: the real differences are about 1% of it, and a dropped tile of squares, a dropped K slice or a
    dropped key moves the logits by thousands of times it."""
    return orders * model_path_length(cfg, T) * U32 * float(logits_max)


def assert_within(got, want, bound, what="error"):
    """|got - want| <= bound elementwise (bound scalar or broadcastable), with the worst offender in the message."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want)
    got, want = np.broadcast_to(got, err.shape), np.broadcast_to(want, err.shape)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(err - bound, nan=np.inf), -np.inf)), err.shape)
        i = tuple(int(j) for j in i)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} entries past their bound; worst at {i}: "
                             f"|{got[i]:.9g} - {want[i]:.9g}| = {err[i]:.3g} > {bound[i]:.3g}")
