"""ChatApp: the conversation on the left, the prompt at the bottom, the live timings panel on the right.

Generation runs in a thread worker (`_generate`) that only reads the session's merged output stream and
posts batches of RequestOutputs to the app (`post_message` is thread-safe); every widget is touched on the
UI thread, in the message handlers. The engine itself lives on the EngineWorker's thread.

The prompt stays open while a reply streams: a message sent then waits in the conversation, marked queued,
and goes when the reply ends (Esc ends it sooner), so nothing typed is lost.

Layout: from WIDE_AT columns on, the panel stands right of the chat; on a narrower terminal it moves under
the chat, compact (its header and toggles with their states, and a one-line summary), so the chat keeps the
full width. ctrl+t shows or hides the panel's details either way.

Keys: each EngineOptions toggle has a function key from F2 on, in EngineOptions.names() order (the sampler
fast path also keeps ctrl+f); a toggle this backend cannot run has no key and no line. F1 (or ? when the
prompt does not have focus) lists every key.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import partial

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from toolkit.errors import ToolkitError
from toolkit.engine.options import EngineOptions

from .chat_view import ErrorScreen, Note, ReplyGroup, UserMessage
from .help import HelpScreen
from .session import ChatSession, Turn
from .settings import Settings, SettingsModal
from .step_stats import implied_off
from .timings_panel import TimingsPanel, key_label, label

SWITCH_INTERVAL_S = 5e-5  # see on_mount
FLUSH_S = 1 / 15  # the worker posts outputs at most this often (many replies x fast steps = many tokens)
WIDE_AT = 106  # columns from which the panel (64 wide at least) stands beside a chat of 40 and more
FAST_PATH_ALIAS = "ctrl+f"  # the sampler fast path's key from before the F-keys, kept


def toggle_keys(names) -> dict:
    """toggle name -> function key, from F2 on, in order (EngineOptions has at most six toggles)."""
    names = tuple(names)
    if len(names) > 11:
        raise ValueError(f"{len(names)} toggles: only F2-F12 are free")
    return {n: f"f{i + 2}" for i, n in enumerate(names)}


TOGGLE_KEYS = toggle_keys(EngineOptions.names())
# What F1 says of each command (the toggles say their EngineOptions help).
HELP_TEXT = {"quit": "quit", "help": "this list of keys (? only outside the prompt)",
             "cancel_reply": "cancel the reply (it keeps what came)",
             "settings": "settings: sampling parameters, parallel replies, system prompt (ctrl+o saves)",
             "system": "edit the system prompt", "clear": "clear the conversation",
             "regenerate": "regenerate the last reply", "details": "show or hide the timing details",
             "command_palette": "command palette: every command by name"}


# -- messages from the worker thread (dataclass messages, as Textual's own) ---------------------------------
@dataclass
class Loaded(Message):
    session: ChatSession


@dataclass
class LoadFailed(Message):
    reason: str


@dataclass
class ReplyChunk(Message):
    turn: Turn
    outputs: tuple
    done: bool = False  # the last one: every reply has ended


# -- the app ------------------------------------------------------------------------------------------------
class ChatApp(App):
    TITLE = "toolkit chat"
    CSS = """
    #main { height: 1fr; }
    #chat-column { width: 1fr; }
    #conversation { height: 1fr; padding: 0 1; }
    #prompt { dock: bottom; }
    #side { width: 42%; min-width: 64; max-width: 84; border-left: solid $primary; }
    #main.-narrow { layout: vertical; }
    #main.-narrow #chat-column { height: 1fr; }
    #main.-narrow #side { width: 1fr; min-width: 0; max-width: 100%; height: auto; max-height: 50%;
                          border-left: none; border-top: solid $primary; }
    #main.-narrow #side.-details { height: 1fr; max-height: 100%; }
    #loading { padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("ctrl+q", "quit", "quit", priority=True),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("f1", "help", "keys", key_display="F1", priority=True),
        Binding("question_mark", "help", "keys", show=False),
        Binding("escape", "cancel_reply", "cancel"),
        Binding("ctrl+o", "settings", "settings"),
        Binding("ctrl+y", "system", "system prompt", show=False),
        Binding("ctrl+l", "clear", "clear"),
        Binding("ctrl+r", "regenerate", "regen"),
        Binding("ctrl+t", "details", "details"),
    ] + [Binding(key, f"toggle('{name}')", label(name), show=False, priority=True)
         for name, key in TOGGLE_KEYS.items()] + \
        [Binding(FAST_PATH_ALIAS, "toggle('sampler_fast_path')", "sampler fast path", show=False, priority=True)]

    def __init__(self, load, **kw):
        """`load()` returns a ChatSession; it runs in a thread, and whatever it raises becomes the error screen."""
        super().__init__(**kw)
        self._load_session = load
        self.session: ChatSession | None = None
        self.panel: TimingsPanel | None = None
        self.turn: Turn | None = None
        self._group: ReplyGroup | None = None
        self.queued: list = []  # UserMessages sent while a reply ran, oldest first; each waits for its turn
        self._last_step = -1
        self.details: bool | None = None  # the timing details shown (ctrl+t); None: as the width says
        self.load_error: str | None = None  # why the model did not load (the exit code is then 2)

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield VerticalScroll(id="conversation")
                yield Input(placeholder="loading the model...", id="prompt", disabled=True)
            yield Vertical(Static("loading the model...", id="loading"), id="side")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#conversation").anchor()  # follow new text while the user is at the bottom
        # The engine thread needs the GIL between every kernel (Numba and BLAS release it inside), and by
        # default a thread waits up to 5 ms for it while the UI thread renders: on the CPU a default-model
        # decode step of ~6 ms took ~48 ms in the app. A 50 us switch interval brought it to ~13 ms.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._relayout()
        self._load()

    # -- layout ------------------------------------------------------------------------------------------
    def on_resize(self) -> None:
        self._relayout()

    def _relayout(self) -> None:
        """Beside the chat from WIDE_AT columns on, else under it and compact; ctrl+t overrides the details."""
        narrow = self.size.width < WIDE_AT
        details = self.details if self.details is not None else not narrow
        try:
            main, side = self.query_one("#main"), self.query_one("#side")
        except NoMatches:  # not composed yet
            return
        main.set_class(narrow, "-narrow")
        side.set_class(details, "-details")
        if self.panel is not None:
            self.panel.set_compact(not details)

    # -- loading -----------------------------------------------------------------------------------------
    @work(thread=True, group="load")
    def _load(self) -> None:
        try:
            session = self._load_session()
        except ToolkitError as e:
            self.post_message(LoadFailed(str(e)))
        except MemoryError as e:
            self.post_message(LoadFailed(f"out of memory{': ' + str(e) if str(e) else ''}"))
        except Exception as e:  # a bug, but still one readable line, not a traceback
            self.post_message(LoadFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(Loaded(session))

    async def on_loaded(self, message: Loaded) -> None:
        s = self.session = message.session
        self.panel = TimingsPanel(s.header, s.toggles, s.peak_gbps, s.engine.weight_bytes, keys=TOGGLE_KEYS,
                                  implied=implied_off(s.engine.backend, s.toggles), requested=s.options,
                                  expected=s.effective(), id="timings")
        side = self.query_one("#side")
        await side.remove_children()
        await side.mount(self.panel)
        self._relayout()
        self.panel.set_fast_path_note(s.fast_path_why())
        mode = "chat template" if s.chat_mode else "no chat template: plain continuation"
        await self._note(f"{s.model_name} ({mode}) · {s.engine.device_note} · F1: keys")
        self._prompt(None)

    def _prompt(self, busy: str | None) -> None:
        """The prompt, open either way; its placeholder says whether a reply runs (`busy`)."""
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = False
        prompt.placeholder = busy or ("message (Enter sends)" if self.session.chat_mode
                                      else "text to continue (Enter sends)")
        if busy is None:
            prompt.focus()
        self.refresh_bindings()

    # -- keys and the command palette --------------------------------------------------------------------
    def get_system_commands(self, screen):
        """The palette's commands: Textual's, one per toggle this backend can run (with the state it ran with),
        and the app's."""
        yield from super().get_system_commands(screen)
        if self.session is None or self.panel is None:
            return
        for name in self.session.toggles:
            ran, asked = self.panel.state(name), getattr(self.session.options, name)
            state = ("on" if ran else "off") + ("" if ran == asked else f", asked {'on' if asked else 'off'}")
            yield SystemCommand(f"Toggle {label(name)} (runs {state})", EngineOptions.help(name),
                                partial(self.action_toggle, name))
        yield SystemCommand("System prompt", "edit the system prompt", self.action_system)
        yield SystemCommand("Clear conversation", "start a new conversation", self.action_clear)
        yield SystemCommand("Regenerate last reply", "run the last prompt again", self.action_regenerate)
        yield SystemCommand("Settings", "sampling parameters, parallel replies, system prompt", self.action_settings)
        yield SystemCommand("Keys", "every key", self.action_help)
        yield SystemCommand("Timing details", "show or hide the timing details", self.action_details)

    def help_rows(self) -> list:
        """(keys, what) for every key the app answers to now: the toggles this backend can run, then the rest."""
        toggles = self.session.toggles if self.session is not None else ()
        by_action = {}
        for b in self.BINDINGS:
            by_action.setdefault(b.action, []).append(b.key)
        rows = [("Enter", "send the prompt (while a reply runs: queue it)")]
        rows += [(key_label(",".join(keys)), HELP_TEXT.get(action, action)) for action, keys in by_action.items()
                 if not action.startswith("toggle(")]
        rows.append((self.COMMAND_PALETTE_BINDING, HELP_TEXT["command_palette"]))
        return rows + [(key_label(",".join(by_action[f"toggle('{n}')"])), f"{label(n)}: {EngineOptions.help(n)}")
                       for n in toggles]

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.reason
        self.push_screen(ErrorScreen(message.reason))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("quit", "command_palette", "help_quit", "help"):
            return True
        if self.session is None:
            return False
        if action == "toggle":
            return parameters[0] in self.session.toggles  # no key for a toggle this backend cannot run
        if action == "cancel_reply":
            return True if self.turn is not None else None
        if action in ("regenerate", "clear", "settings", "system") and self.turn is not None:
            return None  # shown dimmed while a reply runs
        return True

    # -- conversation ------------------------------------------------------------------------------------
    async def _mount(self, widget) -> None:
        """Into the conversation, above the queued messages (they are still to come)."""
        await self.query_one("#conversation").mount(widget, before=self.queued[0] if self.queued else None)

    async def _note(self, text: str, error: bool = False) -> None:
        await self._mount(Note(text, classes="error" if error else "", markup=False))

    @on(Input.Submitted, "#prompt")
    async def _submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if not text.strip() or self.session is None:
            return  # an empty prompt does nothing
        event.input.value = ""
        if self.turn is None:
            await self._ask(text)
            return
        message = UserMessage(text, classes="queued", markup=False)
        self.queued.append(message)
        await self.query_one("#conversation").mount(message)
        self._prompt(self._busy())

    def _busy(self) -> str:
        queued = f", {len(self.queued)} queued" if self.queued else ""
        return f"generating... (Esc cancels{queued}; Enter queues a message)"

    async def _ask(self, text: str, echo: bool = True) -> None:
        if echo:
            await self._mount(UserMessage(text, markup=False))
        try:
            turn = self.session.start(text)
        except ToolkitError as e:
            await self._note(f"error: {e}", error=True)
            return
        self.turn = turn
        if turn.note:
            await self._note(turn.note)
        self._group = ReplyGroup(len(turn.handles), markdown=self.session.chat_mode)
        await self._mount(self._group)
        self._prompt(self._busy())
        self._generate(turn)

    @work(thread=True, exclusive=True, group="reply")
    def _generate(self, turn: Turn) -> None:
        me = get_current_worker()
        buf, last = [], 0.0
        for out in self.session.stream(turn, cancelled=lambda: me.is_cancelled):
            buf.append(out)
            now = time.monotonic()
            if now - last >= FLUSH_S:
                self.post_message(ReplyChunk(turn, tuple(buf)))
                buf, last = [], now
        self.post_message(ReplyChunk(turn, tuple(buf), done=True))

    async def on_reply_chunk(self, message: ReplyChunk) -> None:
        turn, group, panel = message.turn, self._group, self.panel
        if turn is not self.turn or group is None:
            return
        new = {}
        for out in message.outputs:
            i = turn.apply(out)
            new[i] = new.get(i, "") + out.text
            step = out.step
            if step is not None and step.index > self._last_step:
                self._last_step = step.index
                tps = step.n_seqs * 1e3 / step.wall_ms if step.kind == "decode" and step.wall_ms > 0 else None
                panel.record(step, tps)
        for i, text in new.items():
            await group.add(i, text)
        st = turn.stats[0]
        if st is not None:
            panel.set_context_use(st.prompt_tokens + st.generated_tokens, self.session.engine.max_context)
        if message.done:
            await self._end(turn)

    async def _end(self, turn: Turn) -> None:
        """Every reply has ended: the final render, the errors and numbers, then the next queued message."""
        await self._group.finish(turn.texts)
        chosen = self._group.active
        self.session.finish(turn, chosen)
        for e in sorted({e for e in turn.errors if e}):
            await self._note(f"error: {e}", error=True)
        st = turn.stats[chosen]
        if st is not None and not all(turn.errors):
            n = len(turn.handles)
            total = sum(s.generated_tokens for s in turn.stats if s is not None)
            batch = f" | {n} replies, {total} tok" if n > 1 else ""
            end = " | cancelled" if turn.cancelled else ""
            await self._note(f"[{st.prompt_tokens} prompt tok ({st.cached_tokens} reused), "
                             f"{st.prefill_tps:.0f} tok/s | {st.generated_tokens} tok, {st.decode_tps:.1f} tok/s"
                             f"{batch}{end}]")
        self.turn = self._group = None
        self._prompt(None)
        await self._send_queued()

    async def _send_queued(self) -> None:
        """The oldest queued message, now that no reply runs (one that cannot start lets the next go)."""
        while self.queued and self.turn is None:
            message = self.queued.pop(0)
            message.remove_class("queued")
            await self._ask(str(message.content), echo=False)

    # -- actions -----------------------------------------------------------------------------------------
    def action_cancel_reply(self) -> None:
        if self.session is not None and self.turn is not None:
            self.session.cancel(self.turn)  # the engine aborts at its next step; the stream then ends

    def action_toggle(self, name: str) -> None:
        s = self.session
        if s is None or name not in s.toggles:
            return
        value = not getattr(s.options, name)
        s.set_option(name, value)
        self.panel.set_requested(s.options, s.effective())
        runs = getattr(s.effective(), name)
        extra = "" if runs == value else f" (runs {'on' if runs else 'off'} here)"
        self.notify(f"{label(name)} {'on' if value else 'off'} from the next step{extra}", timeout=2)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_rows()))

    def action_details(self) -> None:
        if self.panel is None:
            return
        self.details = self.panel.compact  # compact now: show the details
        self._relayout()

    def _apply_settings(self, result: Settings | None) -> None:
        if result is None:
            return
        self.session.configure(result.params, result.replies, result.system)
        self.panel.set_fast_path_note(self.session.fast_path_why())

    def action_settings(self, focus: str | None = None) -> None:
        s = self.session
        engine = " · ".join(f"{label(n)} {'on' if self.panel.state(n) else 'off'}" for n in s.toggles)
        self.push_screen(SettingsModal(Settings(s.params, s.replies, s.system), focus, engine), self._apply_settings)

    def action_system(self) -> None:
        self.action_settings("system")

    async def action_clear(self) -> None:
        if self.session is None or self.turn is not None:
            return
        self.session.clear()
        await self.query_one("#conversation").remove_children()
        await self._note("(new conversation)")

    async def action_regenerate(self) -> None:
        if self.session is None or self.turn is not None:
            return
        text = self.session.undo_last()
        if text is None:
            self.notify("nothing to regenerate", timeout=2)
            return
        conv = self.query_one("#conversation")
        groups = conv.query(ReplyGroup)
        if groups:  # the old reply goes; its prompt and the notes stay as the record of what ran
            await groups.last().remove()
        await self._note("(regenerating)")
        await self._ask(text, echo=not groups)

    async def action_quit(self) -> None:
        if self.session is not None:
            self.session.cancel(self.turn)
            self.session.close()  # the engine thread stops after its current step
            self.session = None
        self.turn = None  # chunks still queued for the cancelled turn are then dropped (they read the session)
        self.workers.cancel_all()
        self.exit(return_code=2 if self.load_error else 0)
