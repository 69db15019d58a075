"""The query network as frozen, validated data.

A network is sources → steps → sinks. Each source, step and sink is a small record with a
``name`` and exactly one *kind key* saying what it is::

    name: hot-auctions
    sources:
      - name: bids
        nexmark: {stream: bid, rate: 50000}
    steps:
      - name: expensive
        input: bids
        filter: "price > 100"
      - name: per_auction
        input: expensive
        window_aggregate:
          key: auction
          time: date_time
          window: {size: 10s, slide: 2s}
          aggregates: {bids: "count(*)", top: "max(price)"}
          watermark_delay: 4s
    sinks:
      - name: out
        input: per_auction
        files: {path: out/hot, format: parquet}

The Python builder (:mod:`eddyline.api.builder`) produces the same models, so YAML and Python
are two spellings of one thing. Structural checks live here (pydantic); graph checks (unknown
inputs, cycles) and expression checks live in :mod:`eddyline.api.validate`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: Any) -> int:
    """Parse ``'10s'``, ``'500ms'``, ``'2m'``, ``'1h'``, ``'1d'`` (or a whole number of ms).

    >>> parse_duration_ms("2s"), parse_duration_ms("1.5m"), parse_duration_ms(250)
    (2000, 90000, 250)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '10s', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a non-negative duration, got {value!r}")
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(round(float(m.group(1)) * _UNIT_MS[m.group(2)]))
    raise ValueError(f"expected a duration like '10s', got {value!r}")


def format_duration_ms(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


#: A duration in milliseconds; accepts "10s"-style strings and serialises back to them.
Duration = Annotated[
    int,
    BeforeValidator(parse_duration_ms),
    PlainSerializer(format_duration_ms, return_type=str),
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)
_UNIT_BYTES = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_bytes(value: Any) -> int:
    """Parse ``'64MiB'``, ``'500kb'``, ``'2GB'`` (or a whole number of bytes).

    >>> parse_bytes("1KiB"), parse_bytes("1.5kb"), parse_bytes(7)
    (1024, 1500, 7)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(round(float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "b").lower()]))
    raise ValueError(f"expected a size like '64MiB', got {value!r}")


#: A size in bytes; accepts "64MiB"-style strings.
ByteSize = Annotated[int, BeforeValidator(parse_bytes)]

_NAME = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
Name = Annotated[str, Field(pattern=_NAME, min_length=1, max_length=64)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _exactly_one_kind(obj: Any, kinds: tuple[str, ...], what: str) -> None:
    present = [k for k in kinds if getattr(obj, k) is not None]
    if len(present) != 1:
        got = ", ".join(present) if present else "none"
        raise ValueError(f"expected exactly one {what} kind of {', '.join(kinds)}; got {got}")


# --------------------------------------------------------------------------- sources


class Phase(Model):
    """One phase of a generator: for ``duration`` of event time, these settings hold."""

    duration: Duration = Field(gt=0)
    rate: float | None = Field(default=None, gt=0)
    skew: float | None = Field(default=None, ge=0)
    keys: int | None = Field(default=None, gt=0)
    #: Moves the hot set: popularity rank r is key (r * m + hot_shift) mod keys, m a fixed
    #: multiplier coprime with keys; so key ``hot_shift`` is the hottest (see eddyline.io.generator).
    hot_shift: int = 0


class Generator(Model):
    """Synthetic keyed rows computed inside Spark; deterministic from (seed, offset).

    Columns: ``offset`` (long), ``key`` (long in [0, keys)), ``value`` (long in [0, 1000)),
    ``event_time`` (timestamp). Offset ``i`` has event time ``start_time + i / rate`` (piecewise
    over ``phases``), and becomes available at the same wall-clock distance from the run's start.
    """

    rate: float = Field(default=10_000, gt=0)
    keys: int = Field(default=1_000, gt=0)
    skew: float = Field(default=0.0, ge=0)
    seed: int = 0
    start_time: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    phases: tuple[Phase, ...] = ()
    #: Pretend all rows are available at once (benchmarks): offsets are not paced by wall time.
    unpaced: bool = False


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


class Files(Model):
    """A directory of files: a source (new files are picked up in name order) or a sink.

    As a source, ``schema`` (a Spark DDL string such as ``"id long, name string"``) is required for
    ``json`` and ``csv``; records that do not parse or do not fit it go to the dead-letter sink.
    As a sink, each epoch's output appears atomically as ``path/epoch=NNNNNNNN/``.
    """

    path: str = Field(min_length=1)
    format: Literal["parquet", "json", "csv"] = "parquet"

    def __init__(self, path: str | None = None, /, **data: Any) -> None:
        """Allow ``Files("out/dir", format="json")`` with the path first."""
        if path is not None:
            data["path"] = path
        super().__init__(**data)

    schema_: str | None = Field(default=None, alias="schema")
    max_files_per_epoch: int | None = Field(default=None, gt=0)


class Console(Model):
    """Print each epoch's output (at most ``rows`` rows)."""

    rows: int = Field(default=20, gt=0)


class Memory(Model):
    """Collect output in the driver; read it back with ``Network.collected(sink_name)``."""


class SourceSpec(Model):
    name: Name
    generator: Generator | None = None
    nexmark: Nexmark | None = None
    files: Files | None = None
    #: Admission control: at most this many offsets per epoch (files sources: files).
    max_rows_per_epoch: int | None = Field(default=None, gt=0)
    #: A bounded source: only offsets [0, limit) exist (a fixed data set for tests and benchmarks).
    limit: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> SourceSpec:
        _exactly_one_kind(self, SOURCE_KINDS, "source")
        if self.files is not None and self.files.format != "parquet" and not self.files.schema_:
            raise ValueError(f"files.schema: a {self.files.format} source needs a schema (Spark DDL)")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SOURCE_KINDS if getattr(self, k) is not None)

    @property
    def params(self) -> Generator | Nexmark | Files:
        return getattr(self, self.kind)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ()


