"""Quality accounting for aggregates computed over shed input.

When rows are kept independently with probability ``keep`` (Bernoulli sampling, which is what
:func:`eddyline.operators.shed.keep_mask_random` does for distinct row ids), a COUNT or SUM over
the kept rows underestimates the full one by the factor ``keep``. The Horvitz-Thompson estimator
divides by the inclusion probability and is unbiased:

    count_hat = kept_count / keep            sum_hat = kept_sum / keep

For Bernoulli sampling ``Var(count_hat) = N (1 - keep) / keep`` and
``Var(sum_hat) = (1 - keep) / keep * sum_i x_i^2`` over all ``N`` rows. Neither ``N`` nor the
dropped ``x_i`` are known, so both are replaced by their own unbiased estimates from the kept
rows (``N`` by ``kept_count / keep``, ``sum x^2`` by ``kept_sumsq / keep``):

    Var_hat(count_hat) = kept_count (1 - keep) / keep^2
    Var_hat(sum_hat)   = kept_sumsq (1 - keep) / keep^2

The reported errors are half-widths of the normal-approximation confidence interval,
``z * sqrt(Var_hat)`` with ``z`` the two-sided quantile for ``confidence``. With ``keep == 1``
nothing was dropped and the errors are exactly zero. The approximation is poor when only a
handful of rows were kept (an interval around a count of 0 has width 0, for instance).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

__all__ = ["scaled_estimate"]


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def scaled_estimate(
    kept_count: int,
    kept_sum: float | None,
    kept_sumsq: float | None,
    keep: float,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Horvitz-Thompson COUNT and SUM from the kept rows, with confidence half-widths.

    ``kept_count``, ``kept_sum`` and ``kept_sumsq`` are the count, the sum of ``x`` and the sum
    of ``x**2`` over the kept rows; ``keep`` is the probability each row was kept, in ``(0, 1]``.
    Returns ``{"count", "count_error", "sum", "sum_error", "keep", "confidence"}``; ``sum`` is
    ``None`` without ``kept_sum``, and ``sum_error`` is ``None`` without ``kept_sumsq``.
    """
    keep = float(keep)
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(kept_count, bool) or int(kept_count) != kept_count or kept_count < 0:
        raise ValueError(f"kept_count must be a non-negative integer, got {kept_count!r}")
    if kept_sumsq is not None and not float(kept_sumsq) >= 0.0:
        raise ValueError(f"kept_sumsq must be non-negative, got {kept_sumsq!r}")

    z = _z(confidence)
    factor = (1.0 - keep) / (keep * keep)
    count = int(kept_count) / keep
    count_error = z * math.sqrt(int(kept_count) * factor)
    total = None if kept_sum is None else float(kept_sum) / keep
    total_error = (
        None
        if kept_sum is None or kept_sumsq is None
        else z * math.sqrt(float(kept_sumsq) * factor)
    )
    return {
        "count": count,
        "count_error": count_error,
        "sum": total,
        "sum_error": total_error,
        "keep": keep,
        "confidence": confidence,
    }
