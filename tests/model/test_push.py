"""`detour export RUN --push-to-hub REPO`: what goes up, what is refused, and the real upload against a local Hub."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from detour.cli import main as detour
from detour.model.export import export_hf
from detour.model.load import load_mlm_model, tiny_modernbert_config

REPO = Path(__file__).resolve().parents[2]


def _card(synthetic: bool) -> dict:
    return {"name": "tiny", "arm": "detour", "base_model": "answerdotai/ModernBERT-base", "license": "apache-2.0",
            "license_source": "from the recipe's card.license", "language": ["en"], "synthetic": synthetic,
            "phases": [{"name": "clm", "objective": "clm", "tokens": 1000, "tokens_done": 1000, "final_loss": 2.5},
                       {"name": "decay", "objective": "mlm", "mask_rate": 0.15, "tokens": 100, "tokens_done": 100,
                        "final_loss": 3.25}]}


@pytest.fixture(scope="module")
def runs(minilm, tmp_path_factory):
    """Two run folders as `detour train` leaves them: one on real text, one on SYNTHETIC text."""
    model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=0)
    made = {}
    for kind in ("real", "synthetic"):
        run = tmp_path_factory.mktemp(kind)
        export_hf(model, tok, run / "model", _card(kind == "synthetic"))
        export_hf(model, tok, run / "export" / "clm", {**_card(kind == "synthetic"), "taken": {"phase": "clm"}})
        export_hf(model, tok, run / "export" / "clm" / "512", {**_card(kind == "synthetic"),
                                                                "taken": {"phase": "clm", "tokens": 512}})
        made[kind] = run
    return made


class FakeHub:
    """A local Hub API answering what `create_repo` and `upload_folder` ask, recording every request."""

    def __init__(self):
        self.requests: list[dict] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, body: dict, status: int = 200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append({"method": "GET", "path": self.path})
                self._reply({"error": "not served here"}, 404)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append({"method": "POST", "path": self.path, "auth": self.headers.get("authorization"),
                                     "body": body})
                if self.path == "/api/repos/create":
                    sent = json.loads(body)
                    return self._reply({"url": f"{hub.url}/{sent['organization']}/{sent['name']}"})
                if self.path == "/api/validate-yaml":
                    return self._reply({"errors": [], "warnings": []})
                if "/preupload/" in self.path:  # every file inline in the commit: no LFS or Xet storage to fake
                    files = json.loads(body)["files"]
                    return self._reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                  for f in files]})
                if "/commit/" in self.path:
                    return self._reply({"commitUrl": f"{hub.url}/me/tiny/commit/{'a' * 40}", "commitOid": "a" * 40})
                self._reply({"error": "not served here"}, 404)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self, part: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST" and part in r["path"]]


@pytest.fixture
def hub():
    server = FakeHub()
    yield server
    server.server.shutdown()


def push(args: list[str], hub: FakeHub, home: Path, token: str | None) -> subprocess.CompletedProcess:
    """`detour export ...` in a clean interpreter that talks to `hub`, with or without a token."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=str(REPO / "src"))
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "detour.cli", "export", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_dry_run_prints_repo_folder_files_with_sizes_and_front_matter(runs, capsys):
    run = runs["real"]
    assert detour(["export", str(run), "--folder", "export/clm", "--push-to-hub", "me/tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "repository: me/tiny" in out and f"folder:     {run / 'export' / 'clm'}" in out
    assert "tiny: CLM detour, end of phase clm" in out  # the card's title
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "." in line.split()[0]]
    own = sorted(p.name for p in (run / "export" / "clm").iterdir() if p.is_file())
    assert listed == own and "model.safetensors" in own  # the export at 512 tokens is not part of it
    size = (run / "export" / "clm" / "model.safetensors").stat().st_size
    assert f"{size / 1e6:.1f} MB" in out
    assert "  license: apache-2.0" in out and "  base_model: answerdotai/ModernBERT-base" in out
    assert "  pipeline_tag: feature-extraction" in out  # last trained as a causal LM: no fill-mask widget
    assert "dry run: nothing uploaded" in out
    assert "token: none" in out and "a real push would refuse: no Hugging Face token" in out


def test_a_synthetic_export_is_refused_unless_allowed(runs, hub, tmp_path, capsys):
    args = ["export", str(runs["synthetic"]), "--push-to-hub", "me/tiny", "--dry-run"]
    assert detour(args) == 0  # a dry run that worked: it says what a real push would refuse
    out = capsys.readouterr().out
    assert "a real push would refuse: its model card says it was trained on SYNTHETIC text" in out
    assert "--allow-synthetic" in out and "dry run: nothing uploaded" in out
    assert detour(args + ["--allow-synthetic"]) == 0
    assert "would refuse: its model card" not in capsys.readouterr().out
    done = push([str(runs["synthetic"]), "--push-to-hub", "me/tiny"], hub, tmp_path / "hf-home", token="hf_test")
    assert done.returncode == 2 and "SYNTHETIC" in done.stderr and "nothing was uploaded" in done.stderr
    assert hub.requests == []


def test_a_hub_that_cannot_be_reached_is_named_in_one_line(runs, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the connection is refused, for real
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    nowhere = FakeHub.__new__(FakeHub)
    nowhere.url = f"http://127.0.0.1:{closed}"
    done = push([str(runs["real"]), "--push-to-hub", "me/tiny"], nowhere, tmp_path / "hf-home", token="hf_test")
    assert done.returncode == 2, done.stderr
    assert f"cannot reach the Hub at http://127.0.0.1:{closed}" in done.stderr and "Nothing was uploaded" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_folder_that_is_not_an_export_lists_the_runs_exports(runs, capsys):
    assert detour(["export", str(runs["real"]), "--folder", "export/decay", "--push-to-hub", "me/tiny"]) == 2
    assert "the exports of" in (err := capsys.readouterr().err) and "model, export/clm, export/clm/512" in err
    assert detour(["export", str(runs["real"]), "--folder", "../elsewhere", "--push-to-hub", "me/tiny"]) == 2
    assert detour(["export", str(runs["real"]), "--push-to-hub", "not a repo id", "--dry-run"]) == 2
    assert "not a Hub repository id" in capsys.readouterr().err


def test_no_token_stops_before_anything_reaches_the_hub(runs, hub, tmp_path):
    done = push([str(runs["real"]), "--push-to-hub", "me/tiny"], hub, tmp_path / "hf-home", token=None)
    assert done.returncode == 2, done.stderr
    assert "no Hugging Face token" in done.stderr and "HF_TOKEN" in done.stderr and "nothing was uploaded" in done.stderr
    assert hub.requests == []


def test_push_creates_the_repo_and_uploads_the_exports_own_files_in_one_commit(runs, hub, tmp_path):
    run = runs["real"]
    folder = run / "export" / "clm"
    done = push([str(run), "--folder", "export/clm", "--push-to-hub", "me/tiny", "--private"], hub,
                tmp_path / "hf-home", token="hf_test_token")
    assert done.returncode == 0, done.stderr
    assert "pushed" in done.stdout and "/me/tiny" in done.stdout
    assert all(r["auth"] == "Bearer hf_test_token" for r in hub.requests if r["method"] == "POST")
    (create,) = hub.posts("/api/repos/create")
    assert json.loads(create["body"]) == {"name": "tiny", "organization": "me", "visibility": "private"}
    (validate,) = hub.posts("/api/validate-yaml")  # the Hub checks the card's front matter
    assert json.loads(validate["body"])["content"] == (folder / "README.md").read_text(encoding="utf-8")
    (commit,) = hub.posts("/api/models/me/tiny/commit/main")
    lines = [json.loads(line) for line in commit["body"].decode().splitlines()]
    assert lines[0]["value"]["summary"] == "detour export: tiny: CLM detour, end of phase clm"
    sent = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in lines[1:]}
    own = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert sent == own  # byte for byte, and nothing from export/clm/512/


def test_out_writes_exactly_what_a_push_uploads_and_overwrites_nothing(runs, tmp_path, capsys):
    run = runs["synthetic"]  # writing locally publishes nothing: no --allow-synthetic needed
    folder = run / "model"
    bundle = tmp_path / "bundle" / "detour"
    assert detour(["export", str(run), "--out", str(bundle), "--dry-run"]) == 0
    assert f"would write these files into {bundle}" in capsys.readouterr().out and not bundle.exists()
    assert detour(["export", str(run), "--out", str(bundle)]) == 0
    assert f"wrote {len(list(p for p in folder.iterdir() if p.is_file()))} files into {bundle}" in capsys.readouterr().out
    own = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == own  # the export's own files, no sub-exports
    assert not [p for p in bundle.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    before = {p.name: p.read_bytes() for p in bundle.iterdir()}
    assert detour(["export", str(run), "--out", str(bundle)]) == 2  # not empty: refused, untouched
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == before
    assert detour(["export", str(run), "--out", str(folder / "inside")]) == 2
    assert "inside the export" in capsys.readouterr().err and not (folder / "inside").exists()
    assert detour(["export", str(run)]) == 2
    assert "give --push-to-hub REPO (upload) and/or --out DIR" in capsys.readouterr().err
