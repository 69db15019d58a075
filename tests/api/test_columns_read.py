"""Which columns of a source the network reads (``NetworkSpec.columns_read``): what a decoding
source may leave out of what it hands to Spark. Every answer must keep whatever a step, a sink or
a shed point could use; None means all."""

from __future__ import annotations

from typing import Any

from eddyline.api.validate import load_spec

DDL = "auction long, bidder long, price long, channel string, ts timestamp"


def _spec(steps: list[dict[str, Any]], sinks: dict[str, str], **extra: Any):
    return load_spec({
        "name": "cols", "trigger": 0,
        "sources": [{"name": n, "files": {"path": f"/tmp/in-{n}", "format": "json", "schema": DDL}} for n in ("bids", "more")],
        "steps": steps,
        "sinks": [{"name": f"out_{i}", "input": i, "discard": {}, "qos": {"latency": "1s"}} for i in sinks] + [
            {"name": "other", "input": "more", "discard": {}}],
        **extra,
    })


def _read(steps: list[dict[str, Any]], *sinks: str, **extra: Any):
    return _spec(steps, dict.fromkeys(sinks, ""), **extra).columns_read()["bids"]


def test_a_filter_and_a_select_read_their_expressions_columns():
    steps = [{"name": "f", "input": "bids", "filter": "auction % 123 = 0"},
             {"name": "s", "input": "f", "select": ["auction", "price * 2 AS `Twice`"]}]
    assert _read(steps, "s") == {"auction", "price"}
    # a filter passes every column on: its reader's wants count
    assert _read(steps[:1], "f") is None
    assert _spec(steps, {"s": ""}).columns_read()["more"] is None  # a sink reads it as it is


def test_names_are_matched_as_spark_does_without_case_and_a_struct_counts_its_column():
    steps = [{"name": "s", "input": "bids", "select": ["PRICE", "upper(`Channel`) AS c", "ts.x AS y"]}]
    assert _read(steps, "s") == {"price", "channel", "ts", "x"}


def test_a_star_or_an_unknown_kind_reads_everything():
    assert _read([{"name": "s", "input": "bids", "select": ["*", "price + 1 AS p"]}], "s") is None
    assert _read([{"name": "s", "input": "bids", "select": ["t.*"]}], "s") is None
    steps = [{"name": "j", "join": {"left": "bids", "right": "more", "left_key": "auction", "right_key": "auction"}},
             {"name": "s", "input": "j", "select": ["price"]}]
    assert _read(steps, "s") is None  # a join does not say what it reads of its inputs


def test_windows_and_aggregates_read_keys_time_and_aggregated_columns_only():
    window = {"key": "auction", "time": "ts", "window": {"size": "10s"},
              "aggregates": {"n": "count(*)", "hi": "max(price)"}}
    steps = [{"name": "f", "input": "bids", "filter": "price > 10"},
             {"name": "w", "input": "f", "window_aggregate": window}]
    assert _read(steps, "w") == {"auction", "ts", "price"}
    late = {**window, "late": {"path": "/tmp/late", "format": "parquet"}}  # late rows are written whole
    assert _read([{**steps[1], "input": "bids", "window_aggregate": late}], "w") is None
    agg = [{"name": "a", "input": "bids", "aggregate": {"key": "channel", "time": "ts",
                                                         "aggregates": {"top": "max_by(bidder, price)", "n": "count(*)"}}}]
    assert _read(agg, "a") == {"channel", "ts", "bidder", "price"}


def test_two_readers_want_the_union_and_a_union_passes_wants_to_every_input():
    steps = [{"name": "u", "input": None, "union": ["bids", "more"]},
             {"name": "a", "input": "u", "select": ["auction"]},
             {"name": "b", "input": "u", "select": ["bidder"]}]
    spec = _spec(steps, {"a": "", "b": ""})
    assert spec.columns_read()["bids"] == {"auction", "bidder"}
    assert spec.columns_read()["more"] is None  # also read whole by a sink


def test_behind_a_shed_point_every_column_is_read():
    window = {"key": "auction", "time": "ts", "window": {"size": "10s"}, "aggregates": {"n": "count(*)"}}
    steps = [{"name": "w", "input": "bids", "window_aggregate": window}]
    assert _read(steps, "w") == {"auction", "ts"}
    assert _read(steps, "w", control={"overload": {"shedding": "uniform"}}) is None


def test_a_top_k_and_a_dedup_pass_rows_through_and_read_their_own_columns_too():
    steps = [{"name": "first", "input": "bids", "dedup": {"key": "bidder", "time": "ts", "ttl": "10s"}},
             {"name": "top", "input": "first", "top_k": {"partition_by": "auction", "order_by": ["price DESC"],
                                                         "k": 1, "time": "ts"}},
             {"name": "s", "input": "top", "select": ["channel"]}]
    wanted = _spec(steps, {"s": ""}).columns_read()
    assert wanted["top"] == {"channel"}
    assert wanted["first"] == {"channel", "auction", "price", "ts"}
    assert wanted["bids"] == {"channel", "auction", "price", "ts", "bidder"}
    assert _spec(steps[:2], {"top": ""}).columns_read()["bids"] is None  # a sink writes the top rows whole


def test_a_session_window_reads_its_keys_time_and_aggregated_columns_and_its_lanes_need_no_other():
    steps = [{"name": "w", "input": "bids", "session_window": {
        "key": "bidder", "time": "ts", "gap": "10s", "aggregates": {"n": "count(*)", "top": "max(price)"}}}]
    assert _read(steps, "w") == {"bidder", "ts", "price"}
    spec = _spec(steps, {"w": ""})
    step = spec.steps[0]
    assert step.info.lane_columns(step) == {"bidder", "ts", "price"}
