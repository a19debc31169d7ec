"""Whole prefill, dense against sparse, on the engine (Qwen2.5-0.5B shape, random weights, bf16, H200):
one prompt of 4,096 / 16,384 / 32,000 tokens, eager (so each step has its per-section split), the second of
two runs reported; sparse with the default query tile (64) and with a selection per query (Q = 1), then dense. Run from the repo root: `PYTHONPATH=. python3 experiments/sparse_sections.py`."""
import numpy as np
from toolkit.engine.build import build_engine
from toolkit.engine.options import EngineOptions
from toolkit.engine import SamplingParams
e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=32100, kv_cache_tokens=33000,
                 max_num_seqs=4, max_num_batched_tokens=32768, options=EngineOptions(cuda_graphs=False))
rng = np.random.default_rng(0)
for T in (4096, 16384, 32000):
    for on, Q in ((True, 64), (True, 1), (False, 64)):
        e.set_options(EngineOptions(cuda_graphs=False, sparse_prefill=on, prefix_caching=False, sparse_query_tile=Q,
                                    sparse_max_keep_pct=100))  # the sparse kernels at every length
        for rep in range(2):
            ids = rng.integers(0, 1000, T).tolist()
            outs = list(e.generate(ids, SamplingParams(max_tokens=1, ignore_eos=True)))
        st = outs[0].step
        sec = {k: round(v, 3) for k, v in st.sections_ms.items() if v}
        print(f"T={T} sparse={on} Q={Q} path={st.prefill_path} gpu_ms={st.gpu_ms:.2f} sections(24 layers)={sec}", flush=True)
