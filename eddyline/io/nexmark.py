"""The ``nexmark`` source: person / auction / bid events of an online auction site.

This follows the event model of Apache Beam's Nexmark generator (which the Flink ``nexmark``
benchmark ports), computed as Spark SQL column expressions so it runs in the JVM:

* Event numbers are global: of every 50 consecutive numbers, 1 is a person, the next 3 are
  auctions and the remaining 46 are bids (the fixed positions inside the cycle are what make the
  id arithmetic below work). A source for one stream enumerates only that stream's event numbers
  in ``[start, end)``, so it never generates rows it would throw away.
* Ids are dense: the k-th person has id ``1000 + k``, the k-th auction ``1000 + k``. A bid (and an
  auction's seller) refers only to people and auctions whose events come no later than its own,
  so joins find their matches as in Beam. Most bids go to a *hot* auction (the first of the most
  recent batch of 100 auctions) or come from a hot bidder; the rest pick among the most recent
  ``num_in_flight_auctions`` auctions and ``num_active_people`` people.
* Event ``n`` happens at ``start_time + n / rate``.

Deliberate differences from Beam, all documented in ``docs/nexmark.md``: Java's ``Random`` is
replaced by hashing ``(seed, event number, salt)``, so distributions match but individual values
do not; Beam's "lead" of up to 10 not-yet-created ids is dropped and the hot bidder is clamped to
the newest person, so references never point forward in time; free text (names, descriptions,
padding, URLs) is drawn from fixed tables of pre-generated strings, because building strings
character by character is far too slow in SQL. Those tables keep Beam's lengths, so the average
record sizes stay near Beam's (200, 500 and 100 bytes).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field
from pyspark.sql import Column
from pyspark.sql import functions as F

from eddyline.api.sources import SOURCES
from eddyline.api.units import Model
from eddyline.hashing import spark_xxhash64
from eddyline.io.generator import (
    UNPACED_AVAILABLE,
    bit_field,
    epoch_micros,
    hash_bits,
    offsets_until,
    salt_constant,
    uniform_below,
    unit_interval,
    unit_interval_np,
)
from eddyline.io.sources import SourceKind, SyntheticSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.api.sources import SourceSpec


class Nexmark(Model):
    """The Nexmark auction benchmark's person / auction / bid events (Beam's generator model).

    Offsets are global event numbers shared by all three streams, so two sources with the same
    settings see one consistent auction site.
    """

    stream: Literal["person", "auction", "bid"]
    rate: float = Field(default=10_000, gt=0)
    seed: int = 0
    start_time: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    num_active_people: int = Field(default=1_000, gt=0)
    num_in_flight_auctions: int = Field(default=100, gt=0)
    hot_auction_ratio: int = Field(default=2, gt=0)
    hot_seller_ratio: int = Field(default=4, gt=0)
    hot_bidder_ratio: int = Field(default=4, gt=0)
    unpaced: bool = False

# --------------------------------------------------------------------------- Beam's constants

#: Of every TOTAL_PROPORTION events, this many are people, auctions and bids, in that order.
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION

#: Ids start above zero so the published queries' constants find matches in small runs.
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
#: Few categories, so that q3's ``category = 10`` selects a fifth of the auctions.
NUM_CATEGORIES = 5

#: Hot auctions / sellers / bidders are the first of each batch of this many recent ids.
HOT_BATCH = 100

#: Half the bids come through one of the hot channels, the rest through one of CHANNELS.
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
HOT_CHANNEL_RATIO = 2
CHANNELS = 10_000
#: One channel URL in this many has no ``&channel_id=`` parameter.
URL_WITHOUT_CHANNEL_ID_RATIO = 10

#: Beam's average serialized record sizes, which the ``extra`` padding aims for.
AVG_PERSON_BYTES = 200
AVG_AUCTION_BYTES = 500
AVG_BID_BYTES = 100

#: Kept small so that q3's ``state in ('OR', 'ID', 'CA')`` finds people.
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah")
FIRST_NAMES += ("Deiter", "Walter")
LAST_NAMES = (
    "Shultz",
    "Abrams",
    "Spencer",
    "White",
    "Bartels",
    "Walton",
    "Smith",
    "Jones",
    "Noris",
)

SCHEMAS: dict[str, str] = {
    "person": (
        "id long, name string, email_address string, credit_card string, city string,"
        " state string, date_time timestamp, extra string"
    ),
    "auction": (
        "id long, item_name string, description string, initial_bid long, reserve long,"
        " date_time timestamp, expires timestamp, seller long, category long, extra string"
    ),
    "bid": (
        "auction long, bidder long, price long, channel string, url string,"
        " date_time timestamp, extra string"
    ),
}

#: Where each stream sits in the 50-event cycle: (first position, how many positions).
_SLOTS: dict[str, tuple[int, int]] = {
    "person": (0, PERSON_PROPORTION),
    "auction": (PERSON_PROPORTION, AUCTION_PROPORTION),
    "bid": (PERSON_PROPORTION + AUCTION_PROPORTION, BID_PROPORTION),
}

# Salts: one per hash of an event. A hash feeding two draws splits into two 32-bit fields.
_SALT_AUCTION = 11  # hot-or-not, then which recent auction
_SALT_BIDDER = 12  # hot-or-not, then which active person
_SALT_PRICE = 13
_SALT_CHANNEL = 14  # hot-or-not, then which channel
_SALT_CHANNEL_URL = 15  # per channel number, not per event
_SALT_EXTRA = 16
_SALT_NAME = 21  # first name, last name
_SALT_EMAIL = 22  # user, host
_SALT_CARD_HIGH = 23  # two groups of four digits
_SALT_CARD_LOW = 24  # the other two
_SALT_PLACE = 25  # city, state
_SALT_TEXT = 31  # item name, description
_SALT_RESERVE = 32
_SALT_EXPIRES = 33  # auction length, category
_SALT_SELLER = 34  # hot-or-not, then which active person

#: The hashes of one event that each stream uses.
_STREAM_SALTS: dict[str, tuple[int, ...]] = {
    "person": (_SALT_NAME, _SALT_EMAIL, _SALT_CARD_HIGH, _SALT_CARD_LOW, _SALT_PLACE, _SALT_EXTRA),
    "auction": (_SALT_TEXT, _SALT_PRICE, _SALT_RESERVE, _SALT_EXPIRES, _SALT_SELLER, _SALT_EXTRA),
    "bid": (_SALT_AUCTION, _SALT_BIDDER, _SALT_PRICE, _SALT_CHANNEL, _SALT_EXTRA),
}

# --------------------------------------------------------------------------- text tables

#: Entries per pre-generated text table: enough variety for a benchmark, and small enough that
#: the constant arrays shipped with every task stay in the tens of kilobytes.
_TABLE_SIZE = 256
_EXTRA_TABLE_SIZE = 128
#: Beam's random words are at least this long (before trimming spaces).
_MIN_WORD = 3


def _text(label: str, length: int, spaces: bool) -> str:
    """``length`` pseudo-random lowercase letters (with ~1 in 13 spaces when ``spaces``).

    Drawn from BLAKE2 of ``label`` so the tables are identical in every process and version.
    """
    chars: list[str] = []
    block = 0
    while len(chars) < length:
        for byte in hashlib.blake2b(f"{label}/{block}".encode()).digest():
            if spaces and byte < 20:  # 20/256 ≈ 1/13, Beam's share of spaces
                chars.append(" ")
            elif 20 <= byte < 20 + 9 * 26:  # 234 values, 9 per letter: no modulo bias
                chars.append(chr(ord("a") + (byte - 20) % 26))
        block += 1
    return "".join(chars[:length])


def _words(label: str, max_length: int) -> tuple[str, ...]:
    """Beam's ``nextString``: trimmed strings of ``3 .. max_length - 1`` characters."""
    return tuple(
        _text(f"{label}/{i}", _MIN_WORD + i % (max_length - _MIN_WORD), spaces=True).strip()
        for i in range(_TABLE_SIZE)
    )


