"""ChatApp driven headless with Pilot against the scripted engine (tests/tui/tui_fakes.py)."""
import asyncio

import pytest
from textual.widgets import DataTable, Input, Markdown, Static
from tests.tui.tui_fakes import BATCH_MS, DECODE_MS, REPLY, SLOW_MS, fake_session

from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions
from tui.app import FAST_PATH_ALIAS, TOGGLE_KEYS, WIDE_AT, ChatApp, ErrorScreen, Note, ReplyGroup, UserMessage, \
    toggle_keys
from tui.help import HelpScreen
from tui.settings import SettingsModal
from tui.timings_panel import TimingsPanel

SIZE = (150, 45)
SMALL = (80, 24)
CPU_TOGGLES = ("sampler_fast_path", "sparse_prefill", "prefix_caching")


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


def app_with(params=None, **kw):
    def load():
        session = fake_session(**kw)
        if params is not None:
            session.configure(params=params)
        return session
    return ChatApp(load)


def screen_lines(app) -> list:
    """The text of every line on the terminal now, as drawn."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def redrawn(pilot):
    pilot.app.panel.flush()
    await pilot.pause()
    await pilot.pause()


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
    app = app_with(backend="cuda")

    async def same_prompt(pilot):  # a fresh conversation each time: the same step shapes
        await pilot.press("ctrl+l")
        await pilot.pause()
        await ask(pilot, "the same prompt")

    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await same_prompt(pilot)
        panel = app.query_one(TimingsPanel)
        for name, key in TOGGLE_KEYS.items():
            await pilot.press(key)  # the prompt Input has focus: the binding still works
            assert app.query_one("#prompt", Input).has_focus
            assert getattr(app.session.options, name) is False
            await wait_until(pilot, lambda: getattr(app.session.engine.options, name) is False)
            await same_prompt(pilot)
            await pilot.press(key)  # back on: the next toggle is compared with everything else alike
            await same_prompt(pilot)
        assert {r.toggle for r in panel.stats.ab_rows()} == set(EngineOptions.names())
        await redrawn(pilot)
        table = panel.query_one("#tp-ab", DataTable)
        assert table.row_count == len(panel.stats.ab_rows())


async def test_ctrl_f_still_flips_the_sampler_fast_path():
    app = app_with()
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press(FAST_PATH_ALIAS)
        assert app.session.options.sampler_fast_path is False


async def test_toggles_the_cpu_cannot_run_have_no_key_and_no_line():
    app = app_with(backend="cpu")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert app.session.toggles == CPU_TOGGLES
        assert app.panel.option_names == CPU_TOGGLES
        for name in ("cuda_graphs", "fused_kernels", "pdl"):
            await pilot.press(TOGGLE_KEYS[name])
            assert getattr(app.session.options, name) is True  # the key does nothing here
        await ask(pilot, "hi")
        await redrawn(pilot)
        text = "\n".join(screen_lines(app))
        assert "sampler fast path" in text and "cuda graphs" not in text and "pdl" not in text
        assert not any("graphs" in help_text for _, help_text in app.help_rows())


def test_toggle_keys_are_function_keys_from_f2():
    keys = toggle_keys(EngineOptions.names())
    assert list(keys.values()) == [f"f{i}" for i in range(2, 2 + len(EngineOptions.names()))]
    assert keys["sampler_fast_path"] == "f2" and FAST_PATH_ALIAS == "ctrl+f"
    with pytest.raises(ValueError):
        toggle_keys([f"t{i}" for i in range(12)])


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
        assert app.panel.fast_path_why is None  # the fast path holds every sampling setting
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
        assert app.panel.fast_path_why is None  # the fast path holds every sampling setting


@pytest.mark.parametrize("seed", [7, None])
async def test_parallel_replies_one_batch_with_tabs(seed):
    app = app_with(params=SamplingParams(max_tokens=512, seed=seed))
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.session.configure(replies=6)
        await ask(pilot, "many")
        group = app.query_one(ReplyGroup)
        assert group.tabbed and all(t == "".join(REPLY) for t in group.texts)
        seeds = [p.seed for _, p in app.session.engine.requests]
        # a seed: one per reply, consecutive (each its own draw, reproducible); none: every reply draws freshly
        assert seeds == ([seed + i for i in range(6)] if seed is not None else [None] * 6)
        assert app.panel.batch_tps == pytest.approx(6 * 1e3 / (DECODE_MS + 6 * BATCH_MS + 1.5))
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
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert [t for t in titles if t.startswith("Toggle")] == \
            [f"Toggle {n.replace('_', ' ')} (runs on)" for n in CPU_TOGGLES]
        assert {"System prompt", "Clear conversation", "Regenerate last reply", "Keys"} <= set(titles)


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


# -- the comparison tells the truth, visibly (issue 34, item 5) ---------------------------------------------
def sampler_paths(panel) -> list:
    """(sampler path, why) of each step that sampled, as the panel records them from now on."""
    seen, record = [], panel.record
    panel.record = lambda step, *a: (step.sampler_path and seen.append((step.sampler_path, step.sampler_why)),
                                     record(step, *a))
    return seen


def fast_path_line(app) -> tuple:
    """(the sampler fast path's line on screen, the line under it)."""
    lines = screen_lines(app)
    i = next(i for i, line in enumerate(lines) if "F2" in line and "sampler fast path" in line)
    return lines[i], lines[i + 1]


async def test_chat_settings_run_on_the_fast_path_with_no_reason_shown_at_80x24():
    """The default model's kind of settings take the fast path now: no "not applicable" beside F2, before or after
    a reply (where a reason does apply, test_timings_panel shows it beside the toggle)."""
    app = app_with(params=SamplingParams(max_tokens=512, temperature=0.8, top_k=40, top_p=0.95,
                                         repetition_penalty=1.1))
    async with app.run_test(size=SMALL) as pilot:
        await started(pilot)
        await redrawn(pilot)
        assert "not applicable" not in "".join(fast_path_line(app))  # from the settings, before anything ran
        paths = sampler_paths(app.panel)
        await ask(pilot, "Say hello")
        await redrawn(pilot)
        line, under = fast_path_line(app)  # what ran says the same
        assert "on" in line.split("sampler fast path")[1] and "not applicable" not in line + under
        assert paths[-1] == ("fast", "")


async def test_the_header_and_palette_show_what_ran_not_what_was_asked():
    app = app_with(backend="cuda")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "hi")
        await pilot.press(TOGGLE_KEYS["cuda_graphs"])  # asked while idle: nothing has run without graphs yet
        await redrawn(pilot)
        text = "\n".join(screen_lines(app))
        assert "cuda graphs       on  -> off at the next step" in text
        assert "pdl               on  -> off at the next step" in text  # PDL runs only in graphs
        await ask(pilot, "again")
        await redrawn(pilot)
        text = "\n".join(screen_lines(app))
        assert "cuda graphs       off" in text and "pdl               off (asked on)" in text
        assert app.session.options.pdl is True  # asked for
        assert app.panel.state("pdl") is False and app.panel.stats.last_options.pdl is False  # ran
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Toggle pdl (runs off, asked on)" in titles and "Toggle cuda graphs (runs off)" in titles
        await pilot.press("ctrl+o")
        engine = str(app.screen.query_one("#settings-engine", Static).content)
        assert "cuda graphs off" in engine and "pdl off" in engine and "fused kernels on" in engine


