"""The step plan: which kernel runs each op of a step, decided in this one place.

A plan is made once per (backend, dtype, rows, decode rows, context bucket, options) and cached
by the model; `Model.forward` walks the layers through it and makes no choice of its own, and a
CUDA graph is keyed on it (a graph bakes in its kernels). A developer's A/B run builds a plan by
hand: `dataclasses.replace(model.plan(step, options), o="skinny")`.

    qkv      blas | tuned | gemv | skinny | gemv_rope | skinny_rope   (*_rope: RoPE and the K/V write in the epilogue)
    o        blas | tuned | gemv | skinny | skinny_norm   (skinny_norm: the post-attention add + RMSNorm weight
                                                           in the epilogue; the norm's per-row scale after gate_up)
    gate_up  blas | tuned | gemv | skinny | wg     (wg: a decode step's rows on Hopper's wgmma and TMA, SwiGLU in
                                                   the epilogue)
    swiglu   silu_mul | epilogue | scaled         (epilogue: inside gate_up's GEMV, skinny GEMM or wg GEMM;
                                                   scaled: silu_mul_scaled, after an o of skinny_norm)
    down     blas | tuned | gemv | skinny | slices        (slices: down_slices fp32 partial products over K,
                                                           summed by the next add_rmsnorm: no split-K reduce)
    lm_head  blas | tuned | gemv | skinny
    decode_attention   cuda_cores | tc | stream   (tc: a GQA group's heads as the rows of one mma tile; stream: the
                                                   same on a long context bucket, a ring of K/V tiles in flight)
    prefill_attention  cuda_cores | tc | wg       (tc: FlashAttention-2 on mma.sync; wg: the same loop on Hopper's
                                                   wgmma, 128 queries a block, on sm_90 GPUs)
    sparse   None | the options with the sparse prefill's parameters (sparse.py; prompt rows only)
    pdl      whether decode kernels launch with programmatic dependent launch (graph-replayed steps)

"blas" is cuBLAS on the GPU and NumPy's BLAS on the CPU; "tuned" the same product by the cuBLAS algorithm
measured fastest for its (N, K, row bucket), gemmEx's or one of cuBLASLt's (backends/cuda_tuned.py), for a step of
TUNED_MIN_ROWS rows or more on the GPU in 16-bit (a prompt's projections). Our kernels (gemv, skinny, wg, their
epilogues, the slices) run only with the `fused_kernels` toggle, on the GPU, in 16-bit. The thresholds below were
measured at the Qwen2.5-0.5B shape, on the H200 unless they say otherwise (experiments/NOTEBOOK.md has the runs).
"""
import math
from dataclasses import dataclass

from toolkit.backends.cuda_kernels import decode_head_blocks, plan_kv_bytes
from toolkit.backends.cuda_tuned import row_bucket
from toolkit.backends.cuda_wg import CTAS, T_COLS, gw_shape_ok

# Our GEMV takes a 1-row projection of up to GEMV_MAX_N outputs: 2.4-5.9 us against cuBLAS's 9-17 (the batch-1
# step 1.049 -> 0.990 ms); at 2 and 4 rows and for the 151,936-row lm_head cuBLAS is faster.
GEMV_ROWS, GEMV_MAX_N = 1, 32768
# gemm_skinny (tensor cores) takes 2-32 rows of the small projections: weights of up to SKINNY_MAX_WEIGHTS
# elements, or SKINNY_SMALL_WEIGHTS at up to SKINNY_SMALL_ROWS rows (qkv and o: 2.7-3.8 us against cuBLAS's
# 3.9-4.2; gate_up, down and the lm_head at 32 rows are faster on cuBLAS).
SKINNY_ROWS = (2, 32)
SKINNY_SMALL_ROWS, SKINNY_SMALL_WEIGHTS, SKINNY_MAX_WEIGHTS = 8, 6 << 20, 4 << 20
# The down projection in slices of K (one strided-batched cuBLAS GEMM, the next add_rmsnorm adds the partials):
# 8 slices at 2-32 rows (7.0-8.1 us against 8.9-9.4 for cuBLAS + add_rmsnorm), 4 at 33-128.
DOWN_SLICES = ((32, 8), (128, 4))  # (up to rows, slices)
# Decode attention on tensor cores takes D 64 or 128 and GQA groups of up to 16 heads (the mma's A rows).
TC_HEAD_DIMS, TC_DECODE_GROUP = (64, 128), 16
TC_PAYS_MIN_LEN = 512  # decode_tc_pays decides a shorter plan as one of this many keys
# From this context bucket on, decode attention streams (decode_attention_tc_stream), except at head dim 64 where a
# plan's K/V passes STREAM_TC_TILES 64-key tiles a layer (decode_stream_pays).
STREAM_MIN_LEN, STREAM_TC_TILES = 2048, 32768

