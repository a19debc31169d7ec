"""ChatApp driven headless with Pilot against the scripted engine (tests/tui/tui_fakes.py)."""
import asyncio

import pytest
from textual.widgets import DataTable, Input, Markdown, Static
from tests.tui.tui_fakes import REPLY, fake_session

from toolkit.engine.options import EngineOptions
from tui.app import TOGGLE_KEYS, ChatApp, ErrorScreen, Note, ReplyGroup, UserMessage, toggle_keys
from tui.settings import SettingsModal
from tui.timings_panel import TimingsPanel

SIZE = (150, 45)


async def wait_until(pilot, cond, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError("timed out waiting")


async def started(pilot):
    await wait_until(pilot, lambda: pilot.app.session is not None and pilot.app.panel is not None)
    await pilot.pause()


async def ask(pilot, text):
    await pilot.click("#prompt")
    pilot.app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: pilot.app.turn is None)
    await pilot.pause()


def notes(app):
    return [str(n.content) for n in app.query(Note)]


def app_with(**kw):
    sessions = []

    def load():
        sessions.append(fake_session(**kw))
        return sessions[-1]
    return ChatApp(load)


async def test_a_prompt_streams_its_reply_and_the_panel_fills():
    app = app_with(delay=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "Hi there")
        assert [str(u.content) for u in app.query(UserMessage)] == ["Hi there"]
        group = app.query_one(ReplyGroup)
        assert group.texts[0] == "".join(REPLY)
        md = group.query_one(Markdown)
        assert "scripted" in md.source
        panel = app.query_one(TimingsPanel)
        assert panel.stats.prefill_ms is not None
        assert panel.stats.mean_decode_ms in (pytest.approx(8.5), pytest.approx(10.0))
        assert any("prompt tok (0 reused)" in n for n in notes(app))
        # second turn: the history is a prefix of the new prompt, so the cache hands some of it back
        await ask(pilot, "And again")
        assert any("reused)" in n and "(0 reused)" not in n for n in notes(app))
        assert app.query_one("#prompt", Input).disabled is False


async def test_empty_prompt_does_nothing():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("enter", "space", "enter")
        await pilot.pause()
        assert not app.query(UserMessage) and app.turn is None
        assert not app.session.engine.requests


async def test_each_toggle_flips_and_the_ab_table_shows_both_states():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "one")
        panel = app.query_one(TimingsPanel)
        for name, key in TOGGLE_KEYS.items():
            before = getattr(app.session.options, name)
            await pilot.press(key)  # the prompt Input has focus: the binding still works
            assert app.query_one("#prompt", Input).has_focus
            assert getattr(app.session.options, name) is (not before)
            await wait_until(pilot, lambda: getattr(app.session.engine.options, name) is (not before))
        await ask(pilot, "two")
        ab = panel.stats.ab_table()
        effective = app.session.effective(EngineOptions())
        for name in EngineOptions.names():
            if getattr(effective, name):  # a switch this backend can run was seen both ways
                assert ab[name]["on"]["steps"] > 0 and ab[name]["off"]["steps"] > 0, name
        table = panel.query_one("#tp-ab", DataTable)
        assert table.row_count >= len(EngineOptions.names())


def test_toggle_keys_are_ctrl_letters_clear_of_editing_keys():
    keys = toggle_keys(EngineOptions.names())
    assert len(set(keys.values())) == len(keys) == len(EngineOptions.names())
    assert all((k.startswith("ctrl+") or k in [f"f{i}" for i in range(2, 13)])
               and k not in ("ctrl+p", "ctrl+q", "ctrl+c", "ctrl+a", "ctrl+e") for k in keys.values())
    many = toggle_keys(tuple(EngineOptions.names()) + ("one_more", "and_another"))  # letters run out: F2, F3
    assert len(set(many.values())) == len(many) and {"f2", "f3"} <= set(many.values())
    later = toggle_keys(("cuda_graphs", "sampler_fast_path", "sparse_prefill", "tensor_cores"))
    assert later["sampler_fast_path"] == "ctrl+f" and later["sparse_prefill"] == "ctrl+s"


async def test_escape_cancels_the_reply():
    app = app_with(reply=["word "] * 2000, max_context=4096, delay=0.005)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.query_one("#prompt", Input).value = "go"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.turn is not None and len(app.turn.texts[0]) > 20)
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.turn is None)
        text = app.query_one(ReplyGroup).texts[0]
        assert 0 < len(text) < 2000 * 5
        assert any("cancelled" in n for n in notes(app))
        assert app.session.messages[-1]["content"] == text.strip()  # the partial reply stays in the history


