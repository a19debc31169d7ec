"""A progress line on stderr for long batches: requests done / total, output tok/s, ETA (rich)."""
import time


class Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self._bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeRemainingColumn
            from rich.console import Console

            self._bar = RichProgress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[tps]:.0f} tok/s"), TimeRemainingColumn(),
                                     console=Console(stderr=True), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("generate", total=self.total, tps=0.0)
            self._t0, self._n = time.perf_counter(), 0
        return self

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
