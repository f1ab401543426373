"""Object-store access for the driver (:func:`open_store`) and for Spark executors (:class:`StoreConfig`).

``StoreConfig`` is a small picklable value: the driver builds it once from settings and Spark ships
it to tasks, which open a ``pyarrow.fs`` filesystem of their own. Data therefore moves between the
store and executors directly, never through the driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from freshidx.store.errors import Origin, Problem, StoreAccessError
from freshidx.store.object_store import (
    ConditionalWritesUnsupported,
    InvalidKey,
    ListPage,
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreError,
    StoreStats,
    WriteOutcomeUnknown,
)

#: The setting of :attr:`StoreConfig.first_try_seconds` (``Settings.s3_first_try_seconds``) and its default.
FIRST_TRY_ENV = "FRESHIDX_S3_FIRST_TRY_SECONDS"
DEFAULT_FIRST_TRY_S = 1.0
#: Attempts of an executor's pyarrow S3 request (the driver's boto3 client makes as many: ``store/s3.py``).
ARROW_S3_ATTEMPTS = 5

__all__ = [
    "ConditionalWritesUnsupported",
    "InvalidKey",
    "ListPage",
    "NotFound",
    "ObjectInfo",
    "ObjectStore",
    "Origin",
    "PreconditionFailed",
    "Problem",
    "StoreAccessError",
    "StoreConfig",
    "StoreError",
    "StoreStats",
    "StoredObject",
    "WriteOutcomeUnknown",
    "open_store",
]


@dataclass(frozen=True)
class StoreConfig:
    """Where the store is and how to reach it. Safe to pickle into Spark tasks."""

    uri: str
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    #: Seconds the first try of a driver's S3 read may take before it is asked again (0 = one patient try).
    first_try_seconds: float = DEFAULT_FIRST_TRY_S

    def __post_init__(self) -> None:
        scheme = urlparse(self.uri).scheme
        if scheme not in ("file", "s3"):
            raise ValueError(f"store uri must be file:///abs/path or s3://bucket/prefix, got {self.uri!r}")
        if scheme == "file" and not urlparse(self.uri).path.startswith("/"):
            raise ValueError(f"file store uri must be absolute, got {self.uri!r}")
        if scheme == "s3" and not urlparse(self.uri).netloc:
            raise ValueError(f"s3 store uri needs a bucket, got {self.uri!r}")
        if not 0 <= self.first_try_seconds <= 60:
            raise ValueError(f"{FIRST_TRY_ENV} must be 0-60 seconds, got {self.first_try_seconds!r}")

    @classmethod
    def from_env(cls, uri: str, env: dict[str, str] | None = None) -> StoreConfig:
        e = os.environ if env is None else env
        return cls(
            uri=normalize_uri(uri),
            endpoint_url=e.get("FRESHIDX_S3_ENDPOINT_URL") or e.get("AWS_ENDPOINT_URL") or None,
            region=e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or None,
            access_key_id=e.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=e.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=e.get("AWS_SESSION_TOKEN") or None,
            first_try_seconds=_seconds(e.get(FIRST_TRY_ENV)),
        )

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def bucket(self) -> str:
        return urlparse(self.uri).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.uri).path.strip("/")

    @property
    def local_root(self) -> str:
        return urlparse(self.uri).path

    # ---- executor side: pyarrow filesystem ----
    def arrow_fs(self) -> Any:
        import pyarrow.fs as pafs

        if not self.is_s3:
            return pafs.LocalFileSystem()
        kw: dict[str, Any] = {"region": self.region or "us-east-1"}
        if self.endpoint_url:
            u = urlparse(self.endpoint_url)
            kw["endpoint_override"] = u.netloc
            kw["scheme"] = u.scheme or "https"
        if self.access_key_id:
            kw["access_key"] = self.access_key_id
            kw["secret_key"] = self.secret_access_key
            if self.session_token:
                kw["session_token"] = self.session_token
        # A file opened for writing is created when written: a small one (every shard file of a micro-batch)
        # is one PUT instead of a multipart upload's three requests (create, part, complete). The SDK's
        # default retry strategy (a 25 ms backoff doubling per attempt) instead of pyarrow's "standard" one,
        # whose backoff and retry quota cost ~0.6 s per 500/503 answer (freshidx bench chaos): a task's
        # reads are one after another, so every slow retry is on a micro-batch's path. Attempts as boto's.
        return pafs.S3FileSystem(allow_delayed_open=True,
                                 retry_strategy=pafs.AwsDefaultS3RetryStrategy(max_attempts=ARROW_S3_ATTEMPTS), **kw)

    def arrow_path(self, key: str) -> str:
        """Path of ``key`` in :meth:`arrow_fs` terms."""
        if self.is_s3:
            return "/".join(p for p in (self.bucket, self.prefix, key) if p)
        return os.path.join(self.local_root, key)

    # ---- driver side ----
    def boto3_client(self) -> Any:
        from freshidx.store.s3_clients import s3_client

        return s3_client(**self.boto3_kwargs())

    def boto3_quick_client(self) -> Any:
        """The client of a read's first try (:func:`freshidx.store.s3_clients.s3_quick_client`), or None
        when :attr:`first_try_seconds` is 0."""
        from freshidx.store.s3_clients import s3_quick_client

        return s3_quick_client(self.first_try_seconds, **self.boto3_kwargs())

    def boto3_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`freshidx.store.s3_clients.s3_client` for this store."""
        return {"endpoint_url": self.endpoint_url, "region_name": self.region, "aws_access_key_id": self.access_key_id,
                "aws_secret_access_key": self.secret_access_key, "aws_session_token": self.session_token}


