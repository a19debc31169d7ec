"""The engine: prompt ids in, a stream of tokens (with live timings) out.

    Engine.load(model_dir)            config + tokenizer + weights -> backend
    for r in engine.generate(ids):    prefill, then one decode step per token
        r.text, r.token, r.step       new text, token id, StepTiming of this step

The KV cache is preallocated for `max_context` tokens. The prompt is prefilled
in chunks of at most `max_chunk` tokens (bounding scratch memory), then each
step feeds the last token at the next position until EOS or `max_tokens`.
"""
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .backends import make_backend
from .checkpoint import Checkpoint
from .config import ModelConfig
from .device import resolve_device
from .errors import ToolkitError
from .model import Model
from .sampling import make_sampler
from .timings import RunStats, StepTiming
from .weights import load_weights

DEFAULT_MAX_CONTEXT = 4096


@dataclass
class GenerationResponse:
    """One generated token and the state of the run so far (mlx-lm style)."""
    text: str  # new text to show (may be "" while a UTF-8 character is incomplete)
    token: int
    step: StepTiming  # this step's timing (the first response carries the prefill's)
    stats: RunStats  # running totals: prompt/decode tok/s so far
    finish_reason: str | None = None  # "stop" (EOS), "length", or None while running


class Engine:
    def __init__(self, cfg: ModelConfig, weights_source, backend, max_context: int | None = None,
                 max_chunk: int | None = None, tokenizer=None, chat_template=None, device_note: str = ""):
        self.cfg, self.backend = cfg, backend
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.device_note = device_note
        limit = cfg.max_position_embeddings
        if cfg.sliding_window:
            limit = min(limit, cfg.sliding_window)
        if max_context is None:
            max_context = min(limit, DEFAULT_MAX_CONTEXT)
        if not 2 <= max_context <= limit:
            raise ToolkitError(f"--max-context must be between 2 and {limit} for this model, got {max_context}")
        self.max_context = max_context
        max_chunk = min(max_chunk or DEFAULT_MAX_CONTEXT, max_context)
        self.weights = load_weights(weights_source, cfg, backend.from_host)
        self.model = Model(cfg, self.weights, backend, max_context, max_chunk)
        self.weight_bytes = self.weights.nbytes()

    @classmethod
    def load(cls, model_dir, device: str = "auto", max_context: int | None = None,
             dtype: str | None = None, max_chunk: int | None = None) -> "Engine":
        """Load a Hugging Face model folder onto the chosen backend."""
        from .chat_template import ChatTemplate
        from .tokenizer import Tokenizer

        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ToolkitError(f"{model_dir}: no such model folder")
        cfg = ModelConfig.from_dir(model_dir)
        tokenizer = Tokenizer.from_dir(model_dir)
        template = ChatTemplate.from_dir(model_dir)
        backend_name, note = resolve_device(device)
        if dtype is None and backend_name == "cuda":
            # Run 16-bit checkpoints in their own dtype; fp32 ones stay fp32.
            dtype = {"float16": "float16", "bfloat16": "bfloat16"}.get(cfg.torch_dtype, "float32")
        backend = make_backend(backend_name, dtype)
        engine = cls(cfg, Checkpoint(model_dir), backend, max_context, max_chunk, tokenizer, template, note)
        engine.warmup()
        return engine

    def warmup(self):
        """Run a 2-token prefill and a decode step once, so one-off costs (Numba's thread pool,
        CUDA module loading, cuBLAS handles) don't land in the first request's timings."""
        timer = self.backend.timer()
        self.model.forward(np.zeros(2, np.int32), 0, timer)
        self.model.forward(np.zeros(1, np.int32), 2, timer)
        self.backend.synchronize()

    # -- running the model --------------------------------------------------------
    def _forward(self, ids, start_pos: int, timer, all_logits=False):
        """Run `ids` from `start_pos` in chunks; returns the last chunk's logits and section times."""
        sections, out = {}, []
        step = self.model.max_chunk
        for lo in range(0, len(ids), step):
            logits = self.model.forward(ids[lo:lo + step], start_pos + lo, timer, all_logits)
            if all_logits:
                out.append(self.backend.to_host(logits))
            if lo + step < len(ids):  # only intermediate chunks; the caller closes the last one
                for k, v in timer.sections_ms().items():
                    sections[k] = sections.get(k, 0.0) + v
        return (np.concatenate(out) if all_logits else logits), sections

    def logits(self, ids) -> np.ndarray:
        """fp32 logits [T, V] at every position of `ids` (tests, perplexity)."""
        self._check_length(len(ids))
        logits, _ = self._forward(np.asarray(ids, np.int32), 0, self.backend.timer(), all_logits=True)
        return logits

    def _check_length(self, n_prompt: int):
        if n_prompt == 0:
            raise ToolkitError("the prompt is empty (no tokens)")
        if n_prompt >= self.max_context:
            raise ToolkitError(f"the prompt has {n_prompt} tokens but the context holds {self.max_context} "
                               "(raise --max-context or shorten the prompt)")

    def generate(self, prompt_ids, max_tokens: int = 256, temperature: float = 0.0,
                 seed: int | None = None, ignore_eos: bool = False) -> Iterator[GenerationResponse]:
        """Prefill `prompt_ids`, then decode up to `max_tokens` tokens, one response per token."""
        from .detokenizer import StreamingDetokenizer

        ids = np.asarray(prompt_ids, dtype=np.int32)
        self._check_length(len(ids))
        sample = make_sampler(temperature, seed)
        detok = StreamingDetokenizer(self.tokenizer) if self.tokenizer else None
        eos = set() if ignore_eos or self.tokenizer is None else set(self.tokenizer.eos_ids)
        stats = RunStats(prompt_tokens=len(ids))
        timer = self.backend.timer()
        pos, feed = 0, ids
        for n in range(max_tokens):
            t0 = time.perf_counter()
            logits, sections = self._forward(feed, pos, timer)
            token = sample(logits, self.backend)
            timer.lap("sampling")
            for k, v in timer.sections_ms().items():
                sections[k] = sections.get(k, 0.0) + v
            t1 = time.perf_counter()
            finished = "stop" if token in eos else None
            text = "" if finished or detok is None else detok.add_token(token)
            pos += len(feed)
            if not finished and (n + 1 == max_tokens or pos >= self.max_context):
                finished = "length"
            if finished and detok is not None:
                text += detok.finalize()
            t2 = time.perf_counter()
            step = StepTiming("prefill" if n == 0 else "decode", len(feed), (t2 - t0) * 1e3,
                              sections, (t2 - t1) * 1e3)
            if n == 0:
                stats.prefill_ms = step.total_ms
            else:
                stats.decode_ms.append(step.total_ms)
            if finished != "stop":
                stats.generated_tokens += 1
            yield GenerationResponse(text, token, step, stats, finished)
            if finished:
                return
            feed = np.array([token], dtype=np.int32)

    def gbps(self, stats: RunStats) -> float:
        """Weight bytes read per decode step x decode steps per second."""
        return self.weight_bytes * stats.decode_tps / 1e9

