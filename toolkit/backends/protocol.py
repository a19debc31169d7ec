"""The op interface both backends implement; `model.py` and the runner call nothing else.

Backends are stateless: every op takes all of its inputs as arguments (the
step's positions, slots and block tables included) and writes into the output
it is given. A backend holds only what never changes between steps: the
stream, library handles, compiled kernels and their per-shape workspaces.
Arrays are the backend's own (NumPy on the CPU, CuPy on the GPU).
"""
from typing import Protocol

import numpy as np


class Backend(Protocol):
    name: str  # "cpu" | "cuda"
    dtype: str  # compute/storage dtype: "float32" | "float16" | "bfloat16"

    # -- memory ----------------------------------------------------------------------------------------
    def from_host(self, a: np.ndarray): ...  # host floats -> backend array in the compute dtype
    def from_host_f32(self, a: np.ndarray): ...  # host floats -> fp32 backend array (tables)
    def empty(self, shape, dtype=None): ...  # uninitialised, compute dtype unless given
    def to_host(self, a) -> np.ndarray: ...  # -> fp32 NumPy copy (synchronises)
    def int_buffer(self, n: int) -> tuple: ...  # (host int32[n], backend int32[n]) staging pair
    def upload(self, host: np.ndarray, dev, n: int) -> None: ...  # dev[:n] = host[:n], asynchronous

    # -- ops (kernels/<op>.cu and their CPU twins kernels/<op>.py) ------------------------------------
    def linear(self, x, w, out, small_batch_gemv: bool = False) -> None: ...  # out[T, N] = x[T, K] @ w[N, K].T
    def embedding(self, ids, table, out) -> None: ...  # out[t] = table[ids[t]] (also a row gather)
    def add_rmsnorm(self, x, residual, weight, eps: float, out) -> None: ...
    def silu_mul(self, gate_up, out) -> None: ...
    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads: int,
                 n_kv_heads: int, q_out, k_cache, v_cache) -> None: ...
    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size: int, scale: float,
                         out, max_seq_len: int) -> None: ...
    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                          block_size: int, scale: float, out, max_query_len: int,
                          tensor_cores: bool) -> None: ...
    def argmax(self, logits, out) -> None: ...  # out int32[R] = row-wise argmax of fp32 logits[R, V]

    # -- step plumbing -------------------------------------------------------------------------------------
    def bind_thread(self) -> None: ...  # run this thread's launches on the backend's stream
    def ids_to_host(self, dev, n: int) -> np.ndarray: ...  # int32 dev[:n] -> host; the step's one sync
    def section_timer(self): ...  # per-section laps (eager steps)
    def step_clock(self): ...  # start()/stop()/elapsed_ms() around a whole step, read after its sync
    def synchronize(self) -> None: ...