def _mean_length(values: Sequence[str]) -> float:
    return sum(map(len, values)) / len(values)


def _extras(label: str, current_size: float, average_size: int) -> tuple[str, ...]:
    """Padding whose length is uniform over Beam's ``nextExtra`` range (the target ± 20 %)."""
    if current_size >= average_size:
        return ("",)
    desired = round(average_size - current_size)
    delta = round(desired * 0.2)
    return tuple(
        _text(f"{label}/{i}", desired - delta + (i % (2 * delta) if delta else 0), spaces=False)
        for i in range(_EXTRA_TABLE_SIZE)
    )


_ITEM_NAMES = _words("item", 20)
_DESCRIPTIONS = _words("description", 100)
_EMAIL_USERS = _words("email-user", 7)
_EMAIL_HOSTS = _words("email-host", 5)
#: URL path segments: Beam uses short words with '_' in place of spaces.
_PATH_WORDS = tuple(w.replace(" ", "_") for w in _words("path", 5))
#: Channel URLs without their ``&channel_id=`` part: Beam's three random path segments.
#: 2**_URL_BITS of them, so that a bit field of that width picks one uniformly.
_URL_BITS = 6
_URLS = tuple(
    "https://www.nexmark.com/" + "/".join(_PATH_WORDS[3 * i : 3 * i + 3]) + "/item.htm?query=1"
    for i in range(2**_URL_BITS)
)
#: Each hot channel has a fixed URL, like any other channel.
_HOT_URLS = _URLS[: len(HOT_CHANNELS)]

