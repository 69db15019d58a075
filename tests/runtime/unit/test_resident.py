"""Resident lanes without Spark: the wire, the lane's epoch sequence and routing checks, and the
names of what an attempt writes."""

from __future__ import annotations

import io
import socket
import threading

import numpy as np
import pyarrow as pa
import pytest

from eddyline.columns import KG
from eddyline.hashing import spark_xxhash64
from eddyline.operators.dedup import DedupKernel
from eddyline.runtime.lanes import process
from eddyline.runtime.resident import (
    Lane,
    ResidentLanes,
    ResidentStep,
    StageEnded,
    attempt_file_id,
    checked,
    next_attempt,
    receive,
    send,
)
from eddyline.state.store import KeyGroupStore, parse_state_file, state_file, with_chains

SCHEMA = pa.schema([("key", pa.int64()), ("t", pa.timestamp("ms"))])
KEY_GROUPS = 8


def rows(keys: list[int], t0: int) -> pa.Table:
    kg = np.mod(spark_xxhash64(np.asarray(keys, np.int64)), KEY_GROUPS).astype(np.int32)
    return pa.table({"key": pa.array(keys, pa.int64()), "t": pa.array([t0 + i for i in range(len(keys))], pa.timestamp("ms")),
                     KG: pa.array(kg)})


def lanes_spec(tmp_path, routing=(0,) * KEY_GROUPS, attempt=1) -> ResidentLanes:
    return ResidentLanes(steps=(ResidentStep("d", DedupKernel(SCHEMA, ["key"], "t", 1_000), tuple(routing)),),
                         checkpoint=str(tmp_path / "ckpt"), address=("127.0.0.1", 0), secret="s", attempt=attempt,
                         output=str(tmp_path / "out"))


def test_a_frame_carries_its_header_and_table_and_the_end_of_the_connection_is_told():
    buf = io.BytesIO()
    table = rows([1, 2, 3], 0)
    send(buf, {"op": "epoch", "epoch": 4}, table)
    send(buf, {"op": "stop"})
    buf.seek(0)
    header, got = receive(buf)
    assert header == {"op": "epoch", "epoch": 4} and got is not None and got.equals(table)
    assert receive(buf) == ({"op": "stop"}, None)
    assert receive(buf) == ({"op": "eof"}, None)
    truncated = io.BytesIO(buf.getvalue()[:20])
    with pytest.raises(ConnectionError, match="bytes into a frame"):
        receive(truncated)


def test_a_lane_runs_epochs_in_sequence_with_the_kernels_results_and_refuses_a_gap(tmp_path):
    spec = lanes_spec(tmp_path)
    lane = Lane(spec, 0)
    kernel = spec.steps[0].kernel
    state = kernel.state_schema.empty_table()
    for epoch, batch in enumerate([rows([1, 2, 3], 0), rows([2, 3, 4], 100), rows([5, 1], 5_000)], start=1):
        done, _ = lane.run({"epoch": epoch, "watermark_ms": batch.column("t").cast(pa.int64())[0].as_py()}, batch)
        expected = process(kernel, batch.select(kernel.input_schema.names), state, batch.column("t").cast(pa.int64())[0].as_py(), None)
        state = expected.state
        assert done["epoch"] == epoch and done["output_rows"] == expected.output.num_rows
        out = pa.ipc.open_file(pa.memory_map(done["output"])).read_all() if done["output"] else None
        assert out is None or sorted(out.column("key").to_pylist()) == sorted(expected.output.column("key").to_pylist())
    assert lane.held['d'].rows == state.num_rows
    with pytest.raises(RuntimeError, match="epoch 5 after epoch 3"):
        lane.run({"epoch": 5, "watermark_ms": 0}, rows([9], 9_000))
    with pytest.raises(RuntimeError, match="epoch 3 after epoch 3"):
        lane.run({"epoch": 3, "watermark_ms": 0}, rows([9], 9_000))


