"""The Python API, in vLLM's shape:

    from toolkit import LLM, SamplingParams

    llm = LLM("weights/tiny-pd", device="cpu")                 # engine options as keywords: sampler_fast_path=False
    outs = llm.generate(["Once upon a time", "The cat"], SamplingParams(max_tokens=32))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids, outs[0].outputs[0].finish_reason, outs[0].timings
    llm.chat([{"role": "user", "content": "Hello"}])           # the model's chat template, then generate

`LLM` builds its engine with build_engine (toolkit/engine/build.py), as `python -m toolkit generate` does, and
drives it through LLMEngine.add_request / step: every prompt of a call is queued at once and the scheduler batches
them (continuous batching); the results come back in prompt order. With `params=None` a request samples with the
model's generation_config.json (get_default_sampling_params: the CLI's defaults); a SamplingParams given is used
as it is, as in vLLM.

A result's `token_ids` and `text` are the CLI's JSONL `token_ids` and `text`: a stop token (EOS, stop_token_ids)
ends the request but is not part of them, nor is a stop string.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from toolkit.engine.options import EngineOptions
from toolkit.errors import ToolkitError
from toolkit.sampler.params import DEFAULT_MAX_TOKENS, SamplingParams

_calls = itertools.count()


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a request (vLLM's CompletionOutput)."""
    index: int
    text: str
    token_ids: list
    finish_reason: str | None  # "stop" (EOS, a stop token or string), "length", "abort" or "error"
    logprobs: list | None = None  # with params.logprobs: per token {"token", "logprob", "rank", "top"}
    error: str | None = None  # why, when finish_reason is "error"


@dataclass(frozen=True)
class RequestResult:
    """One prompt's result (vLLM's RequestOutput): `outputs[0]` is its completion, `timings` its timing record
    (toolkit/engine/timings.py RequestStats: prefill and decode ms, tok/s, cached tokens)."""
    request_id: str
    prompt: str  # the prompt text (for chat, the rendered template)
    prompt_token_ids: list
    outputs: list
    timings: object
    seed: int | None = None  # the sampling seed used (drawn at random when the params gave none)
    finished: bool = True


