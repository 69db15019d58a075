"""Files under a location that may be a local path or any URI pyarrow opens.

The checkpoint, the files sources and sinks and the state store all read and write through
these few functions, so that a cluster can put them on any filesystem pyarrow supports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pyarrow.fs as pafs


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for a local path or any URI pyarrow understands."""
    if "://" in root:
        fs, path = pafs.FileSystem.from_uri(root)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(root)


def write_atomic(
    fs: pafs.FileSystem, path: str, data: bytes, before_rename: Callable[[], None] | None = None
) -> None:
    """Write then rename, so readers see the old file or the whole new one. ``before_rename``
    runs in between (a fault test's hook: a crash there leaves only the temporary file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    if before_rename is not None:
        before_rename()
    fs.move(tmp, path)


def create_exclusive(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Write ``path`` whole unless it exists (False then): of two processes creating the same file
    exactly one wins, and nobody sees it half written. A hard link fails if its name exists, so
    this needs a local or mounted file system."""
    if not isinstance(fs, pafs.LocalFileSystem):
        raise OSError(f"{path}: creating a file exclusively needs a local or mounted file system")
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(3).hex()}"
    with open(tmp, "wb") as out:
        out.write(data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def read_json(fs: pafs.FileSystem, path: str) -> object:
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound
