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
import functools
import inspect
import os
import threading
import time
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


def s3_client(**kwargs: Any) -> Any:
    """The one boto3 S3 client configuration of freshidx: the CLI and tools (through
    :meth:`StoreConfig.boto3_client`) and the Dagster store resource (with dagster-aws ``S3Resource``'s
    fields, same names) all build their clients here (keyword arguments of :func:`_new_s3_client`).

    One client per configuration and process, reused: building one costs ~0.2 s of CPU (botocore loads
    its service model), which every sensor tick and every store opened in a run paid before. boto3
    clients are thread-safe; the process id is part of the key so a forked child builds its own (a
    client's connection pool must not be shared across a fork). Credentials that botocore resolves
    itself are resolved when a client is built: refreshable ones (assumed roles, instance metadata) are
    refreshed by botocore, and a client is rebuilt every :data:`CLIENT_MAX_AGE_S` so static ones rotated
    in a credentials file or profile are picked up by a long-lived code server too.
    """
    bound = inspect.signature(_new_s3_client).bind(**kwargs)  # a wrong name fails here, naming it
    bound.apply_defaults()  # the same configuration spelled with or without defaults: one client
    era = int(time.monotonic() // CLIENT_MAX_AGE_S)
    return _cached_client(os.getpid(), era, tuple(sorted(bound.arguments.items())))


def s3_check_client(**kwargs: Any) -> Any:
    """:func:`s3_client`'s configuration for the one call that checks a store is there
    (:meth:`S3Store.check_exists`, ``open_store(..., must_exist=True)``): short timeouts and a single retry
    (:data:`CHECK_TIMEOUTS`, :data:`CHECK_ATTEMPTS`), so a wrong endpoint is reported in seconds, not after
    five attempts of a 60 s connect timeout (a refused connection fails at once either way). The store's
    other calls keep the patient configuration."""
    bound = inspect.signature(_new_s3_client).bind(**kwargs)
    bound.apply_defaults()
    bound.arguments["max_attempts"] = CHECK_ATTEMPTS
    era = int(time.monotonic() // CLIENT_MAX_AGE_S)
    return _cached_client(os.getpid(), era, tuple(sorted(bound.arguments.items())), CHECK_TIMEOUTS)


#: How long one S3 client is reused (seconds).
CLIENT_MAX_AGE_S = 900
#: Connect and read timeouts (seconds) of the client that checks a store is there (:func:`s3_check_client`).
CHECK_TIMEOUTS = (3.0, 15.0)
#: Attempts of that check: one retry (botocore waits under 0.05 s before it, unless throttled).
CHECK_ATTEMPTS = 2


@functools.lru_cache(maxsize=32)
def _cached_client(pid: int, era: int, kwargs: tuple[tuple[str, Any], ...],
                   timeouts: tuple[float, float] | None = None) -> Any:
    return _build_client(dict(kwargs), timeouts)


def _new_s3_client(
    *, endpoint_url: str | None = None, region_name: str | None = None, aws_access_key_id: str | None = None,
    aws_secret_access_key: str | None = None, aws_session_token: str | None = None, max_attempts: int = 5,
    profile_name: str | None = None, use_ssl: bool = True, verify: bool | str | None = None,
    use_unsigned_session: bool = False,
) -> Any:
    """A new boto3 S3 client. Path-style addressing, because custom endpoints (moto, MinIO) rarely
    resolve ``bucket.host``; botocore's standard retry mode (5 attempts by default, as dagster-aws)."""
    return _build_client({
        "endpoint_url": endpoint_url, "region_name": region_name, "aws_access_key_id": aws_access_key_id,
        "aws_secret_access_key": aws_secret_access_key, "aws_session_token": aws_session_token,
        "max_attempts": max_attempts, "profile_name": profile_name, "use_ssl": use_ssl, "verify": verify,
        "use_unsigned_session": use_unsigned_session,
    })


def _build_client(kw: dict[str, Any], timeouts: tuple[float, float] | None = None) -> Any:
    """:func:`_new_s3_client` from all its keyword arguments; ``timeouts`` (connect, read) replace botocore's
    defaults (60 s each)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(retries={"max_attempts": kw["max_attempts"], "mode": "standard"}, s3={"addressing_style": "path"})
    if kw["use_unsigned_session"]:
        config = config.merge(Config(signature_version=UNSIGNED))
    if timeouts is not None:
        config = config.merge(Config(connect_timeout=timeouts[0], read_timeout=timeouts[1]))
    return boto3.session.Session(profile_name=kw["profile_name"]).client(
        "s3", endpoint_url=kw["endpoint_url"], region_name=kw["region_name"] or "us-east-1", use_ssl=kw["use_ssl"],
        verify=kw["verify"], aws_access_key_id=kw["aws_access_key_id"],
        aws_secret_access_key=kw["aws_secret_access_key"], aws_session_token=kw["aws_session_token"], config=config,
    )


_MISSING = {"NoSuchKey", "404", "NotFound"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _condition_failed(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _code(exc) in _LOST or status in (409, 412)


KNOWN_GOOD = "AWS S3 (conditional writes, documented since 2024), moto 5.2.5 (tested)"
PROBE_PREFIX = "_freshidx/probe/"

# Probe verdicts per (endpoint, bucket, prefix), for the life of the process: None = supported,
# otherwise the error message. Whether a server enforces a header does not change between calls.
_verdicts: dict[tuple[str, str, str], str | None] = {}
_verdicts_lock = threading.Lock()


class S3Store(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str, uri: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = uri
        self.stats = StoreStats()
        # Count real HTTP LIST calls (every page), not our method calls.
        client.meta.events.register(
            "before-call.s3.ListObjectsV2", lambda **_: self.stats.bump("list_calls")
        )

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
                r = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    raise NotFound(key) from exc
                raise
        return StoredObject(key, r["Body"].read(), r["ETag"])

    def head(self, key: str) -> ObjectInfo:
        self.stats.bump("get_calls")
        with self._reaching():
            try:
                r = self.client.head_object(Bucket=self.bucket, Key=self._k(key))
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
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
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
            r = self.client.list_objects_v2(**args)
        objects = [
            ObjectInfo(self._rel(o["Key"]), int(o["Size"]), str(o["ETag"]), o["LastModified"])
            for o in r.get("Contents", [])
        ]
        prefixes = [self._rel(p["Prefix"]) for p in r.get("CommonPrefixes", [])]
        token = r.get("NextContinuationToken") if r.get("IsTruncated") else None
        return ListPage(objects, prefixes), token
