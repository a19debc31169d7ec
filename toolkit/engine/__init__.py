"""The batched runtime: sequence -> block manager -> scheduler -> runner -> engine (-> worker).

    sequence.py       one request: tokens, KV blocks, parameters, progress
    block_manager.py  KV blocks: free list, reference counts, prefix hashes
    scheduler.py      who runs next, with how many tokens; preemption
    runner.py         stage the step, run it (eagerly or as a CUDA graph), sample
    llm_engine.py     add_request / step / abort: the public API
    worker.py         the engine on its own thread, for UIs
"""
from .llm_engine import LLMEngine, RequestOutput
from .sequence import SamplingParams

__all__ = ["LLMEngine", "RequestOutput", "SamplingParams"]
