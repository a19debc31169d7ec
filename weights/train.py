"""Train the default model on train.bin, evaluate it on val.bin, export a Hugging Face folder (needs PyTorch).

Deterministic given --seed: the model init, the data order and the dropout masks all derive from it. Data
order: in epoch e the training windows are ctx+1 tokens starting at shift_e + ctx*k (k = 0..n-1, shift_e in
[0, ctx) drawn from default_rng(seed + e)), visited in the permutation drawn from the same generator; step s
takes windows s*batch .. s*batch+batch-1 of that endless sequence. So the position in the data is a function
of the step alone, and a resumed run sees exactly the batches an uninterrupted one would.

Schedule: AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine decay to
--min-lr-frac of the peak; bf16 autocast on CUDA; gradient clipping at 1.0.

Chunks: a checkpoint (model, optimiser, RNG states, best weights, log) goes to --ckpt every --ckpt-every steps,
and whenever --max-minutes of wall time have passed (then the script exits 0: run it again with --resume).
When the last step is done it evaluates, exports (export_hf.py) and writes <out>/training.json.

Usage (the real run is weights/run_h200.sh):
  python3 train.py --steps 1500 --max-minutes 6 [--resume] [--compile] [--export-parts DIR]
  python3 train.py --preset tiny --steps 20 --device cpu      (smoke test)
"""
import argparse, json, math, os, sys, time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama import Llama, LlamaConfig, count_parameters  # noqa: E402
import export_hf  # noqa: E402

PRESETS = {  # "default" is the shipped model; "tiny" only exercises the code on a CPU
    "default": dict(hidden_size=384, intermediate_size=768, num_hidden_layers=8, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=64, max_position_embeddings=1024),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, max_position_embeddings=128),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--data", default=os.path.join(HERE, "data"), help="folder with train.bin, val.bin, tokens.json")
    a("--out", default=os.path.join(HERE, "tiny-pd"), help="model folder to export into")
    a("--ckpt", default=None, help="checkpoint file (default <data>/ckpt.pt)")
    a("--preset", default="default", choices=sorted(PRESETS))
    a("--steps", type=int, default=1500)
    a("--batch", type=int, default=64, help="sequences per step")
    a("--lr", type=float, default=2e-3)
    a("--min-lr-frac", type=float, default=0.1)
    a("--warmup", type=int, default=100)
    a("--weight-decay", type=float, default=0.1)
    a("--dropout", type=float, default=0.2)
    a("--seed", type=int, default=1337)
    a("--eval-every", type=int, default=250)
    a("--ckpt-every", type=int, default=500)
    a("--max-minutes", type=float, default=None, help="wall budget of this invocation; checkpoint and exit")
    a("--resume", action="store_true")
    a("--compile", action="store_true", help="torch.compile the training model")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--export-parts", default=None, help="also copy the exported folder here, model.safetensors in <=15 MB parts")
    a("--export-only", action="store_true", help="skip training: evaluate and export the checkpoint")
    return ap.parse_args()


