"""A class-data-sharing archive for the suite's JVMs.

A Spark driver JVM loads and verifies thousands of classes from Spark's jars before its first
epoch ends, and the crash tests start dozens of drivers. Java's application class-data
sharing (``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps those classes
from an archive instead, which takes several seconds off every driver start (docs/perf-notes.md).

The archive is made once per pytest cache by running a small Eddyline network in a separate
process, whose JVM writes it when it exits; it is keyed by the PySpark version, the Java binary
and the JVM options, because the JVM refuses (and then ignores) an archive made by another.
It is made in the background while the first tests run (their JVMs start without it); the
tests that start drivers of their own wait for it (tests/conftest.py).

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


class Archive:
    """The archive of a pytest cache for JVMs started with ``options``. :meth:`options` gives the
    JVM options that map it once it exists; if it does not, :meth:`start` makes it in the
    background and :meth:`finish` waits for it. While it is being made, JVMs start without it."""

    def __init__(self, cache_dir: Path, options: str):
        self.cache_dir, self.jvm_options = cache_dir, options
        self.path = cache_dir / f"spark-{_key(options)}.jsa"
        self.partial = self.path.with_suffix(".partial")
        self.work = cache_dir / "work"
        self.proc: subprocess.Popen | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def options(self) -> str:
        return f"{QUIET} -XX:SharedArchiveFile={self.path}" if self.exists() else QUIET

    def start(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        self.partial.unlink(missing_ok=True)
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{self.jvm_options} {QUIET} -XX:ArchiveClassesAtExit={self.partial}"}
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.jvm_archive", str(self.work)], cwd=root, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def done(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def finish(self) -> str:
        """Wait for the archive being made; the options that map it (only the quieting ones if
        it could not be made: the suite then runs without one, and says so)."""
        if self.proc is not None:
            try:
                _, err = self.proc.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
            failed, self.proc = self.proc.returncode != 0 or not self.partial.exists(), None
            shutil.rmtree(self.work, ignore_errors=True)
            if failed:
                print(f"no JVM class archive (the suite runs without one): {(err or '')[-1500:]}", file=sys.stderr)
                return QUIET
            self.partial.rename(self.path)
            for old in self.cache_dir.glob("spark-*.jsa"):  # made for another PySpark, Java or options
                if old != self.path:
                    old.unlink()
        return self.options()


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
