from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole test session (startup costs ~7 s)."""
    from eddyline.runtime.session import get_spark

    session = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