class LLM:
    def __init__(self, model=None, *, device: str = "auto", dtype: str | None = None, max_context: int | None = None,
                 seed: int | None = None, kv_cache_tokens: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, warmup: bool = True, **engine_options):
        """model: a Hugging Face model folder or Hub id "ORG/NAME[@REVISION]" (None: the default model,
        weights/tiny-pd). device: "auto" (CUDA when usable), "cuda" or "cpu". seed: requests whose params give
        no seed get one drawn from this, in order, so a run repeats. engine_options: EngineOptions fields
        (sampler_fast_path=False, sparse_topk=256, ...); an unknown keyword is a TypeError."""
        from toolkit.engine.build import build_engine, default_model

        options = EngineOptions(**engine_options)  # an unknown keyword: EngineOptions' own TypeError, naming it
        options.validate()
        if model is None:
            model = default_model()
            if model is None:
                raise ToolkitError("no model given and the default model (weights/tiny-pd) is absent")
        self.engine = build_engine(model, device=device, dtype=dtype, max_context=max_context,
                                   kv_cache_tokens=kv_cache_tokens, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens, options=options, warmup=warmup)
        self._seeds = np.random.default_rng(seed) if seed is not None else None

    # -- parameters -------------------------------------------------------------------------------------------
    def get_default_sampling_params(self) -> SamplingParams:
        """The CLI's defaults: max_tokens 256 under the model's generation_config.json."""
        return SamplingParams(**{"max_tokens": DEFAULT_MAX_TOKENS, **getattr(self.engine, "generation_defaults", {})})

    def _params(self, params, sampling_params, n: int) -> list:
        if params is None:
            params = sampling_params if sampling_params is not None else self.get_default_sampling_params()
        elif sampling_params is not None:
            raise TypeError("give params or sampling_params, not both")
        if isinstance(params, SamplingParams):
            params = [params] * n
        else:
            params = list(params)
            if len(params) != n:
                raise ValueError(f"{len(params)} SamplingParams for {n} prompts: give one, or one per prompt")
            for p in params:
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"params must be SamplingParams, got {type(p).__name__}")
        if self._seeds is not None:
            params = [p if p.seed is not None else replace(p, seed=int(self._seeds.integers(2 ** 64, dtype=np.uint64)))
                      for p in params]
        return params

    # -- generate / chat ----------------------------------------------------------------------------------------
    def generate(self, prompts, params=None, *, sampling_params=None) -> list[RequestResult]:
        """prompts: a str or a list of str. params (or vLLM's spelling, sampling_params): one SamplingParams for
        all, or one per prompt (None: get_default_sampling_params()). One result per prompt, in order."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise TypeError(f"prompt {i} must be a str, got {type(p).__name__}")
        tok = self._tokenizer()
        return self._run(prompts, [tok.encode(p) for p in prompts], self._params(params, sampling_params, len(prompts)))

    def chat(self, messages, params=None, *, sampling_params=None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None, allow_special_in_content: bool = False) -> list[RequestResult]:
        """messages: one conversation (a list of {"role", "content"} dicts) or a list of conversations. Each is
        rendered with the model's chat template (toolkit/text/chat_template.py) and generated as a prompt; one
        result per conversation, in order. chat_template_kwargs reach the template (enable_thinking=False).
        A special token's string inside a content ("<|im_start|>") is text, unless allow_special_in_content."""
        template = self.engine.chat_template
        if template is None:
            raise ToolkitError("this model has no chat template (chat_template.jinja, or chat_template in "
                               "tokenizer_config.json): use generate() with plain prompts")
        convs = list(messages) if isinstance(messages, (list, tuple)) else messages
        if not isinstance(convs, list) or not convs:
            raise ToolkitError("chat messages must be a non-empty list of {'role', 'content'} dicts, or a list "
                               "of such lists")
        if isinstance(convs[0], dict):
            convs = [convs]
        kw = {"add_generation_prompt": add_generation_prompt, **(chat_template_kwargs or {})}
        texts = [template.render(c, **kw) for c in convs]
        tok = self._tokenizer()
        # The template writes BOS and the role markers itself: no special tokens are added (as the CLI's --chat).
        ids = [template.encode(c, tok, allow_special_in_content, **kw) for c in convs]
        return self._run(texts, ids, self._params(params, sampling_params, len(convs)))

    def _tokenizer(self):
        if self.engine.tokenizer is None:
            raise ToolkitError("this engine has no tokenizer (a --shape model): it cannot take text prompts")
        return self.engine.tokenizer

    def _run(self, prompts: list, ids: list, params: list) -> list[RequestResult]:
        """Queue every request, step the engine until all have finished (LLMEngine does the scheduling)."""
        engine = self.engine
        if engine.has_unfinished():
            raise ToolkitError("the engine is busy: another generate() is still running on it")
        call = next(_calls)
        parts = {}  # request id -> [index, token ids, text pieces, logprobs or None]
        done = {}  # index -> RequestResult
        try:
            for i, (prompt_ids, p) in enumerate(zip(ids, params)):
                try:
                    rid = engine.add_request(prompt_ids, p, request_id=f"llm{call}-{i}")
                except ToolkitError as e:
                    raise ToolkitError(f"prompt {i}: {e}") from None
                parts[rid] = [i, [], [], [] if p.logprobs is not None else None]
            while engine.has_unfinished():
                for o in engine.step():
                    part = parts.get(o.request_id)
                    if part is None:
                        continue
                    i, tokens, text, logprobs = part
                    if o.token is not None and o.finish_reason != "stop":  # as the CLI's records (records.py)
                        tokens.append(o.token)
                        if logprobs is not None and o.logprobs is not None:
                            logprobs.extend(o.logprobs if isinstance(o.logprobs, list) else [o.logprobs])
                    text.append(o.text)
                    if o.finish_reason is None:
                        continue
                    out = CompletionOutput(0, "".join(text), tokens, o.finish_reason, logprobs, o.error)
                    done[i] = RequestResult(o.request_id, prompts[i], list(ids[i]), [out], o.stats, o.seed)
        except BaseException:
            # Leave the engine idle for the next call: abort what is still queued, and drain.
            for rid, (i, *_) in parts.items():
                if i not in done:
                    engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
            raise
        return [done[i] for i in range(len(prompts))]
