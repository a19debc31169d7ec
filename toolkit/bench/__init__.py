"""Benchmarks behind `python -m toolkit bench`, written against the batched engine's public API.

`speed` times prefill and decode llama-bench style (one row per test and switch
setting), `throughput` runs nano-vllm's many-request workload, `sweep` and
`report` hold the comma-list parsing, statistics and table rendering both share.
"""
