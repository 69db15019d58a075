"""How a running network is kept balanced, sized and within its latency bound: the ``control:``
section of a spec (see :mod:`eddyline.control` for what each setting drives)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eddyline.api.units import ByteSize, Duration, Files, Model


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


class Rewrite(Model):
    """Graph rewriting at run time (AnduIN): when a stateful step is the busiest of the network,
    takes at least ``saturation`` of the epoch's time and one key group carries more than
    ``hot_share`` times a fair lane's load with as many lanes as the step may get (so neither
    moving key groups nor more lanes can bring its slowest lane down to a fair share)
    for ``patience`` epochs in a row, a rule that fits the step rewrites the network at the next
    epoch boundary (``eddyline explain --rules`` lists them)."""

    rules: tuple[Literal["pattern-pipeline-split", "aggregate-local-global-split"], ...] = (
        "pattern-pipeline-split", "aggregate-local-global-split")
    saturation: float = Field(default=0.5, ge=0, le=1)
    hot_share: float = Field(default=1.2, ge=1)
    patience: int = Field(default=3, ge=1)
    #: Planned rewrites, epoch → steps (drills and tests); applied as well as the detector's.
    schedule: dict[int, tuple[str, ...]] = Field(default_factory=dict)
    #: Whether the hot-spot detector decides at all (off: only ``schedule``).
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


class CatchUp(Model):
    """Epochs sized by the backlog (:mod:`eddyline.control.catchup`): a source without a
    per-epoch cap of its own takes what is waiting when that fits one epoch; further behind, an
    epoch takes what the fitted cost model says fits ``target`` (and a sink's latency bound),
    at most ``max_rows``, growing at most ``growth`` times an epoch from ``first_rows``."""

    #: how long an epoch that catches up may take (the latency it adds to its results)
    target: Duration = Field(default=2_000, gt=0)
    #: the most source rows one epoch reads (what it holds in memory at once)
    max_rows: int = Field(default=2_000_000, gt=0)
    #: what the first epoch that is behind takes, before any epoch was measured
    first_rows: int = Field(default=250_000, gt=0)
    #: an epoch takes at most this many times what the last one read within the target
    growth: float = Field(default=4.0, ge=1.0)


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
    rewrite: Rewrite | None = None
    overload: Overload | None = None
    #: Epochs sized by the backlog; ``null`` turns it off (a source without a cap of its own then
    #: takes everything that is waiting in one epoch).
    catch_up: CatchUp | None = CatchUp()
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
    #: A control stream of tuples ``{"query": <network name>, "step": ..., "parameter": ...,
    #: "value": ...}``, read at every epoch boundary like ``eddyline control set``: a directory
    #: (path or URI) of JSON-lines files, read in name order (a file must appear whole: write
    #: it, then rename it in), or a JetStream stream, ``nats://host:port/STREAM[?subject=…]``
    #: (``tls://`` too), one tuple per message. Tuples for another query are skipped.
    commands: str | None = Field(default=None, min_length=1)

    @field_validator("commands")
    @classmethod
    def _stream_named(cls, value: str | None) -> str | None:
        broker = value is not None and value.startswith(("nats://", "tls://"))
        if broker and not value.split("?")[0].split("://", 1)[1].partition("/")[2].strip("/"):  # type: ignore[union-attr]
            raise ValueError(f"expected nats://host:port/STREAM (the JetStream stream to read), got {value!r}")
        return value

    @property
    def adaptive(self) -> bool:
        return bool(
            self.placement != "uniform" or self.profile or self.balance or self.scale or self.spread or self.chaos
            or self.overload or self.rewrite
        )
