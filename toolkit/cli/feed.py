"""Requests read from any iterator (a JSONL reader) on their own thread, a bounded number ahead of the engine.

The engine belongs to the main thread (LLMEngine checks), so only reading and parsing happen here:
the main loop takes requests between engine steps, and a producer that writes a line every few
seconds gets each result while it is still writing. The queue holds at most `ahead` requests, so
an endless input waits in its pipe instead of in memory.
"""
import contextlib
import queue
import threading

_POLL_S = 0.1  # how long a wait lasts before the caller (or the reader) looks at its signals again
_END = object()


class Feed:
    def __init__(self, requests, ahead: int):
        self._queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self.done = False  # every request was handed out
        threading.Thread(target=self._read, args=(requests,), name="generate-input", daemon=True).start()

    def _read(self, requests):
        try:
            for req in requests:
                if not self._put(req):
                    return
            self._put(_END)
        except BaseException as e:  # a read error (or a bug) reaches the main thread, which reports it
            self._put(e)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=_POLL_S)
                return True
        return False

    def get(self, wait: bool):
        """The next request, or None: none arrived (within _POLL_S when `wait`), or the input ended.
        An exception the reader raised is raised here."""
        if self.done:
            return None
        try:
            item = self._queue.get(timeout=_POLL_S) if wait else self._queue.get_nowait()
        except queue.Empty:
            return None
        if item is _END or isinstance(item, BaseException):
            self.done = True
            if item is not _END:
                raise item
            return None
        return item

    def close(self) -> list:
        """Stop reading (a reader blocked on a silent stdin stays so: it is a daemon); the requests
        read but not yet taken. `done` tells whether they are the last."""
        self._stop.set()
        items = []
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self._queue.get_nowait())
        self.done = self.done or any(item is _END for item in items)
        return [item for item in items if item is not _END and not isinstance(item, BaseException)]
