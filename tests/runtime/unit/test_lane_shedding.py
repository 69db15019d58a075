"""What a resident epoch's driver makes of its lanes' shedding: exact utility quantiles, and the
lanes' observations merged as one (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from eddyline.runtime.lanenetwork import merged_observed
from eddyline.runtime.shedding import utility_quantiles


def test_utility_quantiles_are_the_ceil_q_n_th_values_of_all_lanes() -> None:
    lanes = [pa.table({"u": pa.array([5.0, None, 1.0], pa.float64())}),
             pa.table({"u": pa.array([3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0], pa.float64())})]
    q = utility_quantiles(lanes)  # ten values 1..10, nulls left out
    assert q is not None and len(q) == 21
    assert q[0] == 1.0 and q[10] == 5.0 and q[20] == 10.0  # the ceil(q n)-th: 0.5 -> 5th
    assert q[1] == 1.0 and q[3] == 2.0 and q[19] == 10.0  # 0.05 -> 1st, 0.15 -> 2nd, 0.95 -> 10th
    assert utility_quantiles([pa.table({"u": pa.array([None], pa.float64())})]) is None


def test_lanes_observations_add_up_and_their_ratios_average_over_all_rows() -> None:
    merged = merged_observed([
        {"shed:s:0": {"offered": 10, "kept": 4}, "estimates:w": {"rows": 2, "sum:n": 0.5, "count:n": 2, "max:n": 0.3}},
        {"shed:s:0": {"offered": 6, "kept": 3}, "estimates:w": {"rows": 0, "sum:n": 0.0, "count:n": 0, "max:n": None}},
        {"shed:s:0": {"offered": 0, "kept": 0}, "estimates:w": {"rows": 1, "sum:n": 0.4, "count:n": 1, "max:n": 0.4}},
    ])
    assert merged["shed:s:0"] == {"offered": 16, "kept": 7}
    assert merged["estimates:w"]["rows"] == 3 and merged["estimates:w"]["max:n"] == 0.4
    assert abs(merged["estimates:w"]["mean:n"] - 0.3) < 1e-12 and "sum:n" not in merged["estimates:w"]
