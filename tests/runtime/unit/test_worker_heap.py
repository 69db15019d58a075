"""A lane's Python worker times its garbage collector (``gc`` in the lanes' manifests), and
freezes the objects it imported so that the full collection pyspark's daemon runs after every
task does not walk them again.

Run in a fresh interpreter: the clock is installed once per process, and the test must see the
first call.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, weakref
from eddyline.runtime.lanes import gc_clock

before = gc.get_freeze_count()
clock = gc_clock()
installed = gc.callbacks.count(clock)
frozen = gc.get_freeze_count()

class Node:
    pass

later = Node()  # made after the freeze: a cycle of it is still collected
later.me = later
gone = weakref.ref(later)
del later

for _ in range(3):
    cycle = Node()
    cycle.me = cycle
    del cycle
gc.collect(0)
gc.collect()
young = [Node() for _ in range(5000)]  # sets off collections of the youngest generation
again = gc_clock()
print(json.dumps({
    "before": before, "frozen": frozen, "frozen_after": gc.get_freeze_count(),
    "later_collected": gone() is None,
    "installed": installed, "collections": clock.collections, "full": clock.full,
    "seconds": clock.seconds, "same_clock": again is clock, "callbacks": gc.callbacks.count(clock),
}))
"""


def test_a_worker_times_its_collections_with_one_clock() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["installed"] == 1, got
    # the two explicit collections (one of them full) and the ones the allocations set off
    assert got["collections"] >= 3, got
    assert got["full"] == 1, got
    assert got["seconds"] > 0, got
    # the next task in a reused worker gets the same clock, not a second callback
    assert got["same_clock"] and got["callbacks"] == 1, got
    # the imported modules' objects are frozen once, on first use; later garbage is still collected
    assert got["before"] == 0 and got["frozen"] > 10_000, got
    assert got["frozen_after"] == got["frozen"], got
    assert got["later_collected"], got
