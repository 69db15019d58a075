"""A ``postgres`` sink under a lease: the database refuses a transaction of a lease generation
older than the newest that fenced the sink (the generation is checked inside the transaction,
holding the fence row), also for an epoch the newer driver has not written yet, where the
epoch ledger alone would let it through; a driver taking over waits for a transaction in
flight. Real PostgreSQL, no Spark."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from eddyline.errors import Fenced

from .pg import query, run

SCHEMA = StructType([StructField("k", LongType()), StructField("n", LongType())])


def _open(sinks, table: str, generation: int, **params):  # noqa: ANN001, ANN202
    sink = sinks(table, **params)
    sink.fence(generation)  # as the engine does, before it opens the sink
    sink.open("net", "ckpt", SCHEMA)
    return sink


def _stage(sink, epoch: int, rows: list[tuple[int, int]]) -> None:  # noqa: ANN001
    sink.collected[epoch] = pa.table({"k": pa.array([k for k, _ in rows], pa.int64()),
                                      "n": pa.array([n for _, n in rows], pa.int64())})


def test_the_database_refuses_an_older_generation_once_a_newer_one_fenced(postgres, sinks) -> None:
    table = f"t_{uuid.uuid4().hex[:8]}"
    old = _open(sinks, table, 1, mode="upsert", key=["k"], rewind=True)
    _stage(old, 1, [(1, 10), (2, 20)])
    old.publish(1)
    _stage(old, 2, [(1, 11)])  # staged, then frozen past its lease
    _stage(old, 3, [(3, 30)])
    new = _open(sinks, table, 2, mode="upsert", key=["k"], rewind=True)  # the driver that took over
    for epoch in (2, 3):  # 3: an epoch the new driver has not written, which the ledger would not stop
        with pytest.raises(Fenced, match="lease generation 1 was taken over by generation 2: .* refuses its writes"):
            old.publish(epoch)
    with pytest.raises(Fenced):
        old.retract([1], 4)
    with pytest.raises(Fenced):
        old.restore(4)
    assert query(postgres, f"SELECT k, n FROM {table} ORDER BY k") == [(1, 10), (2, 20)]
    assert query(postgres, "SELECT epoch FROM eddyline_epochs WHERE sink = 'out' AND network = 'net' "
                           "AND checkpoint = 'ckpt' ORDER BY epoch") == [(1,)]
    _stage(new, 2, [(1, 12)])
    new.publish(2)
    assert query(postgres, f"SELECT k, n FROM {table} ORDER BY k") == [(1, 12), (2, 20)]
    assert query(postgres, "SELECT epoch, generation FROM eddyline_epochs WHERE network = 'net' AND sink = 'out' "
                           "ORDER BY epoch") == [(1, 1), (2, 2)]  # who wrote each epoch
    assert query(postgres, "SELECT generation FROM eddyline_fence WHERE network = 'net' AND sink = 'out'") == [(2,)]
    with pytest.raises(Fenced, match="taken over by generation 2"):  # woken, it cannot fence its way back in
        _open(sinks, table, 1, mode="upsert", key=["k"], rewind=True)
    run(postgres, "DELETE FROM eddyline_fence WHERE network = 'net'")  # (the next test's sinks start afresh)
    run(postgres, "DELETE FROM eddyline_epochs WHERE network = 'net'")


def test_a_driver_taking_over_waits_for_the_older_generations_transaction_in_flight(postgres, sinks) -> None:
    table = f"t_{uuid.uuid4().hex[:8]}"
    old = _open(sinks, table, 5)
    # an epoch of the old driver, in flight: its transaction holds the fence row
    conn = psycopg.connect(postgres.url)
    conn.execute("SELECT generation FROM eddyline_fence WHERE network = 'net' AND checkpoint = 'ckpt' "
                 "AND sink = 'out' FOR SHARE")
    fenced_at: list[float] = []
    taker = threading.Thread(target=lambda: (_open(sinks, table, 6), fenced_at.append(time.monotonic())))
    taker.start()
    time.sleep(1.0)
    assert not fenced_at  # it waits for the old driver's transaction
    released = time.monotonic()
    conn.commit()
    taker.join(timeout=30)
    conn.close()
    assert fenced_at and fenced_at[0] >= released
    _stage(old, 1, [(1, 1)])
    with pytest.raises(Fenced):
        old.publish(1)
    run(postgres, "DELETE FROM eddyline_fence WHERE network = 'net'")
    run(postgres, "DELETE FROM eddyline_epochs WHERE network = 'net'")
