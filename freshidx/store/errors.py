"""Why a store cannot be used at all, and which setting fixes it: the one classification every entry point uses.

:func:`classify` maps what botocore or the OS raised to a :class:`StoreAccessError` (or ``None``: not a
problem of reaching the store, the caller re-raises the original). It is pure: it reads the exception,
makes no call. The stores raise what it returns (:class:`~freshidx.store.s3.S3Store` on every call,
:func:`~freshidx.store.open_store` with ``must_exist=True`` when opening), so

* the CLI prints it as one line, ``freshidx: <message>``, and exits 2 (:func:`freshidx.cli.base.run`,
  which also says where the store value came from: :class:`Origin`);
* a Dagster run that cannot reach its store fails with the message as its error text.

=================  ============================================================  ==========================
problem            raised for                                                    setting named
=================  ============================================================  ==========================
UNREACHABLE        no connection (refused, DNS, connect/read timeout, TLS)       FRESHIDX_S3_ENDPOINT_URL
NO_CREDENTIALS     botocore found no (or partial) credentials                    AWS_ACCESS_KEY_ID, ...
BAD_CREDENTIALS    InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied, 403  AWS_ACCESS_KEY_ID, ...
EXPIRED_TOKEN      ExpiredToken, InvalidToken                                    AWS_SESSION_TOKEN
WRONG_REGION       AuthorizationHeaderMalformed, PermanentRedirect               AWS_REGION
NO_BUCKET          NoSuchBucket                                                  --store / FRESHIDX_STORE
NO_DIRECTORY       a ``file://`` root that is missing or not a directory         --store / FRESHIDX_STORE
UNREADABLE         a ``file://`` root that may not be read                       --store / FRESHIDX_STORE
=================  ============================================================  ==========================
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from freshidx.store.object_store import StoreError

STORE_VAR = "FRESHIDX_STORE"
ENDPOINT_VAR = "FRESHIDX_S3_ENDPOINT_URL"
CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"


class Problem(enum.Enum):
    UNREACHABLE = "unreachable"
    NO_CREDENTIALS = "no credentials"
    BAD_CREDENTIALS = "credentials rejected"
    EXPIRED_TOKEN = "session token rejected"
    WRONG_REGION = "wrong region"
    NO_BUCKET = "no such bucket"
    NO_DIRECTORY = "no such directory"
    UNREADABLE = "not readable"


@dataclass(frozen=True)
class Origin:
    """Where a command's store coordinates came from, so a message names the setting to fix.

    ``store``: ``"--store"``, ``"FRESHIDX_STORE"`` or ``"default"`` (neither is set); ``endpoint``: the
    variable that set the S3 endpoint (``FRESHIDX_S3_ENDPOINT_URL``, or ``AWS_ENDPOINT_URL`` when only
    that one is set)."""

    store: str
    endpoint: str = ENDPOINT_VAR

    @classmethod
    def of(cls, option: str | None, env: Mapping[str, str]) -> Origin:
        """The origin of a command's store: its ``--store`` value (``None``: not given) and ``env``
        (read as :class:`~freshidx.settings.Settings` reads it: names case-insensitive, empty = unset)."""
        given = {k.upper() for k, v in env.items() if v}
        store = "--store" if option is not None else STORE_VAR if STORE_VAR in given else "default"
        endpoint = "AWS_ENDPOINT_URL" if ENDPOINT_VAR not in given and "AWS_ENDPOINT_URL" in given else ENDPOINT_VAR
        return cls(store, endpoint)

    @property
    def store_setting(self) -> str:
        """The setting that gives the store: the one used, or (default) the ones to use."""
        return {"--store": "--store", "default": f"{STORE_VAR} or --store"}.get(self.store, STORE_VAR)

    def phrase(self) -> str:
        if self.store == "default":
            return " (the default: neither --store nor FRESHIDX_STORE is set)"
        return f" (from {self.store})"


class StoreAccessError(StoreError):
    """The store cannot be used at all: unreachable, no or wrong credentials, no bucket, no directory.

    ``str()`` is one line naming the setting to fix (:class:`Problem`); ``origin`` (set by the CLI,
    :meth:`with_origin`) adds where the store value came from."""

    def __init__(self, problem: Problem, uri: str, endpoint: str | None = None, detail: str = "",
                 origin: Origin | None = None) -> None:
        super().__init__(problem, uri, endpoint, detail, origin)
        self.problem = problem
        self.uri = uri
        self.endpoint = endpoint
        self.detail = detail
        self.origin = origin

    def with_origin(self, origin: Origin | None) -> StoreAccessError:
        """The same error, saying where the store value came from (unchanged if ``origin`` is None)."""
        if origin is None:
            return self
        return StoreAccessError(self.problem, self.uri, self.endpoint, self.detail, origin)

    @property
    def setting(self) -> str:
        """The setting to fix."""
        origin = self.origin or Origin("unknown")
        return {
            Problem.UNREACHABLE: origin.endpoint,
            Problem.NO_CREDENTIALS: CREDENTIAL_VARS,
            Problem.BAD_CREDENTIALS: CREDENTIAL_VARS,
            Problem.EXPIRED_TOKEN: "AWS_SESSION_TOKEN",
            Problem.WRONG_REGION: "AWS_REGION",
        }.get(self.problem, origin.store_setting)

    def __str__(self) -> str:
        origin = self.origin
        where = f"the object store {self.uri}" + (origin.phrase() if origin else "")
        at = self.endpoint or "the default AWS endpoint"
        endpoint_var = origin.endpoint if origin else ENDPOINT_VAR
        p = self.problem
        if p is Problem.UNREACHABLE:
            return f"{where} is unreachable at {at} ({endpoint_var}): {self.detail}"
        if p is Problem.NO_CREDENTIALS:
            return (f"{where} needs AWS credentials: {self.detail} (set {CREDENTIAL_VARS.replace(' / ', ' and ')}, "
                    "or AWS_PROFILE)")
        if p in (Problem.BAD_CREDENTIALS, Problem.EXPIRED_TOKEN):
            return f"{where} refused the AWS credentials at {at} ({self.setting}): {self.detail}"
        if p is Problem.WRONG_REGION:
            return f"{where} is in another region than the one asked at {at} (AWS_REGION): {self.detail}"
        if p is Problem.NO_BUCKET:
            return (f"{where} does not exist: no bucket {urlparse(self.uri).netloc} at {at} (fix {self.setting}, "
                    f"or {endpoint_var} if that is the wrong server)")
        if p is Problem.NO_DIRECTORY:
            return f"{where} does not exist: {self.detail} (fix {self.setting}; commands that only read create nothing)"
        return f"{where} cannot be read: {self.detail} ({self.setting})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoreAccessError, (self.problem, self.uri, self.endpoint, self.detail, self.origin))


_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidClientTokenId", "AllAccessDisabled",
    "AccountProblem", "403",  # a HEAD request's error has no body: only the status
})
_TOKEN_CODES = frozenset({"ExpiredToken", "InvalidToken", "TokenRefreshRequired"})
_REGION_CODES = frozenset({"AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException",
                           "301"})
_BUCKET_CODES = frozenset({"NoSuchBucket"})
_ERRNO_TEXT = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def classify(exc: BaseException, *, uri: str, endpoint: str | None = None) -> StoreAccessError | None:
    """The :class:`StoreAccessError` that ``exc`` means for the store ``uri`` (at ``endpoint``), or None
    when ``exc`` says nothing about reaching the store (a missing key, a lost race, a bug: re-raise it).

    OS errors are classified only for a ``file://`` store: pass the error of an operation on its root."""
    if isinstance(exc, OSError) and uri.startswith("file://"):
        return _local(exc, uri)
    module = type(exc).__module__
    if not module.startswith("botocore"):
        return None
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, PartialCredentialsError):
        return StoreAccessError(Problem.NO_CREDENTIALS, uri, endpoint, _first_lower(str(exc)))
    if isinstance(exc, NoCredentialsError):
        return StoreAccessError(Problem.NO_CREDENTIALS, uri, endpoint, "none found")
    if isinstance(exc, ConnectTimeoutError):
        return StoreAccessError(Problem.UNREACHABLE, uri, endpoint, "connect timeout")
    if isinstance(exc, ReadTimeoutError):
        return StoreAccessError(Problem.UNREACHABLE, uri, endpoint, "no answer (read timeout)")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return StoreAccessError(Problem.UNREACHABLE, uri, endpoint, _connection_detail(exc))
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        detail = f"{code}: {error['Message']}" if error.get("Message") and error["Message"] != code else code
        for codes, problem in ((_CREDENTIAL_CODES, Problem.BAD_CREDENTIALS), (_TOKEN_CODES, Problem.EXPIRED_TOKEN),
                               (_REGION_CODES, Problem.WRONG_REGION), (_BUCKET_CODES, Problem.NO_BUCKET)):
            if code in codes:
                return StoreAccessError(problem, uri, endpoint, detail)
    return None


def _local(exc: OSError, uri: str) -> StoreAccessError | None:
    path = exc.filename if exc.filename is not None else urlparse(uri).path
    if isinstance(exc, FileNotFoundError):
        return StoreAccessError(Problem.NO_DIRECTORY, uri, None, f"no directory {path}")
    if isinstance(exc, NotADirectoryError):
        return StoreAccessError(Problem.NO_DIRECTORY, uri, None, f"{path} is not a directory")
    if isinstance(exc, PermissionError):
        return StoreAccessError(Problem.UNREADABLE, uri, None, f"permission denied on {path}")
    return None


def _connection_detail(exc: Any) -> str:
    """``connection refused``, ``name or service not known``, ... from a botocore connection error."""
    cause = str(getattr(exc, "kwargs", {}).get("error") or exc)
    m = _ERRNO_TEXT.search(cause)
    return _first_lower(m.group(1).strip()) if m else cause


def _first_lower(text: str) -> str:
    return text[:1].lower() + text[1:]
