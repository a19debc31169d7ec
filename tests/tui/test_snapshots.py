"""Snapshots of the main screen and the settings modal (scripted engine: every timing number is fixed).

Regenerate after an intended change: python -m pytest tests/tui/test_snapshots.py --snapshot-update"""
import pytest
from tests.tui.test_app import SIZE, ask, started, wait_until
from tests.tui.tui_fakes import fake_session

from tui import timings_panel
from tui.app import ChatApp
from tui.settings import SettingsModal


async def settle(pilot):
    """The same frame every run: no blinking cursor, and every widget redrawn from its final state."""
    app = pilot.app
    app.panel.flush()
    for w in app.query("Input"):
        w.cursor_blink = False
    for w in app.screen.query("Input"):
        w.cursor_blink = False
    await pilot.pause()
    for w in app.screen.query("*"):
        w.refresh()
    await pilot.pause()


@pytest.fixture(autouse=True)
def one_panel_refresh(monkeypatch):
    """The panel normally redraws at ~15 Hz, and which intermediate numbers it happened to draw decides its
    table's column widths; with the timer out of the way it draws once at start and once in settle()."""
    monkeypatch.setattr(timings_panel, "REFRESH_S", 1e9)


def _app():
    return ChatApp(lambda: fake_session(model_dir=None))


def test_main_screen(snap_compare):
    async def run_before(pilot):
        await started(pilot)
        await ask(pilot, "Say hello")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=run_before)


def test_settings_modal(snap_compare):
    async def run_before(pilot):
        await started(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsModal))
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=run_before)
