"""An object store as a pyarrow file system, every request made by one client and counted.

Eddyline reads and writes a checkpoint through pyarrow's file-system interface (state files,
manifests, Parquet). On an object store that interface is served here by
:class:`~eddyline.objectstore.ObjectStore` (obstore) rather than by pyarrow's own S3 client, so
that one client with one set of timeouts makes every request, and every request is counted by
kind (:data:`eddyline.objectstore.REQUESTS`, reported per epoch in the progress record and on
``/metrics``). An object store has keys, not directories: a "directory" is a key prefix that some
key starts with, creating one does nothing, and a file is read and written whole (one GET, one
PUT: checkpoint files are small).
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline import objectstore

TYPE_NAME = "eddyline-object-store"


class _Upload(io.BytesIO):
    """What is written to an output stream, PUT as one object when it is closed."""

    def __init__(self, store: objectstore.ObjectStore, key: str):
        super().__init__()
        self.store, self.key = store, key

    def close(self) -> None:
        if not self.closed:
            self.store.put(self.key, self.getvalue())
        super().close()


class ObjectStoreHandler(pafs.FileSystemHandler):
    """Paths are ``bucket/key``, as pyarrow's S3 file system has them."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectStoreHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(TYPE_NAME)

    def get_type_name(self) -> str:
        return TYPE_NAME

    def normalize_path(self, path: str) -> str:
        return path.rstrip("/")

    @staticmethod
    def _at(path: str) -> tuple[objectstore.ObjectStore, str]:
        name, _, key = path.strip("/").partition("/")
        return objectstore.bucket(name), key

    # ------------------------------------------------------------------ reading what is there
    def _info(self, path: str) -> pafs.FileInfo:
        store, key = self._at(path)
        if not key:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        size = store.head(key)
        if size is not None:
            return pafs.FileInfo(path, pafs.FileType.File, size=size)
        if store.list(key, limit=1):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [self._info(p.rstrip("/")) for p in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.rstrip("/")
        store, key = self._at(base)
        name = base.partition("/")[0]
        if selector.recursive:
            objects, folders = store.list_sized(key), []
        else:
            objects, folders = store.list_one_level(key)
        if not objects and not folders and not selector.allow_not_found:
            raise FileNotFoundError(f"{base}: no such directory on the object store")
        infos = [pafs.FileInfo(f"{name}/{k}", pafs.FileType.File, size=size) for k, size in objects]
        infos += [pafs.FileInfo(f"{name}/{p.rstrip('/')}", pafs.FileType.Directory) for p in folders]
        if selector.recursive:  # the prefixes between base and each object, as directories
            dirs = {f"{name}/{k}".rsplit("/", 1)[0] for k, _ in objects}
            found = set()
            for d in dirs:
                while d != base and d.startswith(base + "/") and d not in found:
                    found.add(d)
                    d = d.rsplit("/", 1)[0]
            infos += [pafs.FileInfo(d, pafs.FileType.Directory) for d in sorted(found)]
        return infos

    def open_input_stream(self, path: str) -> pa.NativeFile:
        store, key = self._at(path)
        got = store.get(key)
        if got is None:
            raise FileNotFoundError(path)
        return pa.BufferReader(got[0])

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.open_input_stream(path)

    # ------------------------------------------------------------------ writing
    def open_output_stream(self, path: str, metadata: Any = None) -> pa.NativeFile:
        store, key = self._at(path)
        return pa.PythonFile(_Upload(store, key), mode="w")

    def open_append_stream(self, path: str, metadata: Any = None) -> pa.NativeFile:
        raise OSError(f"{path}: an object store cannot append to an object")

    def create_dir(self, path: str, recursive: bool) -> None:
        pass  # prefixes need no making

    def copy_file(self, src: str, dest: str) -> None:
        (store, key), (to, to_key) = self._at(src), self._at(dest)
        if store is to:  # within a bucket: the store copies
            store.copy(key, to_key)
        else:
            to.put(to_key, self.open_input_stream(src).read())

    def move(self, src: str, dest: str) -> None:
        if self._info(src).type != pafs.FileType.File:
            raise OSError(f"{src}: an object store moves objects, not prefixes")
        self.copy_file(src, dest)
        self.delete_file(src)

    # ------------------------------------------------------------------ deleting
    def delete_file(self, path: str) -> None:
        store, key = self._at(path)
        store.delete([key])

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        store, key = self._at(path)
        keys = [k for k, _ in store.list_sized(key)]
        if not keys and not missing_dir_ok:
            raise FileNotFoundError(path)
        if keys:
            store.delete(keys)

    def delete_dir(self, path: str) -> None:
        self.delete_dir_contents(path, missing_dir_ok=True)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to delete a whole object store")


def filesystem() -> pafs.FileSystem:
    """The object store (any bucket) as a pyarrow file system."""
    return pafs.PyFileSystem(ObjectStoreHandler())


def is_object_filesystem(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, ObjectStoreHandler)
