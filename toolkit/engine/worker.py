"""The engine on its own thread, fed through a queue: what a UI (or any multi-threaded caller) talks to.

    worker = EngineWorker(engine)               # the worker thread becomes the engine's owner
    handle = worker.submit(prompt_ids, params)  # from any thread (submit_many: several, admitted together)
    for out in handle:                          # RequestOutputs of this request, as they are produced
        ...
    worker.cancel(handle.request_id)            # takes effect at the next step boundary
    worker.set_options(EngineOptions(...))      # likewise
    worker.close()

Commands and outputs cross threads only through queues, so the engine itself needs no locks, and
Numba kernels (nogil) and CUDA waits release the GIL while the caller's thread keeps running.
"""
import itertools
import queue
import threading

from ..errors import ToolkitError
from toolkit.engine.timings import RequestStats
from .llm_engine import LLMEngine, RequestOutput

_DONE = object()  # on a handle's queue: no more outputs; on the command queue: close


class RequestHandle:
    """Iterate to receive this request's outputs; the iteration ends after its final output."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._queue = queue.Queue()

    def __iter__(self):
        while (out := self._queue.get()) is not _DONE:
            yield out
            if out.finish_reason is not None:
                return


class EngineWorker:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        engine.detach_thread()
        self._commands = queue.Queue()
        self._handles = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="engine-worker", daemon=True)
        self._thread.start()

    # -- any thread -----------------------------------------------------------------------------------
    def submit(self, prompt_ids, params=None) -> RequestHandle:
        return self.submit_many([(prompt_ids, params)])[0]

    def submit_many(self, requests) -> list:
        """[(prompt_ids, params)] as one command: they are all admitted before the next step, so N
        replies to one prompt start together as one batch."""
        handles = [RequestHandle(f"w{next(self._ids)}") for _ in requests]
        batch = [(h, list(ids), p) for h, (ids, p) in zip(handles, requests)]
        self._commands.put(lambda: self._add(batch))
        return handles

    def cancel(self, request_id: str):
        self._commands.put(lambda: self.engine.abort(request_id))

    def set_options(self, options):
        self._commands.put(lambda: self.engine.set_options(options))

    def close(self, timeout: float = 10.0):
        self._commands.put(_DONE)
        self._thread.join(timeout)

    # -- the worker thread ------------------------------------------------------------------------------
    def _loop(self):
        engine = self.engine
        while True:
            # Block while idle; between steps, run every command that has arrived (here, on the engine's thread: the
            # only reader of the queue, so get() does not block once empty() is False).
            while not engine.has_unfinished() or not self._commands.empty():
                cmd = self._commands.get()
                if cmd is _DONE:
                    for h in self._handles.values():
                        h._queue.put(_DONE)
                    return
                cmd()
            try:
                outs = engine.step()
            except Exception as e:  # a bug, not bad input: end every waiting reader with it, keep serving
                outs = []
                for rid in list(self._handles):
                    engine.abort(rid)
                    self._handles.pop(rid)._queue.put(
                        RequestOutput(rid, None, "", "error", None, RequestStats(), f"{type(e).__name__}: {e}"))
            for out in outs:
                h = self._handles.get(out.request_id)
                if h is not None:
                    h._queue.put(out)
                    if out.finish_reason is not None:
                        del self._handles[out.request_id]

    def _add(self, batch):
        for handle, ids, params in batch:
            try:
                self.engine.add_request(ids, params, request_id=handle.request_id)
                self._handles[handle.request_id] = handle
            except ToolkitError as e:
                handle._queue.put(RequestOutput(handle.request_id, None, "", "error", None, RequestStats(), str(e)))
