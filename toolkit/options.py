"""Every run-time switch of the engine, as one frozen value.

The engine reads its `EngineOptions` once at the start of each step, so a
change made with `engine.set_options(...)` (from the CLI, a benchmark sweep or
the terminal UI) takes effect at the next step boundary and never halfway
through one. Each step's `StepTiming` records the options it ran with, so a
timing can always be traced back to the switches that produced it.

A switch that the backend cannot honour (CUDA graphs on the CPU, tensor cores
in fp32) is accepted and reported as off by `effective()`: the record says
what actually ran.
"""
from dataclasses import dataclass, field, fields, replace


def _switch(help_text: str, default: bool = True):
    return field(default=default, metadata={"help": help_text})


def _param(default: int, help_text: str):
    return field(default=default, metadata={"help": help_text, "param": True})


@dataclass(frozen=True)
class EngineOptions:
    cuda_graphs: bool = _switch("replay pure-decode steps from CUDA graphs captured per batch size and context "
                                "bucket (GPU)")
    tensor_cores: bool = _switch("attention on tensor cores: FlashAttention-2 prefill, and decode with a GQA "
                                 "group's heads as the rows of one mma tile (GPU, 16-bit)")
    prefix_caching: bool = _switch("reuse the KV blocks of an earlier request's identical prefix")
    small_batch_gemv: bool = _switch("our GEMV kernel for the projections of a batch-1 step instead of cuBLAS (GPU)")
    gemv_swiglu: bool = _switch("apply SwiGLU in the epilogue of our gate_up GEMV (with small_batch_gemv): one "
                                "kernel a layer fewer, gate_up never written (GPU)")
    # Off by default: measured slower than the kernels it replaces (README, "One kernel for the MLP block").
    mlp_kernel: bool = _switch("run each MLP block of a batch-1 decode step as one persistent kernel (add + RMSNorm, "
                               "gate_up + SwiGLU, a grid barrier, down + residual add; the down weights copied to "
                               "shared memory meanwhile; with small_batch_gemv; GPU, Hopper+)", default=False)
    # Off by default: with pdl on, the unfused step measured as fast or faster (README, "Folding the small kernels").
    fused_gemv: bool = _switch("fold the RMSNorms, residual adds and SwiGLU of a batch-1 step into its GEMVs "
                               "(with small_batch_gemv; GPU)", default=False)
    pdl: bool = _switch("programmatic dependent launch: in a decode step replayed from a CUDA graph each kernel "
                        "starts while the previous one runs, streaming its weights before it waits for its inputs "
                        "(GPU, Hopper+)")
    # Off by default: one launch a layer fewer measured no faster (README, "RoPE inside decode attention").
    rope_in_attention: bool = _switch("in a pure decode step, apply RoPE and write the new K/V inside the decode "
                                      "attention kernel instead of a separate rope_qkv launch: one kernel a layer "
                                      "fewer (GPU)", default=False)
    skinny_gemm: bool = _switch("our tensor-core GEMM (gemm_skinny) instead of cuBLAS for the small projections of a "
                                "decode step of 2-32 rows (Qwen2.5-0.5B: qkv and o, and down up to 8 rows; GPU, "
                                "16-bit)")
    rope_in_gemm: bool = _switch("in a pure decode step of 2-32 rows, apply RoPE and write the new K/V in the "
                                 "epilogue of the qkv projection (gemm_skinny_rope, with skinny_gemm) instead of a "
                                 "separate rope_qkv launch: one kernel a layer fewer (GPU, 16-bit, no q/k norms)")
    # Off by default: measured slower in the decode step than cuBLAS (README, "Streaming the MLP weights").
    stream_gemm: bool = _switch("our TMA weight-streaming GEMM (gemm_stream) instead of cuBLAS for the MLP's gate_up "
                                "(with SwiGLU in its epilogue) and down projections of a decode step of 2-32 rows "
                                "(GPU, 16-bit, Hopper+)", default=False)
    split_down: bool = _switch("in a decode step of 2-128 rows, the down projection as one strided-batched cuBLAS "
                               "GEMM over slices of K whose fp32 partials the next add_rmsnorm adds: cuBLAS's split-K "
                               "reduce kernel left out, one launch a layer fewer (GPU)")
    norm_in_gemm: bool = _switch("in a pure decode step of 2-32 rows, split the post-attention add_rmsnorm over its "
                                 "neighbours: the residual add and the norm weight in the o projection's epilogue "
                                 "(gemm_skinny_norm), the norm's per-row scale after the gate_up GEMM "
                                 "(silu_mul_scaled): one kernel a layer fewer, other roundings (GPU, 16-bit, with "
                                 "skinny_gemm)")
    sampler_fast_path: bool = _switch("skip the FP32 logits copy when no request in the batch needs logits processing")
    sparse_prefill: bool = _switch("prefill attention over the sliding window + the indexer's top-k key blocks "
                                   "(exact when it covers every block)")
    # Parameters of the sparse prefill (DeepSeek-V4-Flash's values); not on/off switches.
    sparse_topk: int = _param(512, "key blocks each query keeps (K)")
    sparse_window: int = _param(128, "sliding-window tokens each query always sees (W)")
    sparse_block: int = _param(4, "tokens per indexer key block (R, the compress ratio)")
    sparse_query_tile: int = _param(64, "neighbouring queries (aligned to this many positions) that share one indexer "
                                        "score and top-k selection (Q; 1 = a selection per query, at most W - R + 2)")
    sparse_max_keep_pct: int = _param(50, "run the sparse kernels only where the selection keeps at most this % of "
                                          "the step's causal keys; above it the dense kernel is faster, and exact "
                                          "(100: wherever the selection approximates)")

    def with_(self, **changes) -> "EngineOptions":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def names(cls) -> tuple:
        """The on/off switches (what --no-<switch>, the bench sweep and the UI toggles are made from)."""
        return tuple(f.name for f in fields(cls) if not f.metadata.get("param"))

    @classmethod
    def param_names(cls) -> tuple:
        """The numeric parameters (sparse_topk, ...): each has its own flag."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("param"))

    @classmethod
    def help(cls, name: str) -> str:
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)

    def validate(self):
        """Raise ToolkitError naming the field for sparse parameters that cannot work (K, W, R, Q >= 1, W >= R,
        keep % >= 1)."""
        from .sparse import validate

        validate(self.sparse_topk, self.sparse_window, self.sparse_block, self.sparse_query_tile,
                 self.sparse_max_keep_pct)

    def effective(self, backend_name: str, dtype: str) -> "EngineOptions":
        """The options as they can run on this backend (unsupported switches read as off; sparse prefill runs on
        both backends)."""
        on_gpu = backend_name == "cuda"
        gemv = self.small_batch_gemv and on_gpu
        graphs = self.cuda_graphs and on_gpu
        skinny = self.skinny_gemm and on_gpu and dtype != "float32"
        rope_attn = self.rope_in_attention and on_gpu  # (where both are asked for, the attention does RoPE)
        return replace(self, cuda_graphs=graphs, tensor_cores=self.tensor_cores and on_gpu and dtype != "float32",
                       rope_in_attention=rope_attn, rope_in_gemm=self.rope_in_gemm and skinny and not rope_attn,
                       small_batch_gemv=gemv, skinny_gemm=skinny,
                       stream_gemm=self.stream_gemm and on_gpu and dtype != "float32",
                       split_down=self.split_down and on_gpu, norm_in_gemm=self.norm_in_gemm and skinny,
                       fused_gemv=self.fused_gemv and gemv,
                       gemv_swiglu=self.gemv_swiglu and gemv, mlp_kernel=self.mlp_kernel and gemv,
                       pdl=self.pdl and graphs)  # PDL runs in graph-replayed steps only (runner.py says why)
