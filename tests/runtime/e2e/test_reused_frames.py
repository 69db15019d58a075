"""A network whose frames depend on nothing but the sources' slices (stateless steps over JSON
files) builds them once and runs them every epoch: each epoch's tasks still read exactly the
epoch's own slice, its observations (rows, bad records, sink counts) are its own, and a changed
network builds them again at the epoch the change takes effect."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.compile import EpochCompiler
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox

DDL = "auction long, price long, ts timestamp"
FILES = 4


def _write(directory: Path) -> dict[int, tuple[list[tuple[int, int]], int]]:
    """File f (epoch f + 1): 40 + 15 f good rows and f + 1 bad ones; per epoch its good rows
    and its bad count (every epoch's differ, so a stale slice or count shows)."""
    directory.mkdir(parents=True)
    out = {}
    for f in range(FILES):
        good = [(f * 1000 + i, (i * 37) % 500) for i in range(40 + 15 * f)]
        lines = [json.dumps({"auction": a, "price": p, "ts": f"2026-01-01T00:00:{i % 60:02d}Z"})
                 for i, (a, p) in enumerate(good)]
        lines += [json.dumps({"auction": "x", "price": 1, "ts": "2026-01-01T00:00:00Z"})] * (f + 1)
        (directory / f"bids-{f}.json").write_text("\n".join(lines) + "\n")
        out[f + 1] = (good, f + 1)
    return out


def _spec(src: Path, out: Path) -> dict:
    return {
        "name": "reused", "trigger": 0, "lanes": 2,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": DDL,
                                               "max_files_per_epoch": 1}}],
        "steps": [{"name": "some", "input": "bids", "filter": "auction % 3 = 0"},
                  {"name": "cols", "input": "some", "select": ["auction", "price"]}],
        "sinks": [{"name": "picked", "input": "cols", "files": {"path": str(out / "picked"), "format": "parquet"}},
                  {"name": "all", "input": "bids", "files": {"path": str(out / "all"), "format": "parquet"}}],
    }


def _per_epoch(directory: Path, columns: str) -> dict[int, list[tuple]]:
    rows = duckdb.connect().execute(
        f"SELECT CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT), {columns} "
        f"FROM read_parquet('{directory}/epoch=*/*.parquet', filename=true) ORDER BY ALL").fetchall()
    got: dict[int, list[tuple]] = {}
    for e, *rest in rows:
        got.setdefault(e, []).append(tuple(rest))
    return got


def test_frames_built_once_read_each_epochs_own_slice_and_a_change_builds_them_again(
    spark, tmp_path: Path, monkeypatch
) -> None:
    files = _write(tmp_path / "in")
    ckpt = str(tmp_path / "ckpt")
    built: list[tuple[int, str]] = []  # (epoch, node) of every node the engine's compiler built
    source, step = EpochCompiler._source, EpochCompiler._step

    def counted(method, name_of):
        def call(self, *args, **kwargs):
            if self.checkpoint == ckpt:  # not the warm-up's own compiler
                built.append((self.epoch, name_of(args)))
            return method(self, *args, **kwargs)
        return call

    monkeypatch.setattr(EpochCompiler, "_source", counted(source, lambda a: a[0]))
    monkeypatch.setattr(EpochCompiler, "_step", counted(step, lambda a: a[0].name))
    net = load_spec(_spec(tmp_path / "in", tmp_path / "out"))
    Engine(net, spark, ckpt).run(epochs=2)
    assert built == [(1, "bids"), (1, "some"), (1, "cols")]  # epoch 2 ran the frames of epoch 1
    Inbox(ckpt).submit({"some.filter": "auction % 3 = 1"})
    Engine(net, spark, ckpt).run(until_idle=True)
    # a new driver, with the change: built for epoch 3 and kept to the end
    assert built[3:] == [(3, "bids"), (3, "some"), (3, "cols")]

    # every epoch's rows are its own file's, through the filter in force at that epoch
    picked = _per_epoch(tmp_path / "out" / "picked", "auction, price")
    want = {e: sorted((a, p) for a, p in good if a % 3 == (0 if e < 3 else 1)) for e, (good, _) in files.items()}
    assert picked == want
    assert _per_epoch(tmp_path / "out" / "all", "auction, price") == {e: sorted(g) for e, (g, _) in files.items()}
    # the observations are each epoch's own: the sinks' counts in the commits and the bad records
    commits = {c.epoch: c for c in Checkpoint(ckpt).commits()}
    for e, (good, _) in files.items():
        assert commits[e].sinks == {"picked": len(want[e]), "all": len(good)}
    dead = duckdb.connect().execute(
        f"SELECT CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT), count(*) "
        f"FROM read_json('{ckpt}/dead-letters/epoch=*/*.json', filename=true) GROUP BY ALL ORDER BY ALL").fetchall()
    assert dead == [(e, bad) for e, (_, bad) in files.items()]