SOURCE_KINDS = ("generator", "nexmark", "files")

# --------------------------------------------------------------------------- steps


class Window(Model):
    """An event-time window: tumbling when ``slide`` is absent, sliding otherwise."""

    size: Duration = Field(gt=0)
    slide: Duration | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _slide_divides(self) -> Window:
        if self.slide is not None and (self.slide > self.size or self.size % self.slide):
            raise ValueError(
                f"slide: expected a slide that divides the size ({format_duration_ms(self.size)}),"
                f" got {format_duration_ms(self.slide)}"
            )
        return self

    @property
    def slide_ms(self) -> int:
        return self.slide if self.slide is not None else self.size


_AGG = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.I)
AGG_FUNCS = ("count", "sum", "min", "max", "avg")


def parse_aggregate(text: str) -> tuple[str, str | None]:
    """``"max(price)"`` → ``("max", "price")``; ``"count(*)"`` → ``("count", None)``."""
    m = _AGG.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"expected one of count(*), count(col), sum(col), min(col), max(col), avg(col); got {text!r}"
        )
    func, col = m.group(1).lower(), m.group(2)
    if col == "*":
        if func != "count":
            raise ValueError(f"expected a column inside {func}(), got {text!r}")
        return func, None
    return func, col


class _Aggregating:
    """For steps with ``aggregates: {name: "func(col)"}``."""

    aggregates: dict[str, str]

    @property
    def parsed_aggregates(self) -> tuple[tuple[str, str, str | None], ...]:
        return tuple((n, *parse_aggregate(t)) for n, t in self.aggregates.items())


class WindowAggregate(_Aggregating, Model):
    key: str | tuple[str, ...] | None = None
    time: str = Field(min_length=1)
    window: Window
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0
    #: Windows stay open this long after they fire; a late row re-emits the window (revision + 1).
    allowed_lateness: Duration = 0
    #: Rows later than the allowed lateness are counted, and also written here when set.
    late: Files | None = None

    @model_validator(mode="after")
    def _check_aggregates(self) -> WindowAggregate:
        problems = []
        for name, text in self.aggregates.items():
            try:
                parse_aggregate(text)
            except ValueError as e:
                problems.append(f"aggregates.{name}: {e}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def keys(self) -> tuple[str, ...]:
        if self.key is None:
            return ()
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)



