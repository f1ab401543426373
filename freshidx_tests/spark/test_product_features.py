"""Product-level features with Arrow (freshidx.record_rules.ProductFeatures): a pure function, checked against a
plain-Python twin on random shards fed in batches of several sizes."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from freshidx.record_rules import FEATURE_COLUMNS, ProductFeatures
from freshidx.spark.shards import DOCS_ARROW_SCHEMA
from freshidx_tests.spark.test_index_shards import COLUMNS, ad, with_features


def random_ads(rng: random.Random, n: int) -> list[dict]:
    ads = []
    for i in range(n):
        a = ad(i, product=rng.randrange(max(1, n // 4)), status=rng.choice(["active", "active", "paused", "deleted"]),
               bid=round(rng.uniform(0.1, 9.9), 2))
        if rng.random() < 0.1:
            a["bid"] = None  # an active ad without a bid counts, but has no bid to be the best
        ads.append({c: a[c] for c in COLUMNS})
    return ads


@pytest.mark.parametrize("batch_rows", [1, 7, 1000])
def test_features_match_the_python_twin(batch_rows: int) -> None:
    rng = random.Random(batch_rows)
    ads = random_ads(rng, 300)
    table = pa.Table.from_pylist(ads, schema=DOCS_ARROW_SCHEMA)
    features = ProductFeatures()
    for batch in table.filter(pc.equal(table["status"], "active")).to_batches(max_chunksize=batch_rows):
        features.add(batch)
    got = {}
    for batch in table.to_batches(max_chunksize=50):
        out = features.attach(batch)
        assert out.schema.names == [*DOCS_ARROW_SCHEMA.names, *FEATURE_COLUMNS]
        assert out.schema.field("product_active_ads").type == pa.int64()
        assert out.schema.field("product_best_bid").type == pa.float64()
        got.update({r["ad_id"]: (r["product_active_ads"], r["product_best_bid"]) for r in out.to_pylist()})
    want = {a["ad_id"]: (a["product_active_ads"], a["product_best_bid"]) for a in with_features(ads)}
    assert got == want
    assert any(v == (0, 0.0) for v in want.values())  # some product has no active ad: the fill path ran
    with pytest.raises(RuntimeError, match="after attach"):
        features.add(table.to_batches()[0])


def test_no_active_ads_at_all() -> None:
    table = pa.Table.from_pylist([{c: a[c] for c in COLUMNS} for a in [ad(1, 1, status="paused")]],
                                 schema=DOCS_ARROW_SCHEMA)
    out = ProductFeatures().attach(table.to_batches()[0])
    assert out.column("product_active_ads").to_pylist() == [0]
    assert out.column("product_best_bid").to_pylist() == [0.0]


def test_a_whole_table_gets_the_same_features_as_its_batches() -> None:
    ads = random_ads(random.Random(3), 200)
    table = pa.Table.from_pylist(ads, schema=DOCS_ARROW_SCHEMA)
    features = ProductFeatures()
    features.add(table.filter(pc.equal(table["status"], "active")))
    whole = features.attach(table)
    assert isinstance(whole, pa.Table) and whole.column_names == [*DOCS_ARROW_SCHEMA.names, *FEATURE_COLUMNS]
    by_batch = pa.Table.from_batches([features.attach(b) for b in table.to_batches(max_chunksize=13)])
    assert whole.to_pylist() == by_batch.to_pylist()
