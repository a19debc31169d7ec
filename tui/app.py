"""ChatApp: the conversation on the left, the prompt at the bottom, the live timings panel on the right.

Generation runs in a thread worker (`_generate`) that only reads the session's merged output stream and
posts batches of RequestOutputs to the app (`post_message` is thread-safe); every widget is touched on the
UI thread, in the message handlers. The engine itself lives on the EngineWorker's thread.

Every EngineOptions switch gets a ctrl+<letter> binding (footer and command palette), generated from the
dataclass: a switch added later appears with no change here (a function key from F2 on, once the free letters
run out, then ctrl+F2 on). `sampler_fast_path` and `sparse_prefill` take ctrl+f / ctrl+s when they exist.
"""
from __future__ import annotations

import sys
import time
from functools import partial

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from toolkit.errors import ToolkitError
from toolkit.engine.options import EngineOptions

from .chat_view import ErrorScreen, Note, ReplyGroup, UserMessage
from .session import ChatSession, Turn, fast_path_note
from .settings import Settings, SettingsModal
from .timings_panel import TimingsPanel

SWITCH_INTERVAL_S = 5e-5  # see on_mount
FLUSH_S = 1 / 15  # the worker posts outputs at most this often (many replies x fast steps = many tokens)
RESERVED_KEYS = {"sampler_fast_path": "f", "sparse_prefill": "s"}
# ctrl+letters taken by the prompt Input's editing keys, the terminal (m=enter, i=tab, h=backspace,
# j=newline), quit/copy (q, c), the palette (p), the two reserved switches, and the app's own commands.
APP_KEYS = {"clear": "l", "regenerate": "r", "settings": "o", "system": "y"}
_TAKEN = set("acdeiuwkxvmhjqpzfs") | set(APP_KEYS.values())


def toggle_keys(names) -> dict:
    """switch name -> ctrl+<letter>: the reserved ones, then the first free initial, then any free letter; once
    the letters run out, function keys from F2 on, then ctrl+F2 on."""
    letters, used = {n: RESERVED_KEYS[n] for n in names if n in RESERVED_KEYS}, set(_TAKEN)
    for name in names:
        if name in letters:
            continue
        words = name.split("_")
        candidates = [w[0] for w in reversed(words) if w] + [c for c in name if c.isalpha()] + \
            list("bgnotlry")
        letter = next((c for c in candidates if c not in used), None)
        if letter is not None:
            letters[name] = letter
            used.add(letter)
    spare = iter([f"f{i}" for i in range(2, 13)] + [f"ctrl+f{i}" for i in range(2, 13)])
    return {**{n: f"ctrl+{k}" for n, k in letters.items()}, **{n: next(spare) for n in names if n not in letters}}


TOGGLE_KEYS = toggle_keys(EngineOptions.names())


def _label(name: str) -> str:
    return name.replace("_", " ")


# -- messages from the worker thread ------------------------------------------------------------------------
class Loaded(Message):
    def __init__(self, session: ChatSession):
        super().__init__()
        self.session = session


class LoadFailed(Message):
    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason


class ReplyChunk(Message):
    def __init__(self, turn: Turn, outputs: tuple):
        super().__init__()
        self.turn, self.outputs = turn, outputs


class ReplyDone(Message):
    def __init__(self, turn: Turn):
        super().__init__()
        self.turn = turn


# -- the command palette ------------------------------------------------------------------------------------
class ChatCommands(Provider):
    """One command per engine switch, and the conversation commands."""

    def _commands(self):
        app = self.app
        if not isinstance(app, ChatApp) or app.session is None:
            return []
        cmds = []
        for name in EngineOptions.names():
            state = "on" if getattr(app.session.options, name) else "off"
            cmds.append((f"Toggle {_label(name)} (now {state})", partial(app.action_toggle, name),
                         EngineOptions.help(name)))
        cmds += [("System prompt", app.action_system, "edit the system prompt"),
                 ("Clear conversation", app.action_clear, "start a new conversation"),
                 ("Regenerate last reply", app.action_regenerate, "run the last prompt again"),
                 ("Settings", app.action_settings, "sampling parameters, parallel replies, system prompt")]
        return cmds

    async def discover(self) -> Hits:
        for title, callback, help_text in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, callback, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