def _names(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class Udf(Model):
    """A vectorized Python function applied to every batch of rows (stateless).

    ``function`` is ``"package.module:name"``; it receives a ``pyarrow.RecordBatch`` (``batch:
    arrow``) or a ``pandas.DataFrame`` (``batch: pandas``) and returns the same kind, with the
    columns of ``schema`` (Spark DDL).
    """

    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    schema_: str = Field(alias="schema", min_length=1)
    batch: Literal["arrow", "pandas"] = "arrow"


class Lookup(Model):
    """Enrich each row from a table in files (stream-to-table join), reloaded when it changes.

    The table is read whole and broadcast; each version used is copied into the checkpoint so
    that a replayed epoch joins against the version it first saw.
    """

    table: Files
    key: str | tuple[str, ...]
    table_key: str | tuple[str, ...]
    how: Literal["inner", "left"] = "inner"

    @model_validator(mode="after")
    def _arity(self) -> Lookup:
        if len(_names(self.key)) != len(_names(self.table_key)):
            raise ValueError("table_key: expected as many columns as key")
        return self


class Join(Model):
    """An equi-join of two streams.

    * ``kind: unbounded`` (default): every matching pair, as soon as both rows are there; rows
      are forgotten ``ttl`` after their event time (never, without ``ttl``);
    * ``kind: window``: pairs within the same tumbling window of ``size``, emitted when the
      window closes;
    * ``kind: interval``: a right row at ``right_time`` joins a left row whose
      ``[left_time, left_end]`` contains it (a bid and the auction open at that moment).
    """

    left: Name
    right: Name
    left_key: str | tuple[str, ...]
    right_key: str | tuple[str, ...]
    kind: Literal["unbounded", "window", "interval"] = "unbounded"
    left_time: str | None = None
    right_time: str | None = None
    left_end: str | None = None
    size: Duration | None = Field(default=None, gt=0)
    ttl: Duration | None = Field(default=None, gt=0)
    watermark_delay: Duration = 0

    @model_validator(mode="after")
    def _kind_fields(self) -> Join:
        if len(_names(self.left_key)) != len(_names(self.right_key)):
            raise ValueError("right_key: expected as many columns as left_key")
        need = {
            "window": ("left_time", "right_time", "size"),
            "interval": ("left_time", "left_end", "right_time"),
            "unbounded": ("left_time", "right_time") if self.ttl is not None else (),
        }[self.kind]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required for a {self.kind} join")
        return self


class Dedup(Model):
    """Keep the first row per key; a key is forgotten ``ttl`` after its first row's event time."""

    key: str | tuple[str, ...]
    time: str
    ttl: Duration = Field(gt=0)
    watermark_delay: Duration = 0


class TopK(Model):
    """The top ``k`` rows of each partition (e.g. each window), emitted once the watermark passes
    the partition's ``time`` (e.g. its ``window_end``); ``with_ties`` keeps rows tied with the k-th."""

    partition_by: str | tuple[str, ...]
    order_by: tuple[str, ...] = Field(min_length=1)  # "column DESC" / "column ASC" / "column"
    k: int = Field(default=1, gt=0)
    time: str
    with_ties: bool = True
    watermark_delay: Duration = 0

    @property
    def ordering(self) -> tuple[tuple[str, str], ...]:
        out = []
        for item in self.order_by:
            parts = item.split()
            if len(parts) == 1 or (len(parts) == 2 and parts[1].lower() in ("asc", "desc")):
                out.append((parts[0], "desc" if len(parts) == 2 and parts[1].lower() == "desc" else "asc"))
            else:
                raise ValueError(f"order_by: expected 'column [ASC|DESC]', got {item!r}")
        return tuple(out)


class SessionWindow(_Aggregating, Model):
    key: str | tuple[str, ...]
    time: str
    gap: Duration = Field(gt=0)
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0



class KeyedAggregate(Model):
    """An unbounded aggregate per key with a changelog output: each epoch, one row per key whose
    value changed, with ``_op`` = ``insert`` (first time) or ``update`` (upsert semantics)."""

    key: str | tuple[str, ...]
    aggregates: dict[Name, str] = Field(min_length=1)  # count/sum/min/max/avg(col), last(col), max_by(col, by)
    time: str | None = None


class OverAggregate(_Aggregating, Model):
    """SQL's ``AGG(col) OVER (PARTITION BY key ORDER BY time ROWS preceding PRECEDING)``: one
    output row per input row, once the watermark passes it, with aggregates over it and up to
    ``preceding`` earlier rows of its key."""

    key: str | tuple[str, ...]
    time: str
    preceding: int = Field(ge=0)
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0



class PatternSplit(Model):
    stage: Literal[1, 2]
    at: str = Field(min_length=1)  # the name of a Kleene-plus element


class PatternSpec(Model):
    """Complex event pattern per key; ``factory`` is ``"module:function"`` returning the pattern
    (e.g. ``eddyline.operators.pattern:tick_pattern``), called with ``args``."""

    key: str | tuple[str, ...]
    time: str
    within: Duration = Field(gt=0)
    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    args: dict[str, Any] = Field(default_factory=dict)
    measures: dict[Name, tuple[str, str | None, str]] = Field(default_factory=dict)
    watermark_delay: Duration = 0
    #: AnduIN's pipeline split P+ = P v (P P+) at the Kleene-plus element ``split.at``: stage 1
    #: emits the partial matches that just bound it; stage 2 (``seeds``: the stage-1 step) extends
    #: them. Both stages read the same events and give exactly the single-step matches.
    split: PatternSplit | None = None
    seeds: Name | None = None

    @model_validator(mode="after")
    def _split_fields(self) -> PatternSpec:
        if self.split is not None and (self.split.stage == 2) != (self.seeds is not None):
            raise ValueError("seeds: a stage-2 pattern names its stage-1 step in 'seeds'; only stage 2 does")
        if self.split is None and self.seeds is not None:
            raise ValueError("seeds: only a stage-2 pattern (split.stage: 2) reads seeds")
        return self


class StepSpec(Model):
    name: Name
    input: Name | None = None
    filter: str | None = None
    select: tuple[str, ...] | None = None
    union: tuple[Name, ...] | None = None
    udf: Udf | None = None
    lookup: Lookup | None = None
    window_aggregate: WindowAggregate | None = None
    join: Join | None = None
    dedup: Dedup | None = None
    top_k: TopK | None = None
    session_window: SessionWindow | None = None
    aggregate: KeyedAggregate | None = None
    over_aggregate: OverAggregate | None = None
    pattern: PatternSpec | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        _exactly_one_kind(self, STEP_KINDS, "step")
        if self.union is not None or self.join is not None:
            field = "union" if self.union is not None else "join"
            if self.input is not None:
                raise ValueError(f"input: a {field} names its inputs in '{field}', not 'input'")
            if self.union is not None and len(self.union) < 2:
                raise ValueError(f"union: expected at least 2 inputs, got {len(self.union)}")
        elif self.input is None:
            raise ValueError("input: field required")
        if self.select is not None and not self.select:
            raise ValueError("select: expected at least one expression")
        if self.top_k is not None:
            self.top_k.ordering  # noqa: B018  (raises on a malformed order_by)
        return self

    @property
    def kind(self) -> str:
        return next(k for k in STEP_KINDS if getattr(self, k) is not None)

    @property
    def inputs(self) -> tuple[str, ...]:
        if self.union is not None:
            return self.union
        if self.join is not None:
            return (self.join.left, self.join.right)
        if self.pattern is not None and self.pattern.seeds is not None:
            return (self.input, self.pattern.seeds)  # type: ignore[return-value]
        return (self.input,)  # type: ignore[return-value]

    @property
    def params(self) -> Any:
        return getattr(self, self.kind)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The key columns of a single-input keyed step (a top-k's ``partition_by``, otherwise
        its ``key``); () for steps without one."""
        return _names(self.top_k.partition_by if self.top_k is not None else getattr(self.params, "key", None))

    @property
    def watermark_delay(self) -> int:
        return int(getattr(self.params, "watermark_delay", 0) or 0)

    def time_columns(self) -> tuple[str | None, ...]:
        """Per input, the event-time column the step's watermark follows (None: no event time)."""
        p = self.params
        if self.join is not None:
            return (self.join.left_time, self.join.right_time)
        if self.pattern is not None and self.pattern.seeds is not None:
            return (self.pattern.time, None)  # seeds follow the stage-1 step's watermark
        return (getattr(p, "time", None),)

    def input_fields(self) -> list[tuple[str, str]]:
        """(field path, input name) pairs, for messages about inputs."""
        if self.union is not None:
            return [("union", i) for i in self.union]
        if self.join is not None:
            return [("join.left", self.join.left), ("join.right", self.join.right)]
        if self.pattern is not None and self.pattern.seeds is not None:
            return [("input", self.input), ("pattern.seeds", self.pattern.seeds)]  # type: ignore[list-item]
        return [("input", self.input)]  # type: ignore[list-item]

    @property
    def stateful(self) -> bool:
        return self.kind in STATEFUL_KINDS


STEP_KINDS = (
    "filter",
    "select",
    "union",
    "udf",
    "lookup",
    "window_aggregate",
    "join",
    "dedup",
    "top_k",
    "session_window",
    "aggregate",
    "over_aggregate",
    "pattern",
)
STATEFUL_KINDS = (
    "window_aggregate", "join", "dedup", "top_k", "session_window", "aggregate", "over_aggregate", "pattern",
)

# --------------------------------------------------------------------------- sinks


class Qos(Model):
    """A query output's service level: its epochs should take at most ``latency``; when load
    must be shed, one of its rows is worth ``utility``."""

    latency: Duration = Field(gt=0)
    utility: float = Field(default=1.0, ge=0)


class SinkSpec(Model):
    name: Name
    input: Name
    files: Files | None = None
    console: Console | None = None
    memory: Memory | None = None
    qos: Qos | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> SinkSpec:
        _exactly_one_kind(self, SINK_KINDS, "sink")
        if self.files is not None and self.files.schema_ is not None:
            raise ValueError("files.schema: a sink writes its input's schema; remove 'schema'")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SINK_KINDS if getattr(self, k) is not None)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)


