"""The driver keeps its long-lived objects out of Python's full garbage collections while it runs."""

from __future__ import annotations

import gc
from pathlib import Path

from eddyline.runtime.engine import Engine

from .helpers import bids_window_spec, write_bid_files


def test_after_the_first_epoch_a_full_collection_walks_only_newer_objects(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=3, rows=20, seed=5)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    gc.unfreeze()  # as in a fresh process: nothing frozen yet
    seen: list[tuple[int, int]] = []

    def probe() -> bool:  # called before each epoch
        seen.append((gc.get_freeze_count(), len(gc.get_objects())))  # frozen / what a full collection walks
        return False

    summary = Engine(spec, spark, str(tmp_path / "ckpt")).run(epochs=3, should_stop=probe)
    assert summary.epochs == 3 and len(seen) == 3
    assert seen[0][0] == 0
    for frozen, walked in seen[1:]:
        # the imported modules (pyspark, pyarrow, pandas, numpy, ...) and the test session
        assert frozen > 100_000 and walked < frozen / 10, seen
    assert gc.get_freeze_count() == 0  # thawed when the run ended: the interpreter can free it all at exit
