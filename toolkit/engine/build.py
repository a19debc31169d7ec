"""The one place an engine is built, for `generate`, `chat`, `bench`, the UI and `LLM`.

Sizing defaults, and why:
  * context: min(model maximum, 4096), as before.
  * KV cache on the GPU: half the memory left free after the weights and scratch, capped at what
    max_num_seqs requests of the full context could ever use; on the CPU 16,384 tokens (a fixed
    size: RAM is shared with everything else, and CPU batches are small).
  * max_num_seqs 256 on the GPU (the largest CUDA-graph bucket), 16 on the CPU.
  * max_num_batched_tokens 8192 on the GPU (a 4,096-token prompt prefills in one step),
    2048 on the CPU (bounds the scratch memory and a step's latency).
"""
import sys
from pathlib import Path

from toolkit.backends import make_backend
from toolkit.model.checkpoint import Checkpoint
from toolkit.model.config import ModelConfig
from toolkit.engine.device import free_memory, resolve_device
from toolkit.engine import LLMEngine, SamplingParams
from toolkit.engine.scheduler import DEFAULT_POLICY
from toolkit.errors import ToolkitError
from toolkit.model.decoder import KVCache
from toolkit.model.hub import resolve_model
from toolkit.engine.options import EngineOptions
from toolkit.sampler.params import load_generation_config
from toolkit.model.weights import load_weights, random_checkpoint

# The embedded default model (weights/README.md says how it was made): `--model`'s and `LLM()`'s default.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "weights" / "tiny-pd"
BLOCK_SIZE = 16
DEFAULT_MAX_CONTEXT = 4096
# The smallest context: one prompt token and one generated token. The flag's parser and _context both use it.
MIN_CONTEXT = 2
CPU_KV_TOKENS = 16384
GPU_KV_FRACTION = 0.5


def default_model() -> str | None:
    return str(DEFAULT_MODEL_DIR) if (DEFAULT_MODEL_DIR / "config.json").is_file() else None


def default_dtype(cfg: ModelConfig) -> str:
    """16-bit checkpoints run in their own dtype on the GPU; fp32 ones stay fp32 (the CPU backend is always fp32)."""
    return {"float16": "float16", "bfloat16": "bfloat16"}.get(cfg.torch_dtype, "float32")


def _context(cfg: ModelConfig, max_context: int | None) -> int:
    limit = cfg.context_limit
    if max_context is None:
        max_context = min(limit, DEFAULT_MAX_CONTEXT)
    if not MIN_CONTEXT <= max_context <= limit:
        raise ToolkitError(f"--max-context must be between {MIN_CONTEXT} and {limit} for this model, "
                           f"got {max_context}")
    return max_context


def _check_tokenizer(tokenizer, cfg: ModelConfig, model: Path):
    """Refuse at load a tokenizer that can produce ids past the embedding (fewer ids than rows is normal)."""
    rows = cfg.vocab_size
    if tokenizer.id_limit > rows:
        raise ToolkitError(f"{model / 'tokenizer.json'}: the tokenizer has token ids up to {tokenizer.id_limit - 1} "
                           f"but the model's embedding has {rows} rows (config.json vocab_size); "
                           "is it the tokenizer of another model?")
    if tokenizer.bos_id is not None and not 0 <= tokenizer.bos_id < rows:
        raise ToolkitError(f"{model}: bos_token_id {tokenizer.bos_id} is outside the model's embedding ({rows} rows)")


