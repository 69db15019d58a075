"""What a step kind tells of its output columns (``StepKind.output_columns``), as the SQL front end
uses it: a SQL step reading a step written in YAML sees exactly those columns."""

from __future__ import annotations

import pytest

import eddyline  # noqa: F401  (registers the kinds)
from eddyline.api.validate import load_spec
from eddyline.errors import SpecError

#: a YAML step a SQL step reads, and the columns its kind says it makes (over nexmark's bid:
#: auction, bidder, price, channel, url, date_time, extra)
BID_COLUMNS = "auction, bidder, price, channel, url, date_time, extra"
YAML_STEPS = {
    "filter": ({"input": "bids", "filter": "price > 1"}, BID_COLUMNS),
    "select": ({"input": "bids", "select": ["*", "price * 2 AS twice"]}, BID_COLUMNS + ", twice"),
    "dedup": ({"input": "bids", "dedup": {"key": "bidder", "time": "date_time", "ttl": "1m"}}, BID_COLUMNS),
    "top_k": ({"input": "bids", "top_k": {"partition_by": "auction", "order_by": ["price DESC"], "k": 2, "time": "date_time"}},
              BID_COLUMNS + ", rank"),
    "window_aggregate": ({"input": "bids", "window_aggregate": {
        "key": "auction", "time": "date_time", "window": {"size": "10s"}, "aggregates": {"n": "count(*)"}}},
        "auction, window_start, window_end, n, revision"),
    "session_window": ({"input": "bids", "session_window": {
        "key": ["bidder", "auction"], "time": "date_time", "gap": "10s", "aggregates": {"n": "count(*)"}}},
        "bidder, auction, session_start, session_end, n"),
    "aggregate": ({"input": "bids", "aggregate": {"key": "bidder", "aggregates": {"top": "max(price)"}}}, "bidder, top"),
    "over_aggregate": ({"input": "bids", "over_aggregate": {
        "key": "auction", "time": "date_time", "preceding": 3, "aggregates": {"avg3": "avg(price)"}}}, BID_COLUMNS + ", avg3"),
    "union": ({"union": ["bids", "bids"]}, BID_COLUMNS),
    "join": ({"join": {"left": "bids", "right": "bids", "left_key": "auction", "right_key": "auction"}},
             BID_COLUMNS + ", auction_right, bidder_right, price_right, channel_right, url_right, date_time_right, extra_right"),
    "window join": ({"join": {"left": "bids", "right": "bids", "left_key": "auction", "right_key": "auction",
                              "kind": "window", "size": "10s", "left_time": "date_time", "right_time": "date_time"}},
                    BID_COLUMNS + ", auction_right, bidder_right, price_right, channel_right, url_right, date_time_right, extra_right"
                    ", window_start, window_end"),
}


@pytest.mark.parametrize("kind", YAML_STEPS)
def test_a_sql_step_reads_a_yaml_step_with_the_columns_its_kind_tells(kind: str) -> None:
    step, columns = YAML_STEPS[kind]
    raw = {"name": "t", "sources": [{"name": "bids", "nexmark": {"stream": "bid"}}],
           "steps": [{"name": "s", **step}, {"name": "q", "sql": "SELECT nope FROM s"}],
           "sinks": [{"name": "out", "input": "q", "console": {}}]}
    with pytest.raises(SpecError) as refused:
        load_spec(raw)
    expected = ", ".join(f"s.{c.strip()}" for c in columns.split(","))
    assert str(refused.value).endswith(f"unknown column 'nope'; expected one of {expected}")
