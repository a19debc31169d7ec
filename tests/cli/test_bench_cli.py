"""`python -m toolkit bench` and `bench throughput`: table, sweep and statistics logic on a fake engine
with exact step times, then the real engine on the CPU (tiny shape and the default model)."""
import json
import math
import sys
from types import SimpleNamespace

import pytest
from tests.conftest import FIXTURES

import toolkit.cli.bench as bench_cli
from toolkit.__main__ import main
from toolkit.bench.sampler import MODES
from toolkit.bench.speed import prefill_flops
from toolkit.bench.sweep import fmt, int_list, mean_std, percentile, switch_list
from toolkit.bench.throughput import workload
from toolkit.engine.options import EngineOptions
from toolkit.model.shapes import shape_config
from toolkit.model.weights import expected_tensors


class FakeEngine:
    """The engine's public surface, scheduling FIFO: one step prefills every waiting prompt, else all decode.

    Step times are exact (prefill 0.01 ms/token, decode 1 + 0.1 ms/sequence) so rows can be checked to the digit.
    """

    def __init__(self, max_context=512, kv_cache_tokens=8192, max_num_seqs=8, max_num_batched_tokens=2048):
        self.cfg = shape_config("tiny")
        self.backend = SimpleNamespace(name="cpu", dtype="float32")
        self.weight_bytes, self.max_context, self.kv_cache_tokens = 10**6, max_context, kv_cache_tokens
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.options, self.device_note, self.scheduler = EngineOptions(), "fake", SimpleNamespace(policy="mixed")
        self.waiting, self.running, self.index, self.next_id, self.set_calls = [], [], 0, 0, []

    def set_options(self, options):
        self.options = options
        self.set_calls.append(options)

    def add_request(self, prompt, params):
        self.next_id += 1
        self.waiting.append(SimpleNamespace(id=str(self.next_id), prompt=len(prompt), left=params.max_tokens, out=0))
        return str(self.next_id)

    def abort(self, rid):
        self.running = [r for r in self.running if r.id != rid]

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def step(self):
        if self.waiting:
            batch, kind = self.waiting, "prefill"
            self.running += self.waiting
            self.waiting = []
            n_tokens, ms = sum(r.prompt for r in batch), 0.01 * sum(r.prompt for r in batch)
        else:
            batch, kind, n_tokens = list(self.running), "decode", len(self.running)
            ms = 1 + 0.1 * len(batch)
        self.index += 1
        step = SimpleNamespace(index=self.index, kind=kind, n_tokens=n_tokens, n_seqs=len(batch), gpu_ms=ms,
                               wall_ms=ms + 0.5, graph=False, cached_tokens=0,
                               options=self.options.effective(SimpleNamespace(name="cpu", dtype="float32",
                                                                               graphs_supported=False,
                                                                               pdl_supported=False)))
        outs = []
        for r in batch:
            r.left, r.out = r.left - 1, r.out + 1
            done = r.left == 0
            if done:
                self.running.remove(r)
            if kind == "prefill":  # the request's prefill totals: this step's whole time, as the engine counts it
                r.prefill = (step.gpu_ms, step.wall_ms)
            stats = SimpleNamespace(prompt_tokens=r.prompt, generated_tokens=r.out, cached_tokens=0, ttft_ms=5.0,
                                    preemptions=0, prefill_gpu_ms=r.prefill[0], prefill_ms=r.prefill[1])
            outs.append(SimpleNamespace(request_id=r.id, token=1, error=None, step=step, stats=stats,
                                        finish_reason="length" if done else None))
        return outs


@pytest.fixture
def fake(monkeypatch):
    made = []

    def build(args, backend_name, max_context, kv_tokens, max_seqs, step_tokens, options, **extra):
        made.append(FakeEngine(max_context=min(max_context, 512), max_num_seqs=max_seqs or 8))
        made[-1].extra = extra
        made[-1].scheduler.policy = extra.get("scheduler_policy", "mixed")
        return made[-1]
    monkeypatch.setattr(bench_cli, "_build", build)
    return made


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_parsing():
    assert int_list(1)("1,8, 32,8") == [1, 8, 32]
    assert switch_list("on,off,ON") == [True, False]
    for bad in ("abc", "0", ""):
        with pytest.raises(Exception):
            int_list(1)(bad)
    with pytest.raises(Exception):
        switch_list("maybe")