#: Size of a person without padding, as Beam counts it: the id, the strings, and the credit card
#: (four groups of four digits and three spaces).
_PERSON_SIZE = (
    8
    + _mean_length([f"{f} {la}" for f in FIRST_NAMES for la in LAST_NAMES])
    + _mean_length(_EMAIL_USERS)
    + 1
    + _mean_length(_EMAIL_HOSTS)
    + len(".com")
    + 19
    + _mean_length(US_CITIES)
    + 2
)
#: Size of an auction without padding: the strings plus six longs, as Beam counts it.
_AUCTION_SIZE = 8 + _mean_length(_ITEM_NAMES) + _mean_length(_DESCRIPTIONS) + 5 * 8
#: Beam counts a bid as four longs.
_BID_SIZE = 4 * 8

_PERSON_EXTRAS = _extras("person-extra", _PERSON_SIZE, AVG_PERSON_BYTES)
_AUCTION_EXTRAS = _extras("auction-extra", _AUCTION_SIZE, AVG_AUCTION_BYTES)
_BID_EXTRAS = _extras("bid-extra", _BID_SIZE, AVG_BID_BYTES)

#: Never occurs in the tables, so it can join them into one literal for ``split``.
_SEPARATOR = ","


def _pick(values: Sequence[str], bits: Column) -> Column:
    """A table entry chosen uniformly by ``bits``.

    ``split`` of a literal is folded by the optimizer into a constant array, so each row costs one
    array index: cheaper than a CASE of many branches, and one JVM call to build.
    """
    table = F.split(F.lit(_SEPARATOR.join(values)), _SEPARATOR)
    return F.get(table, uniform_below(bits, len(values)))


# --------------------------------------------------------------------------- time


def _gap_us(params: Nexmark) -> float:
    return 1_000_000 / params.rate


def _event_time_us(params: Nexmark, event_number: int) -> int:
    # Keep in step with the Spark column in ``nexmark_frame``: same operations, same order.
    return epoch_micros(params.start_time) + math.floor(float(event_number) * _gap_us(params))


def nexmark_event_time_ms(params: Nexmark, event_number: int) -> int:
    """Event time of global event ``event_number``, in ms since the epoch (the column, truncated)."""
    return _event_time_us(params, event_number) // 1000


def nexmark_available(params: Nexmark, elapsed_s: float) -> int:
    """How many global event numbers exist ``elapsed_s`` wall-clock seconds into the run."""
    if params.unpaced:
        return UNPACED_AVAILABLE
    now_us = epoch_micros(params.start_time) + round(elapsed_s * 1_000_000)
    return offsets_until(lambda n: _event_time_us(params, n), now_us)


