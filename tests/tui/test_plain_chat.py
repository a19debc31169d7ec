"""`chat --plain` (also what a pipe gets): Ctrl-C stops the current reply, not the session."""
import io
import signal

from toolkit.cli.chat import _reply
from toolkit.cli.common import Interrupted
from toolkit.engine.llm_engine import RequestOutput
from toolkit.engine.timings import RequestStats


class _Engine:
    def __init__(self, interrupt_at):
        self.steps, self.aborted, self.interrupt_at, self.live = 0, [], interrupt_at, False

    def add_request(self, ids, params):
        self.live = True
        return "r"

    def has_unfinished(self):
        return self.live

    def abort(self, rid):
        self.aborted.append(rid)

    def step(self):
        self.steps += 1
        if self.aborted:
            self.live = False
            return [RequestOutput("r", None, "", "abort", None, RequestStats())]
        if self.steps == self.interrupt_at:
            raise Interrupted(signal.SIGINT)
        return [RequestOutput("r", 5, "tok ", None, None, RequestStats())]


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on():
    engine, out, reply = _Engine(interrupt_at=3), io.StringIO(), []
    _reply(engine, [1, 2], None, out, reply)
    assert engine.aborted == ["r"] and not engine.has_unfinished()
    assert out.getvalue() == "tok tok  [stopped]" and reply == ["tok ", "tok "]


def test_sigterm_still_ends_the_session():
    engine = _Engine(interrupt_at=2)
    engine.step = lambda: (_ for _ in ()).throw(Interrupted(signal.SIGTERM))
    try:
        _reply(engine, [1], None, io.StringIO(), [])
    except Interrupted as e:
        assert e.signum == signal.SIGTERM
    else:
        raise AssertionError("SIGTERM was swallowed")