def _seconds(text: str | None) -> float:
    if not text:
        return DEFAULT_FIRST_TRY_S
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{FIRST_TRY_ENV} must be a number of seconds, got {text!r}") from None


def normalize_uri(uri: str) -> str:
    """Accept a plain path for convenience and turn it into an absolute ``file://`` URI."""
    if "://" not in uri:
        return "file://" + os.path.abspath(os.path.expanduser(uri))
    return uri.rstrip("/") if not uri.endswith(":///") else uri


def open_store(config: StoreConfig | str, *, for_writing: bool = False, must_exist: bool = False) -> ObjectStore:
    """Open a store.

    ``must_exist``: the store must be there already, and opening it creates nothing. A ``file://`` root
    that is missing (or not a directory) raises :class:`StoreAccessError` instead of becoming a new empty
    store, and an S3 store is asked once now (one LIST of at most one key, with short timeouts:
    :func:`freshidx.store.s3_clients.s3_check_client`), so a wrong endpoint, missing or refused credentials or a
    missing bucket fail here, naming the setting to fix. Commands that only read open their store so.
    Without it (writers), a ``file://`` root is created as needed; S3 errors of that kind are raised as
    :class:`StoreAccessError` by the first call that meets them.

    ``for_writing`` probes conditional-write support now (once per process and store) instead of at the
    first create-once / compare-and-swap, which probes anyway: a store that ignores ``If-None-Match`` /
    ``If-Match`` raises :class:`ConditionalWritesUnsupported`."""
    cfg = StoreConfig.from_env(config) if isinstance(config, str) else config
    store: ObjectStore
    if cfg.is_s3:
        from freshidx.store.s3 import S3Store
        from freshidx.store.s3_clients import s3_check_client

        s3 = S3Store(cfg.boto3_client(), cfg.bucket, cfg.prefix, cfg.uri, quick_client=cfg.boto3_quick_client())
        if must_exist:
            s3.check_exists(s3_check_client(**cfg.boto3_kwargs()))
        store = s3
    else:
        from freshidx.store.local import LocalStore

        store = LocalStore(cfg.local_root, cfg.uri, create=not must_exist)
    if for_writing:
        store.check_conditional_writes()
    return store
