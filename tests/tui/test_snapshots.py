"""Snapshots at 80x24 and 160x48: the main screen on the CPU and on a GPU, the help screen and the settings
(scripted engine: every timing number is fixed).

Regenerate after an intended change, and look at them: python -m pytest tests/tui/test_snapshots.py
--snapshot-update (the SVGs are under __snapshots__/)."""
import pytest
from tests.tui.test_app import SMALL, ask, started, wait_until
from tests.tui.tui_fakes import fake_session

from toolkit.engine import SamplingParams
from tui import timings_panel
from tui.app import TOGGLE_KEYS, ChatApp
from tui.help import HelpScreen
from tui.settings import SettingsModal

LARGE = (160, 48)


async def settle(pilot):
    """The same frame every run: no blinking cursor, no toasts, every widget redrawn from its final state."""
    app = pilot.app
    app.clear_notifications()
    app.panel.flush()
    for w in app.query("Input"):
        w.cursor_blink = False
    for w in app.screen.query("Input"):
        w.cursor_blink = False
    await pilot.pause()
    app.panel.flush()
    for w in app.screen.query("*"):
        w.refresh()
    await pilot.pause()


@pytest.fixture(autouse=True)
def one_panel_refresh(monkeypatch):
    """The panel normally redraws at ~15 Hz, and which intermediate numbers it happened to draw decides its
    table's column widths; with the timer out of the way it draws once at start and once in settle()."""
    monkeypatch.setattr(timings_panel, "REFRESH_S", 1e9)


def _app(backend="cpu", temperature=0.7):
    def load():
        session = fake_session(model_dir=None, backend=backend)
        session.configure(params=SamplingParams(max_tokens=512, temperature=temperature))
        return session
    return ChatApp(load)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_main_screen_cpu(snap_compare, size):
    """Sampling at temperature 0.7: the fast path's line says why it does not apply."""
    async def run_before(pilot):
        await started(pilot)
        await ask(pilot, "Say hello")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_main_screen_gpu_after_an_ab_run(snap_compare, size):
    """Six toggles; the fast path run off, then on again, on the same prompt: one A/B row per shape."""
    async def run_before(pilot):
        await started(pilot)
        for key in (TOGGLE_KEYS["sampler_fast_path"],) * 2:
            await ask(pilot, "Say hello")
            await pilot.press(key)
            await pilot.press("ctrl+l")
        await ask(pilot, "Say hello")
        await settle(pilot)

    assert snap_compare(_app("cuda", temperature=1.0), terminal_size=size, run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot):
        await started(pilot)
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))
        await settle(pilot)

    assert snap_compare(_app("cuda"), terminal_size=SMALL, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_settings_modal(snap_compare, size):
    async def run_before(pilot):
        await started(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsModal))
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=size, run_before=run_before)
