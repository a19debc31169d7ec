"""A progress line on stderr for long batches: requests done / read so far, output tok/s (rich).

Requests are read as they are run (feed.py), so the total grows with the input and no time remaining
is guessed."""
import time


class Progress:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn
            from rich.console import Console

            self._bar = RichProgress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("generate", total=0, tps=0.0)
            self._t0, self._n, self._total = time.perf_counter(), 0, 0
        return self

    def admitted(self):
        if self._bar is not None:
            self._total += 1
            self._bar.update(self._task, total=self._total)

    def tokens(self, n: int):
        if self._bar is not None:
            self._n += n
            dt = time.perf_counter() - self._t0
            self._bar.update(self._task, tps=self._n / dt if dt > 0 else 0.0)

    def done(self):
        if self._bar is not None:
            self._bar.advance(self._task)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False