# A step of this many rows or more runs its projections "tuned" (a prompt's, or a big chunk of one).
TUNED_MIN_ROWS = 512
# A pure decode step of WG_DECODE_ROWS rows on Hopper runs gate_up + SwiGLU as gemm_wg_swiglu_t (kernels/gemm_wg.cu,
# the operands swapped: weight rows on wgmma's m side, the step's rows on its n side) at two blocks an SM, whose TMA
# ring holds most of a tile's weights in flight at once, with SwiGLU's bits from its epilogue, where cuBLAS's GEMM
# and silu_mul took two launches and wrote and read back the [rows, 2I] product. Measured on an H100
# (experiments/NOTEBOOK.md, gemm_wg at decode rows):
#   - the step (dev/decode_attribution.py, session 25): 748.5 / 801.4 us against cuBLAS + silu_mul's 780.7 / 807.2
#     at the 0.5B's 8 / 32 rows, Llama-3.2-1B 1,165.3 / 1,315.5 against 1,201.7 / 1,341.2; the 1.5B 1,717.8 /
#     2,004.9 against 1,702.6 / 1,965.0: its 280 tiles of T_COLS columns are one wave and a bit at two blocks an SM
#     (264 on 132 SMs), the others' 96-256 fit one wave, so wg only while gate_up's tiles fit one wave of CTAS
#     blocks an SM; at 128 rows slower (0.5B 1,245.2 against 1,102.0), hence 2-32 rows;
#   - bench (session 26, ms a step at batch 2 / 8 / 16 / 32): the 0.5B 0.754 / 0.754 / 0.744 / 0.805 against 0.775
#     / 0.791 / 0.766 / 0.811, Llama 1.163 / 1.165 / 1.237 / 1.317 against 1.199 / 1.202 / 1.276 / 1.340, Qwen3-0.6B
#     0.938 / 0.977 / 1.041 / 1.208 against 1.033 / 1.081 / 1.064 / 1.210.
# Under wg the o projection stays plain (its RMSNorm in add_rmsnorm): with skinny_norm's scale in wg's epilogue the
# step was far slower at 32 rows (0.5B 1,222.3 us), and that epilogue was removed.
WG_DECODE_ROWS = (2, 32)

PROJECTIONS = ("blas", "tuned", "gemv", "skinny")
# The backend op of each prefill attention kind of the plan.
PREFILL_OPS = {"cuda_cores": "prefill_attention", "tc": "prefill_attention_tc", "wg": "prefill_attention_wg"}


@dataclass(frozen=True)
class StepPlan:
    qkv: str = "blas"
    o: str = "blas"
    gate_up: str = "blas"
    swiglu: str = "silu_mul"
    down: str = "blas"
    down_slices: int = 0
    lm_head: str = "blas"
    decode_attention: str = "cuda_cores"
    prefill_attention: str = "cuda_cores"
    sparse: object = None  # the EngineOptions whose sparse_* parameters the prompt rows run with; None: dense
    pdl: bool = False

    def __post_init__(self):
        ok = (self.qkv in PROJECTIONS + ("gemv_rope", "skinny_rope") and self.o in PROJECTIONS + ("skinny_norm",)
              and self.gate_up in PROJECTIONS + ("wg",) and self.down in PROJECTIONS + ("slices",)
              and self.lm_head in PROJECTIONS and (self.down == "slices") == (self.down_slices > 1)
              and self.swiglu in ("silu_mul", "epilogue", "scaled")
              and (self.swiglu == "scaled") == (self.o == "skinny_norm")
              and (self.gate_up != "wg" or self.swiglu == "epilogue")  # (wg is gate_up with SwiGLU, unscaled)
              and (self.swiglu != "epilogue" or self.gate_up in ("gemv", "skinny", "wg"))
              and self.decode_attention in ("cuda_cores", "tc", "stream")
              and self.prefill_attention in PREFILL_OPS)
        if not ok:
            raise ValueError(f"inconsistent step plan: {self}")

    def describe(self) -> str:
        """One line for the UI and bench: the kernel of each op."""
        down = f"{self.down_slices} slices" if self.down == "slices" else self.down
        swiglu = {"silu_mul": "+silu_mul", "epilogue": " swiglu", "scaled": "+scaled silu"}[self.swiglu]
        return (f"qkv {self.qkv} · o {self.o} · gate_up {self.gate_up}{swiglu} · down {down} · lm_head "
                f"{self.lm_head} · attention {self.decode_attention}/{self.prefill_attention}"
                f"{' · sparse' if self.sparse is not None else ''}{' · pdl' if self.pdl else ''}")


