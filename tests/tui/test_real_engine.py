"""The app on the real engine, on the CPU, with the tiny qwen2 fixture (it has a chat template)."""
from pathlib import Path

from textual.widgets import Input
from test_app import ask, notes, wait_until

from toolkit.engine import SamplingParams
from tui.app import ChatApp, ReplyGroup
from tui.session import ChatSession

QWEN2 = Path(__file__).resolve().parents[1] / "fixtures" / "qwen2"


async def test_chat_on_the_cpu_engine():
    def load():
        session = ChatSession.open(QWEN2, device="cpu", max_context=256, kv_cache_tokens=2048)
        session.configure(params=SamplingParams(max_tokens=4, temperature=0.0))
        return session

    app = ChatApp(load)
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
        assert app.query_one("#prompt", Input).disabled is False
        worker = app.session.worker
        await pilot.press("ctrl+q")
    assert not worker._thread.is_alive()
