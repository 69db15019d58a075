"""Prometheus metrics from progress records (no Spark): the text format parses with
prometheus-client's own parser and every value is what the records say."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from eddyline.observe.metrics import Metrics


def record(epoch: int, rows: int, ms: float, busy: list[float], decisions: list[dict] | None = None) -> dict:
    return {
        "batchId": epoch, "numInputRows": rows, "deadLetters": epoch % 2, "lateRows": 3,
        "durationMs": {"triggerExecution": ms}, "eventTime": {"watermark": "2026-01-01T00:00:05.000Z"},
        "sources": [{"description": "bids", "numInputRows": rows, **({"discarded": 7} if epoch == 2 else {}),
                     "lag": {"bids/0": 10 * epoch, "bids/1": 0}}],
        "backlog": {"bids": 100 * epoch},
        "sinks": [{"description": "out", "numOutputRows": rows // 10}],
        "stateOperators": [{"operatorName": "agg", "numRowsTotal": 50 * epoch, "memoryUsedBytes": 4096 * epoch}],
        "routing": {"agg": {"version": epoch, "lanes": len(busy), "keyGroupsPerLane": [5, 3][: len(busy)]}},
        "load": {"agg": {"laneBusyMs": busy}},
        "decisions": decisions or [],
        # as the engine reports them: per input of the step
        "overload": {"shed": {"agg": {"keep": [0.75, 0.5], "offered": [40, 60], "kept": [30, 30]}},
                     "estimates": {"agg": {"windows": 7, "aggregates": {"n": {"meanRelError": 0.01 * epoch,
                                                                                "maxRelError": 0.2}}}}},
        "driver": {"holder": "h:1:ab", "generation": 4, "leadingSince": 1.0},
    }


def samples(m: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_the_records() -> None:
    m = Metrics()
    records = [record(1, 1000, 400.0, [120.0, 80.0]),
               record(2, 3000, 1200.0, [300.0, 310.0], [{"step": "agg", "kind": "balance"}]),
               record(3, 500, 90.0, [20.0, 10.0], [{"step": "agg", "kind": "balance"}, {"step": "agg", "kind": "rescale"}])]
    for r in records:
        m.observe(r)
    m.set_paused(True)
    s = samples(m)
    assert s[("eddyline_epochs_total", ())] == 3
    assert s[("eddyline_input_rows_total", ())] == sum(r["numInputRows"] for r in records)
    assert s[("eddyline_source_input_rows_total", (("source", "bids"),))] == 4500
    assert s[("eddyline_source_discarded_total", (("source", "bids"),))] == 7
    assert s[("eddyline_output_rows_total", (("sink", "out"),))] == 100 + 300 + 50
    assert s[("eddyline_dead_letters_total", ())] == 2 and s[("eddyline_late_rows_total", ())] == 9
    assert s[("eddyline_decisions_total", (("kind", "balance"), ("step", "agg")))] == 2
    assert s[("eddyline_decisions_total", (("kind", "rescale"), ("step", "agg")))] == 1
    assert s[("eddyline_shed_rows_total", (("step", "agg"),))] == 3 * 40
    assert s[("eddyline_epoch_duration_seconds_count", ())] == 3
    assert abs(s[("eddyline_epoch_duration_seconds_sum", ())] - 1.69) < 1e-9
    assert s[("eddyline_epoch_duration_seconds_bucket", (("le", "0.1"),))] == 1  # the 90 ms epoch
    assert s[("eddyline_epoch_duration_seconds_bucket", (("le", "0.5"),))] == 2
    # gauges: the last epoch's values
    assert s[("eddyline_last_epoch", ())] == 3 and s[("eddyline_backlog_rows", (("source", "bids"),))] == 300
    assert s[("eddyline_partition_lag", (("partition", "bids/0"), ("source", "bids")))] == 30
    assert s[("eddyline_watermark_seconds", ())] == 1767225605.0
    assert s[("eddyline_state_rows", (("step", "agg"),))] == 150 and s[("eddyline_state_bytes", (("step", "agg"),))] == 3 * 4096
    assert s[("eddyline_lanes", (("step", "agg"),))] == 2
    assert s[("eddyline_lane_key_groups", (("lane", "1"), ("step", "agg")))] == 3
    assert s[("eddyline_lane_busy_seconds", (("lane", "0"), ("step", "agg")))] == 0.02
    assert s[("eddyline_keep_fraction", (("input", "0"), ("step", "agg")))] == 0.75
    assert s[("eddyline_keep_fraction", (("input", "1"), ("step", "agg")))] == 0.5
    assert s[("eddyline_estimate_relative_error", (("aggregate", "n"), ("step", "agg")))] == 0.03
    assert s[("eddyline_lease_generation", ())] == 4 and s[("eddyline_leading", ())] == 1
    assert s[("eddyline_paused", ())] == 1 and s[("eddyline_tentative", ())] == 0


def test_a_hot_followers_state_is_a_gauge_per_state() -> None:
    m = Metrics()
    follower = record(1, 10, 100.0, [1.0])
    follower["driver"] = {"holder": "h:2:cd", "generation": 4, "role": "follower", "state": "copying"}
    m.observe(follower)
    s = samples(m)
    assert s[("eddyline_leading", ())] == 0
    assert [s[("eddyline_follower_state", (("state", st),))] for st in ("joining", "copying", "following")] == [0, 1, 0]
    follower["driver"] = {**follower["driver"], "state": "following"}
    m.observe(follower)
    assert samples(m)[("eddyline_follower_state", (("state", "following"),))] == 1
    m.observe({**follower, "driver": {"holder": "h:2:cd", "generation": 5, "role": "leader"}})
    s = samples(m)
    assert s[("eddyline_leading", ())] == 1 and s[("eddyline_follower_state", (("state", "following"),))] == 0