def nexmark_schema(stream: str) -> str:
    """The Spark DDL schema of one stream's rows."""
    return SCHEMAS[stream]


# --------------------------------------------------------------------------- columns


def _div(column: Column, divisor: int) -> Column:
    """Integer division (SQL ``div``): Column has no ``//``, and ``/`` would yield a double."""
    return F.call_function("div", column, F.lit(divisor))


def _price(bits: Column) -> Column:
    """Beam's price, ``round(100 * 10 ** (6u))``: log-uniform over ``[100, 10**8)``.

    ``exp`` and ``floor(x + 0.5)`` stand in for ``pow`` and ``round``, which are several times
    slower in Spark (``round`` goes through BigDecimal).
    """
    power = F.exp(unit_interval(bits) * F.lit(6.0 * math.log(10.0)))  # 10 ** (6u)
    return F.floor(power * F.lit(100.0) + F.lit(0.5))


def _low(bits: Column) -> Column:
    return bit_field(bits, 0, 32)


def _high(bits: Column) -> Column:
    return bit_field(bits, 32, 32)


def _chance(field: Column, ratio: int) -> Column:
    """True with probability ``1 - 1 / ratio``: Beam's ``nextInt(ratio) > 0``."""
    return uniform_below(field, ratio) > F.lit(0)


def _hot_or_recent_person(
    params: Nexmark, newest: Column, bits: Column, ratio: int, hot: Column
) -> Column:
    """``hot`` with probability ``1 - 1 / ratio``, else one of the ``num_active_people`` newest.

    That is Beam's choice of seller and bidder, except that Beam's random pick may also name one
    of the next 10 people, not yet created; this one never points forward.
    """
    active = F.least(newest + F.lit(1), F.lit(params.num_active_people))
    recent = newest + F.lit(1) - active + uniform_below(_high(bits), active)
    return F.when(_chance(_low(bits), ratio), hot).otherwise(recent)


def _hot_batch_head(newest: Column) -> Column:
    """The first id of the batch of HOT_BATCH that ``newest`` belongs to."""
    return _div(newest, HOT_BATCH) * F.lit(HOT_BATCH)


def _date_time(params: Nexmark, event_number: Column) -> Column:
    """Event time in µs since the epoch: ``start_time + n / rate``."""
    offset_us = F.floor(event_number.cast("double") * F.lit(_gap_us(params)))
    return F.lit(epoch_micros(params.start_time)) + offset_us


def _bits(salt: int) -> Column:
    """The event's hash for ``salt``, computed by the first projection of ``nexmark_frame``."""
    return F.col(f"bits_{salt}")


def _person_columns() -> list[Column]:
    def card_groups(salt: int) -> list[Column]:
        # Eight random digits with a leading 1 kept as a string: two zero-padded groups of four
        # by fixed-position substrings, cheaper than formatting or padding numbers.
        digits = (uniform_below(_bits(salt), 10**8) + F.lit(10**8)).cast("string")
        return [F.substring(digits, 2, 4), F.substring(digits, 6, 4)]

    return [
        (F.col("index") + F.lit(FIRST_PERSON_ID)).alias("id"),
        F.concat(
            _pick(FIRST_NAMES, _low(_bits(_SALT_NAME))),
            F.lit(" "),
            _pick(LAST_NAMES, _high(_bits(_SALT_NAME))),
        ).alias("name"),
        F.concat(
            _pick(_EMAIL_USERS, _low(_bits(_SALT_EMAIL))),
            F.lit("@"),
            _pick(_EMAIL_HOSTS, _high(_bits(_SALT_EMAIL))),
            F.lit(".com"),
        ).alias("email_address"),
        F.concat_ws(" ", *card_groups(_SALT_CARD_HIGH), *card_groups(_SALT_CARD_LOW)).alias(
            "credit_card"
        ),
        _pick(US_CITIES, _low(_bits(_SALT_PLACE))).alias("city"),
        _pick(US_STATES, _high(_bits(_SALT_PLACE))).alias("state"),
        F.timestamp_micros(F.col("event_us")).alias("date_time"),
        _pick(_PERSON_EXTRAS, _bits(_SALT_EXTRA)).alias("extra"),
    ]