@pytest.mark.parametrize("inline", [True, False], ids=["run-inline", "run-in-a-file"])
def test_a_kept_stateful_step_runs_its_lanes_on_each_epochs_rows(spark, tmp_path: Path, monkeypatch, inline) -> None:
    """A keyed aggregate kept across epochs, read through a memory sink (which collects its
    frame in the driver): every epoch shuffles and aggregates its own rows, so the changelog,
    applied in order, ends at the totals over every file (a frame planned only once would
    reuse the first epoch's shuffle output). The lanes' epoch (state index, watermark) goes
    with the tasks, or, when it is large, in a file of the checkpoint."""
    from eddyline.io.sinks import make_sink
    from eddyline.runtime import compile as compiling

    if not inline:
        monkeypatch.setattr(compiling, "LANE_RUN_INLINE", 0)

    files = _write(tmp_path / "in")
    ckpt = str(tmp_path / "ckpt")
    steps: list[tuple[int, str]] = []
    step = EpochCompiler._step

    def counted(self, s, *args, **kwargs):
        if self.checkpoint == ckpt:
            steps.append((self.epoch, s.name))
        return step(self, s, *args, **kwargs)

    monkeypatch.setattr(EpochCompiler, "_step", counted)
    raw = _spec(tmp_path / "in", tmp_path / "out")
    raw["steps"] = [{"name": "keyed", "input": "bids", "select": ["auction % 4 AS k", "price"]},
                    {"name": "totals", "input": "keyed", "aggregate": {"key": "k", "aggregates": {
                        "n": "count(*)", "total": "sum(price)"}}}]
    raw["sinks"] = [{"name": "changes", "input": "totals", "memory": {}}]
    net = load_spec(raw)
    sinks = {s.name: make_sink(s) for s in net.sinks}
    Engine(net, spark, ckpt, sinks=sinks).run(until_idle=True)
    assert steps == [(1, "keyed"), (1, "totals")]  # built once, run every epoch
    in_files = sorted(p.parent.parent.name for p in Path(ckpt).glob("epochs/*/totals/run.json"))
    assert len(in_files) == (0 if inline else FILES + 1)  # (+ the end-of-stream epoch)
    changes = sinks["changes"].table()
    assert changes is not None
    # the changelog summed with its weights (each row taken back cancels the row it replaced)
    # is one live row per key with the totals over every file
    final: dict[int, list[int]] = {}
    for row in changes.to_pylist():
        live = final.setdefault(row["k"], [0, 0, 0])
        for i, v in enumerate((1, row["n"], row["total"])):
            live[i] += row["_diff"] * v
    want: dict[int, list[int]] = {}
    for good, _ in files.values():
        for a, p in good:
            live = want.setdefault(a % 4, [1, 0, 0])
            live[1] += 1
            live[2] += p
    assert final == want


