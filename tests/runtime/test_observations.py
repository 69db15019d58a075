"""What an epoch observes on its way (source rows, the newest event time a step has seen) is right
whether the step reads its source directly (one shared observation) or through other steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eddyline.api.validate import load_spec
from eddyline.runtime.compile import SharedObservation
from eddyline.runtime.engine import Engine
from eddyline.runtime.log import Checkpoint

T0 = 1_767_225_600_000  # 2026-01-01, ms


def test_a_step_reading_its_source_directly_shares_the_sources_observation(spark, tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    rng = np.random.default_rng(5)
    newest = []
    for f in range(3):
        ms = T0 + f * 3_000 + rng.integers(0, 3_000, 500)
        newest.append(int(ms.max()))
        pq.write_table(pa.table({"key": pa.array(rng.integers(0, 50, 500), pa.int64()),
                                 "t": pa.array(ms.astype("datetime64[ms]"), pa.timestamp("ms"))}),
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
            kinds.append(type(frames.observations["step:firsts:0"]).__name__)
            return frames

        engine.compiler.build = spy  # type: ignore[method-assign]
        engine.run(epochs=3)
        commits = Checkpoint(str(tmp_path / name / "ckpt")).commits()
        return [c.steps["firsts"]["input_max"] for c in commits], kinds, [sum(c.sinks.values()) for c in commits]

    direct, kinds, out = run("direct", through_filter=False)
    filtered, other_kinds, other_out = run("filtered", through_filter=True)
    assert kinds == [SharedObservation.__name__] * 3
    assert set(other_kinds) == {"Observation"}
    # the newest event time after each epoch, in ms, both ways
    assert direct == filtered == [[newest[0]], [max(newest[:2])], [max(newest)]]
    assert out == other_out and sum(out) > 0