def _auction_columns(params: Nexmark) -> list[Column]:
    cycle, event_us = F.col("cycle"), F.col("event_us")
    # An auction lasts on average as long as it takes to create num_in_flight_auctions more of
    # them (Beam's horizon), so about that many are open at any time.
    horizon_events = params.num_in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon_ms = math.floor(horizon_events * 1000 / params.rate)
    length_ms = F.lit(1) + uniform_below(_low(_bits(_SALT_EXPIRES)), max(2 * horizon_ms, 1))
    # This cycle's person is the newest; hot sellers head its batch of HOT_BATCH.
    seller = _hot_or_recent_person(
        params, cycle, _bits(_SALT_SELLER), params.hot_seller_ratio, _hot_batch_head(cycle)
    )
    initial_bid = _price(_bits(_SALT_PRICE))
    category = F.lit(FIRST_CATEGORY_ID) + uniform_below(_high(_bits(_SALT_EXPIRES)), NUM_CATEGORIES)
    return [
        (F.col("index") + F.lit(FIRST_AUCTION_ID)).alias("id"),
        _pick(_ITEM_NAMES, _low(_bits(_SALT_TEXT))).alias("item_name"),
        _pick(_DESCRIPTIONS, _high(_bits(_SALT_TEXT))).alias("description"),
        initial_bid.alias("initial_bid"),
        (initial_bid + _price(_bits(_SALT_RESERVE))).alias("reserve"),
        F.timestamp_micros(event_us).alias("date_time"),
        F.timestamp_micros(event_us + length_ms * F.lit(1000)).alias("expires"),
        (seller + F.lit(FIRST_PERSON_ID)).alias("seller"),
        category.alias("category"),
        _pick(_AUCTION_EXTRAS, _bits(_SALT_EXTRA)).alias("extra"),
    ]


def _channel_url() -> Column:
    """The URL of a non-hot channel: a fixed function of the channel number, like Beam's cache.

    Beam appends the bit-reversed channel number as ``channel_id``; a hash of it serves as well.
    """
    bits = _bits(_SALT_CHANNEL_URL)
    channel_id = F.when(
        _chance(bit_field(bits, 40, 24), URL_WITHOUT_CHANNEL_ID_RATIO),
        F.concat(F.lit("&channel_id="), bit_field(bits, 0, 31).cast("string")),
    ).otherwise(F.lit(""))
    return F.concat(_pick(_URLS, bit_field(bits, 32, _URL_BITS)), channel_id)


def _channel_number(channel_bits: Column) -> Column:
    return uniform_below(_high(channel_bits), CHANNELS)


def _bid_columns(params: Nexmark) -> list[Column]:
    cycle = F.col("cycle")
    # Bids follow this cycle's person and three auctions, which are therefore the newest.
    newest_auction = cycle * F.lit(AUCTION_PROPORTION) + F.lit(AUCTION_PROPORTION - 1)
    auction_bits = _bits(_SALT_AUCTION)
    oldest_open = F.greatest(newest_auction - F.lit(params.num_in_flight_auctions), F.lit(0))
    open_auction = oldest_open + uniform_below(
        _high(auction_bits), newest_auction - oldest_open + F.lit(1)
    )
    auction = F.when(
        _chance(_low(auction_bits), params.hot_auction_ratio), _hot_batch_head(newest_auction)
    ).otherwise(open_auction)
    # Hot bidders are the second of their batch, so they differ from hot sellers; Beam may name
    # that person before it exists, hence the clamp to the newest.
    hot_bidder = F.least(_hot_batch_head(cycle) + F.lit(1), cycle)
    bidder = _hot_or_recent_person(
        params, cycle, _bits(_SALT_BIDDER), params.hot_bidder_ratio, hot_bidder
    )
    channel_bits = _bits(_SALT_CHANNEL)
    hot_channel = _chance(_low(channel_bits), HOT_CHANNEL_RATIO)
    channel_number = _channel_number(channel_bits)
    return [
        (auction + F.lit(FIRST_AUCTION_ID)).alias("auction"),
        (bidder + F.lit(FIRST_PERSON_ID)).alias("bidder"),
        _price(_bits(_SALT_PRICE)).alias("price"),
        F.when(hot_channel, _pick(HOT_CHANNELS, _high(channel_bits)))
        .otherwise(F.concat(F.lit("channel-"), channel_number.cast("string")))
        .alias("channel"),
        F.when(hot_channel, _pick(_HOT_URLS, _high(channel_bits)))
        .otherwise(_channel_url())
        .alias("url"),
        F.timestamp_micros(F.col("event_us")).alias("date_time"),
        _pick(_BID_EXTRAS, _bits(_SALT_EXTRA)).alias("extra"),
    ]


