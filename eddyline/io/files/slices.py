"""What a Spark task of a ``files`` source reads: its share of the epoch's slice, taken from an
:class:`~eddyline.io.sources.EpochSlice` when the task runs, so that a frame kept across epochs
reads each epoch's own files. Parquet files are shared out whole; text files are laid end to end
and cut into runs of about equal bytes, each cut moved to a line break, so that the tasks finish
together and no line is read twice or missed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from eddyline import objectstore
from eddyline.io.sources import EpochSlice
from eddyline.io.textrecords import TextSchema, file_batches
from eddyline.storage import filesystem

Read = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def with_store(read: Read, directory: str) -> Read:
    """``read``, run in a Spark task with the driver's object-store settings when ``directory``
    is on an object store (a worker's environment is the one its JVM started with)."""
    if not objectstore.is_object_store(directory):
        return read
    store = objectstore.settings()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        objectstore.adopt(store)
        yield from read(batches)

    return run


def _task_numbers(batches: Iterator[pa.RecordBatch]) -> Iterator[int]:
    """In a Spark task: the task numbers that arrive in ``batches`` (a frame's ``range`` rows)."""
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _task_files(slice_: EpochSlice, tasks: int, batches: Iterator[pa.RecordBatch]) -> Iterator[str]:
    """In a Spark task: the names of task i's share of the slice's files (every ``tasks``-th),
    for each task number i that arrives in ``batches``."""
    names = slice_.get().get("files", [])
    for task in _task_numbers(batches):
        yield from names[task::tasks]


def parquet_files(
    directory: str, slice_: EpochSlice, tasks: int, target: pa.Schema, batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: its share of the slice's Parquet files, the ``target`` columns cast to
    its types."""
    fs, base = filesystem(directory)
    for name in _task_files(slice_, tasks, batches):
        with fs.open_input_file(f"{base}/{name}") as f:
            for b in pq.ParquetFile(f).iter_batches(columns=target.names, use_threads=False):
                yield b if b.schema.equals(target) else b.cast(target)


def text_files(
    fmt: Any, header: bool, directory: str, slice_: EpochSlice, tasks: int, schema: TextSchema,
    ship: tuple[str, ...], batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: its share of the slice's bytes (:func:`_task_pieces`), decoded (the
    ``ship`` columns handed on)."""
    fs, base = filesystem(directory)
    planned = slice_.get()
    for task in _task_numbers(batches):
        for name, lo, hi in _task_pieces(planned, tasks, task):
            with fs.open_input_file(f"{base}/{name}") as f:
                begin, text = _records_between(f, lo, hi)
            yield from file_batches(
                fmt, name, text, schema, header=header and begin == 0, ship=ship,
                first_line=functools.partial(_line_at, fs, f"{base}/{name}", begin),
            )


def lines(directory: str, slice_: EpochSlice, tasks: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the lines of its share of the slice's files as ``(file, line, raw)``,
    line numbers from 1, blank lines skipped (what Spark's reader gives for a local directory,
    for files it cannot open itself)."""
    fs, base = filesystem(directory)
    for name in _task_files(slice_, tasks, batches):
        with fs.open_input_file(f"{base}/{name}") as f:
            text = f.read().decode("utf-8", errors="replace")
        numbered = [(n, raw) for n, raw in enumerate(text.replace("\r\n", "\n").split("\n"), 1) if raw.strip(" ")]
        if numbered:
            yield pa.RecordBatch.from_pydict({"file": [name] * len(numbered), "line": [n for n, _ in numbered],
                                              "raw": [raw for _, raw in numbered]})


def _task_pieces(planned: dict[str, Any], tasks: int, task: int) -> list[tuple[str, int, int | None]]:
    """Task ``task``'s pieces of a text slice, ``(file, lo, hi)``: the slice's files laid end to
    end and cut into ``tasks`` runs of about as many bytes, so that five files on two tasks take
    two and a half files' time rather than three. A piece holds the records that start in bytes
    ``[lo, hi)`` of its file (``hi`` None: to its end). A plan without sizes (logged before they
    were) gives every ``tasks``-th file whole."""
    names: list[str] = planned.get("files", [])
    sizes: list[int] | None = planned.get("sizes")
    if sizes is None or len(sizes) != len(names):
        return [(n, 0, None) for n in names[task::tasks]]
    total = sum(sizes)
    first, last = total * task // tasks, total * (task + 1) // tasks
    pieces: list[tuple[str, int, int | None]] = []
    at = 0
    for name, size in zip(names, sizes, strict=True):
        lo, hi = max(first, at), min(last, at + size)
        if lo < hi:
            pieces.append((name, lo - at, None if hi == at + size else hi - at))
        at += size
    return pieces


def _records_between(f: Any, lo: int, hi: int | None) -> tuple[int, bytes]:
    """The lines of the open file ``f`` that start in bytes ``[lo, hi)`` (``hi`` None: to the
    end), and where the first of them starts. A line starts at 0 or after a line break, so a
    piece starts after the first break at or after ``lo - 1`` and ends after the first at or
    after ``hi - 1``: pieces that meet at a byte share no line and miss none."""
    begin = 0 if lo == 0 else _break_at_or_after(f, lo - 1)
    if begin is None or (hi is not None and begin >= hi):  # no line starts in the piece
        return lo, b""
    if hi is None:
        f.seek(begin)
        return begin, f.read()
    end = _break_at_or_after(f, hi - 1)
    f.seek(begin)
    return begin, f.read((f.size() if end is None else end) - begin)


def _break_at_or_after(f: Any, at: int) -> int | None:
    """The position just after the first line break at or after byte ``at`` of ``f``, None if
    there is none."""
    step = 1 << 16
    while True:
        chunk = f.read_at(step, at)
        if not chunk:
            return None
        i = chunk.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(chunk)


def _line_at(fs: pafs.FileSystem, path: str, begin: int) -> int:
    """The line number (from 1) of the line that starts at byte ``begin`` of ``path``: asked for
    only when a piece has a dead letter or a blank line, so the bytes before it are read then (in
    blocks, so that a late piece of a large file needs no copy of all that comes before it)."""
    line, at = 1, 0
    with fs.open_input_file(path) as f:
        while at < begin:
            block = f.read_at(min(1 << 24, begin - at), at)
            if not block:
                break
            line += block.count(b"\n")
            at += len(block)
    return line
