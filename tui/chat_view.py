"""The conversation's widgets: the user's turns, notes, a group of N streamed replies, the load-error screen.

A chat reply streams into a Textual Markdown widget through `Markdown.get_stream` (which batches fast
writes), then gets one final full render. A base model's continuation is plain text, shown as it is in a
Static: Markdown would join its lines and read its `*`s and `#`s as formatting. N parallel replies show side
by side as columns up to SIDE_BY_SIDE, and one at a time behind tabs beyond that.
"""
from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Markdown, Static, Tab, Tabs

SIDE_BY_SIDE = 4  # up to this many parallel replies show as columns; more show one at a time, with tabs


class UserMessage(Static):
    DEFAULT_CSS = """UserMessage { background: $boost; padding: 0 1; margin: 1 0 0 0; color: $text; }
    UserMessage.queued { color: $text-muted; text-style: italic; }"""


class Note(Static):
    DEFAULT_CSS = """Note { color: $text-muted; padding: 0 1; }
    Note.error { color: $error; text-style: bold; }"""


class ReplyGroup(Vertical):
    """N replies to one prompt: columns side by side for a few, else one at a time behind tabs."""

    DEFAULT_CSS = """
    ReplyGroup { height: auto; }
    ReplyGroup > Horizontal { height: auto; }
    ReplyGroup .reply { width: 1fr; margin: 0 1 0 0; padding: 0 1; }
    ReplyGroup Tabs { height: 2; }
    """

    def __init__(self, n: int, markdown: bool = True, **kw):
        super().__init__(**kw)
        self.n, self.markdown = n, markdown
        self.texts = [""] * n
        self.active = 0
        self.tabbed = n > SIDE_BY_SIDE
        self._streams = {}

    def _reply(self, id: str):
        return Markdown("", id=id, classes="reply") if self.markdown else Static("", id=id, classes="reply",
                                                                                markup=False)

    def compose(self) -> ComposeResult:
        if self.tabbed:
            yield Tabs(*[Tab(str(i + 1), id=f"r{i}") for i in range(self.n)])
            yield self._reply("reply-view")
        else:
            with Horizontal():
                for i in range(self.n):
                    yield self._reply(f"reply-{i}")

    def _view(self, i: int):
        if self.tabbed:
            return self.query_one("#reply-view") if i == self.active else None
        return self.query_one(f"#reply-{i}")

    async def _show(self, view, text: str) -> None:
        if self.markdown:
            await view.update(text)
        else:
            view.update(text)

    async def add(self, i: int, text: str) -> None:
        """New text for reply i: streamed into its Markdown (a stream batches fast writes itself)."""
        self.texts[i] += text
        md = self._view(i)
        if md is None or not text:
            return
        if not self.markdown:
            md.update(self.texts[i])
            return
        if i not in self._streams:
            self._streams[i] = Markdown.get_stream(md)
        await self._streams[i].write(text)

    async def finish(self, texts: list) -> None:
        """The final full render of every reply."""
        for stream in self._streams.values():
            await stream.stop()
        self._streams.clear()
        self.texts = list(texts)
        for i in range(self.n):
            view = self._view(i)
            if view is not None:
                await self._show(view, self.texts[i] or ("*(no text)*" if self.markdown else "(no text)"))

    @on(Tabs.TabActivated)
    async def _switch(self, event: Tabs.TabActivated) -> None:
        event.stop()
        i = int(event.tab.id[1:])
        if i == self.active:
            return
        if self.active in self._streams:
            await self._streams.pop(self.active).stop()
        self.active = i
        await self._show(self.query_one("#reply-view"), self.texts[i])


class ErrorScreen(Screen):
    """The model could not be loaded: say why, and leave on any of q, Esc, Enter, ctrl+q."""

    DEFAULT_CSS = """ErrorScreen { align: center middle; }
    ErrorScreen Static { width: 80%; border: thick $error; padding: 1 2; height: auto; }"""
    BINDINGS = [Binding("q,escape,enter", "app.quit", "quit")]

    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason

    def compose(self) -> ComposeResult:
        text = Text.assemble(("The model could not be loaded", "bold"), "\n\n", self.reason,
                             "\n\nPress q to quit.")
        yield Static(text, id="error-reason")