class Windows:
    """The deterministic data order described in the module docstring."""

    def __init__(self, tokens, ctx, batch, seed):
        self.ctx, self.batch, self.seed = ctx, batch, seed
        self.n = (len(tokens) - 1) // ctx - 1    # windows per epoch; shift + ctx*(n-1) + ctx + 1 <= len
        self._epoch, self._starts = None, None

    def starts(self, epoch):
        if epoch != self._epoch:
            rng = np.random.default_rng(self.seed + epoch)
            shift = int(rng.integers(0, self.ctx))
            self._starts = rng.permutation(shift + self.ctx * np.arange(self.n))
            self._epoch = epoch
        return self._starts

    def batch_starts(self, step):
        g = step * self.batch + np.arange(self.batch)
        return np.array([self.starts(e)[k] for e, k in zip(g // self.n, g % self.n)])


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, tokens, ctx, device, autocast, batch=16):
    """Mean next-token NLL over `tokens` cut into non-overlapping windows of ctx tokens (the last one may be
    shorter, >= 2 tokens). Each window is a fresh sequence at positions 0..len-1; its first token is context
    only, every later token is predicted from the tokens before it in the window.
    -> (mean NLL, #predicted tokens, [NLL sum of each window])."""
    model.eval()
    windows = [tokens[i:i + ctx] for i in range(0, len(tokens), ctx) if len(tokens[i:i + ctx]) >= 2]
    sums = []
    for j in range(0, len(windows), batch):
        group = windows[j:j + batch]
        for size in sorted({len(w) for w in group}, reverse=True):   # a short last window: its own batch
            x = torch.from_numpy(np.stack([w for w in group if len(w) == size]).astype(np.int64)).to(device)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
                logits = model(x[:, :-1])
            nll = F.cross_entropy(logits.float().transpose(1, 2), x[:, 1:], reduction="none")  # [B, T-1]
            sums += nll.double().sum(1).tolist()
    model.train()
    count = sum(len(w) - 1 for w in windows)
    return sum(sums) / count, count, sums


def sample_train(tokens, ctx, n, seed):
    """n fixed training windows (for a train-loss figure comparable with the validation one)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([tokens[s:s + ctx] for s in rng.integers(0, len(tokens) - ctx, n)])


def settings(args):
    """The command-line settings, paths relative to weights/ so training.json does not record a machine."""
    out = {k: v for k, v in vars(args).items() if k not in ("resume", "export_parts", "export_only")}
    for k in ("data", "out", "ckpt"):
        if out[k]:
            out[k] = os.path.relpath(out[k], HERE)
    return out


def save_ckpt(path, state):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)     # never leave a half-written checkpoint behind


def main():
    args = parse_args()
    t_start = time.time()
    ckpt_path = args.ckpt or os.path.join(args.data, "ckpt.pt")
    meta = json.load(open(os.path.join(args.data, "tokens.json")))
    train_tok = np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16)
    val_tok = np.fromfile(os.path.join(args.data, "val.bin"), dtype=np.uint16)
    cfg = LlamaConfig(vocab_size=meta["vocab_size"], dropout=args.dropout, **PRESETS[args.preset])
    ctx, device = cfg.max_position_embeddings, args.device
    torch.manual_seed(args.seed)
    model = Llama(cfg).to(device)
    print(f"model: {count_parameters(cfg):,} parameters {cfg.to_dict()}")
    assert count_parameters(cfg) == sum(p.numel() for p in model.parameters())

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=device.startswith("cuda"))
    step, best, log, train_seconds = 0, None, [], 0.0
    if args.resume or args.export_only:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, best, log, train_seconds = ck["step"], ck["best"], ck["log"], ck["train_seconds"]
        torch.set_rng_state(ck["rng_cpu"])
        if device.startswith("cuda") and ck.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ck["rng_cuda"])
        print(f"resumed at step {step} ({train_seconds:.0f} s trained so far)")

    def checkpoint():
        nonlocal train_seconds, t_chunk
        now = time.time()
        train_seconds, t_chunk = train_seconds + now - t_chunk, now
        save_ckpt(ckpt_path, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "best": best,
                              "log": log, "train_seconds": train_seconds, "config": cfg.to_dict(),
                              "args": vars(args), "rng_cpu": torch.get_rng_state(),
                              "rng_cuda": torch.cuda.get_rng_state() if device.startswith("cuda") else None})

    t_chunk = time.time()
    autocast = device.startswith("cuda")
    fwd = torch.compile(model) if args.compile else model
    data = torch.from_numpy(train_tok.astype(np.int64)).to(device)
    windows = Windows(train_tok, ctx, args.batch, args.seed)
    offsets = torch.arange(ctx + 1, device=device)
    tokens_per_step = args.batch * ctx
    print(f"data: {len(train_tok):,} train tokens ({windows.n} windows/epoch), {len(val_tok):,} val tokens; "
          f"{args.steps} steps x {tokens_per_step:,} tokens = {args.steps * tokens_per_step / len(train_tok):.1f} epochs")
    model.train()
    while step < args.steps and not args.export_only:
        x = data[torch.from_numpy(windows.batch_starts(step)).to(device)[:, None] + offsets]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            logits = fwd(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == args.steps:
            loss_v = loss.item()      # syncs the device, so the timing below is real
            now = time.time()
            train_seconds += now - t_chunk
            t_chunk = now
            print(f"step {step:5d}  loss {loss_v:.4f}  lr {lr_at(step - 1, args):.2e}  "
                  f"{step * tokens_per_step / train_seconds:,.0f} tok/s avg  {now - t_start:.0f} s wall", flush=True)
            log.append({"step": step, "loss": round(loss_v, 4)})
        if step % args.eval_every == 0 or step == args.steps:
            loss.item()                                   # sync: evaluation time is not training time
            train_seconds, t_chunk = train_seconds + time.time() - t_chunk, time.time()
            vl, _, _ = evaluate(model, val_tok, ctx, device, autocast)
            t_chunk = time.time()
            log.append({"step": step, "val_loss": round(vl, 4)})
            if best is None or vl < best["val_loss"]:   # keep the best weights in case later epochs overfit
                best = {"step": step, "val_loss": vl,
                        "state": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}}
            print(f"step {step:5d}  val loss {vl:.4f}  (best {best['val_loss']:.4f} at step {best['step']})", flush=True)
        if step % args.ckpt_every == 0 and step < args.steps:
            checkpoint()
        if args.max_minutes is not None and time.time() - t_start > 60 * args.max_minutes and step < args.steps:
            checkpoint()
            print(f"budget of {args.max_minutes} min reached at step {step}: checkpoint written, run again with --resume")
            return
    if not args.export_only:
        checkpoint()

    # ---- final evaluation and export (on the best weights, rounded to bf16 exactly as exported)
    if best is not None:
        model.load_state_dict(best["state"])
    final_step = best["step"] if best else step
    val_autocast, _, _ = evaluate(model, val_tok, ctx, device, autocast)       # as evaluated during training
    exported = export_hf.round_to_bf16(model)            # the same numbers the toolkit will load
    val_loss, n_pred, window_sums = evaluate(model, val_tok, ctx, device, autocast=False)
    train_loss, _, _ = evaluate(model, sample_train(train_tok, ctx, len(val_tok) // ctx + 1, args.seed), ctx,
                                device, autocast=False)
    results = {
        "model": os.path.basename(os.path.normpath(args.out)), "parameters": count_parameters(cfg),
        "config": cfg.to_dict(), "settings": settings(args),
        "steps_trained": step, "exported_step": final_step, "tokens_per_step": tokens_per_step,
        "epochs": round(step * tokens_per_step / len(train_tok), 2),
        "train_tokens": len(train_tok), "val_tokens": len(val_tok), "val_predicted_tokens": n_pred,
        "val_loss": round(val_loss, 5), "val_ppl": round(math.exp(val_loss), 4),
        "train_loss": round(train_loss, 5), "val_loss_bf16_autocast": round(val_autocast, 5),
        "eval_procedure": "bf16-rounded exported weights, fp32 math; mean NLL over every predicted token of val.bin "
                          f"cut into non-overlapping {ctx}-token windows (positions restart at 0, first token of a "
                          "window is context only; the last window may be shorter); ppl = exp(mean NLL). "
                          "train_loss: the same on a fixed sample of training windows",
        "val_window_nll_sums": [round(v, 4) for v in window_sums],
        "train_seconds": round(train_seconds, 1), "wall_seconds_this_run": round(time.time() - t_start, 1),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "log": log,
    }
    export_hf.export(exported, cfg, args.out, results, tokenizer=os.path.join(args.data, "tokenizer.json"),
                     parts_dir=args.export_parts)
    print(f"exported step {final_step} to {args.out}: val loss {val_loss:.4f}  val ppl {math.exp(val_loss):.3f}  "
          f"train loss {train_loss:.4f}  ({n_pred:,} val tokens predicted; bf16 weights, fp32 math)")


if __name__ == "__main__":
    main()
