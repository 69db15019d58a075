"""Sinks, idempotent by epoch.

Writing is two steps so that an epoch's output appears all at once and a replay never duplicates:

1. :meth:`Sink.stage` writes the epoch's rows where no reader looks (``path/_staging/…``);
2. :meth:`Sink.publish` makes them visible: for files, a directory rename to
   ``path/epoch=NNNNNNNNNN`` that replaces whatever an earlier, crashed attempt published.

The runtime publishes before it commits the epoch; a crash in between replays the epoch, which
stages and publishes the same rows again.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline.api.spec import Files, SinkSpec
from eddyline.errors import SinkError
from eddyline.storage import filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from rich.console import Console as RichConsole


def epoch_dir(epoch: int) -> str:
    return f"epoch={epoch:010d}"


class FilesTarget:
    """A directory that receives one sub-directory per epoch."""

    def __init__(self, files: Files):
        self.files = files
        self.fs, self.base = filesystem(files.path)

    def staging(self, epoch: int) -> str:
        return f"{self.base}/_staging/{epoch_dir(epoch)}"

    def final(self, epoch: int) -> str:
        return f"{self.base}/{epoch_dir(epoch)}"

    def spark_uri(self, path: str) -> str:
        return path if "://" in self.files.path else f"file://{path}"

    def publish(self, epoch: int) -> None:
        src, dst = self.staging(epoch), self.final(epoch)
        if self.fs.get_file_info(src).type == pafs.FileType.NotFound:
            return
        if self.fs.get_file_info(dst).type != pafs.FileType.NotFound:
            self.fs.delete_dir(dst)
        self.fs.create_dir(self.base, recursive=True)
        try:
            self.fs.move(src, dst)
        except OSError as e:
            raise SinkError(f"cannot publish epoch {epoch} to {dst}: {e}") from e

    def discard_staging(self) -> None:
        path = f"{self.base}/_staging"
        if isinstance(self.fs, pafs.LocalFileSystem):
            shutil.rmtree(path, ignore_errors=True)
        elif self.fs.get_file_info(path).type != pafs.FileType.NotFound:
            self.fs.delete_dir(path)


@dataclass
class Sink:
    spec: SinkSpec
    collected: dict[int, pa.Table] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def stage(self, df: DataFrame, epoch: int) -> None:
        raise NotImplementedError

    def publish(self, epoch: int) -> None:
        """Make the staged epoch visible (no-op for sinks that stage in memory)."""


class FilesSink(Sink):
    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        assert spec.files is not None
        self.target = FilesTarget(spec.files)

    def stage(self, df: DataFrame, epoch: int) -> None:
        write_frame(df, self.target, epoch)

    def publish(self, epoch: int) -> None:
        self.target.publish(epoch)


def write_frame(df: DataFrame, target: FilesTarget, epoch: int) -> None:
    """Write ``df`` as the epoch's staged output, replacing whatever an earlier attempt staged."""
    fmt = target.files.format
    path = target.staging(epoch)
    writer = df.write
    if fmt == "csv":
        writer = writer.option("header", "true")
    if isinstance(target.fs, pafs.LocalFileSystem):
        # Hadoop's local file system (without its native library) forks a `chmod` for every
        # directory it creates, about 5 ms each; a job's commit protocol creates three before
        # the job starts (the output, `_temporary`, `_temporary/0`) and one more in the first
        # task. Created here they cost ~0.1 ms each and Hadoop finds them present. The job's
        # commit removes `_temporary` with everything in it. Overwriting would delete them
        # again, so the earlier attempt's output is removed here and the job appends.
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(f"{path}/_temporary/0/_temporary")
        writer = writer.mode("append")
    else:
        writer = writer.mode("overwrite")
    writer.format(fmt).save(target.spark_uri(path))


class ConsoleSink(Sink):
    """Prints each epoch's output; it collects the epoch to the driver, so keep it for small outputs."""

    def __init__(self, spec: SinkSpec, console: RichConsole | None = None):
        super().__init__(spec)
        self.console = console

    def stage(self, df: DataFrame, epoch: int) -> None:
        # The whole epoch, not ``limit(rows)``: a limited action stops reading early, and the
        # epoch's observed metrics (input rows, late rows) come from the first action that runs.
        self.collected[epoch] = df.toArrow()

    def publish(self, epoch: int) -> None:
        from rich.console import Console
        from rich.table import Table

        table = self.collected.pop(epoch, None)
        if table is None:
            return
        assert self.spec.console is not None
        shown = self.spec.console.rows
        more = f" (first {shown} of {table.num_rows} rows)" if table.num_rows > shown else ""
        out = Table(title=f"{self.name} · epoch {epoch}{more}", show_lines=False)
        for name in table.column_names:
            out.add_column(name)
        for row in table.slice(0, shown).to_pylist():
            out.add_row(*[str(v) for v in row.values()])
        (self.console or Console()).print(out)


class MemorySink(Sink):
    """Keeps every epoch's rows in the driver, keyed by epoch (so a replay replaces, never adds)."""

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.collected[epoch] = df.toArrow()

    def table(self) -> pa.Table | None:
        if not self.collected:
            return None
        return pa.concat_tables([self.collected[e] for e in sorted(self.collected)])


def make_sink(spec: SinkSpec, console: RichConsole | None = None) -> Sink:
    if spec.kind == "files":
        return FilesSink(spec)
    if spec.kind == "console":
        return ConsoleSink(spec, console)
    return MemorySink(spec)
