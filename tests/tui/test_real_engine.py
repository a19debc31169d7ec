"""The app on the real engine, on the CPU (and on the GPU where there is one), with the tiny qwen2 fixture
(it has a chat template)."""
from pathlib import Path

import pytest

from textual.widgets import Input
from tests.tui.test_app import ask, notes, sampler_paths, wait_until

from toolkit.engine import SamplingParams
from tui.app import ChatApp, ReplyGroup
from tui.session import ChatSession

QWEN2 = Path(__file__).resolve().parents[1] / "fixtures" / "qwen2"


def chat_app(device: str, max_tokens: int, kv_cache_tokens: int, **sampling) -> ChatApp:
    """The app loading the qwen2 fixture on `device`, replies of max_tokens: greedy unless `sampling` says."""
    def load():
        session = ChatSession.open(QWEN2, device=device, max_context=256, kv_cache_tokens=kv_cache_tokens)
        session.configure(params=SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling}))
        return session

    return ChatApp(load)


async def test_chat_on_the_cpu_engine():
    app = chat_app("cpu", max_tokens=4, kv_cache_tokens=2048)
    async with app.run_test(size=(150, 45)) as pilot:
        await wait_until(pilot, lambda: app.session is not None and app.panel is not None, timeout=60)
        await pilot.pause()
        words = " ".join(f"w{i}" for i in range(30))  # long enough to fill whole KV blocks
        await ask(pilot, words)
        await ask(pilot, "and then?")
        assert all(g.texts[0] for g in app.query(ReplyGroup))
        stats = [n for n in notes(app) if "prompt tok" in n]
        assert len(stats) == 2 and "(0 reused)" in stats[0] and "(0 reused)" not in stats[1]
        assert app.panel.stats.prefill_ms is not None and app.panel.stats.mean_decode_ms
        assert app.session.header["device"] == "cpu"
        # the real backend offers the CPU's toggles only, and the header shows what the steps ran with
        assert app.panel.option_names == ("sampler_fast_path", "sparse_prefill", "prefix_caching")
        assert app.panel.stats.last_options == app.session.effective()
        assert app.query_one("#prompt", Input).disabled is False
        worker = app.session.worker
        await pilot.press("ctrl+q")
    assert not worker._thread.is_alive()


@pytest.mark.gpu
async def test_chat_on_the_gpu_engine_with_toggles():
    """On the H200: chat, switch the sampler fast path off and back with ctrl+f, and see both states in the
    A/B table with the sampler's FP32 bytes (0 on the fast path)."""
    from tui.app import TOGGLE_KEYS
    from tui.timings_panel import TimingsPanel

    app = chat_app("cuda", max_tokens=8, kv_cache_tokens=4096)
    async with app.run_test(size=(150, 45)) as pilot:
        await wait_until(pilot, lambda: app.session is not None and app.panel is not None, timeout=120)
        await pilot.pause()
        await ask(pilot, "hello there")
        panel = app.query_one(TimingsPanel)
        assert panel.stats.sampler_bytes == 0  # greedy: the fast path, nothing materialised
        await pilot.press(TOGGLE_KEYS["sampler_fast_path"])
        await wait_until(pilot, lambda: app.session.engine.options.sampler_fast_path is False)
        await ask(pilot, "and again")
        assert panel.stats.sampler_bytes > 0  # the FP32 copy, now that the fast path is off
        assert panel.state("sampler_fast_path") is False  # what ran
        # greedy decode steps of batch 1 in one context bucket, both ways: a like-with-like row
        assert any(r.toggle == "sampler_fast_path" and r.shape.kind == "decode" and r.shape.batch == 1
                   for r in panel.stats.ab_rows())
        assert app.session.header["device"] == "cuda"
        await pilot.press("ctrl+q")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_ctrl_f_with_the_default_models_settings_changes_the_bytes_line(device):
    """The default model's settings (T 0.8, top-k 40, top-p 0.95, repetition penalty 1.1) sample on the fast path,
    with nothing materialised; ctrl+f switches to the FP32 path, and the panel's bytes line shows its copy."""
    from textual.widgets import Static
    from tui.app import TOGGLE_KEYS
    from tui.timings_panel import TimingsPanel, fmt_bytes

    app = chat_app(device, max_tokens=6, kv_cache_tokens=4096, temperature=0.8, top_k=40, top_p=0.95,
                     repetition_penalty=1.1, seed=3)
    async with app.run_test(size=(150, 45)) as pilot:
        await wait_until(pilot, lambda: app.session is not None and app.panel is not None, timeout=120)
        await pilot.pause()
        panel = app.query_one(TimingsPanel)
        paths = sampler_paths(panel)
        await ask(pilot, "hello there")
        bytes_line = lambda: str(app.query_one("#tp-bw", Static).content).split("\n")[-1]  # noqa: E731
        assert paths[-1][0] == "fast" and bytes_line() == "sampler materialised 0 B/step"
        await pilot.press(TOGGLE_KEYS["sampler_fast_path"])
        await wait_until(pilot, lambda: app.session.engine.options.sampler_fast_path is False)
        await ask(pilot, "and again")
        await pilot.pause()
        assert paths[-1][0] == "slow" and panel.stats.sampler_bytes > 0
        assert bytes_line() == f"sampler materialised {fmt_bytes(panel.stats.sampler_bytes)}/step"
        await pilot.press("ctrl+q")
