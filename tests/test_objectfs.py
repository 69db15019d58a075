"""The object store as a pyarrow file system (:mod:`eddyline.objectfs`) against a real
S3-compatible server (moto's): what pyarrow's callers rely on (files, prefixes as directories,
listings, copies, deletes, Parquet through it), and one request counted for each."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from eddyline import objectfs, objectstore


@pytest.fixture
def base(s3) -> str:
    return f"{s3.bucket(f'fs-{uuid.uuid4().hex[:8]}').removeprefix('s3://')}/ck"


def test_files_and_the_prefixes_they_make_are_files_and_directories(base: str) -> None:
    fs = objectfs.filesystem()
    with fs.open_output_stream(f"{base}/a/b/one.json") as out:
        out.write(b'{"x": 1}')
    with fs.open_output_stream(f"{base}/a/two.json") as out:
        out.write(b"22")
    one, a, missing = fs.get_file_info([f"{base}/a/b/one.json", f"{base}/a", f"{base}/nothing"])
    assert (one.type, one.size) == (pafs.FileType.File, 8)
    assert a.type == pafs.FileType.Directory
    assert missing.type == pafs.FileType.NotFound
    with fs.open_input_stream(f"{base}/a/b/one.json") as f:
        assert f.read() == b'{"x": 1}'
    level = {(i.path, i.type) for i in fs.get_file_info(pafs.FileSelector(f"{base}/a"))}
    assert level == {(f"{base}/a/b", pafs.FileType.Directory), (f"{base}/a/two.json", pafs.FileType.File)}
    deep = {i.path for i in fs.get_file_info(pafs.FileSelector(f"{base}/a", recursive=True))}
    assert deep == {f"{base}/a/b", f"{base}/a/b/one.json", f"{base}/a/two.json"}
    assert fs.get_file_info(pafs.FileSelector(f"{base}/none", allow_not_found=True)) == []
    with pytest.raises(FileNotFoundError):
        fs.get_file_info(pafs.FileSelector(f"{base}/none"))
    with pytest.raises(FileNotFoundError):
        fs.open_input_stream(f"{base}/none.json")


def test_copies_moves_and_deletes(base: str) -> None:
    fs = objectfs.filesystem()
    with fs.open_output_stream(f"{base}/d/x") as out:
        out.write(b"x")
    fs.copy_file(f"{base}/d/x", f"{base}/e/x")
    fs.move(f"{base}/e/x", f"{base}/f/y")
    assert fs.get_file_info(f"{base}/e/x").type == pafs.FileType.NotFound
    assert fs.open_input_stream(f"{base}/f/y").read() == b"x"
    with pytest.raises(OSError, match="moves objects, not prefixes"):
        fs.move(f"{base}/d", f"{base}/g")
    fs.delete_dir(f"{base}/d")
    fs.delete_file(f"{base}/f/y")
    assert fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)) == []
    fs.delete_dir(f"{base}/never")  # nothing there: nothing to do


def test_parquet_goes_through_it_and_every_request_is_counted(base: str) -> None:
    fs = objectfs.filesystem()
    table = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    before = objectstore.REQUESTS.copy()
    pq.write_table(table, f"{base}/t.parquet", filesystem=fs)
    assert objectstore.requests_since(before) == {"PUT": 1}  # one PUT, no multipart upload
    before = objectstore.REQUESTS.copy()
    assert pq.read_table(f"{base}/t.parquet", filesystem=fs).equals(table)
    made = objectstore.requests_since(before)
    # each time pyarrow opens the file (its schema, then its rows) it is one GET of all of it
    assert made.get("GET", 0) <= 2 and set(made) <= {"GET", "HEAD"}, made


def test_an_epoch_is_published_by_name_and_a_replay_replaces_what_an_earlier_attempt_left(base: str) -> None:
    """:func:`~eddyline.storage.publish_objects`: the staged names are copied into place without
    a listing; where an earlier attempt published (its marker is there), a file the replay did not
    stage goes, so the epoch holds the replay's output alone."""
    from eddyline.storage import publish_objects

    fs = objectfs.filesystem()
    staged, dst = f"{base}/_staging/g=1/epoch=1", f"{base}/epoch=1"

    def stage(names: dict[str, bytes]) -> None:
        for name, data in names.items():
            with fs.open_output_stream(f"{staged}/{name}") as out:
                out.write(data)

    def held() -> dict[str, bytes]:
        return {i.base_name: fs.open_input_file(i.path).read()
                for i in fs.get_file_info(pafs.FileSelector(dst, recursive=True))}

    stage({"part-00000.json": b"a", "part-00001.json": b"b", "_generation": b"1"})
    before = objectstore.REQUESTS.copy()
    publish_objects(staged, dst, ["part-00000.json", "part-00001.json"], "_generation")
    assert "LIST" not in objectstore.requests_since(before)
    assert held() == {"part-00000.json": b"a", "part-00001.json": b"b", "_generation": b"1"}
    assert fs.get_file_info(pafs.FileSelector(staged, allow_not_found=True)) == []

    stage({"part-00000.json": b"a2", "_generation": b"2"})  # the replay's rows all landed in one partition
    publish_objects(staged, dst, ["part-00000.json"], "_generation")
    assert held() == {"part-00000.json": b"a2", "_generation": b"2"}


def test_a_replay_replaces_an_attempt_cut_in_the_middle_of_its_publish_that_named_its_files_otherwise(
        base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier attempt (the driver wrote its epoch as one file) was cut after its first copy;
    the replay's tasks wrote one file each. What the earlier attempt copied goes: its marker went
    first, so the replay knows to look."""
    from eddyline.storage import publish_objects

    fs = objectfs.filesystem()
    staged, dst = f"{base}/_staging/g=1/epoch=4", f"{base}/epoch=4"
    for name, data in {"part-00000-driver.parquet": b"all", "part-00000.json": b"a", "part-00001.json": b"b",
                       "_generation": b"1"}.items():
        with fs.open_output_stream(f"{staged}/{name}") as out:
            out.write(data)
    copy = objectstore.ObjectStore.copy

    copies: list[str] = []

    def cut(self: objectstore.ObjectStore, src: str, dst_key: str) -> None:
        copy(self, src, dst_key)
        copies.append(src)
        if len(copies) == 2:  # the marker, then its one file
            raise OSError("the store stopped answering")

    monkeypatch.setattr(objectstore.ObjectStore, "copy", cut)
    with pytest.raises(OSError):
        publish_objects(staged, dst, ["part-00000-driver.parquet"], "_generation")
    monkeypatch.setattr(objectstore.ObjectStore, "copy", copy)
    with fs.open_output_stream(f"{staged}/_generation") as out:  # the replay's own marker
        out.write(b"2")
    publish_objects(staged, dst, ["part-00000.json", "part-00001.json"], "_generation")
    held = {i.base_name for i in fs.get_file_info(pafs.FileSelector(dst))}
    assert held == {"part-00000.json", "part-00001.json", "_generation"}
