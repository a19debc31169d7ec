"""A progress line on stderr for long batches: requests done / read so far, output tok/s (rich).

Requests are read as they are run (feed.py), so the total grows with the input and no time remaining
is guessed."""
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn


class Progress(RichProgress):
    def __init__(self):
        super().__init__(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                         TextColumn("{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(),
                         console=Console(stderr=True), transient=True)
        self.task = self.add_task("generate", total=0, tps=0.0)
        self.t0, self.n, self.total = time.perf_counter(), 0, 0

    def admitted(self):
        self.total += 1
        self.update(self.task, total=self.total)

    def tokens(self, n: int):
        self.n += n
        dt = time.perf_counter() - self.t0
        self.update(self.task, tps=self.n / dt if dt > 0 else 0.0)

    def done(self):
        self.advance(self.task)