SINK_KINDS = ("files", "console", "memory")

# --------------------------------------------------------------------------- network


# --------------------------------------------------------------------------- control


class Balance(Model):
    """Dynamic load balancing between lanes (seed 001): pair the most and least loaded lanes and
    move key groups when their average loads differ by ``threshold`` × the mean lane load."""

    method: Literal["one_way", "two_way", "global"] = "one_way"
    threshold: float = Field(default=0.2, gt=0)
    #: Evaluate every ``period`` epochs.
    period: int = Field(default=2, ge=1)
    #: At most this many key groups move per decision.
    max_moves: int = Field(default=4, ge=1)
    #: A moved key group stays put for this many evaluations.
    cooldown: int = Field(default=3, ge=0)
    #: Act only after the imbalance was seen at this many evaluations in a row.
    patience: int = Field(default=2, ge=1)
    #: Epochs of load the decision looks at (recent ones: an old balance must not hide a new skew).
    window: int = Field(default=4, ge=2)
    #: Look at the epoch's input before it runs: when its rows per key group have shifted from
    #: the last epoch's, balance for them in the same epoch instead of one epoch later. Works
    #: where that is cheap: a step fed by a Parquet ``files`` source (directly or through
    #: filters and selects that keep the keys), on BIGINT keys.
    lookahead: bool = False