def test_parquet_slices_of_one_footer_schema_share_a_frame_and_each_epoch_knows_its_own_facts(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """Parquet files read in the tasks: the source and the steps behind it are built once while
    the files' footers agree, and again for a file with another column. What the footers tell
    (rows, newest event time) is each epoch's own: the sinks' counts, and the newest time the
    window's commit records, move with every file (a kept node with the first epoch's facts
    would hold them still)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in"
    src.mkdir()
    t0 = 1_767_225_600_000  # 2026-01-01 in ms
    newest, rows = {}, {}
    for f in range(FILES):
        n = 30 + 11 * f
        times = [t0 + 1000 * (10 * f + i % 10) for i in range(n)]
        table = pa.table({"auction": pa.array([f * 1000 + i for i in range(n)], pa.int64()),
                          "price": pa.array([(i * 37) % 500 for i in range(n)], pa.int64()),
                          "ts": pa.array(times, pa.timestamp("ms", tz="UTC"))})
        if f == FILES - 1:
            table = table.append_column("note", pa.array(["late column"] * n))
        pq.write_table(table, src / f"bids-{f}.parquet")
        newest[f + 1], rows[f + 1] = max(times), n
    ckpt = str(tmp_path / "ckpt")
    built: list[tuple[int, str]] = []
    source = EpochCompiler._source

    def counted(self, name, *args, **kwargs):
        if self.checkpoint == ckpt:
            built.append((self.epoch, name))
        return source(self, name, *args, **kwargs)

    monkeypatch.setattr(EpochCompiler, "_source", counted)
    net = load_spec({
        "name": "parquet-kept", "trigger": 0, "lanes": 2,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "parquet", "max_files_per_epoch": 1}}],
        "steps": [{"name": "per_window", "input": "bids", "window_aggregate": {
            "key": "auction", "time": "ts", "window": {"size": "5s"}, "aggregates": {"n": "count(*)"}}}],
        "sinks": [{"name": "all", "input": "bids", "files": {"path": str(tmp_path / "out"), "format": "parquet"}},
                  {"name": "windows", "input": "per_window", "discard": {}}],
    })
    summary = Engine(net, spark, ckpt).run(until_idle=True)
    assert built[:2] == [(1, "bids"), (FILES, "bids")]  # kept for epochs 1..3, built again for the new column
    assert summary.input_rows == sum(rows.values())
    commits = {c.epoch: c for c in Checkpoint(ckpt).commits()}
    for e in range(1, FILES + 1):
        assert commits[e].sinks["all"] == rows[e]
        assert commits[e].steps["per_window"].input_max == [newest[e]]
    got = _per_epoch(tmp_path / "out", "auction")
    assert {e: len(v) for e, v in got.items()} == rows


def test_epochs_alternating_between_small_and_large_slices_keep_a_frame_of_each(
    spark, nats_server, tmp_path: Path, monkeypatch
) -> None:
    """A NATS slice that one task reads whole gets a frame of one task, a larger one a frame of
    a task per lane: two keys. Epochs that alternate between them build each frame (and the
    steps on it) once and then find it kept, and every epoch still reads its own slice."""
    import asyncio

    import nats

    from eddyline.io.jetstream import NatsSource

    stream = f"S{uuid.uuid4().hex[:10]}"

    async def publish() -> None:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.x"])
        for i in range(40):
            await js.publish(f"{stream}.x", json.dumps(
                {"auction": i, "price": i * 7 % 50, "ts": f"2026-01-01T00:00:{i:02d}Z"}).encode())
        await nc.close()

    asyncio.run(publish())
    monkeypatch.setattr(NatsSource, "min_per_task", 5)
    plan = NatsSource.plan

    def alternating(self, start, elapsed_s, cursor=None, cap=None):  # 7 (large), 3 (small), 7, ...
        return plan(self, start, elapsed_s, cursor, 7 if start % 10 == 0 else 3)

    monkeypatch.setattr(NatsSource, "plan", alternating)
    ckpt = str(tmp_path / "ckpt")
    built: list[tuple[int, str]] = []
    source, step = EpochCompiler._source, EpochCompiler._step

    def counted(method, name_of):
        def call(self, *args, **kwargs):
            if self.checkpoint == ckpt:
                built.append((self.epoch, name_of(args)))
            return method(self, *args, **kwargs)
        return call

    monkeypatch.setattr(EpochCompiler, "_source", counted(source, lambda a: a[0]))
    monkeypatch.setattr(EpochCompiler, "_step", counted(step, lambda a: a[0].name))
    raw = _spec(tmp_path / "in", tmp_path / "out")
    raw["sources"] = [{"name": "bids", "nats": {"url": nats_server.url, "stream": stream, "schema": DDL}}]
    Engine(load_spec(raw), spark, ckpt).run(until_idle=True)
    assert built == [(1, "bids"), (1, "some"), (1, "cols"), (2, "bids"), (2, "some"), (2, "cols")]
    ends = [(c.epoch, c.source_ends["bids"]) for c in sorted(Checkpoint(ckpt).commits(), key=lambda c: c.epoch)]
    assert [end for _, end in ends][:8] == [7, 10, 17, 20, 27, 30, 37, 40]
    every, picked = _per_epoch(tmp_path / "out" / "all", "auction"), _per_epoch(tmp_path / "out" / "picked", "auction")
    for (epoch, end), (_, start) in zip(ends, [(0, 0), *ends], strict=False):
        assert every.get(epoch, []) == [(i,) for i in range(start, end)]
        assert picked.get(epoch, []) == [(i,) for i in range(start, end) if i % 3 == 0]
