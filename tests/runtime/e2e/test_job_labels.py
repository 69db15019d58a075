"""An epoch's Spark jobs carry the network's job group and the epoch in their description, so
that Spark's UI, event log and history server tell which epoch a job ran for; jobs run after
the engine carry neither."""

from __future__ import annotations

from pathlib import Path

import eddyline
from eddyline.runtime.engine import Engine


def _description(spark, job: int) -> str | None:
    data = spark.sparkContext._jsc.sc().statusStore().job(job)
    return data.description().get() if data.description().isDefined() else None


def test_an_epochs_jobs_name_their_network_and_epoch(spark, tmp_path: Path) -> None:
    net = eddyline.Network("labelled", trigger=0, lanes=2, key_groups=8)
    bids = net.source("bids", eddyline.Nexmark(stream="bid", rate=1_000, unpaced=True), max_rows_per_epoch=300)
    bids.window_aggregate(key="auction", time="date_time", window=eddyline.tumbling("2s"),
                          aggregates={"n": "count(*)"}).to(eddyline.Memory(), name="out")
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup("eddyline:labelled"))
    Engine(net.spec, spark, str(tmp_path / "ckpt")).run(epochs=3)
    jobs = sorted(set(tracker.getJobIdsForGroup("eddyline:labelled")) - before)
    descriptions = {_description(spark, j) for j in jobs}
    assert {"eddyline labelled epoch 1", "eddyline labelled epoch 2", "eddyline labelled epoch 3"} <= descriptions
    assert all(d is not None and d.startswith("eddyline labelled epoch ") for d in descriptions)

    # the labels are the epoch's: a job of the user's own afterwards has neither
    spark.range(3).count()
    after = max(tracker.getJobIdsForGroup(None) or [-1])
    assert after not in tracker.getJobIdsForGroup("eddyline:labelled")
    assert after > max(jobs)
    assert _description(spark, after) is None
