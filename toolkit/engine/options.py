"""The engine's toggles: behaviours a user can name and switch off to see what each buys.

Six on/off toggles and the sparse prefill's numeric parameters, as one frozen value. The engine
reads its `EngineOptions` at the start of each step, so a change made with
`engine.set_options(...)` (the CLI, a bench sweep, the terminal UI) takes effect at the next step
boundary, never halfway through one; each step's timing records the options it ran with.

Toggles say *what* the engine does, never *which kernel* runs: the step plan
(toolkit/model/plan.py) turns (backend, dtype, rows, context bucket, options) into kernels, in
one place. A toggle the backend cannot run (CUDA graphs on the CPU) is not offered there
(`available`) and reads as off in `effective`, so a record says what actually ran.
"""
from dataclasses import dataclass, field, fields, replace

from toolkit.errors import ToolkitError


def _toggle(help_text: str):
    return field(default=True, metadata={"help": help_text})


def _param(default: int, help_text: str):
    return field(default=default, metadata={"help": help_text, "param": True})


@dataclass(frozen=True)
class EngineOptions:
    sampler_fast_path: bool = _toggle("sample straight from the model's logits, with no FP32 copy: penalties, bias, "
                                      "bans, temperature, top-k/p and min-p read them in place")
    sparse_prefill: bool = _toggle("prompt attention over a sliding window plus the indexer's top-k key blocks "
                                   "(exact when the selection covers every block)")
    prefix_caching: bool = _toggle("reuse the KV cache of an earlier request's identical prompt prefix")
    cuda_graphs: bool = _toggle("replay each decode step, and each prefill step of up to 2,048 tokens, from a "
                                "CUDA graph instead of launching its kernels one by one")
    fused_kernels: bool = _toggle("our decode kernels: a GEMV at batch 1, a tensor-core GEMM with RoPE, RMSNorm "
                                  "and SwiGLU in its epilogues at 2-32 rows, the down projection in slices; off: "
                                  "cuBLAS for every projection and separate norm, RoPE and SwiGLU kernels")
    pdl: bool = _toggle("in a graph-replayed decode step, start each kernel while the previous one finishes, so "
                        "it streams its weights early (programmatic dependent launch, Hopper)")
    # Parameters of the sparse prefill (DeepSeek-V4-Flash's values); not toggles.
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
        """The toggles (what --no-<toggle>, the bench sweep and the UI's keys are made from)."""
        return tuple(f.name for f in fields(cls) if not f.metadata.get("param"))

    @classmethod
    def param_names(cls) -> tuple:
        """The numeric parameters (sparse_topk, ...): each has its own flag."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("param"))

    @classmethod
    def help(cls, name: str) -> str:
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)

    @classmethod
    def available(cls, backend) -> tuple:
        """The toggles this backend can run: every toggle on a GPU (CUDA graphs only with a capturable cuBLAS, PDL
        only on Hopper with cuda-bindings), the backend-independent ones on the CPU."""
        on_gpu = backend.name == "cuda"
        ok = {"cuda_graphs": on_gpu and backend.graphs_supported,
              "fused_kernels": on_gpu and backend.dtype != "float32",
              "pdl": on_gpu and backend.pdl_supported and backend.graphs_supported}
        return tuple(n for n in cls.names() if ok.get(n, True))

    def validate(self):
        """Raise ToolkitError naming the field for sparse parameters that cannot work (each >= 1, W >= R)."""
        for name in self.param_names():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ToolkitError(f"{name} must be an integer >= 1, got {v!r}")
        W, R = self.sparse_window, self.sparse_block
        if W < R:
            raise ToolkitError(f"sparse_window ({W}) must be >= sparse_block ({R}): the window has to cover the "
                               "partial block at the end of each query's context")

    def effective(self, backend) -> "EngineOptions":
        """The options as they run on this backend: a toggle it cannot run reads as off; PDL needs CUDA graphs
        (it runs in graph-replayed steps only: eagerly each launch through cuda-bindings cost more host time
        than it saved)."""
        ok = set(self.available(backend))
        eff = replace(self, **{n: getattr(self, n) and n in ok for n in self.names()})
        return replace(eff, pdl=eff.pdl and eff.cuda_graphs)