async def test_f1_and_question_mark_show_every_key():
    app = app_with(backend="cuda")
    async with app.run_test(size=SMALL) as pilot:
        await started(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.rows
        listed = " ".join(keys for keys, _ in rows).lower()
        for b in app.BINDINGS:  # every key the app answers to is on the list
            for key in b.key.split(","):
                assert {"question_mark": "?", "escape": "esc"}.get(key, key) in listed, key
        assert "ctrl+p" in listed and "enter" in listed
        assert [what.split(":")[0] for _, what in rows[-6:]] == [n.replace("_", " ") for n in EngineOptions.names()]
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")  # typing in the prompt: ? is a character there
        assert app.query_one("#prompt", Input).value == "?" and not isinstance(app.screen, HelpScreen)
        app.set_focus(None)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


async def test_the_ab_table_compares_one_batch_size():
    """The fast path ran at batch 4; the slow path at batch 1, then 4. Mixed, the slow path's mean is the
    lower one (the issue's 2.41 against 1.65 ms); the table compares batch 4 with batch 4 only."""
    app = app_with()

    async def turn(pilot, replies):
        await pilot.press("ctrl+l")
        await pilot.pause()
        app.session.configure(replies=replies)
        await ask(pilot, "the same prompt")

    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await turn(pilot, 4)
        await pilot.press(TOGGLE_KEYS["sampler_fast_path"])
        await turn(pilot, 1)
        await turn(pilot, 4)
        decode_rows = [r for r in app.panel.stats.ab_rows()
                       if r.toggle == "sampler_fast_path" and r.shape.kind == "decode"]
        assert [(r.shape.batch, r.on_n, r.off_n) for r in decode_rows] == [(4, 7, 7)]
        r = decode_rows[0]
        assert r.on_ms == pytest.approx(DECODE_MS + 4 * BATCH_MS)
        assert r.off_ms == pytest.approx(DECODE_MS + 4 * BATCH_MS + SLOW_MS)  # mixed, it would be 9.75 ms
        await redrawn(pilot)
        table = app.panel.query_one("#tp-ab", DataTable)
        assert [table.get_cell(r.key, c) for c in ("on_ms", "on_n", "off_ms", "off_n")] == \
            ["10.00", "7", "10.50", "7"]


@pytest.mark.parametrize("size", [SMALL, (WIDE_AT - 1, 30), (WIDE_AT, 30), (200, 50)])
async def test_the_chat_keeps_40_columns_and_the_footer_fits(size):
    app = app_with(backend="cuda")
    async with app.run_test(size=size) as pilot:
        await started(pilot)
        await ask(pilot, "hi")
        await redrawn(pilot)
        chat, side = app.query_one("#chat-column").region, app.query_one("#side").region
        assert chat.width >= 40
        narrow = size[0] < WIDE_AT
        assert app.panel.compact is narrow
        if narrow:  # under the chat, the whole width, and short
            assert side.y >= chat.bottom and side.width == size[0] and side.height <= size[1] // 2
        else:  # beside it
            assert side.x >= chat.right and side.height == chat.height
        footer = screen_lines(app)[-1]
        assert "quit" in footer and "keys" in footer and "palette" in footer
        await pilot.press("ctrl+t")  # the details flip either way
        await pilot.pause()
        assert app.panel.compact is not narrow
        assert app.query_one("#chat-column").region.width >= 40


# -- what you type is kept; what had to go is said; continuations are text (issue 37) -----------------------
def conversation(app) -> list:
    """The conversation's widgets in order, as (kind, text): "you", "queued", "reply", "note"."""
    rows = []
    for w in app.query_one("#conversation").children:
        if isinstance(w, UserMessage):
            rows.append(("queued" if w.has_class("queued") else "you", str(w.content)))
        elif isinstance(w, ReplyGroup):
            rows.append(("reply", w.texts[0]))
        elif isinstance(w, Note):
            rows.append(("note", str(w.content)))
    return rows


async def send_and_hold(pilot, text):
    """Send `text` and hold the engine once its reply has begun: Pilot waits for a quiet screen after each
    key, so keys pressed while text streams land late."""
    gate = pilot.app.session.engine.gate
    gate.clear()
    pilot.app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
    gate.set()
    await wait_until(pilot, lambda: pilot.app.turn is not None and pilot.app.turn.texts[0])
    gate.clear()


async def type_and_send(pilot, text):
    pilot.app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
    await pilot.pause()


async def test_a_message_sent_while_a_reply_streams_is_queued_then_sent():
    app = app_with(reply=["word "] * 60, max_context=4096, delay=0.002)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await send_and_hold(pilot, "first")
        for text in ("second", "third"):
            await type_and_send(pilot, text)
        prompt = app.query_one("#prompt", Input)
        assert prompt.value == "" and not prompt.disabled and "2 queued" in prompt.placeholder
        assert conversation(app)[-2:] == [("queued", "second"), ("queued", "third")]
        app.session.engine.gate.set()
        await wait_until(pilot, lambda: app.turn is None and not app.queued, timeout=10)
        await pilot.pause()
        rows = conversation(app)[1:]  # after the model's line
        assert [kind for kind, _ in rows] == ["you", "reply", "note"] * 3  # each reply, then its stats, in order
        assert [text for kind, text in rows if kind == "you"] == ["first", "second", "third"]
        assert all(text == "word " * 60 for kind, text in rows if kind == "reply")
        assert [m["content"] for m in app.session.messages[::2]] == ["first", "second", "third"]


async def test_escape_ends_the_reply_and_the_queued_message_goes():
    app = app_with(reply=["word "] * 2000, max_context=8192, delay=0.002)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await send_and_hold(pilot, "tell me everything")
        await type_and_send(pilot, "no, stop: just this")
        await pilot.press("escape")
        app.session.engine.gate.set()
        await wait_until(pilot, lambda: app.turn is not None and app.turn.user_text == "no, stop: just this")
        assert not app.queued and not app.query("UserMessage.queued")
        first = app.session.messages[:2]  # the cut reply stays as history
        assert first[0]["content"] == "tell me everything" and 0 < len(first[1]["content"]) < 2000 * 5 - 1
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.turn is None)


