"""CPU backend speed alone and with a second copy running at once, for 1 and 2 BLAS threads.

    python experiments/cpu_contention.py [--model DIR]

Runs `python -m toolkit bench` (default model, batch-1 decode and a 256-token prefill) as one process,
then as two concurrent processes, for TOOLKIT_BLAS_THREADS=1 and 2, and prints decode tok/s and prefill
ms for each. This is the measurement behind the CPU backend's one-BLAS-thread default.
"""
import argparse
import json
import os
import subprocess
import sys

CMD = [sys.executable, "-m", "toolkit", "bench", "--device", "cpu", "--batch", "1", "--depth", "0",
       "--prefill", "256", "--decode", "64", "-r", "3", "--format", "json"]


def run(n_procs: int, blas: int, model: str | None) -> list[dict]:
    env = dict(os.environ, TOOLKIT_BLAS_THREADS=str(blas), OMP_WAIT_POLICY="passive")
    cmd = CMD + (["--model", model] if model else [])
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(n_procs)]
    out = []
    for p in procs:
        rows = {r["test"]: r for r in json.loads(p.communicate()[0])["results"]}
        out.append({"decode_tok_s": rows["tg64@b1 d0"]["tok_per_s"], "prefill_ms": rows["pp256"]["ms"]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    print(f"{'BLAS threads':>12} {'processes':>9}   decode tok/s (each)      prefill 256 ms (each)")
    for blas in (1, 2):
        for n in (1, 2):
            res = run(n, blas, args.model)
            dec = ", ".join(f"{r['decode_tok_s']:.0f}" for r in res)
            pre = ", ".join(f"{r['prefill_ms']:.1f}" for r in res)
            print(f"{blas:>12} {n:>9}   {dec:<24} {pre}", flush=True)


if __name__ == "__main__":
    main()
