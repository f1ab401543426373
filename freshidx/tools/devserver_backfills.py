"""Partition backfills through the webserver's GraphQL API, like the UI's partition dialog
(mixed into :class:`freshidx.tools.devserver_graphql.WebserverClient`)."""

from __future__ import annotations

from typing import Any

from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

from freshidx.tools.devserver_graphql_base import WebserverBase, check_union, key_path
from freshidx.tools.devserver_graphql_documents import BACKFILL_QUERY, CANCEL_BACKFILL_MUTATION

BACKFILL_TERMINAL_STATUSES = frozenset({"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"})


class BackfillCalls(WebserverBase):
    """Launch, read and cancel asset backfills."""

    def launch_partition_backfill(
        self,
        asset_key: str,
        partition_keys: list[str] | None = None,
        range: tuple[str, str] | None = None,
        title: str = "freshidx backfill",
        tags: dict[str, str] | None = None,
    ) -> str:
        """Launch an asset backfill like the UI's partition dialog; return the backfill id.

        Exactly one of ``partition_keys`` (explicit list) or ``range`` (inclusive start, end) is needed.
        """
        if (partition_keys is None) == (range is None):
            raise ValueError("pass exactly one of partition_keys / range")
        path = key_path(asset_key)
        params: dict[str, Any] = {"title": title}
        if partition_keys is not None:
            params["assetSelection"] = [{"path": path}]
            params["partitionNames"] = list(partition_keys)
        else:
            assert range is not None
            params["partitionsByAssets"] = [
                {"assetKey": {"path": path}, "partitions": {"range": {"start": range[0], "end": range[1]}}}
            ]
        if tags:
            params["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        data = self.graphql(LAUNCH_PARTITION_BACKFILL_MUTATION, {"backfillParams": params})
        result = check_union(data["launchPartitionBackfill"], "LaunchBackfillSuccess", f"backfill of {asset_key}")
        return str(result["backfillId"])

    def backfill_status(self, backfill_id: str) -> dict[str, Any]:
        """``{id, status, numPartitions, partitionNames, error, runs: [{runId, status, tags}]}``."""
        data = self.graphql(BACKFILL_QUERY, {"backfillId": backfill_id})
        return check_union(data["partitionBackfillOrError"], "PartitionBackfill", f"backfill {backfill_id}")

    def cancel_backfill(self, backfill_id: str) -> dict[str, Any]:
        """Cancel a backfill (``cancelPartitionBackfill``); return :meth:`backfill_status`."""
        data = self.graphql(CANCEL_BACKFILL_MUTATION, {"backfillId": backfill_id})
        check_union(data["cancelPartitionBackfill"], "CancelBackfillSuccess", f"cancel {backfill_id}")
        return self.backfill_status(backfill_id)
