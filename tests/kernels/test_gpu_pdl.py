"""Programmatic dependent launch (toolkit/backends/cuda_launch.py, kernels/pdl.cuh) changes no bit.

A kernel launched with PDL starts while the previous one still runs; if it read its input before
pdl_wait(), it would see the previous layer's values. So: the decode-step kernels of several layers at
Qwen2.5-0.5B's shapes, each reading what the one before it wrote, launched with PDL (eagerly, and replayed
from a CUDA graph) must give exactly the hidden states of plain launches. Skipped without a GPU.
"""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402

from toolkit.backends.cuda_kernels import STORAGE  # noqa: E402

pytestmark = pytest.mark.gpu

H, HQ, HKV, D, I, LAYERS, BS, SLOTS = 896, 14, 2, 64, 4864, 6, 16, 128


def layers(rng, dt):
    def w(*shape, scale=0.05):
        return dev(rounded(scale * rng.standard_normal(shape), dt), dt)

    def norm():
        return dev(rounded(1 + 0.1 * rng.standard_normal(H), dt), dt)

    return [dict(qkv=w((HQ + 2 * HKV) * D, H), o=w(H, HQ * D), gu=w(2 * I, H), down=w(H, I), n1=norm(),
                 n2=norm(), k=w(SLOTS, HKV, D, scale=1.0), v=w(SLOTS, HKV, D, scale=1.0)) for _ in range(LAYERS)]


def buffers(first_pos: int, n_steps: int, dt: str) -> dict:
    """Everything the steps use besides weights and caches, allocated before any capture."""
    half = np.arange(D // 2)
    ang = np.arange(SLOTS)[:, None] / 10000.0 ** (2 * half / D)
    z = lambda *shape: cp.zeros(shape, STORAGE[dt])  # noqa: E731  (bf16: its uint16 bits)
    return dict(cos=cp.asarray(np.cos(ang), cp.float32), sin=cp.asarray(np.sin(ang), cp.float32),
                x=z(1, H), qkv=z(1, (HQ + 2 * HKV) * D), q=z(1, HQ, D), attn=z(1, HQ, D), o=z(1, H), gu=z(1, 2 * I),
                act=z(1, I), mlp=z(1, H), tables=cp.arange(SLOTS // BS, dtype=cp.int32).reshape(1, -1),
                pos=[cp.full(1, p, cp.int32) for p in range(first_pos, first_pos + n_steps)],
                lens=[cp.full(1, p + 1, cp.int32) for p in range(first_pos, first_pos + n_steps)],
                outs=[z(1, H) for _ in range(n_steps)])


def decode_steps(k, Ls, h, b: dict, fused: bool, attention: str = "decode_attention"):
    """Batch-1 decode steps of the layers Ls on the residual h [1, H] (in place), as Model.forward runs them
    (fused: the gate_up GEMV with SwiGLU as its epilogue, else gemv then silu_mul; attention: the decode kernel);
    step i's h lands in b["outs"][i]."""
    attention = getattr(k, attention)
    for pos, lens, out in zip(b["pos"], b["lens"], b["outs"]):
        for i, L in enumerate(Ls):
            k.add_rmsnorm(None if i == 0 else b["mlp"], h, L["n1"], 1e-6, b["x"])
            k.gemv(b["x"], L["qkv"], b["qkv"])
            k.rope_qkv(b["qkv"], None, None, None, 1e-6, b["cos"], b["sin"], pos, pos, HQ, HKV, b["q"], L["k"],
                       L["v"])
            attention(b["q"], L["k"], L["v"], b["tables"], lens, BS, D ** -0.5, b["attn"], SLOTS)
            k.gemv(b["attn"].reshape(1, -1), L["o"], b["o"])
            k.add_rmsnorm(b["o"], h, L["n2"], 1e-6, b["x"])
            if fused:
                k.gemv_swiglu(b["x"], L["gu"], b["act"])
            else:
                k.gemv(b["x"], L["gu"], b["gu"])
                k.silu_mul(b["gu"], b["act"])
            k.gemv(b["act"], L["down"], b["mlp"])
        k.add_rmsnorm(b["mlp"], h, Ls[0]["n1"], 1e-6, b["x"])  # the last MLP output joins the residual
        cp.copyto(out, h)


def run(pdl: bool, fused: bool, graph: bool, dt: str, attention: str = "decode_attention"):
    from toolkit.backends.cuda_kernels import CudaKernels

    k = CudaKernels(dt).with_pdl() if pdl else CudaKernels(dt)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        Ls = layers(np.random.default_rng(3), dt)  # the same weights and caches every run
        h = dev(rounded(np.random.default_rng(4).standard_normal((1, H)), dt), dt)
        b = buffers(20, 4, dt)
        if graph:
            decode_steps(k, Ls, h.copy(), buffers(20, 1, dt), fused, attention)  # compile outside the capture
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
            decode_steps(k, Ls, h, b, fused, attention)
            stream.end_capture().launch(stream)
        else:
            decode_steps(k, Ls, h, b, fused, attention)
        stream.synchronize()
        return np.stack([cp.asnumpy(o) for o in b["outs"]]), [cp.asnumpy(L["k"]) for L in Ls]


@pytest.mark.parametrize("dt, attention", [("bfloat16", "decode_attention"), ("float32", "decode_attention"),
                                           ("bfloat16", "decode_attention_tc"),
                                           ("bfloat16", "decode_attention_stream")])
@pytest.mark.parametrize("fused", [False, True])
def test_pdl_launches_change_no_bit(fused, dt, attention):
    """decode_attention_tc and _stream start loading their first K/V tiles before their PDL wait (all
    but the new key, which rope_qkv writes just before it)."""
    want, want_k = run(pdl=False, fused=fused, graph=False, dt=dt, attention=attention)
    vals = (want.astype(np.uint32) << 16).view(np.float32) if dt == "bfloat16" else want
    assert np.isfinite(vals).all() and vals.any()
    assert len({w.tobytes() for w in want}) == len(want)  # each step moves h: a stale read would show
    for graph in (False, True):
        got, got_k = run(pdl=True, fused=fused, graph=graph, dt=dt, attention=attention)
        np.testing.assert_array_equal(got, want, err_msg=f"PDL, graph={graph}")
        for a, b in zip(got_k, want_k):
            np.testing.assert_array_equal(a, b)


def test_pdl_twin_backend_shares_everything_but_the_launch():
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    if not be.pdl_supported:
        pytest.skip("no PDL here (before Hopper, or without cuda-bindings)")
    twin = be.with_pdl()
    assert twin is not be and be.with_pdl() is twin and twin.with_pdl() is twin
    assert twin.kernels.pdl and not be.kernels.pdl
    assert twin.stream is be.stream and twin._gemm is be._gemm
    assert twin.kernels._decode_plans is be.kernels._decode_plans  # one set of decode workspaces
