"""What an epoch observes on its way (source rows, the newest event time a step has seen) is right
whether the step reads its source directly (one shared observation, or the Parquet footers when
they say it exactly) or through other steps (an observation of its own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eddyline.api.validate import load_spec
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.compile import Known, RunObservation, SharedObservation
from eddyline.runtime.engine import Engine

T0 = 1_767_225_600_000  # 2026-01-01, ms


@pytest.mark.parametrize("tz", [None, "UTC"])
def test_a_step_reading_its_source_directly_shares_the_sources_observation(spark, tmp_path: Path, tz) -> None:
    """Timestamps adjusted to UTC (``tz``): the footers' statistics say the newest time, and
    nothing is observed in Spark; naive ones: Spark observes the source once, for both."""
    data = tmp_path / "in"
    data.mkdir()
    rng = np.random.default_rng(5)
    newest = []
    for f in range(3):
        ms = T0 + f * 3_000 + rng.integers(0, 3_000, 500)
        newest.append(int(ms.max()))
        pq.write_table(pa.table({"key": pa.array(rng.integers(0, 50, 500), pa.int64()),
                                 "t": pa.array(ms.astype("datetime64[ms]"), pa.timestamp("ms", tz=tz))}),
                       str(data / f"{f:03d}.parquet"))

    def run(name: str, through_filter: bool) -> tuple[list[list[int]], list[str], list[int]]:
        steps = [{"name": "firsts", "input": "events", "dedup": {"key": "key", "time": "t", "ttl": "1s"}}]
        if through_filter:  # every row passes; the dedup then observes its own input
            steps = [{"name": "all", "input": "events", "filter": "key >= 0"}, {**steps[0], "input": "all"}]
        spec = {
            "name": name, "trigger": 0, "lanes": 2, "key_groups": 8,
            "sources": [{"name": "events", "files": {"path": str(data), "max_files_per_epoch": 1}}],
            "steps": steps,
            "sinks": [{"name": "out", "input": "firsts", "files": {"path": str(tmp_path / name / "out")}}],
        }
        engine = Engine(load_spec(spec), spark, str(tmp_path / name / "ckpt"))
        kinds: list[str] = []
        build = engine.compiler.build

        def spy(*args, **kwargs):
            frames = build(*args, **kwargs)
            step, source = frames.observations["step:firsts:0"], frames.observations["source:events"]
            kinds.append(type(step).__name__ + ("/" + type(step.of).__name__ if hasattr(step, "of") else ""))
            kinds.append("source " + type(source).__name__)
            return frames

        engine.compiler.build = spy  # type: ignore[method-assign]
        engine.run(epochs=3)
        commits = Checkpoint(str(tmp_path / name / "ckpt")).commits()
        return [c.steps["firsts"].input_max for c in commits], kinds, [sum(c.sinks.values()) for c in commits]

    direct, kinds, out = run("direct", through_filter=False)
    filtered, other_kinds, other_out = run("filtered", through_filter=True)
    shared = f"{SharedObservation.__name__}/{Known.__name__ if tz else RunObservation.__name__}"
    assert kinds == [shared, f"source {Known.__name__ if tz else RunObservation.__name__}"] * 3
    # through a filter the step observes its own input; the source's rows are in the footers
    assert set(other_kinds) == {RunObservation.__name__, f"source {Known.__name__}"}
    # the newest event time after each epoch, in ms, both ways
    assert direct == filtered == [[newest[0]], [max(newest[:2])], [max(newest)]]
    assert out == other_out and sum(out) > 0
