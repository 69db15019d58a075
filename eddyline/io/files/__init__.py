"""The ``files`` source and sink: a directory of Parquet, JSON-lines or CSV files.

- :mod:`.source`: the source, one slice of files in name order per epoch, and its kind.
- :mod:`.slices`: what each Spark task reads of a slice, text cut at line breaks.
- :mod:`.target`: where a sink's epochs are staged and published, behind a lease's gate.
- :mod:`.sink`: the sink and its kind; :mod:`.changelog`: epochs taken back as revisions.
"""

from eddyline.io.files.sink import FilesSink, FilesSinkKind
from eddyline.io.files.source import FilesSource, FilesSourceKind
from eddyline.io.files.target import FilesTarget, write_frame

__all__ = ["FilesSink", "FilesSinkKind", "FilesSource", "FilesSourceKind", "FilesTarget", "write_frame"]
