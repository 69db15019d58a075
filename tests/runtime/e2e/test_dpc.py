"""Delay-Process-Correct with a real broker: bids come from local files and from a NATS stream;
the NATS server is killed for longer than the network's ``max_delay`` and started again. The run
goes on without it (tentative windows, published apart from the stable ones), and once the server
is back it takes the tentative output back and recomputes: the stable output equals DuckDB's over
every bid, as if the server had never been away."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pytest

from eddyline.api.validate import load_spec
from eddyline.io.local import LocalNats
from eddyline.io.natswire import NatsConnection, ensure_stream
from eddyline.runtime.engine import Engine

from .helpers import T0, Crash, CrashAfterPublish

pytestmark = pytest.mark.slow

CHUNKS, PER_CHUNK = 10, 80  # per source: chunk k holds the bids of [20k s, 20(k+1) s)
MAX_DELAY_S = 2.0


def bids(seed: int) -> list[list[dict[str, Any]]]:
    """Per chunk, in-order bids (no row is ever late, however the epochs cut the input)."""
    rng = random.Random(seed)
    out = []
    for k in range(CHUNKS):
        out.append([
            {"auction": rng.randint(0, 9), "price": rng.randint(0, 999),
             "ts": (T0 + timedelta(milliseconds=k * 20_000 + i * (20_000 // PER_CHUNK))).isoformat().replace("+00:00", "Z")}
            for i in range(PER_CHUNK)
        ])
    return out


class Partition:
    """The progress reporter of the run: kills the NATS server once epoch ``cut_after`` is
    reported, and starts it again after ``tentative_epochs`` tentative epochs."""

    console = None

    def __init__(self, server: Any, cut_after: int, tentative_epochs: int):
        self.server, self.cut_after, self.tentative_epochs = server, cut_after, tentative_epochs
        self.records: list[dict[str, Any]] = []
        self.cut_at = self.healed_at = 0.0
        self.seen_tentative: list[list[str]] = []  # the tentative directories, while they are out

    def report(self, record: dict[str, Any]) -> None:
        record = {**record, "reportedAt": time.monotonic()}
        self.records.append(record)
        if record["batchId"] == self.cut_after and not self.cut_at:
            self.server.kill()
            self.cut_at = time.monotonic()
        tentative = [r for r in self.records if r.get("tentative")]
        if len(tentative) == self.tentative_epochs and not self.healed_at:
            self.server.start()
            self.healed_at = time.monotonic()


def network(files: Path, url: str, stream: str, out: Path, pg: str, table: str, bus: str) -> dict[str, Any]:
    schema = "auction long, price long, ts timestamp"
    return {
        "name": "dpc-bids", "trigger": 0, "lanes": 2, "key_groups": 16, "max_delay": f"{MAX_DELAY_S}s",
        "sources": [
            {"name": "local", "files": {"path": str(files), "format": "json", "schema": schema, "max_files_per_epoch": 1}},
            {"name": "remote", "max_rows_per_epoch": PER_CHUNK,
             "nats": {"url": url, "stream": stream, "schema": schema, "wait": "20s"}},
        ],
        "steps": [
            {"name": "all", "union": ["local", "remote"]},
            {"name": "per_auction", "input": "all", "window_aggregate": {
                "key": "auction", "time": "ts", "window": {"size": "20s"},
                "aggregates": {"n": "count(*)", "total": "sum(price)"}, "watermark_delay": "1s"}},
        ],
        "sinks": [
            {"name": "out", "input": "per_auction", "files": {"path": str(out), "format": "parquet"}},
            {"name": "mem", "input": "per_auction", "memory": {}},
            {"name": "db", "input": "per_auction",
             "postgres": {"url": pg, "table": table, "mode": "upsert", "key": ["auction", "window_start"]}},
            {"name": "bus", "input": "per_auction", "nats": {"url": bus, "stream": f"{stream}OUT", "subject": f"{stream}OUT.rows"}},
        ],
    }


def bus_messages(url: str, stream: str) -> tuple[list[int], list[int], list[dict[str, Any]]]:
    """The output stream read back: the epochs of tentative messages, the epochs retracted, and
    the stable rows (window_start as epoch milliseconds)."""
    import asyncio

    import nats

    async def read() -> list[Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.subscribe(f"{stream}.rows", stream=stream, ordered_consumer=True)
        got = []
        while True:
            try:
                got.append(await sub.next_msg(timeout=2))
            except nats.errors.TimeoutError:
                break
        await nc.close()
        return got

    marked, retracted, stable = [], [], []
    for m in asyncio.run(read()):
        headers = m.headers or {}
        if "Eddyline-Retract" in headers:
            retracted.append(int(headers["Eddyline-Retract"]))
        elif headers.get("Eddyline-Tentative") == "true":
            marked.append(int(headers["Eddyline-Epoch"]))
        else:
            row = json.loads(m.data)
            stable.append({**row, "window_start": _millis(row["window_start"])})
    return marked, retracted, stable


def _millis(value: Any) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)


def oracle(rows: list[dict[str, Any]]) -> list[tuple]:
    con = duckdb.connect()
    con.register("bids", pa.Table.from_pylist(rows))
    return con.execute(
        "SELECT auction, epoch_ms(time_bucket(INTERVAL 20 seconds, ts::TIMESTAMP)), count(*), sum(price) "
        "FROM bids GROUP BY ALL ORDER BY ALL"
    ).fetchall()


def inputs(tmp_path: Path, url: str, seed: int, prefix: str) -> tuple[list, list, Path, str]:
    """The local bids (seed ``seed``) in JSON files, the remote ones (``seed + 1``) in a new
    stream: both, the files' directory and the stream's name."""
    local, remote = bids(seed), bids(seed + 1)
    files = tmp_path / "in"
    files.mkdir()
    for k, chunk in enumerate(local):
        (files / f"bids-{k:03d}.json").write_text("".join(json.dumps(b) + "\n" for b in chunk))
    stream = f"{prefix}{uuid.uuid4().hex[:8]}"
    conn = NatsConnection(url)
    ensure_stream(conn, stream, [f"{stream}.>"])
    conn.publish([(f"{stream}.bid", None, json.dumps(b).encode()) for chunk in remote for b in chunk])
    conn.close()
    return local, remote, files, stream


def windows(glob: str) -> list[tuple]:
    return duckdb.connect().execute(
        f"SELECT auction, epoch_ms(window_start), n, total FROM read_parquet('{glob}') ORDER BY ALL"
    ).fetchall()


def test_a_partitioned_source_gives_tentative_windows_then_corrections_and_the_stable_output_of_an_unbroken_run(
    spark, nats_server, postgres, tmp_path: Path
) -> None:
    """The driver dies once the correcting epoch published (its retractions done, nothing
    committed); the restarted one replays it from its stable base on resident lanes and retracts
    again. (Tentative epochs on resident lanes: below.)"""
    local, remote, files, stream = inputs(tmp_path, nats_server.url, 1, "DPC")

    out = tmp_path / "out"
    table = f"dpc_{uuid.uuid4().hex[:8]}"
    bus = LocalNats().start()  # the output's broker is not the one that goes away
    spec = load_spec(network(files, nats_server.url, stream, out, postgres.url, table, bus.url))
    partition = Partition(nats_server, cut_after=3, tentative_epochs=3)
    fixing = 3 + 3 + 1

    def engine(crashing: bool = False) -> Engine:  # (the restart replays the correction on resident lanes)
        return Engine(spec if crashing else spec.model_copy(update={"execution": "resident"}), spark,
                      str(tmp_path / "ckpt"), reporter=partition,  # type: ignore[arg-type]
                      faults=CrashAfterPublish(fixing) if crashing else None)

    try:
        with pytest.raises(Crash):
            engine(crashing=True).run(until_idle=True)
        summary = engine().run(until_idle=True)
    except BaseException:
        bus.stop()
        raise
    finally:
        if nats_server.proc is None:
            nats_server.start()
    records = partition.records
    assert {r["execution"]["mode"] for r in records if r["batchId"] >= fixing} == {"resident"}

    # delay, then process: the first tentative epoch came once max_delay had passed, not before
    tentative = [r for r in records if r.get("tentative")]
    assert [r["tentative"] for r in tentative] == [["remote"]] * 3
    delayed = tentative[0]["reportedAt"] - partition.cut_at
    assert MAX_DELAY_S <= delayed < MAX_DELAY_S + 15, delayed
    assert all(s["numInputRows"] == 0 for r in tentative for s in r["sources"] if s["description"] == "remote")

    # correct: the next epoch continued from the stable commit before them and took them back
    epochs = [r["batchId"] for r in tentative]
    fix = next(r for r in records if r.get("retracts"))  # (the crashed attempt reported nothing)
    assert fix["retracts"] == epochs and fix["batchId"] == epochs[-1] + 1 == fixing
    assert not fix.get("tentative") and fix["replayed"]
    committed = json.loads((tmp_path / "ckpt" / "commits" / f"{epochs[0]:010d}.json").read_text())
    assert committed["tentative"] == ["remote"] and committed["stable"] == epochs[0] - 1
    remote_start = next(s for s in fix["sources"] if s["description"] == "remote")["startOffset"]
    assert remote_start == 3 * PER_CHUNK  # where the last stable commit left the stream

    # the tentative windows were published apart, then moved to the corrections of the fixing epoch
    retracted = out / "_corrections" / f"epoch={fix['batchId']:010d}" / "retracted"
    assert {p.name for p in retracted.iterdir()} <= {f"epoch={e:010d}" for e in epochs}
    assert not (out / "_tentative").exists() or not any((out / "_tentative").iterdir())
    tentative_rows = windows(f"{retracted}/*/*.parquet")
    assert tentative_rows, "no tentative window was published"
    # they counted the local bids only: each is below the complete window
    expected = oracle([b for chunk in local + remote for b in chunk])
    complete = {(a, w): (n, t) for a, w, n, t in expected}
    assert all(n <= complete[(a, w)][0] for a, w, n, _ in tentative_rows)
    assert any(n < complete[(a, w)][0] for a, w, n, _ in tentative_rows)

    # the stable output is every bid's, from both sinks, each window once
    assert windows(f"{out}/epoch=*/*.parquet") == expected
    assert summary.late_rows == 0
    # the database holds the same windows, none of them still marked tentative (upserts took the
    # tentative values back to their before-images, then the stable epochs wrote the complete ones)
    with psycopg.connect(postgres.url) as conn:
        db = conn.execute(f"SELECT auction, window_start, n, total, tentative FROM {table} ORDER BY 1, 2").fetchall()
    assert [(a, int(w.timestamp() * 1000), n, t) for a, w, n, t, _ in db] == expected
    assert not any(row[-1] for row in db)
    # the bus carried tentative messages, one retraction per tentative epoch, then the stable rows
    try:
        marked, retracted, stable = bus_messages(bus.url, f"{stream}OUT")
    finally:
        bus.stop()
    assert marked and set(marked) <= set(epochs) and sorted(set(retracted)) == epochs
    assert sorted((m["auction"], m["window_start"], m["n"], m["total"]) for m in stable) == [
        (a, w, n, t) for a, w, n, t in expected]


def test_resident_lanes_delay_process_and_correct_as_jobs_do(spark, nats_server, postgres, tmp_path: Path) -> None:
    """The same partition on resident lanes, one window per source (so no step but the windows
    runs in Spark): the tentative epochs and the correction run resident (the correction on a
    new stage, loaded from the stable commit), the sinks opened for tentative epochs; the run
    is cut once the epoch after the correction published, and a per-epoch job replays it and
    finishes. The stable output is every bid's; the tentative windows were taken back."""
    local, remote, files, stream = inputs(tmp_path, nats_server.url, 3, "DPCR")
    table = f"dpcr_{uuid.uuid4().hex[:8]}"
    raw = network(files, nats_server.url, stream, tmp_path / "out", "", "", "")
    window = raw["steps"][1]["window_aggregate"]
    raw = {**raw, "name": "dpc-resident", "steps": [
        {"name": "w_local", "input": "local", "window_aggregate": window},
        {"name": "w_remote", "input": "remote", "window_aggregate": window}], "sinks": [
        {"name": "out_local", "input": "w_local", "files": {"path": str(tmp_path / "local"), "format": "parquet"}},
        {"name": "out_remote", "input": "w_remote", "files": {"path": str(tmp_path / "remote"), "format": "parquet"}},
        {"name": "mem", "input": "w_local", "memory": {}},
        {"name": "db", "input": "w_local", "postgres": {"url": postgres.url, "table": table, "mode": "upsert",
                                                        "key": ["auction", "window_start"]}}]}
    partition = Partition(nats_server, cut_after=3, tentative_epochs=3)
    fixing = 3 + 3 + 1
    try:
        first = Engine(load_spec({**raw, "execution": "resident"}), spark, str(tmp_path / "ckpt"),
                       reporter=partition, faults=CrashAfterPublish(fixing + 1))  # type: ignore[arg-type]
        with pytest.raises(Crash):
            first.run(until_idle=True)
        mem = first.sinks["mem"]
        then = Engine(load_spec({**raw, "execution": "job"}), spark, str(tmp_path / "ckpt"), reporter=partition)  # type: ignore[arg-type]
        then.run(until_idle=True)
    finally:
        if nats_server.proc is None:
            nats_server.start()
    records = partition.records
    assert {r["execution"]["mode"] for r in records if r["batchId"] <= fixing} == {"resident"}
    assert records[-1]["execution"]["mode"] == "job" and first.executor.stages_started >= 2

    tentative = [r for r in records if r.get("tentative")]
    assert [r["tentative"] for r in tentative] == [["remote"]] * 3
    assert tentative[0]["reportedAt"] - partition.cut_at >= MAX_DELAY_S
    epochs = [r["batchId"] for r in tentative]
    fix = next(r for r in records if r.get("retracts"))
    assert fix["retracts"] == epochs and fix["batchId"] == fixing and not fix.get("tentative")
    committed = json.loads((tmp_path / "ckpt" / "commits" / f"{epochs[0]:010d}.json").read_text())
    assert committed["tentative"] == ["remote"] and committed["stable"] == epochs[0] - 1
    assert next(s for s in fix["sources"] if s["description"] == "remote")["startOffset"] == 3 * PER_CHUNK

    # the tentative windows (the local ones: the remote source gave none) went out apart and came back
    retracted = tmp_path / "local" / "_corrections" / f"epoch={fixing:010d}" / "retracted"
    assert {p.name for p in retracted.iterdir()} <= {f"epoch={e:010d}" for e in epochs}
    assert not any((tmp_path / "local" / "_tentative").iterdir())
    assert windows(f"{retracted}/*/*.parquet")
    # the memory sink of the resident run took its tentative epochs back: each window it holds once
    assert mem.tentative == set()  # type: ignore[attr-defined]
    held = [(r["auction"], int(r["window_start"].timestamp() * 1000), r["n"], r["total"])
            for e in sorted(mem.collected) for r in mem.collected[e].to_pylist()]  # type: ignore[attr-defined]
    # every bid's windows, each once, whichever mode wrote them
    expected = oracle([b for chunk in local for b in chunk])
    assert windows(f"{tmp_path / 'local'}/epoch=*/*.parquet") == expected
    assert held and len(set(held)) == len(held) and set(held) <= set(expected)
    with psycopg.connect(postgres.url) as db:  # (opened for tentative epochs, which it took back)
        rows = db.execute(f"SELECT auction, window_start, n, total, tentative FROM {table} ORDER BY 1, 2").fetchall()
    assert [(a, int(w.timestamp() * 1000), n, t) for a, w, n, t, _ in rows] == expected
    assert not any(row[-1] for row in rows)
    assert windows(f"{tmp_path / 'remote'}/epoch=*/*.parquet") == oracle([b for chunk in remote for b in chunk])