class Scale(Model):
    """Elastic lanes from the rate model (DS2): lanes = arrival rate / (true per-lane rate ×
    target utilisation), within [min_lanes, max_lanes]."""

    min_lanes: int = Field(default=1, ge=1)
    #: Default: the cores Spark offers (its default parallelism).
    max_lanes: int | None = Field(default=None, ge=1)
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    #: Epochs without another rescale after one (hysteresis).
    cooldown: int = Field(default=3, ge=0)
    #: Ignore utilisation changes within this fraction of the target.
    tolerance: float = Field(default=0.15, ge=0, lt=1)
    #: Planned rescales, epoch → lanes (e.g. before a known peak); applied as well as the model.
    schedule: dict[int, int] = Field(default_factory=dict)
    #: Whether the rate model decides at all (off: only ``schedule``).
    auto: bool = True


class Spread(Model):
    """SPREADFIRE for hot key groups: when one key group's load exceeds ``hot_share`` of a fair
    lane's load (so no move can balance it), its new rows are spread over ``fanout`` lanes while
    its existing state stays where it is. Only steps whose kernel supports it (interval and
    unbounded joins) are split; window aggregates already merge pre-aggregated partials."""

    hot_share: float = Field(default=0.6, gt=0)
    fanout: int = Field(default=2, ge=2, le=16)
    #: Planned splits, epoch → key groups (drills and tests).
    schedule: dict[int, tuple[int, ...]] = Field(default_factory=dict)
    auto: bool = True


