"""The README's "Your own files, in five minutes", run as it is written: its YAML, its SQL and its
Python, each over the same JSON-lines files (one line malformed) in a directory of their own,
give the same windows (checked against DuckDB), and the malformed line is a dead letter where
the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

README = Path(__file__).resolve().parents[3] / "README.md"


def blocks(language: str) -> list[str]:
    text = README.read_text()
    section = text[text.index("## Your own files, in five minutes"):]
    section = section[: section.index("\n## ", 5)]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def write_bids(directory: Path) -> None:
    directory.mkdir()
    for f in range(3):
        with open(directory / f"part-{f}.json", "w") as out:
            for i in range(40):
                out.write(json.dumps({"auction": i % 5, "price": 100 + i, "ts": f"2026-01-01T00:{f:02d}:{i:02d}Z"}) + "\n")
    (directory / "part-1.json").open("a").write('{"auction": "seven", "price": 1, "ts": "2026-01-01T00:01:00Z"}\n')


def windows(out: Path) -> list[tuple]:
    return duckdb.connect().execute(
        f"SELECT auction, bids, top, window_start FROM read_json('{out}/epoch=*/*.json') ORDER BY ALL").fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["yaml", "sql", "python"])
def test_the_readmes_first_query_over_ones_own_files(tmp_path: Path, how: str) -> None:
    """Run as a user runs it: from the directory that holds ``bids/``, in a process of its own."""
    write_bids(tmp_path / "bids")
    [spec] = blocks(how)
    path = tmp_path / f"my-net.{ {'yaml': 'yaml', 'sql': 'sql', 'python': 'py'}[how] }"
    path.write_text(spec)
    eddyline = [sys.executable, "-m", "eddyline.cli"]
    command = {"yaml": [*eddyline, "run", path.name], "sql": [*eddyline, "sql", path.name],
               "python": [sys.executable, path.name]}[how]
    if how != "python":
        command += ["--checkpoint", "ckpt", "--until-idle", "--no-live", "--master", "local[2]"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "EDDYLINE_SPARK_MASTER": "local[2]"})
    assert done.returncode == 0, done.stderr[-3000:]
    if how != "python":
        assert "1 dead letters" in done.stdout
        assert "dead letters (each with its reason) are in ckpt/dead-letters" in done.stderr
    expected = duckdb.connect().execute(
        f"SELECT auction, count(*), max(price) FROM read_json('{tmp_path}/bids/*.json', "
        "columns={auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP'}, ignore_errors=true) WHERE auction IS NOT NULL "
        "GROUP BY auction, time_bucket(INTERVAL 10 SECOND, ts) ORDER BY ALL").fetchall()
    got = [(a, n, top) for a, n, top, _ in windows(tmp_path / "out" / "per-auction")]
    assert sorted(got) == expected and len(got) == 5 * 12
    dead = [p for p in (tmp_path / "ckpt" / "dead-letters").rglob("*") if p.is_file()]
    assert dead and "seven" in "".join(p.read_text(errors="replace") for p in dead)
