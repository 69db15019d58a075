"""A ``files`` sink that takes epochs back by writing revisions (``retract: revisions``) rather
than by moving what it published, for readers that follow the sink's output as a changelog."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from eddyline.columns import DIFF
from eddyline.io.files.target import FilesTarget


class Revisions:
    """A files sink's epochs taken back and put back as revisions (``retract: revisions``).

    Nothing published moves (but tentative epochs, which readers of the changelog never saw):
    the epoch that takes epoch N back carries N's rows with ``_diff`` negated
    (``retract-N.parquet``), the one that puts it back carries them as they were
    (``restore-N.parquet``). Whether N is in force is counted from those files in the published
    epochs before the one at work, so a replayed epoch (whose staging starts afresh) writes the
    same files again and nothing twice. The driver reads the rows it writes back: at most the
    epochs a replay reaches over, which the network's ``history`` bounds."""

    RETRACT, RESTORE = "retract-", "restore-"

    def __init__(self, target: FilesTarget):
        self.target = target
        self._due: dict[str, list[int]] = {}  # file prefix -> epochs, written at the next publish

    def take_back(self, epochs: list[int], at_epoch: int) -> None:
        fs = self.target.fs
        tentative = [e for e in epochs if fs.get_file_info(self.target.final(e, tentative=True)).type != pafs.FileType.NotFound]
        self.target.retract(tentative, at_epoch)
        in_force = self._in_force(at_epoch)
        self._due[self.RETRACT] = [e for e in epochs if e not in tentative and in_force[e] > 0]

    def put_back(self, replayed: int) -> None:
        """Put back what epoch ``replayed`` took back (written at the next publish): none of it
        is in force, since replays are undone latest first and once (the engine refuses others)."""
        self._due[self.RESTORE] = self._marks(self.target.final(replayed)).get(self.RETRACT, [])

    def write(self, epoch: int) -> None:
        due, self._due = self._due, {}
        fs, staged = self.target.fs, self.target.staging(epoch)
        for prefix, epochs in due.items():
            for e in epochs:
                rows = self._rows(e)
                if rows is None:
                    continue
                if prefix == self.RETRACT:
                    rows = rows.set_column(rows.schema.get_field_index(DIFF), DIFF, pc.negate(rows[DIFF]))
                self.target.gate.makedirs(staged)
                pq.write_table(rows, f"{staged}/{prefix}{e:010d}.parquet", filesystem=fs, compression="snappy",
                               store_decimal_as_integer=True)
                self.target.staged(epoch, [f"{prefix}{e:010d}.parquet"], more=True)

    def _published(self, before: int) -> Iterator[tuple[int, pafs.FileInfo]]:
        for info in self.target.fs.get_file_info(pafs.FileSelector(self.target.base, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith("epoch=") and int(name[6:]) < before:
                yield int(name[6:]), info

    def _marks(self, path: str) -> dict[str, list[int]]:
        marks: dict[str, list[int]] = {}
        for info in self.target.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            for prefix in (self.RETRACT, self.RESTORE):
                if info.base_name.startswith(prefix):
                    marks.setdefault(prefix, []).append(int(info.base_name[len(prefix):].split(".")[0]))
        return marks

    def _in_force(self, before: int) -> Counter[int]:
        """How many times each epoch's rows count in the epochs published before ``before``."""
        count: Counter[int] = Counter()
        for e, info in self._published(before):
            count[e] += 1
            marks = self._marks(info.path)
            count.update(marks.get(self.RESTORE, []))
            count.subtract(marks.get(self.RETRACT, []))
        return count

    def _rows(self, epoch: int) -> pa.Table | None:
        """Epoch ``epoch``'s own rows (not the revisions it carries), or None if it wrote none."""
        fs = self.target.fs
        files = [i.path for i in fs.get_file_info(pafs.FileSelector(self.target.final(epoch), allow_not_found=True))
                 if i.base_name.endswith(".parquet") and not i.base_name.startswith((self.RETRACT, self.RESTORE))]
        return pq.read_table(files, filesystem=fs, partitioning=None) if files else None