class Chaos(Model):
    """Relocation drills: random key-group moves during a run (deterministic per seed)."""

    random_moves: int = Field(default=0, ge=0)
    every: int = Field(default=1, ge=1)
    seed: int = 0


class CostModel(Model):
    """Declared epoch costs (e.g. from a benchmark of this network), instead of measured ones:
    an epoch takes ``fixed_ms + read_ms_per_row × rows read + Σ step_ms_per_row[s] × rows s keeps``."""

    fixed_ms: float = Field(default=0.0, ge=0)
    read_ms_per_row: float = Field(default=0.0, ge=0)
    step_ms_per_row: dict[str, float] = Field(default_factory=dict)
    #: What to do when epochs take more than 1.5x (or less than 1/1.5 of) what the model
    #: predicts, twice running: ``refit`` switches to the model fitted from the epochs (and says
    #: so in the decision's ``modelCheck``), ``report`` keeps the declared model and only reports.
    on_miss: Literal["refit", "report"] = "refit"


class Overload(Model):
    """What to do when arrival outruns capacity (needs a ``qos`` latency on some sink).

    Admission control takes fewer offsets per epoch so an epoch fits the latency bound (the
    backlog stays in the replayable source and is reported as lag). Shedding drops rows before
    stateful steps instead, where it costs the least utility: ``lp`` solves the coordinated
    shedding LP, ``uniform`` keeps one fraction everywhere, ``off`` only defers.
    """

    shedding: Literal["lp", "uniform", "off"] = "lp"
    #: ``random``: a pure function of (seed, epoch, row content); ``semantic``: keep the rows of
    #: highest ``utility`` (a SQL expression per step), cut at last epoch's quantiles.
    mode: Literal["random", "semantic"] = "random"
    utility: dict[str, str] = Field(default_factory=dict)
    seed: int = 0
    #: Aim for this fraction of the latency bound.
    headroom: float = Field(default=0.8, gt=0, le=1)
    #: Never keep less than this fraction at a shed point.
    min_keep: float = Field(default=0.02, gt=0, le=1)
    #: Window aggregates behind a shed point scale counts and sums by 1 / keep and report the
    #: half-width of their confidence interval in ``<name>_error`` columns.
    estimate: bool = True
    confidence: float = Field(default=0.95, gt=0, lt=1)
    #: Shed rows go here (with their step and epoch) for later reprocessing.
    shed_sink: Files | None = None
    #: Use these costs instead of fitting them to the epochs' measurements.
    cost_model: CostModel | None = None
    #: Admission control's first epochs take at most this many offsets, then at most twice
    #: what the previous epoch took within the bound (slow start).
    probe_rows: int = Field(default=10_000, gt=0)


