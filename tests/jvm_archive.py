"""A class-data-sharing archive for the suite's JVMs.

A Spark driver JVM loads and verifies thousands of classes from Spark's jars before its first
epoch ends, and the crash tests start dozens of drivers. Java's application class-data
sharing (``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps those classes
from an archive instead, which takes several seconds off every driver start (docs/perf-notes.md).

The archive is made once per pytest cache by running a small Eddyline network in a separate
process, whose JVM writes it when it exits; it is keyed by the PySpark version, the Java binary
and the JVM options, because the JVM refuses (and then ignores) an archive made by another.

``python -m tests.jvm_archive WORKDIR`` is that process (the archive's path is in its JVM options).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The JVM writes what it has to say about the archive (classes it cannot keep, an archive it
# cannot map) as warnings on stdout, where the CLI tests read the CLI's own output.
QUIET = "-Xlog:disable -Xlog:all=warning:stderr"


def _key(options: str) -> str:
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java") or "java"
    java = os.path.realpath(java)
    stamp = os.stat(java).st_mtime_ns if os.path.exists(java) else 0
    return hashlib.sha1(f"{pyspark.__version__}|{java}|{stamp}|{options}".encode()).hexdigest()[:16]


def archive_options(cache_dir: Path, options: str) -> str:
    """The JVM options that map an archive made by a JVM started with ``options`` (making it
    first if this cache has none); only the quieting ones if it cannot be made. A JVM with other
    compiler or collector options maps it too."""
    archive = cache_dir / f"spark-{_key(options)}.jsa"
    if not archive.exists():
        work = cache_dir / "work"
        shutil.rmtree(work, ignore_errors=True)
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} {QUIET} -XX:ArchiveClassesAtExit={partial}"}
        root = Path(__file__).resolve().parents[1]
        done = subprocess.run([sys.executable, "-m", "tests.jvm_archive", str(work)],
                              cwd=root, env=env, capture_output=True, text=True, timeout=600)
        shutil.rmtree(work, ignore_errors=True)
        if done.returncode != 0 or not partial.exists():
            print(f"no JVM class archive (the suite runs without one): {done.stderr[-1500:]}", file=sys.stderr)
            return QUIET
        partial.rename(archive)
        for old in cache_dir.glob("spark-*.jsa"):  # made for another PySpark, Java or options
            if old != archive:
                old.unlink()
    return f"{QUIET} -XX:SharedArchiveFile={archive}"


def _dump(work: Path) -> None:
    """Run the classes the suite's drivers use (JSON files in, a keyed window, Parquet out, the
    checkpoint and its recovery) through one JVM, then let that JVM exit so it writes the archive."""
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.session import get_spark
    from tests.runtime.e2e.helpers import bids_window_spec, write_bid_files

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    write_bid_files(work / "in", files=3, rows=100, seed=1)
    spec = bids_window_spec(work / "in", work / "out")
    Engine(spec, spark, str(work / "ckpt")).run(until_idle=True)
    Engine(spec, spark, str(work / "ckpt")).run(until_idle=True)  # a restart from the checkpoint
    jvm = spark.sparkContext._gateway.proc
    spark.stop()
    jvm.stdin.close()  # Spark's gateway JVM exits when its stdin closes, and writes the archive then
    jvm.wait(timeout=300)


if __name__ == "__main__":
    _dump(Path(sys.argv[1]))