# -- the app ------------------------------------------------------------------------------------------------
class ChatApp(App):
    TITLE = "toolkit chat"
    CSS = """
    #main { height: 1fr; }
    #chat-column { width: 1fr; }
    #conversation { height: 1fr; padding: 0 1; }
    #prompt { dock: bottom; }
    #side { width: 64; border-left: solid $primary; }
    #loading { padding: 1 2; color: $text-muted; }
    """
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("ctrl+q", "quit", "quit", priority=True),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("escape", "cancel_reply", "cancel"),
        Binding(f"ctrl+{APP_KEYS['settings']}", "settings", "settings"),
        Binding(f"ctrl+{APP_KEYS['system']}", "system", "system prompt", show=False),
        Binding(f"ctrl+{APP_KEYS['clear']}", "clear", "clear"),
        Binding(f"ctrl+{APP_KEYS['regenerate']}", "regenerate", "regenerate"),
    ] + [Binding(key, f"toggle('{name}')", _label(name), priority=True) for name, key in TOGGLE_KEYS.items()]

    def __init__(self, load, **kw):
        """`load()` returns a ChatSession; it runs in a thread, and whatever it raises becomes the error screen."""
        super().__init__(**kw)
        self._load_session = load
        self.session: ChatSession | None = None
        self.panel: TimingsPanel | None = None
        self.turn: Turn | None = None
        self._group: ReplyGroup | None = None
        self._last_step = -1
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
        self._load()

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
        self.panel = TimingsPanel(s.header, EngineOptions.names(), s.peak_gbps, s.engine.weight_bytes,
                                  id="timings")
        side = self.query_one("#side")
        await side.remove_children()
        await side.mount(self.panel)
        self.panel.set_context_use(0, s.engine.max_context)
        self.panel.set_fast_path_note(fast_path_note(s.params))
        mode = "chat template" if s.chat_mode else "no chat template: plain continuation"
        await self._note(f"{s.model_name} ({mode}) · {getattr(s.engine, 'device_note', '')}")
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = False
        prompt.placeholder = "message (Enter sends)" if s.chat_mode else "text to continue (Enter sends)"
        prompt.focus()
        self.refresh_bindings()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.reason
        self.push_screen(ErrorScreen(message.reason))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("quit", "command_palette", "help_quit"):
            return True
        if self.session is None:
            return False
        if action == "cancel_reply":
            return True if self.turn is not None else None
        if action in ("regenerate", "clear", "settings", "system") and self.turn is not None:
            return None  # shown dimmed while a reply runs
        return True

    # -- conversation ------------------------------------------------------------------------------------
    async def _note(self, text: str, error: bool = False) -> None:
        await self.query_one("#conversation").mount(Note(text, classes="error" if error else "", markup=False))

    @on(Input.Submitted, "#prompt")
    async def _submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if not text.strip() or self.session is None or self.turn is not None:
            return  # an empty prompt does nothing
        event.input.value = ""
        await self._ask(text)

    async def _ask(self, text: str, echo: bool = True) -> None:
        conv = self.query_one("#conversation")
        if echo:
            await conv.mount(UserMessage(text, markup=False))
        try:
            turn = self.session.start(text)
        except ToolkitError as e:
            await self._note(f"error: {e}", error=True)
            return
        self.turn = turn
        self._group = ReplyGroup(len(turn.handles))
        await conv.mount(self._group)
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = True
        prompt.placeholder = "generating... (Esc cancels)"
        self.refresh_bindings()
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
        if buf:
            self.post_message(ReplyChunk(turn, tuple(buf)))
        self.post_message(ReplyDone(turn))

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

    async def on_reply_done(self, message: ReplyDone) -> None:
        turn = message.turn
        if turn is not self.turn:
            return
        await self._group.finish(turn.texts)
        chosen = self._group.active
        self.session.finish(turn, chosen)
        errors = sorted({e for e in turn.errors if e})
        for e in errors:
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
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = False
        prompt.placeholder = "message (Enter sends)" if self.session.chat_mode else "text to continue"
        prompt.focus()
        self.refresh_bindings()

    # -- actions -----------------------------------------------------------------------------------------
    def action_cancel_reply(self) -> None:
        if self.session is not None and self.turn is not None:
            self.session.cancel(self.turn)  # the engine aborts at its next step; the stream then ends

    def action_toggle(self, name: str) -> None:
        s = self.session
        if s is None:
            return
        value = not getattr(s.options, name)
        s.set_option(name, value)
        self.panel.mark_toggle(name, value)
        runs = getattr(s.effective(), name)
        extra = "" if runs == value else " (this backend runs it as off)"
        self.notify(f"{_label(name)} {'on' if value else 'off'}{extra}", timeout=2)

    def _settings(self) -> Settings:
        s = self.session
        return Settings(s.params, s.replies, s.system)

    def _apply_settings(self, result: Settings | None) -> None:
        if result is None:
            return
        self.session.configure(result.params, result.replies, result.system)
        self.panel.set_fast_path_note(fast_path_note(result.params))

    def action_settings(self) -> None:
        self.push_screen(SettingsModal(self._settings()), self._apply_settings)

    def action_system(self) -> None:
        self.push_screen(SettingsModal(self._settings(), focus="system"), self._apply_settings)

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
