"""bench/sparklog.py: an epoch's wall time split around its Spark jobs, from event-log lines in
Spark's format (only the fields it reads)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.sparklog import EventLog, profile, stage_label


def _rdd(rid: int, scope: str | None) -> dict:
    return {"RDD ID": rid, "Name": "MapPartitionsRDD",
            **({"Scope": json.dumps({"id": str(rid), "name": scope})} if scope else {})}


def _stage(sid: int, rdds: list[dict], parents: list[int], tasks: int) -> dict:
    return {"Stage ID": sid, "RDD Info": rdds, "Parent IDs": parents, "Number of Tasks": tasks}


READ = [_rdd(1, "Range"), _rdd(2, "MapInArrow"), _rdd(3, "Project"), _rdd(4, "CollectMetrics"), _rdd(5, "Exchange")]
LANES = [_rdd(6, "Exchange"), _rdd(7, "MapInArrow"), _rdd(8, "Project"), _rdd(9, None)]


def _job(job: int, t0: int, read_ms: int, lanes_ms: int, stage0: int) -> list[dict]:
    """A job submitted at t0 whose read stage runs read_ms (two tasks) and lanes stage lanes_ms."""
    s_read, s_lanes = stage0, stage0 + 1
    infos = [_stage(s_read, READ, [], 2), _stage(s_lanes, LANES, [s_read], 2)]
    events = [{"Event": "SparkListenerJobStart", "Job ID": job, "Submission Time": t0, "Stage Infos": infos,
               "Stage IDs": [s_read, s_lanes], "Properties": {"spark.job.description": f"epoch {job}"}}]
    t = t0 + 2
    for sid, ms, info in ((s_read, read_ms, infos[0]), (s_lanes, lanes_ms, infos[1])):
        for _ in range(2):
            events.append({"Event": "SparkListenerTaskEnd", "Stage ID": sid, "Task Metrics": {"Executor Run Time": ms - 5}})
        events.append({"Event": "SparkListenerStageCompleted",
                       "Stage Info": {**info, "Submission Time": t, "Completion Time": t + ms}})
        t += ms
    events.append({"Event": "SparkListenerJobEnd", "Job ID": job, "Completion Time": t + 1})
    return events


def test_labels_name_each_sql_operator_once_in_the_order_the_data_meets_it() -> None:
    assert stage_label(READ) == "Range · MapInArrow · Exchange"
    assert stage_label(list(reversed(LANES))) == "Exchange · MapInArrow"
    assert stage_label([_rdd(1, "Scan csv "), _rdd(2, "Exchange")]) == "Scan csv · Exchange"
    assert stage_label([_rdd(1, None)]) == "(no SQL operator)"
    # two sources' reads in one stage: each operator once
    assert stage_label([_rdd(1, "MapInArrow"), _rdd(2, "Union"), _rdd(3, "MapInArrow"), _rdd(4, "Exchange")]) == \
        "MapInArrow · Union · Exchange"


def test_an_epoch_splits_into_driver_time_and_its_jobs_stages(tmp_path: Path) -> None:
    # epoch 1: [1000, 1400) ms, its job at 1100 (read 150, lanes 80): 100 before, 233 in the job
    # epoch 2: [1400, 1700), two jobs, at 1450 (100 + 50) and 1620 (30 + 20)
    lines = _job(1, 1100, 150, 80, 0) + _job(2, 1450, 100, 50, 2) + _job(3, 1620, 30, 20, 4)
    log = tmp_path / "events"
    text = "\n".join(json.dumps(e) for e in lines) + "\n"
    cut = text.index('"Job ID": 3')  # the file ends within the line of epoch 2's second job
    log.mkdir()
    (log / "app-1.inprogress").write_text(text[:cut])
    reader = EventLog(log)
    assert 3 not in reader.read().jobs and set(reader.events.jobs) == {1, 2}
    (log / "app-1.inprogress").write_text(text)  # the rest written since
    events = reader.read()
    assert set(events.jobs) == {1, 2, 3}

    one = profile(events, [(1.0, 1.4)])
    assert (one["wall"], one["before_jobs"], one["jobs"], one["after_jobs"], one["between_jobs"]) == (400, 100, 233, 67, 0)
    assert one["stages"] == {"Range · MapInArrow · Exchange": {"epochs": 1, "wall": 150, "task_ms": 290, "tasks": 2},
                             "Exchange · MapInArrow": {"epochs": 1, "wall": 80, "task_ms": 150, "tasks": 2}}

    two = profile(events, [(1.4, 1.7)])
    # jobs 1450–1603 and 1620–1673: 153 + 53 running, 50 before, 27 after, 17 between
    assert (two["before_jobs"], two["jobs"], two["between_jobs"], two["after_jobs"], two["jobs_per_epoch"]) == (50, 206, 17, 27, 2)
    assert two["stages"]["Range · MapInArrow · Exchange"] == {"epochs": 1, "wall": 130, "task_ms": 240, "tasks": 4}

    both = profile(events, [(1.0, 1.4), (1.4, 1.7)])  # medians over epochs
    assert both["epochs"] == 2 and both["before_jobs"] == 75 and both["jobs"] == 219.5
    assert profile(events, [(2.0, 2.5)])["before_jobs"] == 500  # an epoch without jobs: all driver time
