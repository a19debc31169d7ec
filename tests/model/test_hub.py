"""`--model ORG/NAME[@REVISION]` through the real entry points (`python -m toolkit ...` and `LLM(model=...)`).

Offline: a Hugging Face cache laid out in the test (HF_HOME in tmp_path, HF_HUB_OFFLINE=1) whose snapshots link
to the stories260K files. What needs the network (a download, a repository or revision the Hub does not have, a
Hub that does not answer) talks to a stand-in for the Hub on 127.0.0.1 (HF_ENDPOINT): nothing leaves the machine.
"""
import fcntl
import hashlib
import http.server
import json
import os
import pty
import shutil
import socket
import struct
import subprocess
import sys
import termios
import threading

import pytest
from tests.conftest import ROOT

MAIN, V1 = "a" * 40, "b" * 40  # commits: refs/main -> MAIN, refs/v1 (a tag) -> V1, whose context is 256
TEMPLATE = "{% for m in messages %}{{ m.content }}\n{% endfor %}"  # stories260K has none; chat needs one
SAMPLING = {"temperature": 0.25, "top_k": 7}  # the cached snapshots' generation_config.json


def _env(hf_home, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    return dict(env, PYTHONPATH=str(ROOT), HF_HOME=str(hf_home), **extra)


def _toolkit(env, *args, cwd=None, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], env=env, cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=300)


def _error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines, r.stderr
    return lines[-1]


@pytest.fixture
def offline(tmp_path, stories_dir):
    """HF_HOME with org/stories cached at MAIN (refs/main) and V1 (refs/v1), offline."""
    repo = tmp_path / "hf" / "hub" / "models--org--stories"
    for commit in (MAIN, V1):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (snap / f).symlink_to(stories_dir / f)
        (snap / "chat_template.jinja").write_text(TEMPLATE)
        (snap / "generation_config.json").write_text(json.dumps(SAMPLING))
        config = json.loads((stories_dir / "config.json").read_text())
        (snap / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=256 if commit == V1
                                                          else config["max_position_embeddings"])))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(V1)
    return _env(tmp_path / "hf", HF_HUB_OFFLINE="1")


GEN = ["generate", "--device", "cpu", "--max-tokens", "4", "--max-context", "300"]


def test_generate_by_hub_id_from_the_cache(offline):
    r = _toolkit(offline, *GEN, "--model", "org/stories", "Once upon a time")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


@pytest.mark.parametrize("revision", ["v1", V1])
def test_revision_picks_its_snapshot(offline, revision):
    """V1's config holds 256 positions, MAIN's 512: --max-context 300 fits only MAIN."""
    r = _toolkit(offline, *GEN, "--model", f"org/stories@{revision}", "Once")
    assert r.returncode == 2
    assert _error_line(r) == "error: --max-context must be between 2 and 256 for this model, got 300"


def test_chat_and_bench_by_hub_id(offline):
    r = _toolkit(offline, "chat", "--plain", "--device", "cpu", "--model", "org/stories", "--max-tokens", "3",
                 stdin="Hello\n/quit\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = _toolkit(offline, "bench", "--device", "cpu", "--model", "org/stories@v1", "--prefill", "16", "--batch", "1",
                 "--depth", "0", "--decode", "2", "-r", "1", "--format", "json")
    env = json.loads(r.stdout)["environment"]
    assert r.returncode == 0 and env["model"] == "org/stories@v1" and env["max_context"] <= 256


def test_terminal_chat_takes_the_snapshots_sampling_defaults(offline):
    """The terminal UI's loader (cli/chat.py _tui) with the app stubbed: its params come from the snapshot."""
    code = ("import tui.app, toolkit.cli.chat as chat\n"
            "class App:\n"
            "    def __init__(self, load): self.load, self.load_error, self.return_code = load, None, 0\n"
            "    def run(self): p = self.load().params; print(p.temperature, p.top_k)\n"
            "tui.app.ChatApp = App\n"
            "chat._tui(chat.setup_arg_parser().parse_args(['--model', 'org/stories', '--device', 'cpu']))")
    r = subprocess.run([sys.executable, "-c", code], env=offline, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["0.25", "7"], r.stderr


def test_terminal_chat_fetches_the_model_before_the_screen(offline):
    """The UI takes the terminal, so a Hub id is resolved (and its bars drawn) before the app starts: a missing
    model is the one-line error, exit 2, and no app is made."""
    code = ("import sys, tui.app, toolkit.cli.chat as chat\n"
            "class App:\n"
            "    def __init__(self, load): print('app made')\n"
            "tui.app.ChatApp = App\n"
            "args = chat.setup_arg_parser().parse_args(['--model', 'org/missing', '--device', 'cpu'])\n"
            "sys.exit(chat.run(chat._tui, args))")
    r = subprocess.run([sys.executable, "-c", code], env=offline, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "app made" not in r.stdout
    assert _error_line(r).startswith("error: org/missing: no such local folder")


def test_llm_api_by_hub_id(offline):
    code = ("from toolkit import LLM, SamplingParams; "
            "llm = LLM('org/stories@v1', device='cpu'); "
            "print(llm.engine.max_context, llm.generate('Once', SamplingParams(max_tokens=3))[0].outputs[0].token_ids)")
    r = subprocess.run([sys.executable, "-c", code], env=offline, capture_output=True, text=True, timeout=300)
    context, ids = r.stdout.split(" ", 1)
    assert r.returncode == 0 and context == "256" and len(json.loads(ids)) == 3, r.stderr


def test_a_local_folder_wins_over_the_hub_id(offline, tmp_path, stories_dir):
    local = tmp_path / "here" / "org" / "stories"
    shutil.copytree(stories_dir, local)
    config = json.loads((local / "config.json").read_text())
    (local / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=128)))
    r = _toolkit(offline, *GEN, "--model", "org/stories", "Once", cwd=tmp_path / "here")
    assert r.returncode == 2 and _error_line(r).endswith("between 2 and 128 for this model, got 300")