def test_a_lane_refuses_rows_routed_to_another_lane(tmp_path):
    spec = lanes_spec(tmp_path, routing=[kg % 2 for kg in range(KEY_GROUPS)])
    batch = rows(list(range(20)), 0)
    assert set(np.asarray(batch.column(KG)) % 2) == {0, 1}
    with pytest.raises(RuntimeError, match="routed elsewhere"):
        Lane(spec, 0).run({"epoch": 1, "watermark_ms": 0}, batch)


def test_what_an_attempt_writes_is_named_by_it_and_a_later_attempt_reloads_the_committed_state(tmp_path):
    spec = lanes_spec(tmp_path)
    first = Lane(spec, 0)
    done, _ = first.run({"epoch": 1, "watermark_ms": 0}, rows([1, 2, 3], 0))
    index = with_chains({}, done["chains"])
    files = {tuple(seg[:2]) for chain in index.values() for seg in chain}
    assert files == {(1, attempt_file_id(0, 1))}
    # an attempt that was never committed wrote epoch 2; the next attempt replays it from epoch 1
    first.run({"epoch": 2, "watermark_ms": 0}, rows([7, 8], 100))
    second = Lane(lanes_spec(tmp_path, attempt=2), 0)
    second.load(1, {'d': index})
    assert second.held['d'].rows == 3 and second.held['d'].epoch == 1
    redo, _ = second.run({"epoch": 2, "watermark_ms": 0}, rows([7, 8], 100))
    names = {state_file("", "d", 2, seg[1]).rsplit("/", 1)[1] for chain in redo["chains"].values() for seg in chain if seg[0] == 2}
    assert names and all(parse_state_file(n) == (2, attempt_file_id(0, 2)) for n in names)
    assert (tmp_path / "out" / f"{2:010d}" / "0000-a1.arrow").exists()
    assert (tmp_path / "out" / f"{2:010d}" / "0000-a2.arrow").exists()
    store = KeyGroupStore(spec.checkpoint, "d", spec.steps[0].kernel.state_schema, spec.steps[0].kernel.primary_key)
    reloaded = store.load(with_chains(index, redo["chains"]), range(KEY_GROUPS))
    assert sorted(reloaded.column("key").to_pylist()) == [1, 2, 3, 7, 8]


def test_attempt_file_ids_stay_apart_from_slices_and_refuse_what_does_not_fit():
    assert attempt_file_id(3, 1) != 3 and attempt_file_id(3, 1) & 0xFFFF == 3
    assert attempt_file_id(3, 1) != attempt_file_id(3, 2)
    for lane, attempt in [(-1, 1), (1 << 16, 1), (0, 0), (0, 1 << 7)]:
        with pytest.raises(ValueError, match="out of range"):
            attempt_file_id(lane, attempt)


def test_a_lane_serves_until_told_to_stop_over_a_socket(tmp_path):
    spec = lanes_spec(tmp_path)
    a, b = socket.socketpair()
    lane = Lane(spec, 0)
    server = threading.Thread(target=lane.serve, args=(b.makefile("rb"), b.makefile("wb")))
    server.start()
    src, out = a.makefile("rb"), a.makefile("wb")
    send(out, {"op": "load", "after": 0, "index": {}})
    assert receive(src)[0]["op"] == "loaded"
    send(out, {"op": "epoch", "epoch": 1, "watermark_ms": 0}, rows([1, 1, 2], 0))
    done, _ = receive(src)
    assert done["op"] == "done" and done["output_rows"] == 2
    send(out, {"op": "stop"})
    server.join(5)
    assert not server.is_alive()