async def test_settings_modal_changes_the_parameters():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, SettingsModal)
        app.screen.query_one("#f-temperature", Input).value = "abc"
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, SettingsModal)  # invalid: stays open with a message
        app.screen.query_one("#f-temperature", Input).value = "-1"
        await pilot.press("ctrl+o")
        assert "temperature" in str(app.screen.query_one("#settings-error", Static).content)
        app.screen.query_one("#f-temperature", Input).value = "0.7"
        app.screen.query_one("#f-max_tokens", Input).value = "3"
        app.screen.query_one("#f-seed", Input).value = "42"
        app.screen.query_one("#f-replies", Input).value = "300"
        await pilot.press("ctrl+o")
        assert "between 1 and 256" in str(app.screen.query_one("#settings-error", Static).content)
        app.screen.query_one("#f-replies", Input).value = "2"
        app.screen.query_one("#f-system", Input).value = "Be brief."
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsModal)
        s = app.session
        assert (s.params.temperature, s.params.max_tokens, s.params.seed, s.replies, s.system) == \
            (0.7, 3, 42, 2, "Be brief.")
        assert "temperature 0.7" in (app.panel.fast_path_note or "")
        await ask(pilot, "hello")
        prompts = [p for p, _ in s.engine.requests]
        assert len(prompts) == 2 and prompts[0] == prompts[1]
        assert [p.seed for _, p in s.engine.requests] == [42, 43]
        assert all(len(t) == len("".join(REPLY[:3])) for t in app.query_one(ReplyGroup).texts)


async def test_defaults_come_from_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6, "top_k": 20, "do_sample": true}')
    app = app_with(model_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert app.session.params.temperature == 0.6
        assert "temperature 0.6" in app.panel.fast_path_note


async def test_parallel_replies_one_batch_with_tabs():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.session.configure(replies=6)
        await ask(pilot, "many")
        group = app.query_one(ReplyGroup)
        assert group.tabbed and all(t == "".join(REPLY) for t in group.texts)
        assert len({p.seed for _, p in app.session.engine.requests}) == 6 or \
            all(p.seed is None for _, p in app.session.engine.requests)
        assert app.panel.batch_tps == pytest.approx(6 * 1e3 / 10.0)
        assert any("6 replies" in n for n in notes(app))


async def test_prompt_longer_than_the_context_is_a_message():
    app = app_with(max_context=64)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "x" * 200)
        errors = [n for n in app.query(Note) if n.has_class("error")]
        assert errors and "context holds 64" in str(errors[0].content)
        assert app.session.messages == []
        await ask(pilot, "short")  # and the app goes on
        assert app.session.messages[-1]["role"] == "assistant"


async def test_clear_regenerate_and_palette_commands():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "first")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.turn is None)
        await pilot.pause()
        assert len(app.query(ReplyGroup)) == 1 and len(app.session.messages) == 2
        assert len(app.session.engine.requests) == 2
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.session.messages == [] and not app.query(UserMessage)
        from tui.app import ChatCommands
        titles = [t for t, _, _ in ChatCommands(app.screen)._commands()]
        assert all(any(n.replace("_", " ") in t for t in titles) for n in EngineOptions.names())
        assert {"System prompt", "Clear conversation", "Regenerate last reply"} <= set(titles)


async def test_base_model_gets_plain_continuation():
    app = app_with(chat=False)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "Once upon a time")
        await ask(pilot, " then")
        assert app.session.transcript == "Once upon a time" + "".join(REPLY) + " then" + "".join(REPLY)
        assert any("plain continuation" in n for n in notes(app))


async def test_a_model_that_fails_to_load_shows_the_reason():
    def load():
        from toolkit.errors import ToolkitError
        raise ToolkitError("/nowhere: no such model folder")
    app = ChatApp(load)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ErrorScreen))
        assert "no such model folder" in str(app.screen.query_one("#error-reason", Static).content)
        await pilot.press("q")
    assert app.return_code == 2


async def test_quit_mid_reply_is_clean():
    app = app_with(reply=["w "] * 5000, max_context=8192, delay=0.005)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.query_one("#prompt", Input).value = "go"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.turn is not None and app.turn.texts[0])
        worker = app.session.worker
        await pilot.press("ctrl+c")
        await asyncio.sleep(0.1)
    assert not worker._thread.is_alive()
