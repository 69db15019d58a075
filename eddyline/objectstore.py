"""An object store: every request Eddyline makes to one, counted, and the conditional writes a
lease, a plan or a commit needs where there are no hard links and no atomic renames.

A location ``s3://bucket/prefix/...`` is served by obstore (the Rust ``object_store`` crate)
configured from the usual AWS environment: ``AWS_ENDPOINT_URL`` (an S3-compatible store; a plain
``http://`` endpoint is allowed), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``. The rest of a checkpoint is read and written through the same client
(:mod:`eddyline.objectfs`), so :data:`REQUESTS` counts them all. :meth:`ObjectStore.create` sends ``If-None-Match: *``, and the store, not
the writer, decides: of many writers creating one key, exactly one succeeds (a lease generation,
a plan, a commit). A plain :meth:`ObjectStore.put` replaces a whole object at once (readers see
the old one or the new one), so nothing needs a rename: a lease's heartbeat is one per
generation, written only by its holder.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from eddyline.errors import CheckpointError, StoreUnreachable

SCHEMES = ("s3://",)


def timeout_s() -> float:
    """How long one request to the store may take, connecting included, and it is tried twice at
    most: ``$EDDYLINE_STORE_TIMEOUT`` seconds (default 5). A lease holder that has not renewed for
    three quarters of its lease stops (:mod:`eddyline.ha.lease`), so with a lease timeout of at
    least eight times this no write it sent can still reach the store once a standby could have
    taken over."""
    raw = os.environ.get("EDDYLINE_STORE_TIMEOUT", "5")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise CheckpointError(f"EDDYLINE_STORE_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


#: what a process needs in its environment to reach the store the way this one does
STORE_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "EDDYLINE_STORE_TIMEOUT")


def settings() -> dict[str, str]:
    """This process's store settings, for a Spark task to :func:`adopt`: Spark's Python workers
    inherit the environment their JVM started with, which need not be the driver's now (a session
    made before the variables were set, an executor on a host configured otherwise)."""
    return {k: os.environ[k] for k in STORE_VARIABLES if k in os.environ}


def adopt(given: dict[str, str]) -> None:
    """In a Spark task: use the driver's store settings ``given`` (a no-op when they are this
    process's already)."""
    if all(os.environ.get(k) == v for k, v in given.items()):
        return
    os.environ.update(given)
    bucket.cache_clear()


@contextlib.contextmanager
def using(variables: dict[str, str]) -> Iterator[None]:
    """Reach the store through ``variables`` (``AWS_*``) inside the block, and as before after it."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    bucket.cache_clear()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        bucket.cache_clear()


def _endpoint() -> str:
    """An S3-compatible store's URL from the environment ('' for AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def is_object_store(location: str) -> bool:
    return location.startswith(SCHEMES)


@dataclass(frozen=True)
class Key:
    """An object's store (its bucket) and key."""

    bucket: str
    key: str


def split(location: str) -> Key:
    """``s3://bucket/a/b`` → bucket ``bucket``, key ``a/b``."""
    if not is_object_store(location):
        raise ValueError(f"{location}: not an object store location (expected {' or '.join(SCHEMES)}…)")
    bucket, _, key = location.split("://", 1)[1].partition("/")
    if not bucket:
        raise CheckpointError(f"{location}: no bucket; expected s3://<bucket>/<prefix>")
    return Key(bucket, key.strip("/"))


#: the requests this process made to object stores, by kind (GET, HEAD, PUT, COPY, DELETE, LIST)
REQUESTS: Counter[str] = Counter()


def requests_since(before: Counter[str]) -> dict[str, int]:
    """The requests made since ``before`` (a copy of :data:`REQUESTS`), by kind."""
    return {k: v for k, v in (REQUESTS - before).items() if v}