def _kv_tokens(backend, cfg, requested, max_context, max_num_seqs) -> int:
    # More than max_num_seqs full contexts, each in whole blocks, can never be used: larger requests are clamped.
    ceiling = max_num_seqs * -(-max_context // BLOCK_SIZE) * BLOCK_SIZE + BLOCK_SIZE
    per_token = KVCache.bytes_per_token(cfg, backend.empty((1,)).itemsize)
    free = free_memory(backend.name)
    if requested is not None:
        if requested < BLOCK_SIZE:
            raise ToolkitError(f"--kv-cache-tokens must be >= {BLOCK_SIZE} (one KV-cache block), got {requested}")
        tokens = min(requested, ceiling)
        if tokens * per_token > 0.9 * free:
            raise ToolkitError(f"--kv-cache-tokens {requested} needs {tokens * per_token / 2**30:.1f} GiB for the KV "
                               f"cache but {free / 2**30:.1f} GiB is free ({per_token} bytes per token)")
        return tokens
    if backend.name == "cpu":
        return min(max(CPU_KV_TOKENS, max_context + BLOCK_SIZE), ceiling)
    return max(min(int(free * GPU_KV_FRACTION) // per_token, ceiling), max_context + BLOCK_SIZE)


def build_engine(model=None, shape: str | None = None, device: str = "auto", dtype: str | None = None,
                 max_context: int | None = None, kv_cache_tokens: int | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 options: EngineOptions | None = None, warmup: bool = True,
                 scheduler_policy: str = DEFAULT_POLICY, config: ModelConfig | None = None,
                 weights_seed: int = 0) -> LLMEngine:
    """`config` overrides the model's config.json (tests); `weights_seed` seeds a shape's random weights."""
    from toolkit.text.chat_template import ChatTemplate
    from toolkit.model.shapes import shape_config
    from toolkit.text.tokenizer import Tokenizer

    tokenizer = template = None
    generation_defaults = {}  # a random --shape model has no generation_config.json
    if shape is not None:
        cfg = config or shape_config(shape)
    else:
        if model is None:
            raise ToolkitError("give a model folder or a shape")
        model = resolve_model(model)
        cfg = config or ModelConfig.from_dir(model)
        tokenizer, template = Tokenizer.from_dir(model), ChatTemplate.from_dir(model)
        _check_tokenizer(tokenizer, cfg, model)
        generation_defaults = load_generation_config(model)  # before the weights: a bad file fails fast
    backend_name, note = resolve_device(device)
    dtype = dtype or default_dtype(cfg)
    backend = make_backend(backend_name, dtype)
    if backend_name == "cuda":
        note += f"; {backend.gemm_note}"
    max_context = _context(cfg, max_context)
    on_gpu = backend_name == "cuda"
    max_num_seqs = max_num_seqs or (256 if on_gpu else 16)
    max_num_batched_tokens = max_num_batched_tokens or (8192 if on_gpu else 2048)
    if max_num_batched_tokens < max_num_seqs:
        raise ToolkitError(f"--max-num-batched-tokens ({max_num_batched_tokens}) must be at least "
                           f"--max-num-seqs ({max_num_seqs}): every running request feeds a token per step")
    source = random_checkpoint(cfg, dtype, seed=weights_seed) if shape is not None else Checkpoint(model)
    weights = load_weights(source, cfg, backend.from_host)
    if isinstance(source, Checkpoint) and source.nonfinite_warning():
        print(source.nonfinite_warning(), file=sys.stderr, flush=True)
    kv_tokens = _kv_tokens(backend, cfg, kv_cache_tokens, max_context, max_num_seqs)
    # The step's buffers hold at least a hidden state per fed token and a row of logits per request. Checked before
    # allocating: where the OS overcommits memory, a buffer past the RAM is handed out and fails only when touched.
    itemsize = backend.empty((1,)).itemsize
    least = (max(max_num_batched_tokens, max_num_seqs) * cfg.hidden_size + max_num_seqs * cfg.vocab_size) * itemsize
    if least > free_memory(backend.name):
        raise ToolkitError(f"not enough memory for the engine's buffers (--max-num-seqs {max_num_seqs}, "
                           f"--max-num-batched-tokens {max_num_batched_tokens}: at least {least / 2**30:.1f} GiB): "
                           "lower them")
    try:
        engine = LLMEngine(cfg, weights, backend, max_context=max_context, num_blocks=kv_tokens // BLOCK_SIZE,
                           block_size=BLOCK_SIZE, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, options=options or EngineOptions(),
                           tokenizer=tokenizer, chat_template=template, device_note=note,
                           scheduler_policy=scheduler_policy)
    except MemoryError:  # NumPy's, and CuPy's OutOfMemoryError (a subclass)
        raise ToolkitError(f"not enough memory for the engine's buffers (--max-num-seqs {max_num_seqs}, "
                           f"--max-num-batched-tokens {max_num_batched_tokens}, --kv-cache-tokens {kv_tokens}): "
                           "lower them") from None
    engine.generation_defaults = generation_defaults  # sampling defaults under the flags and JSONL fields
    engine.model_dir = None if shape is not None else model  # the local folder, also for a Hub id
    if warmup:
        warm_up(engine)
    return engine


def warm_up(engine: LLMEngine):
    """A 2-token request and a decode step, the tuned projections' measurements, then every CUDA-graph bucket, so
    one-off costs (Numba's thread pool, module loading, cuBLAS handles and algorithm choices, graph capture) never
    land in a request's timings."""
    # Two prompt tokens when the context allows (a prefill of more than one row), else one: the
    # smallest context, 2, holds one prompt token and one generated token.
    list(engine.generate([0] * min(2, engine.max_context - 1), SamplingParams(max_tokens=2, ignore_eos=True)))
    options = engine.effective_options()
    engine.runner.model.tune(options, engine.runner.logits)  # before the captures: a graph replays a measured choice
    if options.cuda_graphs:
        engine.runner.capture_all(options)
    engine.backend.synchronize()