def _stream_events_before(stream: str, event_number: int) -> int:
    """How many of ``stream``'s events have global numbers below ``event_number``."""
    first, count = _SLOTS[stream]
    cycle, position = divmod(event_number, TOTAL_PROPORTION)
    return cycle * count + min(max(position - first, 0), count)


@functools.lru_cache(maxsize=64)
def _projections(
    spark: SparkSession, params: Nexmark
) -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """The two projections that turn stream indexes into ``params.stream``'s rows.

    They do not depend on the range, so they are built once per session and settings: building
    them costs hundreds of JVM calls, more time than a small epoch takes to generate. (``spark``
    is only part of the key, since the columns are objects in its JVM.)

    The first projection computes each hash once per row and the second reads them. In one
    projection, a hash used both in a CASE condition and in a branch would be computed twice,
    because Spark shares only subexpressions that are evaluated unconditionally.
    """
    stream = params.stream
    first, count = _SLOTS[stream]
    index = F.col("id")  # the k-th event of the stream
    cycle = _div(index, count)
    event_number = cycle * F.lit(TOTAL_PROPORTION) + F.lit(first) + F.pmod(index, F.lit(count))
    hashes = {salt: hash_bits(params.seed, event_number, salt) for salt in _STREAM_SALTS[stream]}
    if stream == "bid":
        # Hashed per channel, not per event, so that a channel always has the same URL.
        channel = _channel_number(hashes[_SALT_CHANNEL])
        hashes[_SALT_CHANNEL_URL] = hash_bits(params.seed, channel, _SALT_CHANNEL_URL)
    events = (
        index.alias("index"),
        cycle.alias("cycle"),
        _date_time(params, event_number).alias("event_us"),
        *(column.alias(f"bits_{salt}") for salt, column in hashes.items()),
    )
    if stream == "person":
        return events, tuple(_person_columns())
    if stream == "auction":
        return events, tuple(_auction_columns(params))
    return events, tuple(_bid_columns(params))


def nexmark_frame(
    spark: SparkSession, params: Nexmark, start: int, end: int, partitions: int
) -> DataFrame:
    """The ``params.stream`` events among global event numbers ``[start, end)``.

    Rows are enumerated by their index within the stream (the k-th person, auction or bid), from
    which the global event number follows arithmetically; so a person source does not generate
    the 49 other events of each cycle only to drop them.
    """
    events, rows = _projections(spark, params)
    indexes = spark.range(
        _stream_events_before(params.stream, start),
        _stream_events_before(params.stream, end),
        1,
        partitions,
    )
    return indexes.select(*events).select(*rows)


def nexmark_columns(spark: SparkSession, params: Nexmark, indexes: DataFrame) -> DataFrame:
    """``params.stream``'s rows for a frame whose ``id`` column holds stream indexes (the k-th
    bid, ...). Lets another engine (the benchmark's Structured Streaming peer) compute exactly
    the rows Eddyline's source computes."""
    events, rows = _projections(spark, params)
    return indexes.select(*events).select(*rows)


def stream_indexes(params: Nexmark, start: int, end: int) -> tuple[int, int]:
    """The stream indexes of ``params.stream``'s events among global numbers ``[start, end)``."""
    return _stream_events_before(params.stream, start), _stream_events_before(params.stream, end)


