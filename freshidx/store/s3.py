"""S3 (or any S3-protocol server) as an object store, using conditional writes.

Create-once is ``PutObject`` with ``If-None-Match: *``; compare-and-swap is ``PutObject`` with
``If-Match: <etag>`` (AWS since 2024; moto enforces both). HTTP 412 means the condition did not
hold; 409 (``ConditionalRequestConflict``, a concurrent conditional write in flight) is treated the
same. Neither proves somebody else won: botocore retries a PUT whose response was lost, and the
retry of an applied write gets 412. Callers re-read (``create_or_same``, ``publish``). A conditional
write that never got any response raises :class:`WriteOutcomeUnknown`.

Before the first conditional write, the store is probed once per process (create-once twice on a
probe key, then a stale ``If-Match``): a server or proxy that drops those headers would silently
overwrite manifests and let two publishers both "win", so it is refused with
:class:`ConditionalWritesUnsupported`. Reads and unconditional writes never need the probe.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from freshidx.store.errors import StoreAccessError, classify
from freshidx.store.object_store import (
    ConditionalWritesUnsupported,
    ListPage,
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreStats,
    WriteOutcomeUnknown,
    check_key,
)

_LOST = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


_MISSING = {"NoSuchKey", "404", "NotFound"}


def _call(client: Any, op: str, read_body: bool, args: dict[str, Any]) -> Any:
    r = getattr(client, op)(**args)
    return (r, r["Body"].read()) if read_body else r


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _condition_failed(exc: ClientError) -> bool:
    return _code(exc) in _LOST or _status(exc) in (409, 412)


KNOWN_GOOD = "AWS S3 (conditional writes, documented since 2024), moto 5.2.5 (tested)"
PROBE_PREFIX = "_freshidx/probe/"

# Probe verdicts per (endpoint, bucket, prefix), for the life of the process: None = supported,
# otherwise the error message. Whether a server enforces a header does not change between calls.
_verdicts: dict[tuple[str, str, str], str | None] = {}
_verdicts_lock = threading.Lock()


class S3Store(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str, uri: str, *, quick_client: Any = None) -> None:
        """``client``: the patient client (:func:`~freshidx.store.s3_clients.s3_client`); ``quick_client``
        (:func:`~freshidx.store.s3_clients.s3_quick_client`), if given, makes the first try of each read."""
        self.client = client
        self.quick_client = quick_client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = uri
        self.stats = StoreStats()
        # Count real HTTP LIST calls (every page), not our method calls.
        for c in (client, quick_client) if quick_client is not None else (client,):
            c.meta.events.register("before-call.s3.ListObjectsV2", self._count_list)

    def _count_list(self, **_: Any) -> None:
        self.stats.bump("list_calls")

    def _read(self, op: str, read_body: bool = False, **args: Any) -> Any:
        """A read (``GetObject``, ``HeadObject``, ``ListObjectsV2``; with ``read_body`` the object's bytes
        too): first one attempt on the quick client, then, if that got no answer in time, lost its
        connection or got a 5xx, the patient client's attempts. A read has no side effect, so a slow first
        try left behind costs nothing; a 2 s stall on a micro-batch's path costs the quick timeout instead.
        Writes never go this way: a write given up on may still land after its retry."""
        if self.quick_client is not None:
            try:
                return _call(self.quick_client, op, read_body, args)
            except (HTTPClientError, BotoConnectionError):
                pass
            except ClientError as exc:
                if _status(exc) < 500:
                    raise
            self.stats.bump("quick_retries")
        return _call(self.client, op, read_body, args)

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """What says the store cannot be used at all (endpoint, credentials, region, bucket) is raised as
        :class:`~freshidx.store.errors.StoreAccessError`, naming the setting to fix; anything else as it came."""
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            if (error := self._access_error(exc)) is None:
                raise
            raise error from exc

    def _access_error(self, exc: BaseException) -> StoreAccessError | None:
        return classify(exc, uri=self.uri, endpoint=getattr(self.client.meta, "endpoint_url", None))

    def check_exists(self, client: Any | None = None) -> None:
        """One LIST of at most one key under the prefix, with ``client`` (default: the store's): raises
        :class:`~freshidx.store.errors.StoreAccessError` if the endpoint cannot be reached, the credentials
        are missing or refused, or the bucket does not exist. An empty prefix is an empty store, not an error."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        with self._reaching():
            (client or self.client).list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)

    def _k(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def get(self, key: str) -> StoredObject:
        self.stats.bump("get_calls")
        with self._reaching():
            try:
                r, body = self._read("get_object", True, Bucket=self.bucket, Key=self._k(key))
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    raise NotFound(key) from exc
                raise
        return StoredObject(key, body, r["ETag"])

    def head(self, key: str) -> ObjectInfo:
        self.stats.bump("get_calls")
        with self._reaching():
            try:
                r = self._read("head_object", Bucket=self.bucket, Key=self._k(key))
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    raise NotFound(key) from exc
                raise
        return ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"])

    def put(self, key: str, data: bytes) -> str:
        self.stats.bump("put_calls")
        with self._reaching():
            return str(self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)["ETag"])

    # ---- conditional writes ----
    @property
    def endpoint(self) -> str:
        return str(getattr(self.client.meta, "endpoint_url", "") or "default AWS endpoint")

    def check_conditional_writes(self) -> None:
        ident = (self.endpoint, self.bucket, self.prefix)
        with _verdicts_lock:  # one probe per store and process, even with concurrent first writers
            if ident not in _verdicts:
                with self._reaching():  # no verdict when the store cannot be reached at all
                    _verdicts[ident] = self._probe()
            verdict = _verdicts[ident]
        if verdict is not None:
            raise ConditionalWritesUnsupported(verdict)

    def _probe(self) -> str | None:
        key = self._k(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        missing: list[str] = []

        def put(body: bytes, **cond: str) -> str | ClientError:
            try:
                return str(self.client.put_object(Bucket=self.bucket, Key=key, Body=body, **cond)["ETag"])
            except ClientError as exc:
                status = _status(exc)
                if status >= 500 and status != 501:
                    raise  # transient (botocore's retries spent): no verdict, the next write probes again
                if self._access_error(exc) is not None:
                    raise  # credentials, bucket, region: says nothing about conditional writes
                return exc

        try:
            first = put(b"probe-1", IfNoneMatch="*")
            if isinstance(first, ClientError) and _condition_failed(first):
                first = self._ours(key, b"probe-1") or first  # applied, answer lost, retried
            if isinstance(first, ClientError):
                missing.append(f"If-None-Match: * on a new key was rejected ({_code(first)})")
            else:
                again = put(b"probe-2", IfNoneMatch="*")
                if not isinstance(again, ClientError):
                    missing.append("If-None-Match: * (create-once) overwrote an existing object")
                elif not _condition_failed(again):
                    missing.append(f"If-None-Match: * on an existing key failed with {_code(again)}, not 412")
                current = str(self.client.head_object(Bucket=self.bucket, Key=key)["ETag"])
                swapped = put(b"probe-3", IfMatch=current)
                if isinstance(swapped, ClientError) and _condition_failed(swapped):
                    swapped = self._ours(key, b"probe-3") or swapped  # applied, answer lost, retried
                if isinstance(swapped, ClientError):
                    missing.append(f"If-Match with the current ETag was rejected ({_code(swapped)})")
                stale = current if not isinstance(swapped, ClientError) else '"0000000000000000000000000000dead"'
                lost = put(b"probe-4", IfMatch=stale)
                if not isinstance(lost, ClientError):
                    missing.append("If-Match with a stale ETag (compare-and-swap) overwrote the object")
                elif not _condition_failed(lost):
                    missing.append(f"If-Match with a stale ETag failed with {_code(lost)}, not 412")
        finally:
            with contextlib.suppress(Exception):  # best effort: a probe key left behind is harmless
                self.client.delete_object(Bucket=self.bucket, Key=key)
        if not missing:
            return None
        return (
            f"store {self.uri} (endpoint {self.endpoint}) does not enforce S3 conditional writes: "
            + "; ".join(missing)
            + ". freshidx needs If-None-Match: * (create-once manifests, history, ledger) and If-Match "
            "(compare-and-swap of CURRENT) to publish without overwriting or forking; refusing to write "
            f"(reads still work). Known good: {KNOWN_GOOD}; see docs/operations.md, "
            "'Publication safety'."
        )

    def _ours(self, full_key: str, body: bytes) -> str | None:
        """ETag of ``full_key`` if it holds exactly ``body`` (our write landed), else None."""
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=full_key)
        except ClientError:
            return None
        return str(obj["ETag"]) if obj["Body"].read() == body else None

    def _conditional_put(self, key: str, data: bytes, **cond: str) -> str:
        self.check_conditional_writes()
        self.stats.bump("put_calls")
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, **cond)
        except ClientError as exc:
            if _condition_failed(exc):
                raise PreconditionFailed(f"{key}: {_code(exc)}") from exc
            if (error := self._access_error(exc)) is not None:
                raise error from exc
            raise
        except (HTTPClientError, BotoConnectionError) as exc:
            # botocore's own retries are spent and no response ever arrived: applied or not, unknown.
            raise WriteOutcomeUnknown(f"{key}: no response to a conditional write ({exc})") from exc
        return str(r["ETag"])

    def create(self, key: str, data: bytes) -> str:
        return self._conditional_put(key, data, IfNoneMatch="*")

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        if expected_etag is None:
            return self._conditional_put(key, data, IfNoneMatch="*")
        return self._conditional_put(key, data, IfMatch=expected_etag)

    def delete(self, key: str) -> None:
        with self._reaching():
            self.client.delete_object(Bucket=self.bucket, Key=self._k(key))

    def _list_page(
        self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
        continuation: str | None,
    ) -> tuple[ListPage, str | None]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._k(prefix) if prefix else
                                (self.prefix + "/" if self.prefix else ""), "MaxKeys": max_keys}
        if delimiter:
            args["Delimiter"] = delimiter
        if continuation:
            args["ContinuationToken"] = continuation
        elif start_after:
            args["StartAfter"] = self._k(start_after)
        with self._reaching():
            r = self._read("list_objects_v2", **args)
        objects = [
            ObjectInfo(self._rel(o["Key"]), int(o["Size"]), str(o["ETag"]), o["LastModified"])
            for o in r.get("Contents", [])
        ]
        prefixes = [self._rel(p["Prefix"]) for p in r.get("CommonPrefixes", [])]
        token = r.get("NextContinuationToken") if r.get("IsTruncated") else None
        return ListPage(objects, prefixes), token