@pytest.mark.parametrize("argv", [["--prefill", "abc"], ["--batch", "0"], ["--cuda-graphs", "maybe"],
                                  ["--format", "xml"], ["throughput", "--num-requests", "x"],
                                  ["throughput", "--scheduler", "fifo"]])
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench"] + argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_stats_formatting():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([4.0]) == (4.0, 0.0)
    assert fmt(1234.5678, 1.25) == "1234.57 ± 1.25" and fmt(0.5, None, 3) == "0.500" and fmt(None) == "-"
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile(range(101), 99) == 99
    assert fmt(percentile([], 50)) == "-"


def test_rows_and_switch_sweep(fake, capsys):
    data = _json(capsys, ["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "100", "--batch", "1,4",
                          "--depth", "0,600", "--decode", "5", "-r", "3", "--warmup", "0",
                          "--prefix-caching", "on,off", "--cuda-graphs", "on,off", "--format", "json"])
    rows = data["results"]
    # graphs on/off run the same on the CPU: one setting is dropped with a note; depth 600 exceeds the context.
    assert [(r["test"], r["switches"]["prefix_caching"]) for r in rows] == [
        ("pp100", True), ("pp100", False), ("tg5@b1 d0", True), ("tg5@b1 d0", False),
        ("tg5@b4 d0", True), ("tg5@b4 d0", False)]
    assert any("skipped tg5@b1 d600" in n and "context" in n for n in data["notes"])
    assert "cuda_graphs=on runs as off on cpu float32" in data["notes"]
    pp, tg4 = rows[0], rows[4]
    assert pp["ms"] == pytest.approx(1.0) and pp["tok_per_s"] == pytest.approx(1e5) and pp["gb_per_s"] is None
    assert tg4["ms"] == pytest.approx(1.4) and tg4["tok_per_s"] == pytest.approx(4 / 1.4e-3)
    assert tg4["wall_ms"] == pytest.approx(1.9) and tg4["ms_std"] == 0 and tg4["repeats"] == 3
    assert tg4["gb_per_s"] > 0 and tg4["hbm_pct"] is None  # no roofline on the CPU
    assert len(fake[0].set_calls) == 6


def test_markdown_table_and_peak_flag(fake, capsys):
    assert main(["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "64", "--batch", "2",
                 "--depth", "0", "--decode", "4", "-r", "2", "--peak-gbps", "100"]) == 0
    out = capsys.readouterr().out
    switches = " | ".join(EngineOptions.names())  # one column per switch, whatever switches exist
    assert f"| test | impl | {switches} | ms | wall ms | tok/s | GB/s | % HBM |" in out
    assert ("| tg4@b2 d0 | toolkit | on | on | on | off | off | off "  # the CPU runs the first three toggles
            "| 1.200 ± 0.000 | "
            "1.700 ± 0.000 | 1666.67 ± 0.00 |") in out
    assert "x peer" not in out and "backend: cpu" in out


class FakePeer:
    label = "torch-fake"
    model = SimpleNamespace(cfg=shape_config("tiny"))

    def __init__(self, cfg, dtype, device, max_batch, max_seq_len, compile):
        assert (max_batch, compile) == (2, True)

    def decode_ms_per_step(self, batch, depth, steps, repeats):
        return [2.4] * repeats

    def prefill_ms(self, length, repeats):
        return [0.32] * repeats


def test_peer_rows_and_ratio(fake, capsys, monkeypatch):
    monkeypatch.setattr(bench_cli, "_peer_class", lambda device: FakePeer)
    data = _json(capsys, ["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "64", "--batch", "2",
                          "--depth", "0", "--decode", "4", "-r", "2", "--peer", "torch", "--format", "json"])
    rows = data["results"]
    assert [r["impl"] for r in rows] == ["toolkit", "torch-fake", "toolkit", "torch-fake"]
    assert rows[0]["vs_peer"] == pytest.approx(0.32 / 0.64) and rows[2]["vs_peer"] == pytest.approx(2.0)
    assert rows[1]["switches"] is None and data["environment"]["peer"] == "torch-fake"
    flops = prefill_flops(shape_config("tiny"), 64)
    assert rows[0]["tflops"] == pytest.approx(flops / 0.64e-3 / 1e12)  # the fake engine: 0.01 ms a token
    assert rows[1]["tflops"] == pytest.approx(flops / 0.32e-3 / 1e12) and rows[2]["tflops"] is None


