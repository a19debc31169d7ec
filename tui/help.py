"""The help screen (F1 or ?): every key the app answers to, the toggles this backend can run among them."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    """All keys; Esc, F1, ?, q or Enter closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 90%; max-width: 100; height: auto; max-height: 90%; border: thick $accent;
                            background: $surface; padding: 0 1; }
    HelpScreen #help-keys { height: auto; max-height: 100%; }
    HelpScreen #help-title { text-style: bold; }
    """
    BINDINGS = [Binding("escape,f1,question_mark,q,enter", "close", "close")]

    def __init__(self, rows):
        """rows: (keys, what) pairs."""
        super().__init__()
        self.rows = list(rows)

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for keys, what in self.rows:
            table.add_row(keys, what)
        with Vertical():
            yield Static("Keys (they work while typing; Esc closes)", id="help-title")
            with VerticalScroll(id="help-keys"):
                yield Static(table, id="help-table")

    def action_close(self) -> None:
        self.dismiss(None)