# --------------------------------------------------------------------------- the same rows in numpy


def nexmark_arrow(params: Nexmark, lo: int, hi: int) -> pa.Table:
    """The rows of stream indexes ``[lo, hi)`` computed here (a resident lane's own read): the
    values of :func:`nexmark_columns`' Spark columns, operation for operation (the hashes are
    Spark's ``xxhash64``, :mod:`eddyline.hashing`; the doubles go through the same steps)."""
    stream = params.stream
    first, count = _SLOTS[stream]
    index = np.arange(lo, hi, dtype=np.int64)
    cycle = index // count
    event_number = cycle * TOTAL_PROPORTION + first + np.mod(index, count)
    event_us = epoch_micros(params.start_time) + np.floor(event_number.astype(np.float64) * _gap_us(params)).astype(np.int64)
    bits = {salt: spark_xxhash64(event_number, salt_constant(params.seed, salt)) for salt in _STREAM_SALTS[stream]}
    extras = {"person": _PERSON_EXTRAS, "auction": _AUCTION_EXTRAS, "bid": _BID_EXTRAS}[stream]
    cols = {"date_time": pa.array(event_us, _TIMESTAMP), "extra": _pick_np(extras, bits[_SALT_EXTRA])}
    if stream == "person":
        cols |= _person_arrow(index, bits)
    elif stream == "auction":
        cols |= _auction_arrow(params, index, cycle, event_us, bits)
    else:
        cols |= _bid_arrow(params, cycle, bits)
    return pa.table(cols).select([c.split()[0] for c in SCHEMAS[stream].split(",")])


_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _pick_np(values: Sequence[str], bits: np.ndarray) -> pa.Array:
    return pa.array(values, pa.string()).take(pa.array(np.mod(bits, len(values))))