class ObjectStore:
    """One bucket, with the writes a lease and a checkpoint need."""

    def __init__(self, bucket: str):
        from obstore.store import S3Store

        endpoint = _endpoint()
        self.bucket = bucket
        t = f"{timeout_s():g}s"
        self.store = S3Store.from_url(
            f"s3://{bucket}", client_options={"allow_http": endpoint.startswith("http://"), "timeout": t,
                                              "connect_timeout": t},
            retry_config={"max_retries": 1, "retry_timeout": datetime.timedelta(seconds=2 * timeout_s())})

    @contextlib.contextmanager
    def _answered(self, method: str, key: str) -> Iterator[None]:
        """A request the store did not answer (a timeout, a connection refused or cut) as an
        error that says so and names the request; the store's other answers pass through."""
        from obstore.exceptions import GenericError

        try:
            yield
        except GenericError as e:
            text = str(e)
            if not any(s in text for s in ("error sending request", "TimedOut", "timed out", "Connect")):
                raise
            raise StoreUnreachable(
                f"{method} s3://{self.bucket}/{key}: the object store at {_endpoint() or 'AWS S3'} did not answer "
                f"(each request waits up to {timeout_s():g} s, EDDYLINE_STORE_TIMEOUT): {text.splitlines()[0][:200]}"
            ) from e

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None if there is none."""
        import obstore

        REQUESTS["GET"] += 1
        try:
            with self._answered("GET", key):
                got = obstore.get(self.store, key)
                return bytes(got.bytes()), str(got.meta["e_tag"])
        except FileNotFoundError:
            return None

    def head(self, key: str) -> int | None:
        """The object's size; None if there is none."""
        import obstore

        REQUESTS["HEAD"] += 1
        try:
            with self._answered("HEAD", key):
                return int(obstore.head(self.store, key)["size"])
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> str:
        """Write the whole object (replacing one that is there); its new ETag."""
        import obstore

        REQUESTS["PUT"] += 1
        with self._answered("PUT", key):
            return str(obstore.put(self.store, key, data)["e_tag"])

    def create(self, key: str, data: bytes) -> bool:
        """Write the object unless it exists (False then): the store refuses all writers but one."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        REQUESTS["PUT"] += 1
        try:
            with self._answered("PUT", key):
                obstore.put(self.store, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def put_if(self, key: str, data: bytes, etag: str | None) -> str | None:
        """Write the object only if it is still the version ``etag`` names (``If-Match``; None:
        only if there is none, ``If-None-Match: *``). Its new ETag, or None if the store refused:
        someone wrote or deleted it since that version was read."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        REQUESTS["PUT"] += 1
        try:
            with self._answered("PUT", key):
                got = obstore.put(self.store, key, data, mode="create" if etag is None else {"e_tag": etag})
        except (AlreadyExistsError, PreconditionError, FileNotFoundError):
            return None
        return str(got["e_tag"])

    def copy(self, src: str, dst: str) -> None:
        """A server-side copy of one object."""
        import obstore

        REQUESTS["COPY"] += 1
        with self._answered("COPY", dst):
            obstore.copy(self.store, src, dst)

    def delete(self, keys: str | list[str]) -> None:
        """Delete objects (up to a thousand a request)."""
        import obstore

        keys = [keys] if isinstance(keys, str) else keys
        REQUESTS["DELETE"] += max(1, -(-len(keys) // 1000))
        with self._answered("DELETE", keys[0] if keys else ""):
            obstore.delete(self.store, keys)

    def list_sized(self, prefix: str, limit: int | None = None) -> list[tuple[str, int]]:
        """The keys under ``prefix`` (a folder: ``prefix/``) with their sizes, sorted; at most
        ``limit`` (then in one request)."""
        import obstore

        pages = obstore.list(self.store, prefix=prefix.rstrip("/") + "/" if prefix else None,
                             chunk_size=limit or 1000)
        found: list[tuple[str, int]] = []
        requests = 1  # an empty listing is a request too
        with self._answered("LIST", prefix):
            for n, page in enumerate(pages):
                requests = n + 1
                found += [(str(m["path"]), int(m["size"])) for m in page]
                if limit is not None and len(found) >= limit:
                    break
        REQUESTS["LIST"] += requests
        return sorted(found)[:limit] if limit is not None else sorted(found)

    def list(self, prefix: str, limit: int | None = None) -> list[str]:
        """The keys under ``prefix`` (a folder: ``prefix/``), sorted."""
        return [k for k, _ in self.list_sized(prefix, limit)]

    def list_one_level(self, prefix: str) -> tuple[list[tuple[str, int]], list[str]]:
        """The objects directly under ``prefix`` (keys and sizes) and the prefixes one level
        down (``prefix/name``, without the trailing slash)."""
        import obstore

        REQUESTS["LIST"] += 1
        with self._answered("LIST", prefix):
            got = obstore.list_with_delimiter(self.store, prefix=prefix.rstrip("/") + "/" if prefix else None)
        objects = [(str(m["path"]), int(m["size"])) for m in got["objects"]]
        return sorted(objects), sorted(str(p).rstrip("/") for p in got["common_prefixes"])

    def probe(self, prefix: str) -> None:
        """One LIST request of at most one key under ``prefix``: raises what the store says (no
        such bucket, access denied) or that it cannot be reached."""
        self.list_sized(prefix, limit=1)


@functools.cache
def bucket(name: str) -> ObjectStore:
    """The store of bucket ``name`` (one per process: the client keeps its connections)."""
    return ObjectStore(name)


def at(location: str) -> tuple[ObjectStore, str]:
    """The store and key of ``s3://bucket/key``."""
    where = split(location)
    return bucket(where.bucket), where.key


def check(location: str) -> None:
    """Refuse, before anything starts, a location whose store cannot be used, naming why: the
    bucket does not exist, the credentials are refused, the store cannot be reached, or it does
    not honour conditional writes."""
    where = split(location)
    endpoint = _endpoint() or "AWS S3"
    try:
        bucket(where.bucket).probe(where.key)
    except Exception as e:  # obstore's errors carry the store's answer in their text
        text = str(e)
        if "NoSuchBucket" in text:
            raise CheckpointError(f"{location}: bucket '{where.bucket}' does not exist at {endpoint}; "
                                  "create it, or name another") from None
        if any(s in text for s in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "credential")):
            raise CheckpointError(f"{location}: {endpoint} refused the credentials (AWS_ACCESS_KEY_ID, "
                                  f"AWS_SECRET_ACCESS_KEY): {text.splitlines()[0][:200]}") from None
        raise CheckpointError(f"{location}: cannot reach the object store at {endpoint} (AWS_ENDPOINT_URL): "
                              f"{text.splitlines()[0][:200]}") from None
    _check_conditional_writes(location, where, endpoint)


def _check_conditional_writes(location: str, where: Key, endpoint: str) -> None:
    """Refuse a store that does not honour ``If-None-Match: *`` (some S3-compatible stores ignore
    it): on it two drivers could both take one lease generation, or both commit one epoch."""
    store = bucket(where.bucket)
    probe = f"{where.key}/_probe-{uuid.uuid4().hex}" if where.key else f"_probe-{uuid.uuid4().hex}"
    first, second = store.create(probe, b"1"), store.create(probe, b"2")
    with contextlib.suppress(Exception):  # a probe left behind is harmless
        store.delete(probe)
    if not first or second:
        raise CheckpointError(
            f"{location}: the object store at {endpoint} does not refuse a second create of one object "
            "(If-None-Match: *), so two drivers could both hold the lease or both commit an epoch; Eddyline "
            "needs a store with conditional writes (AWS S3, MinIO, Ceph RGW 17+, GCS and Azure through their "
            "S3 APIs where they support them)")
