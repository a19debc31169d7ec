"""A progress line on stderr for long batches: requests done / read so far, output tok/s (rich).

Requests are read as they are run (feed.py), so the total grows with the input and no time remaining
is guessed."""
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn


class Progress(RichProgress):
    def __init__(self):
        super().__init__(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                         TextColumn("{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(),
                         console=Console(stderr=True), transient=True)
        self.task = self.add_task("generate", total=0, tps=0.0)
        self.n = 0  # output tokens so far

    def admitted(self):
        self.update(self.task, total=self.tasks[0].total + 1)

    def tokens(self, n: int):
        self.n += n
        dt = self.tasks[0].elapsed  # the clock the elapsed-time column shows
        self.update(self.task, tps=self.n / dt if dt else 0.0)

    def done(self):
        self.advance(self.task)