def decode_tc_pays(batch: int, n_kv_heads: int, group: int, D: int, itemsize: int, n_sm: int,
                   max_seq_len: int) -> bool:
    """Whether a decode plan goes to the tensor-core kernel (one block a GQA group): wherever the CUDA-core kernel
    gives a group one block too (decode_head_blocks), i.e. a big batch or a long plan. There it measured 93 against
    157 us a step at batch 32 and context 1, 301 against 410 at 512. Where the CUDA-core kernel spreads a group over
    several blocks (a small batch at a short plan) it stays: batch 1 at 512 keys took 204 us on tensor cores against
    154. Those were plans of 512 keys or more; a shorter plan decides as a 512-key one would, so the 256-key context
    bucket changes a plan's split count, not its kernel."""
    kv_bytes = plan_kv_bytes(batch, n_kv_heads, D, itemsize, max(max_seq_len, TC_PAYS_MIN_LEN))
    return decode_head_blocks(batch, n_kv_heads, group, n_sm, kv_bytes) == math.ceil(group / 8)


def decode_stream_pays(batch: int, n_kv_heads: int, D: int, max_seq_len: int) -> bool:
    """Whether a long plan (max_seq_len >= STREAM_MIN_LEN) goes to decode_attention_tc_stream rather than
    decode_attention_tc. Alone on the H200 (dev/decode_attention_long.py, experiments/logs/decode_long_graph.log)
    the stream kernel took 44 against 55 us at batch 128 x 2,048 keys (Qwen2.5-0.5B), 48 against 55 at 32 x 8,192,
    263 against 276 at Qwen3-0.6B's 128 x 2,048, 272 against 289 at Qwen2.5-1.5B's 128 x 8,192; in the 0.5B step
    (dev/decode_attribution.py, decode_attr_long.log) the step took 1,951 against 2,175 us at batch 128 x 2,049,
    801 against 884 at batch 1 x 8,193. But at head dim 64 and K/V of 32K tiles a layer or more, where 4 blocks an
    SM of the double-buffered kernel beat 2 of the stream kernel's: Llama-3.2-1B at batch 128 x 8,192 took 545
    against 609 us, 128 x 2,048 150 against 160; the 0.5B step at batch 128 x 8,193 4,522 against 4,629."""
    tiles = batch * n_kv_heads * math.ceil(max_seq_len / 64)
    return max_seq_len >= STREAM_MIN_LEN and not (D == 64 and tiles >= STREAM_TC_TILES)


def tensor_core_prefill(backend) -> str:
    """The prefill attention kernel on tensor cores: wg on Hopper (sm_90a's wgmma), tc (mma.sync) elsewhere."""
    return "wg" if backend.sm90 else "tc"