def _field_np(bits: np.ndarray, shift: int, width: int) -> np.ndarray:
    return ((bits.view(np.uint64) >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(np.int64)


def _price_np(bits: np.ndarray) -> np.ndarray:
    return np.floor(np.exp(unit_interval_np(bits) * (6.0 * math.log(10.0))) * 100.0 + 0.5).astype(np.int64)


def _hot_or_recent_np(params: Nexmark, newest: np.ndarray, bits: np.ndarray, ratio: int, hot: np.ndarray) -> np.ndarray:
    active = np.minimum(newest + 1, params.num_active_people)
    recent = newest + 1 - active + np.mod(_field_np(bits, 32, 32), active)
    return np.where(np.mod(_field_np(bits, 0, 32), ratio) > 0, hot, recent)


def _texts(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values, pa.int64()), pa.string())


def _joined(*parts: pa.Array | str) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _person_arrow(index: np.ndarray, bits: dict[int, np.ndarray]) -> dict[str, pa.Array]:
    def card_groups(salt: int) -> list[pa.Array]:
        digits = _texts(np.mod(bits[salt], 10**8) + 10**8)
        return [pc.utf8_slice_codeunits(digits, 1, 5), pc.utf8_slice_codeunits(digits, 5, 9)]

    name, email, place = bits[_SALT_NAME], bits[_SALT_EMAIL], bits[_SALT_PLACE]
    return {
        "id": pa.array(index + FIRST_PERSON_ID),
        "name": _joined(_pick_np(FIRST_NAMES, _field_np(name, 0, 32)), " ", _pick_np(LAST_NAMES, _field_np(name, 32, 32))),
        "email_address": _joined(_pick_np(_EMAIL_USERS, _field_np(email, 0, 32)), "@",
                                 _pick_np(_EMAIL_HOSTS, _field_np(email, 32, 32)), ".com"),
        "credit_card": pc.binary_join_element_wise(*card_groups(_SALT_CARD_HIGH), *card_groups(_SALT_CARD_LOW), " "),
        "city": _pick_np(US_CITIES, _field_np(place, 0, 32)),
        "state": _pick_np(US_STATES, _field_np(place, 32, 32)),
    }


def _auction_arrow(params: Nexmark, index: np.ndarray, cycle: np.ndarray, event_us: np.ndarray,
                   bits: dict[int, np.ndarray]) -> dict[str, pa.Array]:
    horizon_events = params.num_in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon_ms = math.floor(horizon_events * 1000 / params.rate)
    expires = bits[_SALT_EXPIRES]
    length_ms = 1 + np.mod(_field_np(expires, 0, 32), max(2 * horizon_ms, 1))
    seller = _hot_or_recent_np(params, cycle, bits[_SALT_SELLER], params.hot_seller_ratio, cycle // HOT_BATCH * HOT_BATCH)
    initial_bid = _price_np(bits[_SALT_PRICE])
    text = bits[_SALT_TEXT]
    return {
        "id": pa.array(index + FIRST_AUCTION_ID),
        "item_name": _pick_np(_ITEM_NAMES, _field_np(text, 0, 32)),
        "description": _pick_np(_DESCRIPTIONS, _field_np(text, 32, 32)),
        "initial_bid": pa.array(initial_bid),
        "reserve": pa.array(initial_bid + _price_np(bits[_SALT_RESERVE])),
        "expires": pa.array(event_us + length_ms * 1000, _TIMESTAMP),
        "seller": pa.array(seller + FIRST_PERSON_ID),
        "category": pa.array(FIRST_CATEGORY_ID + np.mod(_field_np(expires, 32, 32), NUM_CATEGORIES)),
    }


def _bid_arrow(params: Nexmark, cycle: np.ndarray, bits: dict[int, np.ndarray]) -> dict[str, pa.Array]:
    newest_auction = cycle * AUCTION_PROPORTION + (AUCTION_PROPORTION - 1)
    ab = bits[_SALT_AUCTION]
    oldest_open = np.maximum(newest_auction - params.num_in_flight_auctions, 0)
    open_auction = oldest_open + np.mod(_field_np(ab, 32, 32), newest_auction - oldest_open + 1)
    auction = np.where(np.mod(_field_np(ab, 0, 32), params.hot_auction_ratio) > 0,
                       newest_auction // HOT_BATCH * HOT_BATCH, open_auction)
    hot_bidder = np.minimum(cycle // HOT_BATCH * HOT_BATCH + 1, cycle)
    bidder = _hot_or_recent_np(params, cycle, bits[_SALT_BIDDER], params.hot_bidder_ratio, hot_bidder)
    cb = bits[_SALT_CHANNEL]
    hot = pa.array(np.mod(_field_np(cb, 0, 32), HOT_CHANNEL_RATIO) > 0)
    number = np.mod(_field_np(cb, 32, 32), CHANNELS)
    url_bits = spark_xxhash64(number, salt_constant(params.seed, _SALT_CHANNEL_URL))
    with_id = np.mod(_field_np(url_bits, 40, 24), URL_WITHOUT_CHANNEL_ID_RATIO) > 0
    channel_id = pc.if_else(pa.array(with_id), _joined("&channel_id=", _texts(_field_np(url_bits, 0, 31))), "")
    return {
        "auction": pa.array(auction + FIRST_AUCTION_ID),
        "bidder": pa.array(bidder + FIRST_PERSON_ID),
        "price": pa.array(_price_np(bits[_SALT_PRICE])),
        "channel": pc.if_else(hot, _pick_np(HOT_CHANNELS, _field_np(cb, 32, 32)), _joined("channel-", _texts(number))),
        "url": pc.if_else(hot, _pick_np(_HOT_URLS, _field_np(cb, 32, 32)),
                          _joined(_pick_np(_URLS, _field_np(url_bits, 32, _URL_BITS)), channel_id)),
    }


@SOURCES.register
class NexmarkKind(SourceKind):
    key = "nexmark"
    params = Nexmark

    def columns(self, params: Nexmark) -> tuple[str, ...]:
        return tuple(c.split()[0] for c in SCHEMAS[params.stream].split(","))

    def make(self, spec: SourceSpec) -> SyntheticSource:
        return SyntheticSource(spec, nexmark_available, nexmark_columns, stream_indexes, unpaced=spec.params.unpaced,
                               arrow=nexmark_arrow)
