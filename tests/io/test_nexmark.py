"""The Nexmark source: Beam's event model, exact schemas, and the published queries' shapes."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from functools import reduce

import duckdb
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from eddyline.io.generator import UNPACED_AVAILABLE
from eddyline.io.nexmark import (
    HOT_CHANNELS,
    US_CITIES,
    US_STATES,
    Nexmark,
    nexmark_available,
    nexmark_event_time_ms,
    nexmark_frame,
    nexmark_schema,
)

STREAMS = ("person", "auction", "bid")
#: 2,000 people, 6,000 auctions and 92,000 bids.
EVENTS = 100_000


def _frame(spark, stream: str, start: int, end: int, partitions: int = 2, **kw) -> DataFrame:
    return nexmark_frame(spark, Nexmark(stream=stream, **kw), start, end, partitions)


#: The columns that tie the streams together: enough for the reference and hot-id checks.
_KEYS = {
    "person": ("id", "date_time"),
    "auction": ("id", "date_time", "seller"),
    "bid": ("auction", "bidder", "date_time"),
}


def _site(
    spark, bids_from: int, end: int, keys_only: bool = True, **kw
) -> duckdb.DuckDBPyConnection:
    """DuckDB over people and auctions of events [0, end) and the bids of [bids_from, end)."""
    con = duckdb.connect()
    for stream in STREAMS:
        df = _frame(spark, stream, bids_from if stream == "bid" else 0, end, **kw)
        con.register(stream, (df.select(*_KEYS[stream]) if keys_only else df).toPandas())
    return con


@pytest.fixture(scope="module")
def site(spark) -> Iterator[duckdb.DuckDBPyConnection]:
    with _site(spark, 0, EVENTS, keys_only=False) as con:
        yield con


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    (row,) = con.sql(sql).fetchall()
    return row


# --------------------------------------------------------------------------- shape, determinism


@pytest.mark.parametrize("stream", STREAMS)
def test_schema_is_exact(spark, stream):
    def fields(df: DataFrame) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]

    declared = spark.createDataFrame([], nexmark_schema(stream))
    assert fields(_frame(spark, stream, 0, 100)) == fields(declared)


def test_each_stream_gets_its_share_of_event_numbers(spark):
    ranges = [(0, 10_000), (37, 1234), (49, 51), (5, 5)]
    expected = Counter()
    frames = []
    for start, end in ranges:
        for n in range(start, end):
            stream = "person" if n % 50 == 0 else "auction" if n % 50 < 4 else "bid"
            expected[(start, stream)] += 1
        for stream in STREAMS:
            frame = _frame(spark, stream, start, end)
            frames.append(frame.select(F.lit(start).alias("start"), F.lit(stream).alias("s")))
    assert Counter(tuple(r) for r in reduce(DataFrame.unionAll, frames).collect()) == expected
    assert expected[(0, "bid")] / 10_000 == 0.92


@pytest.mark.parametrize("stream", STREAMS)
def test_rows_do_not_depend_on_ranges_or_partitions(spark, stream):
    whole = sorted(_frame(spark, stream, 0, 3000, 3).collect())
    assert whole == sorted(_frame(spark, stream, 0, 3000, 3).collect())
    pieces = [(0, 51), (51, 1613), (1613, 3000)]
    split = reduce(
        DataFrame.unionAll, (_frame(spark, stream, a, b, i + 1) for i, (a, b) in enumerate(pieces))
    )
    assert sorted(split.collect()) == whole
    other_seed = sorted(_frame(spark, stream, 0, 3000, 3, seed=1).collect())
    assert other_seed != whole


def test_event_times_follow_event_numbers(spark):
    params = dict(rate=3.7)  # a rate whose row gap is not a whole number of µs

    def millis(stream: str) -> list[tuple[int, int]]:
        df = _frame(spark, stream, 0, 3000, **params)
        key = "id" if stream != "bid" else "auction"
        return [(r[0], r[1]) for r in df.select(key, F.unix_millis("date_time")).collect()]

    p = Nexmark(stream="person", **params)
    assert all(ms == nexmark_event_time_ms(p, (i - 1000) * 50) for i, ms in millis("person"))
    for i, ms in millis("auction"):
        cycle, k = divmod(i - 1000, 3)
        assert ms == nexmark_event_time_ms(p, cycle * 50 + 1 + k)
    bid_times = sorted(ms for _, ms in millis("bid"))
    assert bid_times == [nexmark_event_time_ms(p, n) for n in range(3000) if n % 50 >= 4]


def test_pacing():
    params = Nexmark(stream="bid", rate=10_000)
    assert nexmark_available(params, 0.0) == 1  # event 0 happens at the start
    assert nexmark_available(params, 1.0) == 10_001
    assert nexmark_available(params, -0.5) == 0
    slow = Nexmark(stream="bid", rate=3.7)
    for elapsed in (0.1, 1.0, 12.345, 100.0):
        n = nexmark_available(slow, elapsed)
        now_ms = nexmark_event_time_ms(slow, 0) + round(elapsed * 1000)
        assert nexmark_event_time_ms(slow, n - 1) <= now_ms <= nexmark_event_time_ms(slow, n)
    assert nexmark_available(params.model_copy(update={"unpaced": True}), 0) == UNPACED_AVAILABLE


# --------------------------------------------------------------------------- the auction site


def _dangling(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """References to people or auctions that do not exist (yet) when the referring event occurs."""
    checks = {
        "bid.auction": "bid b left join auction a on a.id = b.auction"
        " where a.id is null or a.date_time > b.date_time",
        "bid.bidder": "bid b left join person p on p.id = b.bidder"
        " where p.id is null or p.date_time > b.date_time",
        "auction.seller": "auction a left join person p on p.id = a.seller"
        " where p.id is null or p.date_time > a.date_time",
    }
    return {name: _one(con, f"select count(*) from {sql}")[0] for name, sql in checks.items()}


def test_references_point_to_earlier_events(site):
    assert _dangling(site) == {"bid.auction": 0, "bid.bidder": 0, "auction.seller": 0}


def test_references_point_to_earlier_events_later_in_the_run(spark):
    params = dict(num_active_people=50, num_in_flight_auctions=30)
    with _site(spark, 1_000_000, 1_020_000, **params) as con:
        assert _dangling(con) == {"bid.auction": 0, "bid.bidder": 0, "auction.seller": 0}
        oldest_auction, oldest_bidder = _one(con, "select min(auction), min(bidder) from bid")
    # Non-hot picks stay among the newest: 30 in-flight auctions, 50 active people.
    assert oldest_auction >= 1000 + 3 * (1_000_000 // 50) - 30
    assert oldest_bidder >= 1000 + 1_000_000 // 50 - 50


def test_hot_auctions_bidders_and_sellers(spark):
    ratios = dict(hot_auction_ratio=2, hot_bidder_ratio=4, hot_seller_ratio=10)
    # A hot auction heads its batch of 100 (id ≡ 1000 mod 100); a hot bidder is second in its
    # batch. Hot with probability 1 - 1/ratio, plus the ~1 % of random picks that land there.
    with _site(spark, 1_000_000, 1_100_000, **ratios) as con:
        hot_auction, hot_bidder = _one(
            con,
            "select avg(((auction - 1000) % 100 = 0)::int), avg(((bidder - 1000) % 100 = 1)::int)"
            " from bid",
        )
        (hot_seller,) = _one(con, "select avg(((seller - 1000) % 100 = 0)::int) from auction")
    assert hot_auction == pytest.approx(0.5 + 0.5 / 100, abs=0.01)
    assert hot_bidder == pytest.approx(0.75 + 0.25 / 100, abs=0.01)
    assert hot_seller == pytest.approx(0.9 + 0.1 / 100, abs=0.02)


def test_q2_selects_bids(site):
    (count,) = _one(site, "select count(*) from bid where auction % 123 = 0")
    assert count > 100


def test_q3_finds_local_sellers_in_category_10(site):
    (count,) = _one(
        site,
        "select count(*) from auction a join person p on a.seller = p.id"
        " where a.category = 10 and p.state in ('OR', 'ID', 'CA')",
    )
    assert count > 100


def test_field_domains(site):
    assert {r[0] for r in site.sql("select distinct category from auction").fetchall()} == set(
        range(10, 15)
    )
    assert {r[0] for r in site.sql("select distinct state from person").fetchall()} == set(
        US_STATES
    )
    assert {r[0] for r in site.sql("select distinct city from person").fetchall()} == set(US_CITIES)
    low, high, bad_reserve, bad_expiry = _one(
        site,
        "select min(initial_bid), max(initial_bid), count_if(reserve <= initial_bid),"
        " count_if(expires <= date_time) from auction",
    )
    assert 100 <= low < 200 and 10**7 < high <= 10**8
    assert bad_reserve == bad_expiry == 0
    low, high = _one(site, "select min(price), max(price) from bid")
    assert low >= 100 and high <= 10**8
    people = site.sql("select name, email_address, credit_card from person").fetchall()
    assert all(re.fullmatch(r"\w+ \w+", name) for name, _, _ in people)
    assert all(re.fullmatch(r"[a-z ]*@[a-z ]*\.com", email) for _, email, _ in people)
    assert all(re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", card) for _, _, card in people)


def test_channels_have_fixed_urls(site):
    hot_share, urls_per_channel = _one(
        site,
        f"select avg((channel in {tuple(HOT_CHANNELS)})::int),"
        " (select max(n) from (select count(distinct url) n from bid group by channel))"
        " from bid",
    )
    assert hot_share == pytest.approx(0.5, abs=0.01)
    assert urls_per_channel == 1
    (with_id,) = _one(
        site,
        "select avg(contains(url, '&channel_id=')::int) from bid where channel like 'channel-%'",
    )
    assert with_id == pytest.approx(0.9, abs=0.03)


def test_record_sizes_are_near_beams(site):
    # Beam pads records to average 200 / 500 / 100 bytes, counting longs as 8 bytes.
    person, auction, bid = (
        _one(site, sql)[0]
        for sql in (
            "select avg(8 + len(name) + len(email_address) + len(credit_card) + len(city)"
            " + len(state) + len(extra)) from person",
            "select avg(48 + len(item_name) + len(description) + len(extra)) from auction",
            "select avg(32 + len(extra)) from bid",
        )
    )
    assert person == pytest.approx(200, rel=0.05)
    assert auction == pytest.approx(500, rel=0.05)
    assert bid == pytest.approx(100, rel=0.05)


@pytest.mark.parametrize("settings", [
    {}, {"rate": 777, "seed": 9, "num_in_flight_auctions": 7, "num_active_people": 30, "hot_auction_ratio": 3},
], ids=["defaults", "other-settings"])
@pytest.mark.parametrize("stream", STREAMS)
def test_rows_computed_without_spark_are_the_rows_spark_computes(spark, stream: str, settings: dict) -> None:
    """What a resident epoch reads (``nexmark_arrow``) equals the Spark frame, value for value,
    types included: 200,000 global events, from the start (where the clamps bite) on."""
    from eddyline.io.nexmark import nexmark_arrow, stream_indexes

    params = Nexmark(stream=stream, **settings)
    ours = nexmark_arrow(params, *stream_indexes(params, 0, 200_000))
    theirs = _frame(spark, stream, 0, 200_000, **settings).toArrow()
    assert [(f.name, f.type) for f in ours.schema] == [(f.name, f.type) for f in theirs.schema]
    for name in ours.column_names:
        assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
