"""The balancer's look-ahead counts a files slice per file, and the next slice's files in the
background while an epoch runs; the counts are the ones a read of the whole slice gives."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eddyline.api.sources import SourceSpec
from eddyline.io.files import FilesSource
from eddyline.plan.keygroups import key_group_counts
from eddyline.runtime.lookahead import LookAhead

K = 16


class RecordingSource(FilesSource):
    """A files source that notes which thread read which files, and at which CPU priority."""

    def __init__(self, spec: SourceSpec) -> None:
        super().__init__(spec)
        self.reads: list[tuple[str, tuple[str, ...]]] = []
        self.nice: dict[str, int] = {}

    def peek(self, planned, columns):
        name = threading.current_thread().name
        self.reads.append((name, tuple(planned.get("files") or ())))
        self.nice[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return super().peek(planned, columns)


def _source(path: Path, per_epoch: int = 2) -> RecordingSource:
    return RecordingSource(SourceSpec.model_validate(
        {"name": "events", "files": {"path": str(path), "format": "parquet", "max_files_per_epoch": per_epoch}}))


def _write(path: Path, name: str, seed: int, rows: int = 500) -> None:
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"k": rng.integers(0, 300, rows), "v": np.arange(rows)}), str(path / name))


def _truth(path: Path, names: list[str]) -> np.ndarray:
    return key_group_counts(pq.read_table([str(path / n) for n in names], columns=["k"]), ("k",), K)


def test_a_slice_is_counted_file_by_file_as_one_read_of_it_would_count(tmp_path):
    for i in range(3):
        _write(tmp_path, f"{i:03d}.parquet", seed=i)
    src = _source(tmp_path, per_epoch=3)
    slice_ = src.plan(0, 0.0)
    ahead = LookAhead(K)
    got = ahead.counts(src, slice_, ("k",))
    assert np.array_equal(got, _truth(tmp_path, slice_["files"])) and got.sum() == 1500
    assert ahead.counts(src, slice_, ("missing",)) is None  # Spark reports it when the epoch runs
    assert ahead.counts(src, {**slice_, "files": []}, ("k",)) is None


def test_the_next_slices_files_are_counted_in_the_background_while_an_epoch_runs(tmp_path):
    for i in range(4):
        _write(tmp_path, f"{i:03d}.parquet", seed=i)
    src = _source(tmp_path)
    ahead = LookAhead(K)
    first = src.plan(0, 0.0)
    assert np.array_equal(ahead.counts(src, first, ("k",)), _truth(tmp_path, first["files"]))
    ahead.prefetch(src, first, ("k",))
    ahead.start()
    # A file arrives after the prefetch started and the next slice takes it too: it is counted
    # when the plan needs it.
    _write(tmp_path, "004.parquet", seed=4)
    second = {"start": 2, "end": 5, "files": ["002.parquet", "003.parquet", "004.parquet"], "cursor": "004.parquet"}
    main = threading.current_thread().name
    before = sum(thread == main for thread, _ in src.reads)
    got = ahead.counts(src, second, ("k",))
    ahead.close()
    assert np.array_equal(got, _truth(tmp_path, second["files"]))
    background = {f for thread, files in src.reads if thread.startswith("eddyline-lookahead") for f in files}
    inline = [files for thread, files in src.reads if thread == main][before:]
    assert background == {"002.parquet", "003.parquet"}, src.reads
    assert inline == [("004.parquet",)], src.reads
    # The background counting runs at the lowest priority, so it takes only cores the job leaves
    # idle; the driver's own thread keeps the process's priority.
    assert {n for t, n in src.nice.items() if t != main} == {19}, src.nice
    assert src.nice[main] == os.getpriority(os.PRIO_PROCESS, 0) < 19


def test_a_file_unreadable_in_the_background_makes_the_counts_unknown(tmp_path):
    for i in range(2):
        _write(tmp_path, f"{i:03d}.parquet", seed=i)
    (tmp_path / "002.parquet").write_bytes(b"not parquet")
    _write(tmp_path, "003.parquet", seed=3)
    src = _source(tmp_path)
    ahead = LookAhead(K)
    first = src.plan(0, 0.0)
    ahead.prefetch(src, first, ("k",))
    ahead.start()
    second = src.plan(first["end"], 0.0, first["cursor"])
    assert ahead.counts(src, second, ("k",)) is None
    ahead.close()