def test_peer_only_builds_no_engine(fake, capsys, monkeypatch):
    """`bench suite`'s process for a cell whose two caches do not fit in one: the peer's rows alone."""
    monkeypatch.setattr(bench_cli, "_peer_class", lambda device: FakePeer)
    data = _json(capsys, ["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "64", "--batch", "2",
                          "--depth", "0", "--decode", "4", "-r", "2", "--peer", "torch", "--peer-only",
                          "--format", "json"])
    assert fake == [] and [(r["test"], r["impl"]) for r in data["results"]] == [
        ("pp64", "torch-fake"), ("tg4@b2 d0", "torch-fake")]
    assert data["results"][1]["tok_per_s"] == pytest.approx(2 / 2.4e-3) and data["results"][1]["gb_per_s"] is None
    env = data["environment"]
    assert env["peer"] == "torch-fake" and env["dtype"] == "float32" and "kv_cache_tokens" not in env


def test_a_peer_that_cannot_be_built_is_a_note(fake, capsys, monkeypatch):
    class NoRoom(FakePeer):
        def __init__(self, *args, **kw):
            raise MemoryError("CUDA out of memory. Tried to allocate 120.00 GiB")
    monkeypatch.setattr(bench_cli, "_peer_class", lambda device: NoRoom)
    argv = ["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "64", "--batch", "2", "--depth", "0",
            "--decode", "4", "-r", "1", "--peer", "torch", "--format", "json"]
    data = _json(capsys, argv)
    assert [r["impl"] for r in data["results"]] == ["toolkit", "toolkit"]
    assert data["notes"] == ["peer skipped: MemoryError: CUDA out of memory. Tried to allocate 120.00 GiB"]
    assert main(argv + ["--peer-only"]) == 2  # the peer alone and no peer: nothing to time
    assert capsys.readouterr().err.endswith("error: --peer-only: the peer could not be built: MemoryError: CUDA out "
                                            "of memory. Tried to allocate 120.00 GiB\n")


@pytest.mark.parametrize("flags,tests", [
    (["--prefill", "64", "--decode", "0"], ["pp64"]),  # llama-bench's -n 0: no decode tests
    (["--decode", "0"], ["pp64", "pp256"]),  # the default prefills, not nothing
    (["--prefill", "0", "--batch", "2", "--decode", "4"], ["tg4@b2 d0", "tg4@b2 d128"]),  # -p 0
])
def test_zero_prefill_or_decode_means_none_of_that_kind(flags, tests, fake, capsys):
    data = _json(capsys, ["bench", "--device", "cpu", "--shape", "tiny", "-r", "1", *flags, "--format", "json"])
    assert [r["test"] for r in data["results"]] == tests


