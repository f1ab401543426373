"""S3 (or any S3-protocol server) as an object store, using conditional writes.

Create-once is ``PutObject`` with ``If-None-Match: *``; compare-and-swap is ``PutObject`` with
``If-Match: <etag>`` (AWS since 2024; moto enforces both). HTTP 412 means we lost; 409
(``ConditionalRequestConflict``, a concurrent conditional write in flight) is treated the same,
and the caller's optimistic loop re-reads and retries.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from freshidx.store.base import (
    ListPage,
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreStats,
    check_key,
)

_LOST = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


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

    def _k(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def get(self, key: str) -> StoredObject:
        self.stats.bump("get_calls")
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
        except ClientError as exc:
            if _code(exc) in _MISSING:
                raise NotFound(key) from exc
            raise
        return StoredObject(key, r["Body"].read(), r["ETag"])

    def head(self, key: str) -> ObjectInfo:
        self.stats.bump("get_calls")
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self._k(key))
        except ClientError as exc:
            if _code(exc) in _MISSING:
                raise NotFound(key) from exc
            raise
        return ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"])

    def put(self, key: str, data: bytes) -> str:
        self.stats.bump("put_calls")
        return str(self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)["ETag"])

    def _conditional_put(self, key: str, data: bytes, **cond: str) -> str:
        self.stats.bump("put_calls")
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, **cond)
        except ClientError as exc:
            if _code(exc) in _LOST or exc.response.get("ResponseMetadata", {}).get(
                "HTTPStatusCode"
            ) in (409, 412):
                raise PreconditionFailed(f"{key}: {_code(exc)}") from exc
            raise
        return str(r["ETag"])

    def create(self, key: str, data: bytes) -> str:
        return self._conditional_put(key, data, IfNoneMatch="*")

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        if expected_etag is None:
            return self._conditional_put(key, data, IfNoneMatch="*")
        return self._conditional_put(key, data, IfMatch=expected_etag)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._k(key))

    def list_page(
        self, prefix: str, *, delimiter: str | None = None, start_after: str | None = None,
        max_keys: int = 1000, continuation: str | None = None,
    ) -> tuple[ListPage, str | None]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._k(prefix) if prefix else
                                (self.prefix + "/" if self.prefix else ""), "MaxKeys": max_keys}
        if delimiter:
            args["Delimiter"] = delimiter
        if continuation:
            args["ContinuationToken"] = continuation
        elif start_after:
            args["StartAfter"] = self._k(start_after)
        r = self.client.list_objects_v2(**args)
        objects = [
            ObjectInfo(self._rel(o["Key"]), int(o["Size"]), str(o["ETag"]), o["LastModified"])
            for o in r.get("Contents", [])
        ]
        prefixes = [self._rel(p["Prefix"]) for p in r.get("CommonPrefixes", [])]
        token = r.get("NextContinuationToken") if r.get("IsTruncated") else None
        return ListPage(objects, prefixes), token
