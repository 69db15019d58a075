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