def test_offline_and_not_cached_is_one_line(offline, tmp_path):
    r = _toolkit(offline, *GEN, "--model", "org/missing", "Once")
    assert r.returncode == 2 and r.stdout == ""
    assert _error_line(r) == (f"error: org/missing: no such local folder, not (or only partly) in the Hugging Face "
                              f"cache ({tmp_path / 'hf' / 'hub'}), and HF_HUB_OFFLINE is set")


# -- a stand-in for the Hub: org/stories at MAIN, every file of the stories260K folder ----------------------------
class FakeHub(http.server.BaseHTTPRequestHandler):
    files: dict = {}

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self.path.split("?")[0]
        repo = "/api/models/org/stories/"
        if path == repo + "revision/main":
            return self._send(json.dumps({"id": "org/stories", "sha": MAIN,
                                          "siblings": [{"rfilename": n} for n in self.files]}).encode())
        if path.startswith(repo + "revision/"):
            return self._send(b"{}", 404, {"X-Error-Code": "RevisionNotFound"})
        if path == repo + f"tree/{MAIN}":
            tree = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for n, b in self.files.items()]
            return self._send(json.dumps(tree).encode())
        name = path.removeprefix(f"/org/stories/resolve/{MAIN}/")
        if name in self.files:
            body = self.files[name]
            return self._send(body, 200, {"X-Repo-Commit": MAIN, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'})
        self._send(b"{}", 404, {"X-Error-Code": "RepoNotFound"})

    def _send(self, body: bytes, code: int = 200, headers: dict | None = None):
        self.send_response(code)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


@pytest.fixture
def hub(tmp_path, stories_dir, monkeypatch):
    monkeypatch.setattr(FakeHub, "files", {p.name: p.read_bytes() for p in stories_dir.iterdir() if p.is_file()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield _env(tmp_path / "hf", HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def test_download_fetches_only_what_the_engine_reads_and_no_bars_off_a_terminal(hub, tmp_path):
    r = _toolkit(hub, *GEN, "--model", "org/stories", "Once upon a time")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert "Fetching" not in r.stderr and "%|" not in r.stderr
    snap = tmp_path / "hf" / "hub" / "models--org--stories" / "snapshots" / MAIN
    assert sorted(p.name for p in snap.iterdir()) == [  # no README.md, no stories260K.gguf
        "config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
        "tokenizer_config.json"]


def test_download_shows_bars_on_a_terminal(hub):
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm draws nothing 0 columns wide
    p = subprocess.Popen([sys.executable, "-m", "toolkit", *GEN, "--model", "org/stories", "Once"], env=hub,
                         stdout=subprocess.PIPE, stderr=side)
    os.close(side)
    err = b""
    while chunk := _read(main):
        err += chunk
    os.close(main)
    assert p.wait(timeout=300) == 0 and b"Fetching 6 files" in err and b"100%" in err, err


def _read(fd) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the child closed the terminal
        return b""


@pytest.mark.parametrize("model,message", [
    ("org/other", "error: org/other: no such local folder, and no such model on the Hugging Face Hub (a private "
                  "one needs HF_TOKEN)"),
    ("org/stories@nope", "error: org/stories@nope: the Hugging Face Hub has no revision 'nope' of org/stories"),
])
def test_what_the_hub_does_not_have_is_one_line(hub, model, message):
    r = _toolkit(hub, *GEN, "--model", model, "Once")
    assert r.returncode == 2 and r.stdout == "" and _error_line(r) == message


def test_a_hub_that_does_not_answer_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _toolkit(_env(tmp_path / "hf", HF_ENDPOINT=f"http://127.0.0.1:{port}"), *GEN, "--model", "org/stories", "x")
    line = _error_line(r)
    assert r.returncode == 2 and line.startswith("error: org/stories: no such local folder, not (or only partly) in")
    assert "the Hugging Face Hub cannot be reached (ConnectError" in line