def make_plan(backend, cfg, rows: int, decodes: int, context_bucket: int, options) -> StepPlan:
    """The plan of a step of `rows` tokens whose first `decodes` rows are decodes (one token each), its decode
    attention sized for `context_bucket`, under `options` as effective on `backend`."""
    itemsize = 4 if backend.dtype == "float32" else 2
    vec = 16 // itemsize  # elements a 16-byte load
    on_gpu, wide = backend.name == "cuda", itemsize == 2
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Q, group = cfg.num_heads * D, cfg.num_heads // cfg.num_kv_heads
    ours = options.fused_kernels and on_gpu and wide
    # Our skinny GEMMs (and the slices) only in a pure decode step: a prompt's projections stay on cuBLAS at any
    # row count, so its logits do not depend on how much of it a prefix-cache hit left to compute.
    pure_decode = decodes == rows

    def gemv(n, k):
        return ours and rows <= GEMV_ROWS and n <= GEMV_MAX_N and k % vec == 0

    def skinny(n, k):
        lo, hi = SKINNY_ROWS
        most = SKINNY_SMALL_WEIGHTS if rows <= SKINNY_SMALL_ROWS else SKINNY_MAX_WEIGHTS
        return ours and pure_decode and lo <= rows <= hi and n * k <= most and k % 32 == 0

    def project(n, k):
        tuned = on_gpu and wide and rows >= TUNED_MIN_ROWS
        return "gemv" if gemv(n, k) else "skinny" if skinny(n, k) else "tuned" if tuned else "blas"

    qkv = project(cfg.qkv_size, H)
    # RoPE and the K/V write in the qkv projection's epilogue: rope_qkv is never launched. Not with q/k norms, which
    # need the whole head; gemm_skinny's tile holds 8 pairs (a GEMV block holds 1-4). At batch 1 on an H100 the step
    # took 679 against 698 us (Qwen2.5-0.5B), 1,464 against 1,507 (Qwen2.5-1.5B), 1,103 against 1,105 (Llama-3.2-1B);
    # gemm_skinny_rope at 1 row 694, 1,546 and 1,101 (experiments/NOTEBOOK.md, session 26).
    if (qkv == "gemv" or qkv == "skinny" and D % 16 == 0) and not cfg.qk_norm:
        qkv += "_rope"
    o = project(H, Q)
    gate_up = project(2 * I, H)
    lo, hi = WG_DECODE_ROWS
    if (ours and pure_decode and backend.sm90 and lo <= rows <= hi and gw_shape_ok(rows, I, H)
            and -(-I // T_COLS) <= CTAS * backend.num_sms):
        gate_up = "wg"
    if o == "skinny" and H % 16 == 0 and I % vec == 0 and gate_up != "wg":
        o = "skinny_norm"  # RMSNorm(h) * w = inv * (h * w): inv, one number a row, commutes with gate_up's GEMM
    swiglu = "scaled" if o == "skinny_norm" else "epilogue" if gate_up in ("gemv", "skinny", "wg") else "silu_mul"
    slices = next((s for top, s in DOWN_SLICES if 2 <= rows <= top), 0) if ours and pure_decode else 0
    slices = next((s for s in range(slices, 1, -1) if I % (8 * s) == 0), 0)  # each slice 16-byte aligned
    down = "slices" if slices else project(H, I)
    tc = on_gpu and wide and D in TC_HEAD_DIMS
    decode_tc = tc and decodes > 0 and group <= TC_DECODE_GROUP
    stream = decode_tc and decode_stream_pays(decodes, cfg.num_kv_heads, D, context_bucket)
    decode_tc = decode_tc and decode_tc_pays(decodes, cfg.num_kv_heads, group, D, itemsize, backend.num_sms,
                                             context_bucket)
    return StepPlan(qkv=qkv, o=o, gate_up=gate_up, swiglu=swiglu, down=down, down_slices=slices,
                    lm_head=project(cfg.vocab_size, H),
                    decode_attention="stream" if stream else "tc" if decode_tc else "cuda_cores",
                    prefill_attention=tensor_core_prefill(backend) if tc else "cuda_cores",
                    sparse=options if options.sparse_prefill and decodes < rows else None, pdl=options.pdl and on_gpu)


def tuned_calls(backend, cfg, rows: int, max_seqs: int, options) -> list:
    """The (projection, rows) calls that measure, ahead of any request, every "tuned" choice a step of up to `rows`
    tokens can need (cuda_tuned.py measures a (shape, row bucket) on its first call, dozens of GEMMs of that
    shape, which the first prompts of a run would otherwise pay for): qkv, o, gate_up and down at each power-of-two
    row bucket from TUNED_MIN_ROWS on, and the lm_head, which a prompt step runs on its requests' last rows, at each
    bucket of 1 to max_seqs rows. Each bucket at its largest rows, at most the engine's; none where no step is
    tuned (the CPU, fp32, or fewer than TUNED_MIN_ROWS rows a step)."""
    if rows < TUNED_MIN_ROWS:
        return []
    calls = []
    for lo, hi, names in ((TUNED_MIN_ROWS, rows, ("qkv", "o", "gate_up", "down")), (1, max_seqs, ("lm_head",))):
        b = row_bucket(lo)
        while b // 2 < hi:  # the buckets holding some of lo..hi rows
            n = max(lo, min(b, hi))
            plan = make_plan(backend, cfg, max(n, TUNED_MIN_ROWS), 0, 0, options)
            calls += [(name, n) for name in names if getattr(plan, name) == "tuned"]
            b *= 2
    return calls
