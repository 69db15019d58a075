"""A files sink on an object store (a real S3-compatible server, moto's server mode), fenced: a
driver that takes the lease over deletes what older generations staged, so the publish of a driver
woken past its lease (its lease check passed, its epoch staged) is refused by the store, which no
longer has what it would copy, and the driver is told who took over. With the deletion left out,
the same publish goes through: what the first test catches."""

from __future__ import annotations

import uuid

import pyarrow.fs as pafs
import pytest

from eddyline import objectfs, storage
from eddyline.api.units import Files
from eddyline.errors import Fenced
from eddyline.io.files import FilesTarget


@pytest.fixture
def path(s3) -> str:
    return f"{s3.bucket(f'sink-{uuid.uuid4().hex[:8]}')}/out"


def staged(path: str, generation: int, epoch: int) -> FilesTarget:
    """A target of ``generation`` with ``epoch`` staged, as a driver has after its lease check."""
    target = FilesTarget(Files(path, format="json"))
    target.fence(generation)
    with objectfs.filesystem().open_output_stream(f"{target.staging(epoch)}/part-00000.json") as out:
        out.write(b'{"x": 1}\n')
    target.staged(epoch, ["part-00000.json"])
    return target


def published(path: str) -> list[str]:
    base = path.removeprefix("s3://")
    infos = objectfs.filesystem().get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return sorted(i.path[len(base) + 1:] for i in infos
                  if i.type == pafs.FileType.File and not i.path[len(base) + 1:].startswith("_staging"))


def test_a_woken_drivers_publish_is_refused_once_a_newer_generation_opened_the_sink(path: str) -> None:
    old = staged(path, 1, 3)
    new = staged(path, 2, 3)  # the standby took over and staged the same epoch
    with pytest.raises(Fenced, match="generation 1 was taken over by generation 2"):
        old.publish(3)
    assert published(path) == []
    new.publish(3)
    assert published(path) == ["epoch=0000000003/_generation", "epoch=0000000003/part-00000.json"]
    with pytest.raises(Fenced, match="generation 2"):
        FilesTarget(Files(path, format="json")).fence(1)


def test_without_deleting_the_older_staging_the_woken_publish_goes_through(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage.Gate, "_open_on_store", lambda self: None)
    old = staged(path, 1, 3)
    staged(path, 2, 3)
    old.publish(3)
    assert published(path) == ["epoch=0000000003/_generation", "epoch=0000000003/part-00000.json"]