@pytest.mark.parametrize("flags,error", [
    (["--prefill", "0", "--decode", "0"], "error: --prefill 0 with --decode 0 leaves no test to run"),
    (["--peer-only"], "error: --peer-only needs --peer torch"),
])
def test_nothing_to_time_is_a_usage_error(flags, error, capsys):
    assert main(["bench", "--device", "cpu", "--shape", "tiny", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == error


def test_prefill_flops_count_every_weight_matrix_once_per_token():
    """Against the parameter count: 2 FLOPs per weight of every layer matrix and token, the causal score and value
    products, and the lm_head for the last token only (our prefill and the peer's compute no other logits)."""
    for name in ("qwen2.5-0.5b", "llama-3.2-1b", "tiny"):
        cfg = shape_config(name)
        matrices = sum(math.prod(s) for n, s in expected_tensors(cfg).items() if n.startswith("model.layers.")
                       and n.endswith("proj.weight"))
        attention = cfg.num_layers * 2 * 2 * cfg.num_heads * cfg.head_dim * (4096 * 4097 // 2)
        assert prefill_flops(cfg, 4096) == pytest.approx(2 * matrices * 4096 + attention
                                                         + 2 * cfg.vocab_size * cfg.hidden_size)


def test_a_peer_failure_skips_its_cell_with_a_note(fake, capsys, monkeypatch):
    """The peer running out of memory in one cell (as torch.compile's did at batch 128 x 8K) costs that cell its
    ratio, not the run: the other cells keep theirs and the note names the cell and the error."""
    class OutOfMemoryAtDepth(FakePeer):
        def decode_ms_per_step(self, batch, depth, steps, repeats):
            if depth:
                raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
            return super().decode_ms_per_step(batch, depth, steps, repeats)
    monkeypatch.setattr(bench_cli, "_peer_class", lambda device: OutOfMemoryAtDepth)
    data = _json(capsys, ["bench", "--device", "cpu", "--shape", "tiny", "--prefill", "64", "--batch", "2",
                          "--depth", "0,16", "--decode", "4", "-r", "2", "--peer", "torch", "--format", "json"])
    assert [(r["test"], r["impl"], r["vs_peer"] is not None) for r in data["results"]] == [
        ("pp64", "toolkit", True), ("pp64", "torch-fake", False), ("tg4@b2 d0", "toolkit", True),
        ("tg4@b2 d0", "torch-fake", False), ("tg4@b2 d16", "toolkit", False)]
    assert data["notes"] == ["peer skipped tg4@b2 d16: MemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]


def test_peer_without_torch_is_one_line(capsys, monkeypatch):
    # A stand-in for toolkit/bench/peer.py on a machine without torch (importing the real one costs seconds).
    fake_peer = SimpleNamespace(TorchPeer=None, torch_available=lambda device=None: False)
    monkeypatch.setitem(sys.modules, "toolkit.bench.peer", fake_peer)
    assert main(["bench", "--device", "cpu", "--shape", "tiny", "--peer", "torch"]) == 2
    assert capsys.readouterr().err == "error: --peer torch: PyTorch is not installed\n"


def test_throughput_on_fake(fake, capsys):
    data = _json(capsys, ["bench", "throughput", "--device", "cpu", "--shape", "tiny", "--num-requests", "6",
                          "--min-len", "10", "--max-len", "20", "--format", "json"])
    (row,) = data["results"]
    assert row["requests"] == 6 and row["errors"] == 0 and row["preemptions"] == 0
    assert 60 <= row["output_tokens"] <= 120 and row["output_tok_per_s"] > 0
    assert row["ttft_ms_p50"] == 5.0 and row["itl_ms_p99"] >= row["itl_ms_p50"] >= 0
    # device s: the fake's exact step times, one prefill of every prompt (0.01 ms a token), then decode steps of
    # 1 + 0.1 ms a running request (each request's first token came with the prefill)
    prompts, outs, _ = workload(6, 10, 20, 40, 4096, seed=0)
    want = 0.01 * sum(map(len, prompts)) + sum(1 + 0.1 * sum(o > t for o in outs) for t in range(1, max(outs)))
    assert row["device_s"] == pytest.approx(want / 1e3)  # (the fake's wall is not its made-up device time)


def test_throughput_workload_fits_the_context():
    prompts, outs, note = workload(256, 100, 1024, 1024, 4096, seed=0)
    assert len(prompts) == 256 and "capped at 512" in note
    assert all(100 <= len(p) <= 512 and 100 <= o <= 512 for p, o in zip(prompts, outs))
    again, _, _ = workload(256, 100, 1024, 4096, 4096, seed=0)
    assert max(map(len, again)) > 900 and (again[0] == workload(256, 100, 1024, 4096, 4096, seed=0)[0][0]).all()


def test_scheduler_sweep(fake, capsys):
    data = _json(capsys, ["bench", "throughput", "--device", "cpu", "--shape", "tiny", "--num-requests", "2",
                          "--min-len", "4", "--max-len", "8", "--scheduler", "mixed,alternate", "--format", "json"])
    assert [r["scheduler"] for r in data["results"]] == ["mixed", "alternate"]
    assert [e.extra for e in fake] == [{"scheduler_policy": "mixed"}, {"scheduler_policy": "alternate"}]


# -- the real engine on the CPU ----------------------------------------------------------------------------------

SMALL = ["--device", "cpu", "--prefill", "16", "--batch", "1,2", "--depth", "0,8", "--decode", "4", "-r", "2",
         "--warmup", "0"]


def test_tiny_shape_json_and_markdown(capsys):
    data = _json(capsys, ["bench", "--shape", "tiny", *SMALL, "--format", "json"])
    rows = data["results"]
    assert [r["test"] for r in rows] == ["pp16", "tg4@b1 d0", "tg4@b2 d0", "tg4@b1 d8", "tg4@b2 d8"]
    assert all(r["tok_per_s"] > 0 and r["ms"] > 0 and r["repeats"] == 2 for r in rows)
    assert all(r["timed_steps"] == 4 for r in rows[1:]), "every timed step is pure decode at the full batch"
    assert rows[0]["switches"] == {"cuda_graphs": False, "prefix_caching": True, "fused_kernels": False,
                                   "pdl": False, "sampler_fast_path": True, "sparse_prefill": True,
                                   "sparse_topk": 512, "sparse_window": 128, "sparse_block": 4,
                                   "sparse_query_tile": 64, "sparse_max_keep_pct": 50}
    assert data["environment"]["backend"] == "cpu" and data["notes"] == []
    assert main(["bench", "--shape", "tiny", *SMALL[:-4], "-r", "1", "--depth", "0"]) == 0
    out = capsys.readouterr().out
    assert "| pp16 | toolkit | on | on | on | off | off | off |" in out and "| tg4@b2 d0 | toolkit |" in out


def test_defaults_on_the_default_model(capsys):
    """The default model, lengths, batches and depths on the CPU; fewer steps and runs keep the test short."""
    data = _json(capsys, ["bench", "--device", "cpu", "--decode", "4", "-r", "1", "--warmup", "0", "--format", "json"])
    assert [r["test"] for r in data["results"]] == [
        "pp64", "pp256", "tg4@b1 d0", "tg4@b4 d0", "tg4@b1 d128", "tg4@b4 d128"]


def test_lengths_past_the_context_are_skipped(capsys):
    data = _json(capsys, ["bench", "--shape", "tiny", "--device", "cpu", "--prefill", "16,4096", "--batch", "1",
                          "--depth", "5000", "--decode", "2", "-r", "1", "--warmup", "0", "--format", "json"])
    assert [r["test"] for r in data["results"]] == ["pp16"]
    assert len(data["notes"]) == 2 and all("context" in n for n in data["notes"])


def test_a_prefill_over_the_step_budget_is_timed_over_its_chunks(capsys):
    """pp96 with 32 tokens a step: three steps, their device time summed, and a note that says so; one step
    (the default budget) gives no note."""
    flags = ["bench", "--shape", "tiny", "--device", "cpu", "--prefill", "96", "--decode", "0", "-r", "1",
             "--warmup", "0", "--format", "json"]
    data = _json(capsys, flags + ["--max-num-batched-tokens", "32"])
    (row,) = data["results"]
    assert row["test"] == "pp96" and row["timed_steps"] == 3 and row["ms"] > 0 and row["tflops"] > 0
    assert data["notes"] == ["pp96: a chunked prefill, 3 steps of up to 32 tokens (--max-num-batched-tokens); its "
                             "time is theirs summed"]
    data = _json(capsys, flags)
    assert data["results"][0]["timed_steps"] == 1 and data["notes"] == []


@pytest.mark.parametrize("flags,first", [
    (["--depth", "5000", "--decode", "2"], "tg2@b1 d5000 needs 5006 tokens of context; the engine has 256 (the "
                                           "model's maximum is 256) (and 1 more)"),
    (["--prefill", "100", "--max-context", "64"], "pp100 needs 101 tokens of context; the engine has 64 (raise "
                                                  "--max-context up to 256)"),
])
def test_every_requested_test_skipped_is_a_usage_error(flags, first, capsys):
    """Only the tests the flags asked for count: --depth asks for decode tests, not the default prefill ones,
    which would run (the model's context is 256)."""
    rc = main(["bench", "--model", str(FIXTURES / "llama"), "--device", "cpu", "-r", "1", *flags])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.strip().splitlines()[-1] == f"error: every requested test would be skipped: {first}"


def test_throughput_real_engine(capsys):
    data = _json(capsys, ["bench", "throughput", "--shape", "tiny", "--device", "cpu", "--num-requests", "5",
                          "--min-len", "4", "--max-len", "12", "--format", "json"])
    (row,) = data["results"]
    assert row["requests"] == 5 and row["errors"] == 0 and row["scheduler"] == "alternate"
    assert 20 <= row["output_tokens"] <= 60 and row["output_tok_per_s"] > 0
    assert row["ttft_ms_p50"] > 0 and row["itl_ms_p99"] >= row["itl_ms_p50"] > 0


def test_bench_sampler_cpu(capsys):
    assert main(["bench", "sampler", "--device", "cpu", "--batch", "1,3", "--vocab", "300", "--steps", "2",
                 "-r", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 3 |")]
    assert len(rows) == 2 * len(MODES)
    fast = [r for r in rows if "| fast |" in r]
    slow = [r for r in rows if "| slow |" in r]
    assert fast and slow and all(r.split(" | ")[3] == "0.0 MiB" for r in fast)
    assert "| 3 | greedy, fast path off | slow |" in out  # the switch forces the FP32 copy
    # every processing setting goes fast with the path on, and each path has its bytes against the roofline
    assert "| 3 | default model's settings, 256-token histories, fast path | fast |" in out
    assert "| 3 | top-p 0.95 + penalties, 256-token histories, fast path off | slow |" in out
    assert "| HBM bytes/step (least) | roofline µs |" in out


def test_sampler_modes_sample_unless_greedy():
    """A mode without a temperature would run greedy (SamplingParams' default), whatever its name says."""
    from toolkit.sampler.params import SamplingParams

    for name, (params, *_) in MODES.items():
        assert (SamplingParams(**params).temperature > 0) == ("greedy" not in name), name
