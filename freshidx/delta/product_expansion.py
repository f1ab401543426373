"""The delta window rebuild's rows, in Spark (docs/architecture.md#incremental-delta): every ad of every
product the window touched, at its latest state over what the serving full version knows.

Indexing works at the product level, so a change to one ad recomputes its product's grouped features and
the delta must re-emit *all* ads of that product (its kill-list then hides every stale copy in the full
index). The rows are :func:`expand_to_products` of the window's records over the full version's state
(:func:`read_version_state`): the Spark rendering of :func:`freshidx.record_rules.touched_products` and of
which version wins. The incremental micro-batch applies the same rules per task in Arrow
(:mod:`freshidx.delta.segment_merge`). Reading, validation, quarantine and shard writing are every build's
(:mod:`freshidx.spark.index_build`); :func:`freshidx.delta.delta_build.build_delta` composes them with this.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.delta.executor.state_lookup import StateLayer
from freshidx.raw_record import ACTIVE
from freshidx.record_rules import TYPED_FIELDS
from freshidx.spark.index_shards import read_state_files, version_files
from freshidx.spark.shards import COVERED_FILE, DOCS_FILE
from freshidx.spark.transform import latest_per_ad
from freshidx.store import StoreConfig


def read_version_state(spark: SparkSession, store_config: StoreConfig, layers: Sequence[StateLayer]) -> DataFrame:
    """Everything the ``layers`` (the serving full version's) know about their ads, read on the executors and
    checkpointed: the active ads as whole records (``docs.parquet``) and the paused/deleted ones from the
    kill-list files (``covered.parquet``: ``ad_id, status, version, updated_at``, other columns null). The
    caller drops the checkpoint (``unpersist``) when its build is done.

    A window rebuild compares its window with this (:func:`expand_to_products`), so an ad whose
    highest version is deleted or paused in the full version stays hidden. Columns:
    :data:`~freshidx.record_rules.TYPED_FIELDS`; the file list comes from the layers' shard commits, never
    from a listing.
    """
    manifest = {"shards": [sh for layer in layers for sh in layer.shards]}
    keys = [(k, DOCS_FILE) for k in version_files(manifest, DOCS_FILE)]
    keys += [(k, COVERED_FILE) for k in version_files(manifest, COVERED_FILE)]
    # One task reads all the files: a Python task that starts a new worker costs more than reading.
    return read_state_files(spark, store_config, keys, max_tasks=1).localCheckpoint(eager=True)


def expand_to_products(latest_window: DataFrame, full_state: DataFrame) -> DataFrame:
    """The delta's rows: every ad of every product the window touched, at its latest state.

    * ``latest_window``: one row per ad changed in the delta window
      (:func:`freshidx.spark.transform.latest_per_ad` output);
    * ``full_state``: what the current full version knows (:func:`read_version_state`): its active ads as
      whole records, and its paused and deleted ads as ``ad_id, status, version, updated_at`` (other
      columns null).

    A product is *touched* when an ad in the window belongs to it now, or belonged to it (active) in
    the full version (an ad that moved products changes both). The result is, for every touched
    product, the union of the window's rows and the full version's active rows, plus the full
    version's state of every window ad whatever its status, reduced to one row per ad by
    ``latest_per_ad``. So a full row never overrides a newer window row, and a window row never
    overrides a *higher* version the full version holds: a deleted or paused v10 before the window
    keeps a re-delivered or late active v5 inside it hidden (the row comes out inactive and lands in
    the kill-list only). Columns: :data:`~freshidx.record_rules.TYPED_FIELDS`. Each product it mentions is
    whole, as the product features need (computed in the shard tasks,
    :class:`freshidx.record_rules.ProductFeatures`).
    """
    window = latest_window.select(*TYPED_FIELDS)
    full = full_state.select(*TYPED_FIELDS)
    known = full.join(window.select("ad_id"), "ad_id", "left_semi")  # inactive ones included: they may be newer
    touched = touched_products(window, known)
    siblings = full.filter(_is_active()).join(touched, "product_id", "left_semi")
    return latest_per_ad(window.unionByName(siblings).unionByName(known))


def touched_products(batch: DataFrame, prior: DataFrame) -> DataFrame:
    """:func:`freshidx.record_rules.touched_products` in Spark: the ``product_id`` of every product the
    ``batch`` ads belong to now or, active, in ``prior`` (their rows before the batch)."""
    return (batch.select("product_id").unionByName(prior.filter(_is_active()).select("product_id"))
            .distinct())


def _is_active() -> Column:
    return F.col("status") == F.lit(ACTIVE)
