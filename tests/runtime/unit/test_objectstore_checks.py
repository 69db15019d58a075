"""An ``s3://`` checkpoint that cannot be used is refused before anything starts (no Spark, no
lease, nothing written), with one line naming why: a missing bucket, or a store that cannot be
reached."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eddyline.cli import app

SPEC = {"name": "n", "sources": [{"name": "s", "generator": {"rate": 10, "unpaced": True}, "limit": 10}],
        "steps": [], "sinks": [{"name": "out", "input": "s", "console": {}}]}


def run(tmp_path: Path, checkpoint: str) -> tuple[int, str]:
    spec = tmp_path / "net.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    done = CliRunner().invoke(app, ["run", str(spec), "--checkpoint", checkpoint, "--epochs", "1", "--no-live"])
    return done.exit_code, done.output


def test_a_missing_bucket_is_named_before_anything_starts(s3, tmp_path: Path) -> None:
    code, out = run(tmp_path, f"s3://nobucket-{uuid.uuid4().hex[:6]}/ckpt")
    assert code == 3, out  # (the command line's code for a checkpoint it cannot use)
    assert "bucket 'nobucket-" in out and f"does not exist at {s3.endpoint}; create it, or name another" in out


def test_an_unreachable_store_is_named_before_anything_starts(s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eddyline import objectstore

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(objectstore, "bucket", objectstore.ObjectStore)  # (no client cached for the old endpoint)
    code, out = run(tmp_path, "s3://ckb/ckpt")
    assert code == 3, out  # (the command line's code for a checkpoint it cannot use)
    assert "cannot reach the object store at http://127.0.0.1:9 (AWS_ENDPOINT_URL)" in out
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"


def test_a_store_that_ignores_conditional_writes_is_refused_naming_why(s3, tmp_path: Path) -> None:
    """moto's server behind a relay that drops ``If-None-Match`` from every request, as an
    S3-compatible store without conditional writes would ignore it: refused before anything
    starts, since two drivers could both take one lease generation there."""
    import json
    import socket
    import subprocess
    import sys
    import time

    from eddyline import objectstore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    control = tmp_path / "relay.json"
    control.write_text(json.dumps({"strip": ["if-none-match"]}))
    root = str(Path(__file__).resolve().parents[3])
    relay = subprocess.Popen([sys.executable, "-m", "tests.hosts.slowlink", f"127.0.0.1:{port}",
                              f"127.0.0.1:{s3.port}", str(control)], cwd=root)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and relay.poll() is None, "the relay did not start"
                time.sleep(0.05)
        name = s3.bucket(f"nocond-{uuid.uuid4().hex[:6]}").removeprefix("s3://")
        with objectstore.using({**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}):
            code, out = run(tmp_path, f"s3://{name}/ckpt")
        assert code == 3, out
        assert "does not refuse a second create of one object (If-None-Match: *)" in out, out
        with objectstore.using(s3.env()):  # straight to the store, conditional writes work
            code, out = run(tmp_path, f"s3://{name}/ckpt")
        assert code == 0, out
    finally:
        relay.kill()
        relay.wait()


def test_a_request_the_store_does_not_answer_is_named_with_the_store_and_its_timeout(monkeypatch) -> None:
    """Once running, a store that stops answering (a host cut off from it): each kind of request
    fails with one error naming the request, the store and the time it waited, which the command
    line prints as one line (not a traceback of the client's internals)."""
    from eddyline import objectstore
    from eddyline.errors import EddylineError, StoreUnreachable

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("EDDYLINE_STORE_TIMEOUT", "0.5")
    store = objectstore.ObjectStore("ckb")  # (not the process's cached client)
    calls = [("GET", lambda: store.get("ck/head.json")), ("PUT", lambda: store.create("ck/plans/4.json", b"{}")),
             ("PUT", lambda: store.put_if("ck/head.json", b"{}", "etag")), ("LIST", lambda: store.list("ck/plans")),
             ("COPY", lambda: store.copy("ck/a", "ck/b")), ("DELETE", lambda: store.delete(["ck/a"]))]
    for method, call in calls:
        with pytest.raises(StoreUnreachable) as caught:
            call()
        text = str(caught.value)
        assert text.startswith(f"{method} s3://ckb/ck") and "the object store at http://127.0.0.1:9 did not answer" in text
        assert "up to 0.5 s, EDDYLINE_STORE_TIMEOUT" in text and isinstance(caught.value, EddylineError)