async def test_dropped_turns_are_named_in_the_chat():
    """One token per character, 128 of context, 64 kept for the reply: each new turn pushes out the oldest."""
    app = app_with(max_context=128)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        for text in ("hi", "yo", "ok"):
            await ask(pilot, text)
        dropped = [n for n in notes(app) if n.startswith("dropped")]
        assert dropped == ["dropped turn 1 (of 2) to fit the 128-token context",
                           "dropped turn 2 (of 3) to fit the 128-token context"]
        assert [m["content"] for m in app.session.messages[::2]] == ["ok"]


async def test_a_continuation_is_plain_text_and_says_what_scrolled_out():
    app = app_with(chat=False, reply=["Line one", "\n", "**two** # not a heading"], max_context=64)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await ask(pilot, "Once upon a time")
        group = app.query_one(ReplyGroup)
        assert not group.query(Markdown)
        lines = screen_lines(app)
        i = next(i for i, line in enumerate(lines) if "Line one" in line)
        assert "**two** # not a heading" in lines[i + 1]  # its own line, the marks as typed
        await ask(pilot, " then")
        # 16 + 32 characters, then 5 more: 32 are kept for the reply, so only 31 of the 53 fit
        assert "continuing from the last 31 tokens of the text (the first 22 do not fit the 64-token context)" \
            in notes(app)
