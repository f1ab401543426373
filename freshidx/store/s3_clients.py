"""The boto3 S3 clients of freshidx: one configuration (:func:`s3_client`), and two variants of it for
calls that must not wait the patient client's minutes: the check that a store is there
(:func:`s3_check_client`) and the first try of a read (:func:`s3_quick_client`)."""

from __future__ import annotations

import functools
import inspect
import os
import time
from typing import Any

#: How long one S3 client is reused (seconds).
CLIENT_MAX_AGE_S = 900
#: Connect and read timeouts (seconds) of the client that checks a store is there (:func:`s3_check_client`).
CHECK_TIMEOUTS = (3.0, 15.0)
#: Attempts of that check: one retry (botocore waits under 0.05 s before it, unless throttled).
CHECK_ATTEMPTS = 2


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
    return _cached_client(os.getpid(), _era(), _arguments(kwargs))


def s3_check_client(**kwargs: Any) -> Any:
    """:func:`s3_client`'s configuration for the one call that checks a store is there
    (:meth:`S3Store.check_exists`, ``open_store(..., must_exist=True)``): short timeouts and a single retry
    (:data:`CHECK_TIMEOUTS`, :data:`CHECK_ATTEMPTS`), so a wrong endpoint is reported in seconds, not after
    five attempts of a 60 s connect timeout (a refused connection fails at once either way). The store's
    other calls keep the patient configuration."""
    return _cached_client(os.getpid(), _era(), _arguments(kwargs, max_attempts=CHECK_ATTEMPTS), CHECK_TIMEOUTS)


def s3_quick_client(timeout_s: float, **kwargs: Any) -> Any | None:
    """:func:`s3_client`'s configuration for the first try of a read (:class:`~freshidx.store.s3.S3Store`):
    one attempt, ``timeout_s`` to connect and between bytes (None for 0: no first try). What it does not
    answer in time (or answers with a 5xx) is asked again on the patient client (S3's own advice for
    latency-sensitive reads: a slow request retried usually takes another path and answers at once)."""
    if timeout_s <= 0:
        return None
    return _cached_client(os.getpid(), _era(), _arguments(kwargs, max_attempts=0), (timeout_s, timeout_s))


def _era() -> int:
    return int(time.monotonic() // CLIENT_MAX_AGE_S)


def _arguments(kwargs: dict[str, Any], **overrides: Any) -> tuple[tuple[str, Any], ...]:
    bound = inspect.signature(_new_s3_client).bind(**kwargs)  # a wrong name fails here, naming it
    bound.apply_defaults()  # the same configuration spelled with or without defaults: one client
    bound.arguments.update(overrides)
    return tuple(sorted(bound.arguments.items()))


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
    resolve ``bucket.host``; botocore's standard retry mode (``max_attempts`` retries, 5 by default as
    dagster-aws; 0 = the one attempt alone)."""
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

    retries: dict[str, Any] = {"mode": "standard", "max_attempts": kw["max_attempts"]}
    if kw["max_attempts"] == 0:
        retries = {"mode": "standard", "total_max_attempts": 1}
    config = Config(retries=retries, s3={"addressing_style": "path"})
    if kw["use_unsigned_session"]:
        config = config.merge(Config(signature_version=UNSIGNED))
    if timeouts is not None:
        config = config.merge(Config(connect_timeout=timeouts[0], read_timeout=timeouts[1]))
    return boto3.session.Session(profile_name=kw["profile_name"]).client(
        "s3", endpoint_url=kw["endpoint_url"], region_name=kw["region_name"] or "us-east-1", use_ssl=kw["use_ssl"],
        verify=kw["verify"], aws_access_key_id=kw["aws_access_key_id"],
        aws_secret_access_key=kw["aws_secret_access_key"], aws_session_token=kw["aws_session_token"], config=config,
    )
