"""The write-ahead log of upstream backup (eddyline.io.wal), without Spark or a server: appending,
the durable end, reading ranges, deleting consumed segments, the bound, the lock, and reopening
after a crash that tore the last block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eddyline.io.wal import (
    HEADER_BYTES,
    WalError,
    WalLocked,
    WriteAheadLog,
    read_range,
    scan,
    segment_name,
    segments,
)


def _payloads(lo: int, hi: int) -> list[bytes]:
    return [b"record-%d-" % i + b"x" * (i % 7) for i in range(lo, hi)]


def _all(directory: Path, first: int, stop: int, chunk: int = 10_000) -> list[tuple[int, bytes]]:
    return [(n, p) for ns, ps in read_range(str(directory), first, stop, chunk) for n, p in zip(ns, ps, strict=True)]


def test_records_are_numbered_across_blocks_and_segments_and_read_back_by_range(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=300) as wal:
        assert (wal.first, wal.end, scan(str(d))) == (1, 0, (1, 0))
        for lo in range(1, 201, 20):  # 10 blocks of 20 records
            assert wal.append(_payloads(lo, lo + 20)) == 20
            assert wal.end == lo + 19  # the durable end moves once the block is on disk
        assert wal.append([]) == 0 and wal.end == 200
        assert wal.append([b""]) == 1 and wal.end == 201  # an empty message is a record
        assert wal.segment_count() > 3  # a new segment once one reaches 300 bytes
        assert wal.bytes == sum(os.path.getsize(p) for _, p in segments(str(d)))
    want = [*zip(range(1, 201), _payloads(1, 201), strict=True), (201, b"")]
    assert _all(d, 1, 202) == want
    # any range, across block and segment boundaries, in chunks of about the size asked for
    assert _all(d, 17, 18) == want[16:17]
    assert _all(d, 19, 143) == want[18:142]
    chunks = list(read_range(str(d), 5, 120, chunk=25))
    assert [n for ns, _ in chunks for n in ns] == list(range(5, 120))
    assert all(len(ns) >= 25 for ns, _ in chunks[:-1]) and len(chunks) > 2
    assert list(read_range(str(d), 50, 50)) == []
    with pytest.raises(WalError, match=r"records 202-204 are not in the log"):
        _all(d, 200, 205)
    assert scan(str(d)) == (1, 201)


def test_consumed_segments_are_deleted_but_never_the_last_and_numbering_goes_on(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    wal = WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=200)
    for lo in range(1, 101, 10):
        wal.append(_payloads(lo, lo + 10))
    firsts = [f for f, _ in segments(str(d))]
    assert len(firsts) >= 4
    # consumed up to the middle of the third segment: the first two go, the third stays
    assert wal.truncate_before(firsts[2] + 1) == 2
    assert [f for f, _ in segments(str(d))] == firsts[2:] and wal.first == firsts[2]
    assert _all(d, firsts[2], 101) == list(zip(range(firsts[2], 101), _payloads(firsts[2], 101), strict=True))
    with pytest.raises(WalError, match=f"record {firsts[1]} is not in the log any more"):
        _all(d, firsts[1], 101)
    # everything consumed: only the last segment is left (it carries the numbering)
    wal.truncate_before(100)
    assert len(segments(str(d))) == 1
    wal.close()
    with WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=200, after=100) as again:
        assert again.end == 100
        again.append([b"next"])
        assert again.end == 101
    assert _all(d, 101, 102) == [(101, b"next")]


def test_a_new_log_starts_after_the_committed_offset_and_a_shorter_one_is_refused(tmp_path: Path) -> None:
    with WriteAheadLog(str(tmp_path / "a"), max_bytes=1000, segment_bytes=100, after=41) as wal:
        assert (wal.first, wal.end) == (42, 41)
        wal.append([b"a", b"b"])
    assert _all(tmp_path / "a", 42, 44) == [(42, b"a"), (43, b"b")]
    # a checkpoint that committed more than its log holds: the log was removed or replaced
    with pytest.raises(WalError, match="ends at record 43 but 50 were committed"):
        WriteAheadLog(str(tmp_path / "a"), max_bytes=1000, segment_bytes=100, after=50)
    # ... or records after the committed offset are gone
    with pytest.raises(WalError, match=r"records 11-41 are not in the log any more"):
        WriteAheadLog(str(tmp_path / "a"), max_bytes=1000, segment_bytes=100, after=10)


def test_the_bound_drops_what_does_not_fit_counts_it_and_deleting_consumed_segments_makes_room(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    wal = WriteAheadLog(str(d), max_bytes=1000, segment_bytes=400)
    appended = 0
    for lo in range(0, 200, 10):  # 10 records of 104 bytes with their lengths: ~1 block per 1000 bytes
        appended += wal.append([b"%03d" % i + b"p" * 97 for i in range(lo, lo + 10)])
    assert wal.bytes <= 1000 and wal.dropped == 200 - appended and appended > 0
    assert wal.full_since is not None
    assert wal.end == appended  # the kept ones are the first ones, in order
    assert [p[:3] for _, p in _all(d, 1, appended + 1)] == [b"%03d" % i for i in range(appended)]
    wal.truncate_before(wal.end)  # the driver committed everything: whole segments go
    assert wal.bytes < 1000
    assert wal.append([b"after"]) == 1 and wal.full_since is None
    assert wal.dropped == 200 - appended
    wal.close()
    with pytest.raises(WalError, match="segment_bytes <= max_bytes"):
        WriteAheadLog(str(tmp_path / "b"), max_bytes=100, segment_bytes=200)


def test_only_one_process_appends_at_a_time(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    first = WriteAheadLog(str(d), max_bytes=1000, segment_bytes=100)
    t0 = time.monotonic()
    with pytest.raises(WalLocked, match=f"held by another process \\(pid {os.getpid()}\\)"):
        WriteAheadLog(str(d), max_bytes=1000, segment_bytes=100, lock_wait_s=0.3)
    assert time.monotonic() - t0 >= 0.3
    first.close()
    WriteAheadLog(str(d), max_bytes=1000, segment_bytes=100).close()


@pytest.mark.parametrize("tear", ["half a header", "half a body", "a damaged body"])
def test_reopening_after_a_crash_cuts_a_torn_last_block_and_appends_after_the_last_whole_one(tmp_path: Path, tear: str) -> None:
    d = tmp_path / "wal"
    with WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=1 << 20) as wal:
        wal.append(_payloads(1, 11))
        wal.append(_payloads(11, 21))
        whole = os.path.getsize(d / segment_name(1))
        wal.append(_payloads(21, 31))  # the block the crash tears
    path = d / segment_name(1)
    data = path.read_bytes()
    if tear == "half a header":
        path.write_bytes(data[: whole + HEADER_BYTES // 2])
    elif tear == "half a body":
        path.write_bytes(data[: whole + (len(data) - whole) // 2])
    else:  # all there, but the last bytes never reached the disk (zeros)
        path.write_bytes(data[:-5] + b"\0" * 5)
    assert scan(str(d)) == (1, 20)  # read-only: the torn block does not count
    with pytest.raises(WalError, match=r"damaged" if tear == "a damaged body" else r"records 21-30 are not in the log"):
        _all(d, 1, 31)  # a reader asked for more than the durable end is refused, never given garbage
    with WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=1 << 20) as wal:
        assert wal.end == 20 and os.path.getsize(path) == whole  # cut back to the last whole block
        wal.append([b"new-21", b"new-22"])
    assert _all(d, 1, 23) == [*zip(range(1, 21), _payloads(1, 21), strict=True), (21, b"new-21"), (22, b"new-22")]


def test_a_damaged_block_in_the_middle_is_an_error_when_read_never_wrong_data(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with WriteAheadLog(str(d), max_bytes=1 << 20, segment_bytes=1 << 20) as wal:
        wal.append(_payloads(1, 11))
        wal.append(_payloads(11, 21))
    path = d / segment_name(1)
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 40 + 3] ^= 0xFF  # a byte of the first block's payloads
    path.write_bytes(bytes(data))
    with pytest.raises(WalError, match="damaged"):
        _all(d, 1, 21)
    assert _all(d, 11, 21) == list(zip(range(11, 21), _payloads(11, 21), strict=True))  # skipped unread


def test_a_process_killed_while_appending_leaves_a_log_that_reopens_with_every_counted_record(tmp_path: Path) -> None:
    """A real SIGKILL in the middle of appending: what it reported durable is all there, intact."""
    d = tmp_path / "wal"
    progress = tmp_path / "progress"
    script = textwrap.dedent(f"""
        import os
        from eddyline.io.wal import WriteAheadLog
        wal = WriteAheadLog({str(d)!r}, max_bytes=1 << 30, segment_bytes=64 << 10)
        n = 0
        while True:
            batch = [b"%d:" % i + b"z" * (i % 500) for i in range(n + 1, n + 301)]
            wal.append(batch)
            n = wal.end
            with open({str(progress)!r} + ".tmp", "w") as f:  # replaced whole: a kill never leaves it empty
                f.write(str(n))
            os.replace({str(progress)!r} + ".tmp", {str(progress)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (progress.exists() and int(progress.read_text() or 0) > 20_000):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reported = int(progress.read_text())
    assert reported > 20_000
    _, end = scan(str(d))
    assert end >= reported  # every record it was told is durable is there (and maybe one more block)
    with WriteAheadLog(str(d), max_bytes=1 << 30, segment_bytes=64 << 10) as wal:
        assert wal.end == end and wal.segment_count() > 10
    got = _all(d, 1, end + 1)
    assert [n for n, _ in got] == list(range(1, end + 1))
    assert all(p == b"%d:" % n + b"z" * (n % 500) for n, p in got)