def test_an_idle_lane_still_gets_its_epoch_and_the_watermark_expires_its_state(tmp_path):
    """A lane with no rows in an epoch is sent the epoch anyway (its tick): the dedup forgets keys
    older than its TTL once the watermark passes them, rows or not."""
    lane = Lane(lanes_spec(tmp_path), 0)
    lane.run({"epoch": 1, "watermark_ms": 0}, rows([1, 2, 3], 0))
    assert lane.held['d'].rows == 3
    tick, _ = lane.run({"epoch": 2, "watermark_ms": 10_000}, None)
    assert tick["input_rows"] == 0 and tick["state_rows"] == 0 and lane.held['d'].rows == 0
    assert any(chain is None for chain in tick["chains"].values())  # the forgotten groups leave the index


def test_each_stage_gets_an_attempt_of_its_own_even_when_two_ask_at_once(tmp_path):
    import concurrent.futures

    ckpt = str(tmp_path / "ckpt")
    assert [next_attempt(ckpt) for _ in range(3)] == [1, 2, 3]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: next_attempt(ckpt), range(16)))
    assert sorted(got) == list(range(4, 20))
    with pytest.raises(RuntimeError, match="attempts are used"):
        next_attempt(ckpt, limit=19)


def test_only_the_current_attempts_manifests_of_the_epoch_and_step_are_taken():
    done = [{"lane": 0, "attempt": 2, "epoch": 5, "step": "d"}, {"lane": 1, "attempt": 2, "epoch": 5, "step": "d"}]
    assert checked(done, 2, 5, "d") == done
    with pytest.raises(StageEnded, match="attempt 1, epoch 5, step 'd'; expected attempt 2"):
        checked([*done[:1], {**done[1], "attempt": 1}], 2, 5, "d")
    with pytest.raises(StageEnded, match="epoch 4, step 'd'; expected attempt 2, epoch 5"):
        checked([{**done[0], "epoch": 4}], 2, 5, "d")
    with pytest.raises(StageEnded, match="step 'e'; expected attempt 2, epoch 5, step 'd'"):
        checked([{**done[0], "step": "e"}], 2, 5, "d")


def test_a_lane_keeps_a_large_state_in_place_a_small_one_as_a_table_and_its_checkpoint_is_the_same(
        tmp_path, monkeypatch):
    """The dedup's rows are held in place once they are many times an epoch's rows (an epoch
    then touches the batch's keys and the keys past their TTL, not the whole state) and as a
    table again once most are forgotten; either way what the lane writes each epoch, snapshots
    of whole groups and deltas, loads back to exactly the rows it holds, and the manifest's
    counts are the held rows'."""
    from eddyline.runtime import resident

    monkeypatch.setattr(resident, "IN_PLACE_FROM", 4)
    monkeypatch.setattr(resident, "MIN_BATCH_ROWS", 1)
    monkeypatch.setattr(resident, "CHANGED_UNDER", 1)
    spec = lanes_spec(tmp_path)
    lane = Lane(spec, 0)
    held = lane.held["d"]
    store = KeyGroupStore(spec.checkpoint, "d", held.kernel.state_schema, held.kernel.primary_key)
    rng = np.random.default_rng(11)
    index: dict = {}
    modes, deltas = [], 0
    for epoch in range(1, 61):
        keys = rng.integers(0, 400, 60).tolist() if epoch <= 40 else rng.integers(0, 20, 5).tolist()
        watermark = 100 * epoch - 1_500 if epoch <= 40 else 100 * epoch + 1_000  # then most keys expire
        done, _ = lane.run({"epoch": epoch, "watermark_ms": watermark}, rows(keys, 100 * epoch))
        modes.append("in place" if held.in_place is not None else "table")
        index = with_chains(index, done["chains"])
        loaded = store.load(index, range(KEY_GROUPS))
        got = held.in_place.table() if held.in_place is not None else held.state
        assert sorted(loaded.to_pylist(), key=repr) == sorted(got.to_pylist(), key=repr), epoch
        assert done["state_rows"] == got.num_rows
        assert sum(done["kg_state_rows"].values()) == got.num_rows
        deltas += done["deltas"]
    assert modes[0] == "table" and "in place" in modes and modes[-1] == "table", modes
    assert deltas > 0  # (deltas were written, not only snapshots)
