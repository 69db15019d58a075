"""The fault matrix (issue #22): each fault in a run of its own over a sequence-numbered NATS
stream, each run verified sink by sink (0 lost, 0 duplicated, identical to an uninterrupted run)
and timed (from the fault to the next commit once what it took away is back).

The network, the input and the verifier are in :mod:`bench.faults.harness`, the cells in
:mod:`bench.faults.cells`. A NATS server and PostgreSQL are started here (``LocalNats``,
``LocalPostgres``, in a temporary directory), and for the executor cell the standalone two-worker
cluster of ``tests/runtime/e2e/standalone.py``. The Kafka cells run a network of their own (a
Kafka topic in, Kafka sinks), with a reference run of their own, on a Tansu broker whose log is
on an S3 server (``LocalS3``), so that it survives a kill.

Usage::

    ./dev.sh bench bench/faults/matrix.py                  # every cell (~15 min on a quiet 2-core machine)
    python bench/faults/matrix.py --only driver,commit     # the cells whose fault names contain these
    python bench/faults/matrix.py --keep /tmp/fm --no-write

A run of every cell writes ``bench/results/faults.json`` and the table of the "Fault matrix"
section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:  # run as a script: `bench.faults` and `tests` importable
    sys.path.append(str(ROOT))

from bench.faults.cells import CELLS, NOT_RUN, Cell, Result, run_cell  # noqa: E402
from bench.faults.harness import (  # noqa: E402
    Driver,
    Outputs,
    Servers,
    Setup,
    SinkRows,
    Watch,
    code_root,
    expected_windows,
    publish_input,
    publish_kafka_input,
    read_outputs,
    verify,
    write_spec,
)

JSON_OUT = ROOT / "bench" / "results" / "faults.json"
RESULTS = ROOT / "bench" / "RESULTS.md"
TABLE = ("<!-- fault-matrix-table:start -->", "<!-- fault-matrix-table:end -->")


def reference(setup: Setup, directory: Path, expected: list) -> tuple[SinkRows | None, dict[str, Any]]:
    """One uninterrupted run of the same network; it must itself pass the verifier."""
    directory.mkdir(parents=True)
    out = Outputs(directory / "out", "ref")
    spec = write_spec(directory / "net.yaml", setup, out)
    watch = Watch(directory / "ckpt")
    watch.start()
    t0 = time.monotonic()
    d = Driver("reference", directory, spec, directory / "ckpt", "local[2]", 3.0)
    rc = d.proc.wait(900)
    watch.stop()
    if rc != 0:
        raise SystemExit(f"the reference run failed (exit {rc}): {d.last_error()}")
    rows = read_outputs(setup, out)
    bad = [c for c in verify(rows, setup.n, expected, None) if not c.ok]
    if bad:
        raise SystemExit(f"the reference run itself does not pass the verifier: {bad}")
    at = sorted(c["at"] for c in watch.commits.values())
    gaps = sorted(b - a for a, b in zip(at, at[1:], strict=False))
    return rows, {"seconds": round(time.monotonic() - t0, 1), "epochs": len(at),
                  "median_commit_gap_s": round(gaps[len(gaps) // 2], 2) if gaps else None}


def table(results: list[Result]) -> str:
    lines = ["| fault | how | result | lost | dup | zombie writes | = reference | fault → next commit | of which outage | notes |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in results:
        rec = f"{r.recovery_s:.1f} s (epoch {r.next_commit})" if r.recovery_s is not None else "–"
        status = r.status if r.status == "pass" else f"**{r.status}**"
        bad = [f"{c.sink}: lost {c.lost}, dup {c.duplicated}, wrong {c.wrong}{'' if c.identical else ', ≠ ref'}"
               for c in r.checks if not c.ok]
        notes = "; ".join([*bad, *(n.splitlines()[0][:160] for n in r.notes)]).replace("|", "/")
        same = "yes" if r.identical else "**no**"
        zombie = "–" if r.zombie_writes is None else str(r.zombie_writes)
        lines.append(f"| {r.target} × {r.mode} | {r.how} | {status} | {r.lost} | {r.duplicated} | {zombie} | {same} | "
                     f"{rec} | {r.outage_s:.1f} s | {notes} |")
    for target, why in NOT_RUN.items():
        lines.append(f"| {target} | – | not run | | | | | | | {why} |")
    return "\n".join(lines)


def write_results(results: list[Result], meta: dict[str, Any]) -> None:
    """Replace the table between the markers of the "Fault matrix" section of RESULTS.md."""
    block = (f"{TABLE[0]}\nRun {meta['when'][:16]} UTC (commit `{meta['commit']}`{meta['dirty']}), "
             f"{meta['n']:,} records, {meta['cells_seconds'] / 60:.0f} min for {meta.get('cells_run', len(results))} cells; the "
             f"reference run: {meta['reference']['epochs']} epochs, a commit every "
             f"{meta['reference']['median_commit_gap_s']} s (median)."
             + "".join(f" Run again {r['when'][:16]} UTC: {', '.join(r['cells'])}." for r in meta.get("reruns", []))
             + f"\n\n{table(results)}\n{TABLE[1]}")
    text = RESULTS.read_text()
    if TABLE[0] not in text:
        print("RESULTS.md has no fault-matrix table markers: the table is only printed", file=sys.stderr)
        return
    RESULTS.write_text(text[: text.index(TABLE[0])] + block + text[text.index(TABLE[1]) + len(TABLE[1]):])


def merge(results: list[Result], meta: dict[str, Any]) -> None:
    """Cells run again replace the same cells of the last full run (each noted as a rerun); cells
    it did not have are added at the end; cells no longer in the matrix (renamed) are dropped."""
    last = json.loads(JSON_OUT.read_text())
    last.setdefault("cells_run", len(last["cells"]))  # by the full run (cells added since are reruns')
    current = {(c.target, c.mode) for c in CELLS}
    last["cells"] = [c for c in last["cells"] if (c["target"], c["mode"]) in current]
    again = {(r.target, r.mode): r for r in results}
    had = {(c["target"], c["mode"]) for c in last["cells"]}
    for r in results:
        r.notes.insert(0, f"{'rerun' if (r.target, r.mode) in had else 'run'} {meta['when'][:16]} UTC "
                          "(its own reference run)")
    cells = [again[(c["target"], c["mode"])].to_json() if (c["target"], c["mode"]) in again else c
             for c in last["cells"]]
    cells += [r.to_json() for r in results if (r.target, r.mode) not in had]
    last["cells"] = cells
    last["not_run"] = NOT_RUN
    last.setdefault("reruns", []).append({k: meta[k] for k in ("when", "commit", "dirty", "reference")}
                                         | {"cells": [f"{r.target} × {r.mode}" for r in results]})
    JSON_OUT.write_text(json.dumps(last, indent=1) + "\n")
    write_results([Result.from_json(c) for c in cells], last)


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="records in the input stream")
    ap.add_argument("--only", default="", help="comma-separated words: run the cells whose fault or mode contains one")
    ap.add_argument("--keep", default=None, help="keep every run's directory here")
    ap.add_argument("--no-reference", action="store_true",
                    help="no uninterrupted run: check the sinks against the input only (no '= reference')")
    ap.add_argument("--merge", action="store_true",
                    help="put the cells run (with --only) in place of the same cells of bench/results/faults.json")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/faults.json or RESULTS.md")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up (servers, drivers) on a kill

    from eddyline.io.local import LocalNats, LocalPostgres

    words = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    chosen: list[Cell] = [c for c in CELLS if not words or any(w in c.key.lower() for w in words)]
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="eddyline-faults-"))
    base.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"code: {code_root()} · runs in {base}", file=sys.stderr)
    for d in ("nats", "pg"):
        (base / d).mkdir(exist_ok=True)
    nats = LocalNats(str(base / "nats")).start()
    pg = LocalPostgres(str(base / "pg")).start()
    s3 = broker = None
    if any(c.kafka for c in chosen):
        from eddyline.io.local import LocalS3, LocalTansu

        s3 = LocalS3().start()
        s3.bucket("tansu-log")
        broker = LocalTansu(storage="s3://tansu-log/", env={
            **s3.env(), "AWS_ENDPOINT": s3.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}).start()
    servers = Servers(nats, pg, broker)
    t_start = time.monotonic()
    results: list[Result] = []
    try:
        setup = Setup(nats.url, pg.url, "SEQIN", args.n)
        expected = expected_windows(setup.n)
        ref_rows, ref_meta = None, {"epochs": None, "median_commit_gap_s": None}
        kafka_setup, kafka_rows = None, None
        if any(not c.kafka for c in chosen):
            publish_input(setup.nats_url, setup.input_stream, setup.n)
            if not args.no_reference:
                print(f"reference run ({setup.n:,} records, {len(expected):,} windows) ...", file=sys.stderr)
                ref_rows, ref_meta = reference(setup, base / "reference", expected)
                print(f"  {ref_meta}", file=sys.stderr)
        if broker is not None:
            kafka_setup = dataclasses.replace(setup, kafka=broker.bootstrap)
            publish_kafka_input(broker.bootstrap, kafka_setup.input_topic, setup.n)
            if not args.no_reference:
                print("reference run of the Kafka network ...", file=sys.stderr)
                kafka_rows, kafka_meta = reference(kafka_setup, base / "reference-kafka", expected)
                print(f"  {kafka_meta}", file=sys.stderr)
                if ref_rows is None:  # only Kafka cells: theirs is the run's reference
                    ref_meta = kafka_meta
        t_cells = time.monotonic()
        for i, c in enumerate(chosen):
            print(f"[{i + 1}/{len(chosen)}] {c.key} ...", file=sys.stderr, flush=True)
            cluster = None
            if c.cluster:
                from tests.runtime.e2e.standalone import Cluster

                (base / f"cluster{i:02d}").mkdir()
                cluster = Cluster(base / f"cluster{i:02d}")
            try:
                if c.kafka:
                    assert kafka_setup is not None
                    r = run_cell(c, kafka_setup, servers, base / f"cell{i:02d}", kafka_rows, expected, cluster=cluster)
                else:
                    r = run_cell(c, setup, servers, base / f"cell{i:02d}", ref_rows, expected, cluster=cluster)
            finally:
                if cluster is not None:
                    cluster.stop()
            results.append(r)
            print(f"  {r.status}: {r.lost} lost, {r.duplicated} dup, identical {r.identical}, recovery "
                  f"{r.recovery_s} s; {'; '.join(n.splitlines()[0][:200] for n in r.notes)}", file=sys.stderr,
                  flush=True)
        cells_s = time.monotonic() - t_cells
    finally:
        nats.stop()
        pg.stop()
        if broker is not None:
            broker.stop()
        if s3 is not None:
            s3.stop()
    print(table(results))
    meta = {"benchmark": "faults", "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "--short", "HEAD"), "dirty": " + uncommitted changes" if git("status", "--porcelain",
                                                                                             "eddyline") else "",
            "n": args.n, "reference": ref_meta, "cells_seconds": round(cells_s),
            "seconds": round(time.monotonic() - t_start)}
    if args.merge and not args.no_reference and JSON_OUT.exists():
        merge(results, meta)
    elif not args.no_write and not words and not args.no_reference:
        JSON_OUT.write_text(json.dumps({**meta, "cells": [r.to_json() for r in results],
                                        "not_run": NOT_RUN}, indent=1) + "\n")
        write_results(results, meta)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
