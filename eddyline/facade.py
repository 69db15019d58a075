"""Running a network from Python: the thin layer over the spec builder that starts the engine.

The spec layer (:mod:`eddyline.api`) only builds and checks frozen data; everything that runs
(Spark, the epoch loop, the control plane) lives above it. This module joins the two for the
public API: ``eddyline.Network`` is the builder with ``run`` and ``collected``, and
``eddyline.validate`` adds Spark's analysis to the offline checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from eddyline.api import builder
from eddyline.api import validate as checks
from eddyline.api.network import NetworkSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.io.sinks import Sink
    from eddyline.runtime.summary import RunSummary


def validate(spec: NetworkSpec, spark: SparkSession | None = None) -> NetworkSpec:
    """Every check: structure, graph and expressions; with ``spark`` also Spark's analysis of
    each step over empty frames of the real source schemas."""
    checks.validate(spec)
    if spark is not None:
        from eddyline.runtime.compile import analyze

        analyze(spec, spark)
    return spec


def check_inputs(spec: NetworkSpec) -> None:
    """Refuse (:class:`~eddyline.errors.SpecError`) a source that cannot be read as configured
    (a files source's missing directory), before Spark starts or a checkpoint is made."""
    import eddyline.io  # noqa: F401  (registers the source kinds)
    from eddyline.errors import SpecError

    problems = [f"source '{s.name}': {why}" for s in spec.sources if (why := s.info.unreadable(s.params))]
    if problems:
        raise SpecError(problems)


class Network(builder.Network):
    """A query network built in Python (see :class:`eddyline.api.builder.Network`) that can run."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._last_sinks: dict[str, Sink] = {}

    def run(
        self,
        checkpoint: str,
        *,
        epochs: int | None = None,
        duration: float | None = None,
        until_idle: bool = False,
        lanes: int | None = None,
        progress: bool = False,
        progress_json: str | None = None,
        spark: SparkSession | None = None,
    ) -> RunSummary:
        """Run in this process's SparkSession (``local[*]`` unless one is active)."""
        from eddyline.io.sinks import make_sink
        from eddyline.observe.progress import ProgressReporter
        from eddyline.runtime.engine import Engine
        from eddyline.runtime.session import get_spark

        spec = self.spec
        session = spark or get_spark()
        validate(spec, session)
        self._last_sinks = {s.name: make_sink(s) for s in spec.sinks}
        with ProgressReporter(live=progress, json_path=progress_json) as reporter:
            engine = Engine(spec, session, checkpoint, lanes=lanes, reporter=reporter, sinks=self._last_sinks)
            return engine.run(epochs=epochs, duration_s=duration, until_idle=until_idle)

    def collected(self, sink: str) -> pa.Table | None:
        """Rows a ``Memory`` sink received in the last :meth:`run` (epoch order)."""
        from eddyline.io.memory import MemorySink

        s = self._last_sinks.get(sink)
        if not isinstance(s, MemorySink):
            raise KeyError(f"no memory sink named {sink!r} ran in this network")
        return s.table()
