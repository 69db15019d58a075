"""Sinks, idempotent by epoch.

Writing is two steps so that an epoch's output appears all at once and a replay never duplicates:
:meth:`Sink.stage` writes (or collects) the epoch's rows where no reader looks, and
:meth:`Sink.publish` makes them visible, replacing whatever an earlier, crashed attempt of the same
epoch published. The runtime publishes before it commits the epoch; a crash in between replays the
epoch, which stages and publishes the same rows again. The kinds (``files``, ``console``,
``memory``, ...) are one module each in this package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from eddyline.api import sinks as api_sinks
from eddyline.api.sinks import SinkSpec
from eddyline.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


@dataclass
class Sink:
    spec: SinkSpec
    collected: dict[int, pa.Table] = field(default_factory=dict)
    #: the lease generation of the driver that writes (0: no lease): see :meth:`fence`
    generation: int = 0
    #: names this driver's staging area, where two drivers write the same place (a hot pair)
    writer: str = ""
    #: set by the runtime before each :meth:`stage`: the epoch's input was small, so its output
    #: most likely is too, and a sink may write it from the driver rather than from Spark tasks
    small_epoch: bool = False
    #: a sink that writes from Spark cannot count what it wrote without an extra job: the
    #: runtime counts its rows on the way (an observation); one that collects knows the count
    counts_itself: ClassVar[bool] = False
    #: it can take back any epoch it published and put it back later (:meth:`restore`), so a
    #: network that writes only to such sinks can be replayed from an earlier epoch
    rewinds: ClassVar[bool] = False
    #: how many of the newest epochs the checkpoint keeps (the network's ``history``; set by the
    #: engine): a sink that rewinds by records of its own keeps them that long and no longer
    history: int = 10

    @property
    def name(self) -> str:
        return self.spec.name

    def open(
        self, network: str, checkpoint: str, schema: StructType, tentative: bool = False
    ) -> None:
        """Called once per run, before the sink stages its first epoch and before that epoch's
        first job: ``network`` is the network's name, ``checkpoint`` the id of its checkpoint
        (a replay comes from the same checkpoint; a fresh start on a new checkpoint, whose epochs
        count from 1 again, does not), ``schema`` its input's Spark schema. A sink that writes
        into something that exists already checks it here, raising
        :class:`~eddyline.errors.SinkError` before anything is written.

        ``tentative``: the network may publish tentative epochs and retract them (it has
        ``max_delay``, see :mod:`eddyline.ha.dpc`). A sink whose readers see the mark in what it
        writes prepares for that here, before the first epoch, when a tentative one can no longer
        wait (the ``postgres`` sink's table gets its ``tentative`` column); the others ignore
        it."""

    def fence(self, generation: int) -> None:
        """Write under lease generation ``generation`` from now on. A sink whose store can refuse
        an older generation's writes tells the store here (files: the generation's gate; a
        database: a fencing row; a broker: a fencing message its publishes are conditional on),
        before this driver writes anything, and raises :class:`~eddyline.errors.Fenced` if a
        newer generation told it first. Called before :meth:`open` (and again when the driver
        takes a lease over); a sink that needs its connection for it does it in :meth:`open`."""
        self.generation = generation

    def stage(self, df: DataFrame, epoch: int) -> None:
        raise NotImplementedError

    #: it can stage rows given as Arrow (:meth:`stage_table`): a resident epoch has no frame
    takes_arrow: ClassVar[bool] = False

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        """:meth:`stage` for rows the driver holds (a resident epoch,
        :mod:`eddyline.runtime.residentmode`), for sinks that :attr:`takes_arrow`."""
        raise SinkError(f"sink '{self.name}': a {self.spec.kind} sink takes its rows from Spark only")

    def arrow_problem(self, schema: pa.Schema) -> str | None:
        """Why this sink cannot take rows of ``schema`` as Arrow (:meth:`stage_table`), asked
        before a resident run starts; None: it can."""
        return None

    def lane_parts(self, epoch: int) -> dict[str, Any] | None:
        """Where the lanes of a resident epoch write this sink's rows themselves, a part each
        (:func:`eddyline.io.files.target.write_part`), the epoch's staging made empty for them;
        None (the default): the lanes send the rows back and :meth:`stage_table` writes them."""
        return None

    def parts_staged(self, epoch: int, names: list[str]) -> None:
        """The parts the lanes wrote where :meth:`lane_parts` said."""
        raise SinkError(f"sink '{self.name}': a {self.spec.kind} sink takes no parts from lanes")

    def status(self) -> dict[str, Any] | None:
        """How its server is doing (sinks that write to one): shown in the progress."""
        return None

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        """Make the staged epoch visible (no-op for sinks that stage in memory). A sink that
        publishes in several steps calls ``midway()`` between them (crash tests cut there).

        ``tentative``: the epoch ran without an input that could not be reached (see
        :mod:`eddyline.ha.dpc`); its rows are published marked as tentative, so that readers can
        tell them from stable ones, and :meth:`retract` can take them back later."""

    def drop(self, epoch: int) -> None:
        """Forget what was staged for ``epoch`` without publishing it (the other driver of a
        hot pair published the same, see :mod:`eddyline.ha.selector`)."""
        self.collected.pop(epoch, None)

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        """Take back everything the tentative ``epochs`` published, as part of epoch
        ``at_epoch`` (the first epoch that recomputes them with the missing input), before it
        publishes its own rows. Idempotent: a replay of ``at_epoch`` retracts again and must
        change nothing more. Every sink kind that can stand in a network with ``max_delay``
        implements it."""
        for epoch in epochs:
            self.collected.pop(epoch, None)

    def restore(self, at_epoch: int) -> None:
        """Put back the output epoch ``at_epoch`` retracted (undoing a replay); sinks that
        ``rewinds`` implement it. Idempotent."""
        raise SinkError(f"sink '{self.name}': a {self.spec.kind} sink cannot put back what it took back")

    def rewind_problem(self, network: str, checkpoint: str, epochs: range, restore: int | None) -> str | None:
        """Why the sink could not take ``epochs`` back (and, undoing a replay, put back what
        epoch ``restore`` took back), or None; asked before a replay or an undo is accepted,
        possibly before :meth:`open`. Sinks that keep what they take back for a while only
        (the ``postgres`` sink) say so here rather than fail in the middle of the epoch."""
        return None

    def staged_rows(self, epoch: int) -> int:
        """Rows staged for ``epoch`` (for sinks that ``counts_itself``)."""
        staged = self.collected.get(epoch)
        return staged.num_rows if staged is not None else 0


class SinkKind(api_sinks.SinkKind):
    """A sink kind that can write: ``make`` turns its spec into a :class:`Sink`."""

    def make(self, spec: SinkSpec, console: Any = None) -> Sink:
        raise NotImplementedError


def make_sink(spec: SinkSpec, console: Any = None) -> Sink:
    """The sink for ``spec``; ``console``: where a console sink prints (rich Console)."""
    kind = spec.info
    assert isinstance(kind, SinkKind), kind
    return kind.make(spec, console)
