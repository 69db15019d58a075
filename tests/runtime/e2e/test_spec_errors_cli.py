"""A spec the user can fix, found wrong only once Spark analyses it, is reported once: Eddyline's
line naming the step, with Spark's reason, and none of PySpark's own log lines before it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.e2e.drivers import finish, start

pytestmark = pytest.mark.slow

SPEC = """
name: typo
sources:
  - name: bids
    files: {path: bids, format: json, schema: "auction long, price long, ts timestamp"}
steps:
  - name: cheap
    input: bids
    filter: "nosuchcol > 1"
sinks:
  - name: out
    input: cheap
    files: {path: out, format: json}
"""


def test_an_unknown_column_is_one_line_naming_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bids").mkdir()
    (tmp_path / "bids" / "a.json").write_text('{"auction": 7, "price": 120, "ts": "2026-01-01T00:00:03Z"}\n')
    spec = tmp_path / "net.yaml"
    spec.write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    code, stderr = finish(start(spec, tmp_path / "ckpt"), timeout_s=240)
    assert code == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: step 'cheap': filter: ") and "`nosuchcol`" in errors[0]
    assert '"level": "ERROR"' not in stderr and "Py4JJavaError" not in stderr, stderr
    assert "Setting default log level" not in stderr  # Spark's shell banner, not for a user of eddyline
