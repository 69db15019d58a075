"""Relocation drills (``control.chaos``): random key-group moves that exercise state migration.

The moves are drawn from a generator seeded by (seed, epoch, step), so a rerun of the same
network repeats the same drills.
"""

from __future__ import annotations

import zlib

import numpy as np

from eddyline.api.control import Chaos
from eddyline.control.decisions import Decision, DecisionKind
from eddyline.plan.keygroups import RoutingTable


def relocation_drill(
    cfg: Chaos | None, epoch: int, step: str, table: RoutingTable
) -> tuple[RoutingTable, list[Decision]]:
    """The table with this epoch's drill applied and the drill's decision, if one is due."""
    if cfg is None or not cfg.random_moves or epoch % cfg.every != 0 or table.lanes <= 1:
        return table, []
    rng = np.random.default_rng([cfg.seed, epoch, zlib.crc32(step.encode())])
    kgs = rng.choice(table.key_groups, size=min(cfg.random_moves, table.key_groups), replace=False)
    mv = {
        int(g): int((table.assignment[g] + rng.integers(1, table.lanes)) % table.lanes)
        for g in kgs
    }
    drill = Decision(
        epoch,
        step,
        DecisionKind.CHAOS,
        {"moves": [[g, table.assignment[g], d] for g, d in sorted(mv.items())]},
        {"reason": "relocation drill", "seed": cfg.seed},
        {},
    )
    return table.moved(mv), [drill]
