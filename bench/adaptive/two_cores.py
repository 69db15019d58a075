"""How evenly this machine runs two equal CPU-bound processes: the noise balanced lanes meet.

Two processes each run the same pure-Python loop (~170 ms, a share of a lane's kernel stage),
then sleep 0.3 s (the gap between lane stages), over and over for ``--seconds``. With two lanes on
two cores, any difference between the two is time one balanced lane waits for the other.
Prints the median per process, how often one took more than 1.4x the other, and the largest ratio.

Usage: ``python bench/adaptive/two_cores.py [--seconds 60] [--loop 2500000]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def spin(index: int, seconds: float, loop: int, out: mp.Queue) -> None:
    times = []
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        acc = 0
        for k in range(loop):
            acc += k * k
        times.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.3)
    out.put((index, times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--loop", type=int, default=2_500_000)
    args = ap.parse_args()
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=spin, args=(i, args.seconds, args.loop, out)) for i in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    a, b = results[0], results[1]
    n = min(len(a), len(b))
    ratios = [max(a[i], b[i]) / min(a[i], b[i]) for i in range(n)]
    print(
        f"median ms {statistics.median(a):.0f} / {statistics.median(b):.0f} · rounds {n} · "
        f"one > 1.4x the other in {sum(r > 1.4 for r in ratios)} ({sum(r > 1.4 for r in ratios) / n:.0%}) · "
        f"largest ratio {max(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