class Control(Model):
    """How the running query is kept balanced and sized (see ``eddyline.control``)."""

    #: Initial placement of key groups, once ``warmup_epochs`` of statistics exist (or from
    #: ``profile``): uniform ranges, greedy (largest first), correlation-based, or resilient (ROD).
    placement: Literal["uniform", "greedy", "correlation", "resilient"] = "uniform"
    warmup_epochs: int = Field(default=3, ge=1)
    #: A placement is applied only if it lowers the predicted makespan by this fraction.
    min_gain: float = Field(default=0.05, ge=0)
    #: A JSON load profile: {step: [[load per epoch] per key group]} (e.g. from ``--stats-out``).
    profile: str | None = None
    balance: Balance | None = None
    scale: Scale | None = None
    spread: Spread | None = None
    chaos: Chaos | None = None
    overload: Overload | None = None
    #: Memory budget for one lane's state; state beyond it stays on disk and is processed in
    #: slices of key groups that fit.
    state_budget: ByteSize | None = Field(default=None, gt=0)
    #: Epochs of load statistics kept for the policies.
    history: int = Field(default=30, ge=2)
    #: What a key group's load is measured in for placement and balancing: ``time`` shares the
    #: lanes' measured busy time out by rows (the true cost, but as noisy as the machine's
    #: clock); ``rows`` counts the rows its kernel worked on (the same input then gives the same
    #: decisions in every run). Rescaling always uses measured rates.
    load: Literal["time", "rows"] = "time"
    #: The steps the control plane adapts (default: every stateful step).
    steps: tuple[str, ...] | None = None

    @property
    def adaptive(self) -> bool:
        return bool(
            self.placement != "uniform" or self.profile or self.balance or self.scale or self.spread or self.chaos
            or self.overload
        )


class NetworkSpec(Model):
    name: Name
    sources: tuple[SourceSpec, ...] = Field(min_length=1)
    steps: tuple[StepSpec, ...] = ()
    sinks: tuple[SinkSpec, ...] = Field(min_length=1)
    #: Key groups per stateful step: fixed when the checkpoint is first created.
    key_groups: int = Field(default=128, gt=0, le=32768)
    #: Parallel lanes per stateful step; default: Spark's default parallelism.
    lanes: int | None = Field(default=None, gt=0)
    #: Target epoch interval: an epoch starts at most this often (immediately when behind).
    trigger: Duration = 1000
    #: Where malformed records go; default ``<checkpoint>/dead-letters``.
    dead_letters: Files | None = None
    #: The control plane: placement, balancing, rescaling, hot-key splits, state budget.
    control: Control = Control()

    def node(self, name: str) -> SourceSpec | StepSpec | SinkSpec:
        for n in (*self.sources, *self.steps, *self.sinks):
            if n.name == name:
                return n
        raise KeyError(name)

    def step(self, name: str) -> StepSpec:
        n = self.node(name)
        if not isinstance(n, StepSpec):
            raise KeyError(name)
        return n

    def upstream(self, name: str) -> set[str]:
        """``name`` and every node whose rows reach it."""
        reach, frontier = set(), [name]
        while frontier:
            n = frontier.pop()
            if n not in reach:
                reach.add(n)
                frontier.extend(self.node(n).inputs)
        return reach

    @property
    def latency_bound(self) -> int | None:
        """The tightest declared latency of any query output (ms), if any."""
        bounds = [s.qos.latency for s in self.sinks if s.qos is not None]
        return min(bounds) if bounds else None

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must agree on with the network that resumes it."""
        return {
            "name": self.name,
            "key_groups": self.key_groups,
            "stateful_steps": sorted(s.name for s in self.steps if s.stateful),
        }
