"""Write a trained llama.Llama as a Hugging Face model folder (the format the toolkit's loader reads).

Files: model.safetensors (bf16, HF Llama tensor names, no lm_head.weight: tied), config.json,
tokenizer.json (copied), tokenizer_config.json (ChatML chat template), generation_config.json,
training.json (settings and results from train.py).

Special tokens: <|endoftext|> (id 0) separates documents in training and is the EOS token; <|im_start|> (1)
and <|im_end|> (2) frame chat messages. No BOS token is added to prompts (add_bos_token false, bos_token null),
because training windows start anywhere in the text, not after a marker; config.json's bos_token_id is 0 only
for tools that insist on a number (as Qwen2.5 does). Generation stops at <|endoftext|> or <|im_end|>.

--export-parts: the GPU box returns at most 8 files of at most 16 MB, so the folder (less tokenizer.json) is also
copied to a directory with model.safetensors cut into <= 15 MB pieces plus its SHA-256; weights/join_parts.sh
puts it back together.
"""
import hashlib, json, os, shutil

import torch
from safetensors.torch import save_file

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PART_BYTES = 15 * 1000 * 1000


@torch.no_grad()
def round_to_bf16(model):
    """Round every parameter to bf16 in place (the model keeps computing in fp32) and return the bf16 state dict
    under HF names. After this the in-memory model is exactly the exported one."""
    out = {}
    for name, t in model.hf_state_dict().items():
        b = t.detach().to(torch.bfloat16)
        t.copy_(b.to(t.dtype))
        out[name] = b.cpu().contiguous()
    return out


def hf_config(cfg):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "initializer_range": 0.02,
        "pretraining_tp": 1, "use_cache": True, "bos_token_id": 0, "eos_token_id": 0,
    }


def tokenizer_config(cfg):
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, s in enumerate(SPECIAL)}
    return {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": added, "additional_special_tokens": SPECIAL[1:],
        "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position_embeddings, "tokenizer_class": "PreTrainedTokenizerFast",
    }


# Sampling defaults chosen with experiments/repetition.py (greedy decoding of this model loops within a few lines).
GENERATION_CONFIG = {"bos_token_id": 0, "eos_token_id": [0, 2], "pad_token_id": 0,
                     "do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export(state, cfg, out, results, tokenizer=None, parts_dir=None):
    os.makedirs(out, exist_ok=True)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out, "config.json"), hf_config(cfg))
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(cfg))
    write_json(os.path.join(out, "generation_config.json"), GENERATION_CONFIG)
    write_json(os.path.join(out, "training.json"), results)
    if tokenizer and os.path.exists(tokenizer) and os.path.abspath(tokenizer) != os.path.abspath(
            os.path.join(out, "tokenizer.json")):
        shutil.copyfile(tokenizer, os.path.join(out, "tokenizer.json"))
    if parts_dir:
        write_parts(out, parts_dir)


def write_parts(folder, parts_dir):
    """Copy the folder to parts_dir with model.safetensors split into model.safetensors.partNN (<= 15 MB).
    tokenizer.json is left out: it is train_tokenizer.py's output, already where the run started (and the box
    returns at most 8 files)."""
    os.makedirs(parts_dir, exist_ok=True)
    for name in os.listdir(folder):
        if name not in ("model.safetensors", "tokenizer.json"):
            shutil.copyfile(os.path.join(folder, name), os.path.join(parts_dir, name))
    blob = open(os.path.join(folder, "model.safetensors"), "rb").read()
    for i in range(0, len(blob), PART_BYTES):
        with open(os.path.join(parts_dir, f"model.safetensors.part{i // PART_BYTES:02d}"), "wb") as f:
            f.write(blob[i:i + PART_BYTES])
    with open(os.path.join(parts_dir, "model.safetensors.sha256"), "w") as f:
        f.write(hashlib.sha256(blob).hexdigest() + "  model.safetensors\n")
