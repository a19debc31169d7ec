"""The step plan (toolkit/model/plan.py): which kernel runs each op, decided in one place from (backend, dtype,
rows, decode rows, context bucket, options). Checked on the CPU with stand-in backends at the Qwen2.5-0.5B shape,
where the thresholds were measured; the GPU tests run the plans."""
from types import SimpleNamespace

import pytest

from toolkit.engine.options import EngineOptions
from toolkit.backends.cuda_wg import CTAS, T_COLS
from toolkit.model.plan import TUNED_MIN_ROWS, WG_DECODE_ROWS, StepPlan, make_plan, tuned_calls
from toolkit.model.shapes import shape_config

GPU = SimpleNamespace(name="cuda", dtype="bfloat16", num_sms=132, sm90=True, graphs_supported=True, pdl_supported=True)
CPU = SimpleNamespace(name="cpu", dtype="float32", num_sms=0, sm90=False, graphs_supported=False, pdl_supported=False)
QWEN = shape_config("qwen2.5-0.5b")  # H 896, I 4864, 14 q heads / 2 kv heads of 64, no q/k norms
QWEN3 = shape_config("qwen3-0.6b")  # q/k norms
AMPERE = SimpleNamespace(**{**vars(GPU), "sm90": False})  # no wgmma


def plan(rows, decodes=None, backend=GPU, cfg=QWEN, ctx=256, **toggles):
    opts = EngineOptions(**toggles).effective(backend)
    return make_plan(backend, cfg, rows, rows if decodes is None else decodes, ctx, opts)


def test_batch_1_decode_is_our_gemv_path():
    p = plan(1)
    assert (p.qkv, p.o, p.gate_up, p.swiglu, p.down) == ("gemv_rope", "gemv", "gemv", "epilogue", "gemv")
    assert plan(1, cfg=QWEN3).qkv == "gemv"  # q/k norms need the whole head: RoPE stays its own kernel
    assert p.lm_head == "blas"  # 151,936 rows: cuBLAS measured faster than our GEMV
    assert p.decode_attention == "cuda_cores"  # a small batch at a short context spreads a group over blocks
    assert p.pdl and p.sparse is None


@pytest.mark.parametrize("rows", [2, 8, 32])
def test_2_to_32_rows_are_the_skinny_path(rows):
    p = plan(rows, backend=AMPERE)
    assert p.qkv == "skinny_rope" and p.o == "skinny_norm" and p.swiglu == "scaled"
    assert p.gate_up == "blas"  # 8.7M weights: past gemm_skinny's limit
    assert p.down == "slices" and p.down_slices == 8
    assert plan(rows, cfg=QWEN3).qkv == "skinny"  # q/k norms need the whole head: RoPE stays its own kernel



def test_past_32_rows_cublas_and_4_slices():
    p = plan(64, backend=AMPERE)
    assert (p.qkv, p.o, p.gate_up, p.swiglu) == ("blas", "blas", "blas", "silu_mul")
    assert (p.down, p.down_slices) == ("slices", 4)
    assert plan(256).down == "blas"


