"""The separate-hosts tests need root and iproute2 (CI has both); elsewhere they skip, saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import Cluster
from .netns import available


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A store, a master and two 2-core worker hosts, once per module."""
    why = available()
    if why is not None:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("hosts"))
    try:
        yield c
    finally:
        c.close()
