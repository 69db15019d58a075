"""Resident lanes in a real Spark barrier stage: epochs fed over the socket give the kernel's
results; a lane's worker killed ends the stage, and a new attempt from the last commit gives the
same output as if nothing had happened."""

from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import pytest

from eddyline.columns import KG
from eddyline.hashing import spark_xxhash64
from eddyline.operators.dedup import DedupKernel
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.lanes import process
from eddyline.runtime.resident import ResidentStage, ResidentStep, StageEnded, next_attempt
from eddyline.state.store import with_chains

SCHEMA = pa.schema([("key", pa.int64()), ("t", pa.timestamp("ms"))])
KEY_GROUPS = 16
EPOCHS = 12


def epoch_rows(epoch: int) -> pa.Table:
    rng = np.random.default_rng(epoch)
    keys = rng.integers(0, 400, 300)
    t = (epoch - 1) * 1_000 + np.sort(rng.integers(0, 1_000, keys.size))
    return pa.table({"key": keys, "t": pa.array(t, pa.timestamp("ms")),
                     KG: pa.array(np.mod(spark_xxhash64(keys), KEY_GROUPS).astype(np.int32))})


def watermark(epoch: int) -> int:
    return (epoch - 1) * 1_000  # the end of the epoch before


def reference(kernel: DedupKernel) -> dict[int, list[int]]:
    state, out = kernel.state_schema.empty_table(), {}
    for e in range(1, EPOCHS + 1):
        r = process(kernel, epoch_rows(e).select(kernel.input_schema.names), state, watermark(e), None)
        state, out[e] = r.state, sorted(r.output.column("key").to_pylist())
    return out


def outputs(paths: list[str | None]) -> list[int]:
    keys: list[int] = []
    for p in paths:
        if p is not None:
            keys += pa.ipc.open_file(pa.memory_map(p)).read_all().column("key").to_pylist()
    return sorted(keys)


@pytest.mark.timeout(300)
def test_resident_lanes_serve_epochs_and_a_killed_lane_is_replayed_by_a_new_attempt_from_the_commit(spark, tmp_path):
    kernel = DedupKernel(SCHEMA, ["key"], "t", 2_000)
    routing = tuple(int(x) for x in RoutingTable.uniform(KEY_GROUPS, 2).owners())
    args = {"steps": [ResidentStep("d", kernel, routing)], "checkpoint": str(tmp_path / "ckpt"), "lanes": 2,
            "output": str(tmp_path / "out")}
    committed: dict[int, tuple[dict, list]] = {0: ({}, [])}  # epoch -> (state index, its output files)
    stage = ResidentStage(spark, attempt=next_attempt(args["checkpoint"]), **args)
    assert len(set(stage.pids.values())) == 2  # two lanes, two Python workers
    killed_at = 7
    try:
        for e in range(1, EPOCHS + 1):
            if e == killed_at:
                os.kill(stage.pids[1], signal.SIGKILL)
                with pytest.raises(StageEnded):
                    stage.run(e, epoch_rows(e), watermark(e))
                break
            done = stage.run(e, epoch_rows(e), watermark(e))
            index = committed[e - 1][0]
            for d in done:
                index = with_chains(index, d["chains"])
            committed[e] = (index, [d["output"] for d in done])
    finally:
        stage.close()
    last = max(committed)
    assert last == killed_at - 1
    stage = ResidentStage(spark, attempt=next_attempt(args["checkpoint"]), after=last, index={"d": committed[last][0]}, **args)
    try:
        for e in range(last + 1, EPOCHS + 1):
            done = stage.run(e, epoch_rows(e), watermark(e))
            assert {d["attempt"] for d in done} == {2}
            index = committed[e - 1][0]
            for d in done:
                index = with_chains(index, d["chains"])
            committed[e] = (index, [d["output"] for d in done])
        with pytest.raises(ValueError, match="in sequence"):
            stage.run(EPOCHS + 2, epoch_rows(1), 0)
    finally:
        stage.close()
    expected = reference(kernel)
    assert {e: outputs(committed[e][1]) for e in range(1, EPOCHS + 1)} == expected
    assert sum(len(v) for v in expected.values()) > 0


@pytest.mark.timeout(300)
def test_a_move_of_key_groups_ends_the_stage_and_the_next_one_runs_with_the_new_routing(spark, tmp_path):
    """Key groups moved between epochs: the lanes that now own them load their state from the
    commit, and the output is that of one lane holding everything."""
    kernel = DedupKernel(SCHEMA, ["key"], "t", 2_000)
    before = RoutingTable.uniform(KEY_GROUPS, 2)
    after = before.moved({kg: 1 for kg in before.key_groups_of(0)[:5]})
    assert after.owners().tolist() != before.owners().tolist()
    ckpt = str(tmp_path / "ckpt")
    committed: dict[int, tuple[dict, list]] = {0: ({}, [])}
    for routing, epochs in ((before, range(1, 7)), (after, range(7, EPOCHS + 1))):
        last = epochs.start - 1
        stage = ResidentStage(spark, steps=[ResidentStep("d", kernel, tuple(int(x) for x in routing.owners()))],
                              checkpoint=ckpt, lanes=2, output=str(tmp_path / "out"), attempt=next_attempt(ckpt),
                              after=last, index={"d": committed[last][0]})
        try:
            for e in epochs:
                index, outs = committed[e - 1][0], []
                for d in stage.run(e, epoch_rows(e), watermark(e)):
                    index = with_chains(index, d["chains"])
                    outs.append(d["output"])
                committed[e] = (index, outs)
        finally:
            stage.close()
    assert {e: outputs(committed[e][1]) for e in range(1, EPOCHS + 1)} == reference(kernel)
