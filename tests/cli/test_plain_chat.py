"""`chat --plain` (also what a pipe gets) on the scripted engine: Ctrl-C stops the current reply, not the
session; SIGTERM ends it; a failed line makes the exit code 1."""
import io
import os
import signal
import threading
import time

import pytest
from tests.tui.tui_fakes import fake_session

from toolkit.cli.chat import converse
from toolkit.cli.common import Interrupted, signals
from toolkit.engine import SamplingParams


def _session(max_tokens=300, **kw):
    session = fake_session(reply=["tok "] * 1000, max_context=4096, delay=0.002, **kw)
    session.configure(params=SamplingParams(max_tokens=max_tokens))
    return session


def _signal_once_text_flows(out, signum):
    def send():
        while len(out.getvalue()) < 20:
            time.sleep(0.005)
        os.kill(os.getpid(), signum)
    threading.Thread(target=send, daemon=True).start()


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(capsys):
    session, out = _session(), io.StringIO()
    _signal_once_text_flows(out, signal.SIGINT)
    with signals.installed():
        rc = converse(session, iter(["first", "second"]), out)
    session.close()
    first, second = out.getvalue().splitlines()
    assert rc == 0 and first.endswith(" [stopped]") and first.count("tok") < 300
    assert second == "tok " * 300  # the next line still got its whole reply
    assert session.messages[1]["content"] == first[:-len(" [stopped]")].strip()  # the partial reply is history
    assert capsys.readouterr().err.count("prompt tok") == 2


def test_sigterm_still_ends_the_session():
    session, out = _session(), io.StringIO()
    _signal_once_text_flows(out, signal.SIGTERM)
    with signals.installed(), pytest.raises(Interrupted) as e:
        converse(session, iter(["first", "second"]), out)
    session.close()
    assert e.value.signum == signal.SIGTERM and "\n" not in out.getvalue()


@pytest.mark.parametrize("lines", [["hi", None, "again"], ["x" * 300, "short"]], ids=["bad line", "too long"])
def test_a_failed_line_makes_it_exit_1_and_the_chat_goes_on(lines, capsys):
    """None: a line _lines already reported (not UTF-8, too long); "x" * 300: a prompt the context cannot hold."""
    session = fake_session(max_context=256)
    rc = converse(session, iter(lines), io.StringIO())
    session.close()
    assert rc == 1 and capsys.readouterr().err.count("prompt tok") == len(lines) - 1
