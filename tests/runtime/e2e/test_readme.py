"""The README's "Your own files, in five minutes", run as it is written: its YAML, its SQL and its
Python, each over the same JSON-lines files (one line malformed) in a directory of their own,
give the same windows (checked against DuckDB), and the malformed line is a dead letter where
the README says."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from eddyline.cli import app

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


@pytest.fixture
def workdir(tmp_path: Path):  # noqa: ANN201
    here, handlers = os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.chdir(tmp_path)
    write_bids(tmp_path / "bids")
    yield tmp_path
    os.chdir(here)
    for s, h in handlers.items():
        signal.signal(s, h)


@pytest.mark.parametrize("how", ["yaml", "sql", "python"])
def test_the_readmes_first_query_over_ones_own_files(spark, workdir: Path, how: str) -> None:
    [spec] = blocks(how)
    if how == "python":
        exec(compile(spec, "README.md", "exec"), {})
    else:
        path = workdir / f"my-net.{'yaml' if how == 'yaml' else 'sql'}"
        path.write_text(spec)
        command = ["run", str(path)] if how == "yaml" else ["sql", str(path)]
        result = CliRunner().invoke(app, [*command, "--checkpoint", "ckpt", "--until-idle", "--no-live",
                                          "--master", "local[2]"])
        assert result.exit_code == 0, result.output
        assert "1 dead letters" in result.output and "dead letters (each with its reason) are in ckpt/dead-letters" in result.output
    expected = duckdb.connect().execute(
        "SELECT auction, count(*), max(price), time_bucket(INTERVAL 10 SECOND, ts) FROM read_json('bids/*.json', "
        "columns={auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP'}, ignore_errors=true) WHERE auction IS NOT NULL "
        "GROUP BY ALL ORDER BY ALL").fetchall()
    got = windows(workdir / "out" / "per-auction")
    assert [(a, n, top) for a, n, top, _ in got] == [(a, n, top) for a, n, top, _ in expected] and len(got) == 5 * 12
    dead = list((workdir / "ckpt" / "dead-letters").glob("epoch=*/*"))
    assert dead and "seven" in "".join(p.read_text() for p in dead if p.is_file())
