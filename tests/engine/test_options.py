"""EngineOptions.effective: a switch the backend cannot honour reads as off, so each step's record says what ran."""
from toolkit.engine.options import EngineOptions


def test_rope_in_gemm_reads_as_on_only_where_its_kernel_runs():
    assert EngineOptions().rope_in_gemm is True
    assert EngineOptions().effective("cuda", "bfloat16").rope_in_gemm is True
    assert EngineOptions().effective("cuda", "float32").rope_in_gemm is False  # gemm_skinny is 16-bit
    assert EngineOptions().effective("cpu", "float32").rope_in_gemm is False
    assert EngineOptions(skinny_gemm=False).effective("cuda", "bfloat16").rope_in_gemm is False
    both = EngineOptions(rope_in_attention=True).effective("cuda", "bfloat16")  # the attention does RoPE then
    assert both.rope_in_attention is True and both.rope_in_gemm is False


def test_stream_gemm_reads_as_on_only_on_the_gpu_in_16_bit():
    assert EngineOptions().stream_gemm is False  # measured slower than cuBLAS in the step
    on = EngineOptions(stream_gemm=True)
    assert on.effective("cuda", "bfloat16").stream_gemm is True
    assert on.effective("cuda", "float16").stream_gemm is True
    assert on.effective("cuda", "float32").stream_gemm is False  # tensor cores take 16-bit inputs
    assert on.effective("cpu", "bfloat16").stream_gemm is False


def test_split_down_is_a_gpu_switch():
    assert EngineOptions().split_down is True
    assert EngineOptions().effective("cuda", "float32").split_down is True  # cuBLAS takes every dtype
    assert EngineOptions().effective("cpu", "float32").split_down is False


def test_norm_in_gemm_rides_on_skinny_gemm():
    assert EngineOptions().norm_in_gemm is True
    assert EngineOptions().effective("cuda", "bfloat16").norm_in_gemm is True
    assert EngineOptions().effective("cuda", "float32").norm_in_gemm is False  # gemm_skinny takes 16-bit inputs
    assert EngineOptions(skinny_gemm=False).effective("cuda", "bfloat16").norm_in_gemm is False
    assert EngineOptions().effective("cpu", "bfloat16").norm_in_gemm is False
