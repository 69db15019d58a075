"""The replay tests' network: Nexmark q2 (a price filter) over bid files, one file per epoch."""

from __future__ import annotations

from pathlib import Path

from tests.runtime.e2e.helpers import BIDS_DDL


def q2(src: Path, out: Path, predicate: str) -> dict:
    return {
        "name": "q2", "trigger": 0, "lanes": 2, "key_groups": 8, "history": 12,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": BIDS_DDL, "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "picked", "input": "bids", "filter": predicate},
            {"name": "q2", "input": "picked", "select": ["auction", "price"]},
        ],
        "sinks": [{"name": "out", "input": "q2", "files": {"path": str(out), "format": "parquet"}}],
    }
