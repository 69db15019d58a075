"""PyFlink for ``bench/state_growth.py``: the same dedup (the first row per key, every key kept)
as a Flink SQL job, to see how Flink's cost grows with its state.

It runs in the PyFlink virtualenv that ``bench/nexmark/run_nexmark.py`` makes (see
``bench/latency_flink.py``). The job: a ``TableEnvironment`` in streaming mode on the local
mini-cluster, parallelism 2, heap state (Flink's default), a ``filesystem`` source of ``format =
csv`` that lists the directory every 100 ms, ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY
PROCTIME())`` = 1 (Flink's keep-first-row deduplication; state kept a day) and a ``print`` sink.

Flink has no epochs. What stands for one: ``bench/state_growth.py`` puts a file of every key in
the directory and waits until it is read, then puts in the measured files (``--epochs`` files of
``--rows`` rows over the same keys) all at once; the job's cost of an "epoch" is the time from
then until the last file was read, divided by the number of files. Each file ends with a marker
row, a new key with ``value`` -1: the only rows the sink prints (with the time it printed them),
so that printing costs nothing while the job works. (The filter is on ``value``, not the key, so
that the planner cannot move it in front of the deduplication.)

``python state_growth_flink.py --dir DIR`` runs the job until it is killed; it prints
``@@running`` once the job is submitted, then the markers.
"""

from __future__ import annotations

import argparse
import sys

from latency_flink import submit

#: the marker rows' keys: above every key of the data, one per file
MARKER_BASE = 10**12


def sql(directory: str) -> list[str]:
    return [
        f"""CREATE TABLE events (`key` BIGINT, event_time BIGINT, `value` BIGINT, proc AS PROCTIME())
            WITH ('connector' = 'filesystem', 'path' = '{directory}', 'format' = 'csv',
                  'source.monitor-interval' = '100 ms')""",
        "CREATE TABLE markers (`key` BIGINT, emitted STRING) WITH ('connector' = 'print')",
        """INSERT INTO markers SELECT `key`, DATE_FORMAT(CURRENT_TIMESTAMP, 'yyyy-MM-dd HH:mm:ss.SSS') FROM (
               SELECT `key`, `value`, ROW_NUMBER() OVER (PARTITION BY `key` ORDER BY proc ASC) AS rn
               FROM events) WHERE rn = 1 AND `value` < 0""",
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    submit(sql(args.dir), {"table.exec.state.ttl": "1 d"})


if __name__ == "__main__":
    sys.exit(main())
