"""The PyTorch reference on the same GPU: Hugging Face transformers, random weights.

Builds Qwen2ForCausalLM from the same shape `python -m toolkit bench --shape`
uses, in bf16, and times (CUDA events, medians) a prefill of each length and
greedy decode at batch 1 with the KV cache, so our numbers can be read as
ratios measured in the same run on the same card.

    python benchmarks/bench_torch.py --shape qwen2.5-0.5b --attn sdpa
"""
import argparse
import json
import statistics

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from toolkit.shapes import _SHAPES


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--attn", default="sdpa", choices=("eager", "sdpa"))
    p.add_argument("--prefill", default="512,4096")
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**{k: v for k, v in _SHAPES[args.shape].items() if k != "torch_dtype"})
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation=args.attn)
    model = model.cuda().eval()
    vocab = cfg.vocab_size
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "attn": args.attn}

    def timed(fn):
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    with torch.inference_mode():
        for P in [int(x) for x in args.prefill.split(",")]:
            ids = torch.randint(0, vocab, (1, P), device="cuda")
            run = lambda: model(ids, use_cache=False, logits_to_keep=1)  # noqa: E731
            run()
            out[f"pp{P}_ms"] = statistics.median(timed(run) for _ in range(args.repeats))
        ids = torch.randint(0, vocab, (1, 16), device="cuda")

        def decode():
            o = model(ids, use_cache=True)
            past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
            for _ in range(args.decode):
                o = model(tok, past_key_values=past, use_cache=True)
                past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
            tok.item()

        decode()
        prefill_ms = timed(lambda: model(ids, use_cache=True))
        runs = [timed(decode) for _ in range(3)]
        per_step = (statistics.median(runs) - prefill_ms) / args.decode
        out[f"tg{args.decode}_tok_per_s"] = 1e3 / per_step
    print(json.dumps(out))


if __name__ == "__main__":
    main()
