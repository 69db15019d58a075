"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .helpers import bids_window_spec, read_windows, write_bid_files

#: epochs this far apart, so that a standby started after the leader is ready before it ends
TRIGGER_MS = 500


@pytest.fixture
def windowed_bids(spark, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, list[tuple]]:
    """A windowed count over bid files (``request.param`` files, 16 by default) as a spec file
    whose epochs are ``TRIGGER_MS`` apart, and the windows of one uninterrupted run over them."""
    write_bid_files(tmp_path / "in", files=getattr(request, "param", 16), rows=150, seed=5)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True) | {"trigger": TRIGGER_MS}
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    from eddyline.runtime.engine import Engine

    Engine(bids_window_spec(tmp_path / "in", tmp_path / "ref"), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    expected = read_windows(tmp_path / "ref")
    assert len(expected) > 100
    return spec_file, expected
