"""Nexmark q4 and q5 over bids that get corrected (docs/revisions.md): some bids are withdrawn,
some change their price, the corrections arriving a little after the bid, in the same epoch.
The queries' specs are the user-facing ones in examples/nexmark/, reading Parquet files of the
generated events; their sinks, summed by ``_diff``, equal DuckDB's reference over the *final*
bids, the first epoch run as a Spark job, the others under ``execution: auto``."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.columns import DIFF
from eddyline.io.memory import MemorySink
from eddyline.io.nexmark import Nexmark, nexmark_frame
from eddyline.runtime.engine import Engine

from .nexmark_ref import REFERENCE, SPECS, canonical

EVENTS = 12_000
RATE = 1_000
EPOCHS = 3


@pytest.fixture(scope="module")
def corrected(spark, tmp_path_factory) -> tuple[Path, dict[str, pa.Table]]:
    """Per stream, EPOCHS Parquet files of the generated events; the bid files also hold
    corrections (−1 for a withdrawn bid; −1 and +1 with a new price for a changed one), each
    after its bid in the same file. Returns the directory and the final tables."""
    root = tmp_path_factory.mktemp("nexmark-revised")
    rng = np.random.default_rng(5)
    final: dict[str, pa.Table] = {}
    for stream in ("person", "auction", "bid"):
        events = nexmark_frame(spark, Nexmark(stream=stream, rate=RATE, unpaced=True), 0, EVENTS, 2).toArrow()
        (root / stream).mkdir()
        kept = []
        for e, chunk in enumerate(np.array_split(np.arange(events.num_rows), EPOCHS)):
            rows = events.take(pa.array(chunk, pa.int64()))
            if stream != "bid":
                pq.write_table(rows, root / stream / f"{e:03d}.parquet")
                kept.append(rows)
                continue
            rows = rows.append_column(DIFF, pa.array(np.ones(rows.num_rows, np.int64)))
            picked = rng.choice(rows.num_rows, rows.num_rows // 8, replace=False)
            withdrawn = rows.take(pa.array(picked, pa.int64()))
            withdrawn = withdrawn.set_column(withdrawn.schema.get_field_index(DIFF), DIFF,
                                             pa.array(np.full(len(picked), -1, np.int64)))
            changed = rows.take(pa.array(picked[::2], pa.int64()))
            new_price = pc.cast(rng.integers(1, 5_000, changed.num_rows), changed.schema.field("price").type)
            changed = changed.set_column(changed.schema.get_field_index("price"), "price", new_price)
            pq.write_table(pa.concat_tables([rows, withdrawn, changed]), root / stream / f"{e:03d}.parquet")
            gone = np.zeros(rows.num_rows, bool)
            gone[picked] = True
            kept += [rows.filter(pa.array(~gone)).drop_columns([DIFF]), changed.drop_columns([DIFF])]
        final[stream] = pa.concat_tables(kept)
    return root, final


@pytest.mark.parametrize("query", ["q4", "q5"])
def test_nexmark_query_over_corrected_bids_ends_exact(spark, corrected, tmp_path: Path, query: str) -> None:
    root, final = corrected
    raw = yaml.safe_load((SPECS / f"{query}.yaml").read_text())
    raw.update(trigger=0, lanes=2)
    for src in raw["sources"]:
        stream = src.pop("nexmark")["stream"]
        src["files"] = {"path": str(root / stream), "format": "parquet", "max_files_per_epoch": 1}
    for sink in raw["sinks"]:
        sink.pop("files", None)
        sink["memory"] = {}
    spec = load_spec(raw)
    sinks = {s.name: MemorySink(s) for s in spec.sinks}
    # the first epoch a Spark job, the rest under auto: q4 (a join, a top-k and an aggregate of
    # revised bids) on resident lanes from the state the job left; q5's window weighs in Spark
    Engine(spec, spark, str(tmp_path / "ckpt"), sinks=sinks).run(epochs=1)
    engine = Engine(load_spec({**raw, "execution": "auto"}), spark, str(tmp_path / "ckpt"), sinks=sinks)
    engine.run(until_idle=True)
    assert engine.executor.mode == ("resident" if query == "q4" else "job"), engine.executor.why
    got = sinks["out"].table()
    assert got is not None and DIFF in got.column_names

    con = duckdb.connect()
    for name, table in final.items():
        con.register(name, table)
    con.register("changes", got)
    # the sink's changelog summed: every row must end with weight 1
    con.execute(f"""CREATE VIEW got AS SELECT * EXCLUDE (w), 1 AS {DIFF} FROM (
                      SELECT * EXCLUDE ({DIFF}), sum({DIFF}) AS w FROM changes GROUP BY ALL HAVING sum({DIFF}) <> 0)""")
    assert con.execute("SELECT count(*) FROM (SELECT * EXCLUDE (_diff) FROM changes GROUP BY ALL HAVING sum(_diff) NOT IN (0, 1))").fetchone() == (0,)
    want_sql, got_sql = REFERENCE[query]
    want = canonical(con, f"({want_sql})")
    assert len(want) > 0
    assert canonical(con, f"({got_sql})") == want