@pytest.mark.parametrize("cfg", [QWEN, QWEN3, shape_config("llama-3.2-1b")], ids=lambda c: f"I{c.intermediate_size}")
def test_decode_gate_up_runs_wg_on_hopper(cfg):
    """A pure decode step of WG_DECODE_ROWS rows on Hopper runs gate_up on our wgmma GEMM with SwiGLU in its
    epilogue (gemm_wg.cu), under fused_kernels, with the o projection plain (its RMSNorm in add_rmsnorm); not a
    prompt's rows, not elsewhere, not with the toggle off."""
    lo, hi = WG_DECODE_ROWS
    for rows in sorted({lo, (lo + hi) // 2, hi}):
        p = plan(rows, cfg=cfg)
        assert p.gate_up == "wg" and p.swiglu == "epilogue" and "gate_up wg swiglu" in p.describe()
        assert p.o in ("skinny", "blas")
        assert plan(rows, cfg=cfg, fused_kernels=False).gate_up == "blas"
        assert plan(rows, cfg=cfg, backend=AMPERE).gate_up in ("blas", "skinny")
        assert plan(rows, decodes=rows - 1, cfg=cfg).gate_up == "blas"  # a prompt's rows stay on cuBLAS
    assert plan(lo - 1, cfg=cfg).gate_up != "wg" and plan(hi + 1, cfg=cfg).gate_up != "wg"
    assert plan(4096, decodes=0, cfg=cfg).gate_up == "tuned"
    with pytest.raises(ValueError):
        StepPlan(gate_up="wg")  # wg has no plain form: its epilogue is SwiGLU


def test_wg_only_where_gate_ups_tiles_fit_one_wave():
    """Qwen2.5-1.5B's I = 8,960 is 280 tiles of T_COLS columns, past one wave of two blocks on 132 SMs: cuBLAS, and
    the o projection's RMSNorm epilogue stays."""
    cfg = shape_config("qwen2.5-1.5b")
    assert -(-cfg.intermediate_size // T_COLS) > CTAS * GPU.num_sms
    p = plan(8, cfg=cfg)
    assert p.gate_up == "blas" and p.o == "skinny_norm" and p.swiglu == "scaled"


def test_prompt_steps_stay_on_cublas():
    """A prompt's projections do not depend on how much of it a prefix-cache hit left to compute."""
    p = plan(8, decodes=4)
    assert (p.qkv, p.o, p.gate_up, p.down) == ("blas",) * 4 and p.down_slices == 0
    assert p.prefill_attention == "wg" and p.sparse is not None  # Hopper: wgmma
    assert plan(8, decodes=4, backend=AMPERE).prefill_attention == "tc"  # elsewhere mma.sync


@pytest.mark.parametrize("rows", [512, 4096])
def test_prompt_sized_steps_run_measured_cublas_algorithms(rows):
    """From TUNED_MIN_ROWS rows on the GPU's projections are "tuned" (the cuBLAS algorithm measured fastest for the
    shape), whatever the toggles; below them, on the CPU and in fp32 they stay plain cuBLAS / BLAS."""
    for p in (plan(rows, decodes=0), plan(rows, decodes=3), plan(rows, decodes=0, fused_kernels=False)):
        assert (p.qkv, p.o, p.gate_up, p.down) == ("tuned",) * 4 and p.swiglu == "silu_mul"
    assert plan(TUNED_MIN_ROWS - 1, decodes=0).gate_up == "blas"
    assert plan(rows, decodes=0, backend=CPU).gate_up == "blas"
    assert plan(rows, decodes=0, backend=SimpleNamespace(**{**vars(GPU), "dtype": "float32"})).gate_up == "blas"
    with pytest.raises(ValueError):
        StepPlan(gate_up="tuned", swiglu="epilogue")  # cuBLAS has no SwiGLU epilogue, tuned or not


def test_start_up_measures_every_tuned_bucket_a_step_can_reach():
    """tuned_calls lists what the engine's warm-up runs so no request pays for a measurement: the four layer
    projections at each power-of-two bucket from TUNED_MIN_ROWS to the engine's rows (the last bucket at those rows),
    the lm_head at each bucket of 1 to max_seqs rows (a prompt step's last rows); nothing where no step is tuned."""
    opts = EngineOptions().effective(GPU)
    calls = tuned_calls(GPU, QWEN, 8192, 256, opts)
    layer = [(name, n) for n in (512, 1024, 2048, 4096, 8192) for name in ("qkv", "o", "gate_up", "down")]
    assert calls == layer + [("lm_head", n) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    # Rows between powers of two: the last bucket is measured at the engine's rows, which no step exceeds.
    assert [n for name, n in tuned_calls(GPU, QWEN, 6000, 3, opts) if name == "down"] == [512, 1024, 2048, 4096, 6000]
    assert [n for name, n in tuned_calls(GPU, QWEN, 6000, 3, opts) if name == "lm_head"] == [1, 2, 3]
    assert [n for name, n in tuned_calls(GPU, QWEN, 700, 1, opts)] == [512] * 4 + [700] * 4 + [1]
    # Every listed call is one a step of that many rows runs tuned; a bucket's rows never exceed the engine's.
    for name, n in calls:
        assert getattr(make_plan(GPU, QWEN, max(n, TUNED_MIN_ROWS), 0, 256, opts), name) == "tuned"
    assert tuned_calls(GPU, QWEN, TUNED_MIN_ROWS - 1, 256, opts) == []
    assert tuned_calls(CPU, QWEN, 8192, 256, EngineOptions().effective(CPU)) == []
    fp32 = SimpleNamespace(**{**vars(GPU), "dtype": "float32"})
    assert tuned_calls(fp32, QWEN, 8192, 256, EngineOptions().effective(fp32)) == []


def test_fused_kernels_off_is_cublas_and_plain_kernels():
    for rows in (1, 8, 32):
        p = plan(rows, fused_kernels=False)
        assert (p.qkv, p.o, p.gate_up, p.swiglu, p.down, p.lm_head) == ("blas", "blas", "blas", "silu_mul", "blas",
                                                                        "blas")


def test_tensor_core_decode_where_it_pays():
    assert plan(32).decode_attention == "tc"  # one block a GQA group either way: tensor cores measured faster
    assert plan(1).decode_attention == "cuda_cores"
    assert plan(1, ctx=8192).decode_attention == "stream"  # a long context bucket streams (decode_stream_pays)


def test_cpu_and_fp32_plans_are_blas_and_cuda_cores():
    for backend in (CPU, SimpleNamespace(**{**vars(GPU), "dtype": "float32"})):
        for rows in (1, 8, 64):
            p = plan(rows, backend=backend)
            assert p == StepPlan(pdl=p.pdl)
    assert plan(1, backend=CPU).pdl is False


def test_graph_key_holds_what_changes_a_graph():
    """The runner keys a decode graph on (batch bucket, context bucket, plan, sampler path): flipping a toggle
    that changes a decode step's kernels changes its plan; the others leave it alone (they act elsewhere)."""
    base = plan(32)
    changes = {n: plan(32, **{n: False}) != base for n in EngineOptions.names()}
    assert changes == {"sampler_fast_path": False, "sparse_prefill": False, "prefix_caching": False,
                       "cuda_graphs": True,  # (PDL needs graphs: an eager step's plan has no PDL)
                       "fused_kernels": True, "pdl": True}


def test_hand_built_plans_are_checked():
    with pytest.raises(ValueError):
        StepPlan(o="skinny_norm")  # needs swiglu "scaled"
    with pytest.raises(ValueError):
        StepPlan(down="slices")  # needs a slice count
    with pytest.raises(ValueError):
        StepPlan(swiglu="epilogue")  # cuBLAS has no SwiGLU epilogue
    assert "8 slices" in plan(8).describe()
