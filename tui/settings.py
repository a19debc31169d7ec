"""The settings modal: one row per SamplingParams field (so fields a later issue adds appear by themselves),
plus the number of parallel replies and the system prompt; above them, read-only, the engine's toggles as
the last step ran them (their keys flip them, F1 lists the keys). Save checks everything by building the values;
a bad one gets a message under the form and the modal stays open.

Fields holding strings or pairs (stop, bad_words, logit_bias) have no row: comma-separated text cannot say
them faithfully (a stop string may hold a comma). They keep the values they have."""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, Switch

from toolkit.engine import SamplingParams
from toolkit.errors import ToolkitError

MAX_REPLIES = 256
NO_ROW = {"stop", "bad_words", "logit_bias"}


@dataclass(frozen=True)
class Settings:
    params: SamplingParams
    replies: int
    system: str


def _kind(tp) -> tuple[type, bool]:
    """(base type, optional) of a field annotation: int, float, bool, tuple or another (text), and whether None is
    allowed."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return typing.get_origin(tp) or tp, False


def _show(value) -> str:
    return "" if value is None else ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


PARSERS = {int: (int, "an integer"), float: (float, "a number"),
           tuple: (lambda text: tuple(int(x) for x in text.replace(",", " ").split()), "integers separated by commas")}


def _parse(name: str, tp, text: str):
    base, optional = _kind(tp)
    text = text.strip()
    if not text:
        if optional:
            return None
        if base is not tuple:  # an empty tuple is a value
            raise ValueError(f"{name}: a value is needed")
    parse, what = PARSERS.get(base, (str, "text"))
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"{name}: expected {what}, got {text!r}") from None


class SettingsModal(ModalScreen[Settings | None]):
    """Edit the sampling parameters, parallel replies and system prompt; dismisses with Settings or None."""

    DEFAULT_CSS = """
    SettingsModal { align: center middle; }
    SettingsModal > Vertical { width: 72; max-width: 100%; height: 90%; border: thick $accent;
                               background: $surface; padding: 0 1; }
    SettingsModal #settings-form { height: 1fr; }
    SettingsModal .row { height: 3; }
    SettingsModal .row Label { width: 22; padding: 1 1 0 0; }
    SettingsModal .row Input { width: 1fr; }
    SettingsModal #settings-engine { color: $text-muted; }
    SettingsModal #settings-error { color: $error; height: auto; }
    SettingsModal #settings-buttons { height: 3; align-horizontal: right; }
    """
    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("ctrl+o", "save", "save", priority=True)]

    def __init__(self, settings: Settings, focus: str | None = None, engine: str = ""):
        """`engine`: the toggles as the last step ran them, shown read-only (their keys flip them)."""
        super().__init__()
        self.settings = settings
        self.engine = engine
        self._focus = focus
        hints = typing.get_type_hints(SamplingParams)
        self._fields = [(f.name, hints[f.name]) for f in dataclasses.fields(SamplingParams) if f.name not in NO_ROW]

    def compose(self) -> ComposeResult:
        p = self.settings.params
        with Vertical():
            yield Static("[b]Settings[/b]  (ctrl+o saves, Esc cancels)")
            if self.engine:
                yield Static(f"engine, as it ran: {self.engine} (F1 lists their keys)", id="settings-engine",
                             markup=False)
            with VerticalScroll(id="settings-form"):
                for name, tp in self._fields:
                    base, optional = _kind(tp)
                    if base is bool:
                        field = Switch(value=bool(getattr(p, name)), id=f"f-{name}")
                    else:
                        kind = {int: "integer", float: "number"}.get(base, "text")
                        field = Input(_show(getattr(p, name)), type=kind, id=f"f-{name}",
                                      placeholder="blank: none" if optional else "")
                    yield Horizontal(Label(name.replace("_", " ")), field, classes="row")
                yield Horizontal(Label("parallel replies"), Input(str(self.settings.replies), type="integer",
                                 id="f-replies", placeholder=f"1 to {MAX_REPLIES}"), classes="row")
                yield Horizontal(Label("system prompt"), Input(self.settings.system, id="f-system", placeholder="none"),
                                 classes="row")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one(f"#f-{self._focus}" if self._focus else "Input").focus()

    def values(self) -> Settings:
        """The form as Settings; raises ValueError with a message fit for the user."""
        kw = {}
        for name, tp in self._fields:
            w = self.query_one(f"#f-{name}")
            kw[name] = w.value if isinstance(w, Switch) else _parse(name, tp, w.value)
        try:
            params = dataclasses.replace(self.settings.params, **kw)
        except (ToolkitError, TypeError) as e:
            raise ValueError(str(e)) from None
        replies = _parse("parallel replies", int, self.query_one("#f-replies", Input).value)
        if not 1 <= replies <= MAX_REPLIES:
            raise ValueError(f"parallel replies must be between 1 and {MAX_REPLIES}, got {replies}")
        return Settings(params, replies, self.query_one("#f-system", Input).value.strip())

    def action_save(self) -> None:
        try:
            settings = self.values()
        except ValueError as e:
            self.query_one("#settings-error", Static).update(f"{e}")
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_save() if event.button.id == "save" else self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()
