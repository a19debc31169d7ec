"""The whole decode step with the sampler's fast path on and off, every request sampling with the default model's
settings (T 0.8, top-k 40, top-p 0.95, repetition penalty 1.1): the end-to-end check of issue 35 (`bench` decodes
with plain sampling, where both paths are the same kernel).

    python3 dev/sampler_decode_ab.py [--shape qwen2.5-0.5b] [--batch 128] [--steps 48] [-r 5]

Prints the median device ms per pure decode step (CUDA graphs on) for each path, alternating on/off runs so drift
hits both, and their ratio.
"""
import argparse
import statistics

import numpy as np

from toolkit.bench.speed import _step
from toolkit.engine.build import build_engine
from toolkit.engine.options import EngineOptions
from toolkit.sampler.params import SamplingParams

DEFAULT = dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1)


def run(engine, batch: int, steps: int, prompt_len: int, rng) -> float:
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, **DEFAULT)
    for _ in range(batch):
        engine.add_request(rng.integers(0, engine.cfg.vocab_size, prompt_len), params)
    timed = []
    while engine.has_unfinished():
        timed += [o.step for o in _step(engine)[:1] if o.step.kind == "decode" and o.step.n_seqs == batch]
    return statistics.median(s.gpu_ms for s in timed)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens (the penalties' history)")
    p.add_argument("-r", "--repeats", type=int, default=5)
    a = p.parse_args()
    engine = build_engine(shape=a.shape, device="cuda", max_num_seqs=a.batch)
    rng = np.random.default_rng(0)
    ms = {True: [], False: []}
    for i in range(2 * a.repeats + 2):
        fast = i % 2 == 0
        engine.set_options(EngineOptions(sampler_fast_path=fast))
        t = run(engine, a.batch, a.steps, a.prompt, rng)
        if i >= 2:  # one warm-up run each way (graph capture)
            ms[fast].append(t)
    on, off = statistics.median(ms[True]), statistics.median(ms[False])
    print(f"{a.shape} batch {a.batch}, default-model sampling, {a.repeats} runs each, median ms per decode step")
    print(f"fast path on  {on:.3f}  ({', '.join(f'{x:.3f}' for x in ms[True])})")
    print(f"fast path off {off:.3f}  ({', '.join(f'{x:.3f}' for x in ms[False])})")
    print(f"off / on = {off / on:.3f}")


if __name__ == "__main__":
    main()
