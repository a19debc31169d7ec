"""Named model shapes for `bench`: real architectures, random weights, no download.

The numbers are copied from each model's config.json on the Hugging Face hub.
"""
from toolkit.model.config import ModelConfig
from toolkit.errors import ToolkitError

_SHAPES = {
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                         tie_word_embeddings=True, torch_dtype="bfloat16"),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                         tie_word_embeddings=True, torch_dtype="bfloat16"),
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
                       tie_word_embeddings=True, torch_dtype="bfloat16"),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                         tie_word_embeddings=True, torch_dtype="bfloat16",
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Small enough for a CPU smoke test of the bench itself.
    "tiny": dict(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=688,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048,
                 tie_word_embeddings=True, torch_dtype="float32"),
}

NAMES = tuple(_SHAPES)


def shape_config(name: str) -> ModelConfig:
    if name not in _SHAPES:
        raise ToolkitError(f"unknown shape {name!r} (known: {', '.join(_SHAPES)})")
    return ModelConfig.from_dict(_SHAPES[name], source=f"shape {name}")
