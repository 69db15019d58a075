"""What the coming epoch will load each key group with, read ahead of it.

Balancing normally looks back at measured epochs; when the input read ahead for the next epoch
has shifted, the manager balances on this estimate instead.
"""

from __future__ import annotations

import numpy as np

from eddyline.control import policies
from eddyline.control.stats import LoadHistory


def coming_load(
    history: LoadHistory, step: str, recent: np.ndarray, upcoming: np.ndarray | None
) -> tuple[np.ndarray | None, dict[str, int]]:
    """The coming epoch's load per key group, when it has shifted (``since_shift``) from the
    ``recent`` epochs; otherwise None, and balancing looks at the measured epochs as usual.

    The coming work per group is the epoch's input rows (read ahead) that the kernel will
    work on at once, plus the input it held back that the watermark will release, each at
    the last epoch's shares: a kernel that holds rows until the watermark passes them works
    in this epoch on what arrived in the last one, so a shift of the input reaches its work
    one epoch later. The estimate is priced at the last epoch's cost per row worked on. Also
    returns what it foresaw, for the decision's explanation."""
    if upcoming is None or recent.shape[1] == 0 or upcoming.sum() <= 0:
        return None, {}
    last = history.latest(step)
    if last is None:
        return None, {}
    work = history.rows_series(step, 1, of="work")[:, -1]
    load = recent[:, -1]
    if work.sum() <= 0 or load.sum() <= 0:
        return None, {}
    upcoming = np.asarray(upcoming, dtype=float)
    foreseen = {"rows": int(upcoming.sum())}
    if last.kg_work is None:  # the kernel works on its input as it arrives
        coming = upcoming
    else:
        held = history.rows_series(step, 1, of="kg_held")[:, -1]
        # of last epoch's work, the part that was new input; of the held input, the part released
        fresh = max(work.sum() - last.held_worked, 0.0) / max(last.input_rows, 1)
        released = last.held_worked / last.held_before if last.held_before else 1.0
        coming = min(fresh, 1.0) * upcoming + min(released, 1.0) * held
        foreseen |= {"heldRows": int(held.sum()), "workRows": int(round(coming.sum()))}
    if coming.sum() <= 0:
        return None, {}
    ahead = coming * (load.sum() / work.sum())
    if policies.since_shift(np.column_stack([recent, ahead])) != 1:
        return None, {}
    return ahead, foreseen
