"""What ``freshidx bench build`` and ``freshidx bench query`` (:mod:`freshidx.tools.bench`,
:mod:`freshidx.tools.bench_query`) run on: N synthetic ads generated in the JVM, user-like queries
over the same vocabulary, and the Spark session a benchmark borrows or starts."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from typing import Any

from freshidx.tools.generator import ADJECTIVES, BRANDS, NOUNS, QUALIFIERS, VOCABULARY

#: Static confs of a session the benchmark starts itself: the local defaults cap the JIT at C1 for
#: fast start-up (freshidx.spark.session), which roughly doubles the JVM's per-row cost of the shuffle
#: and the Arrow hand-over to Python; its docstring says to pass your own options for heavy runs.
BENCH_SPARK_CONF = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "spark.driver.memory": "2g"}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def synthetic_docs(spark: Any, n: int, *, seed: int = 0, products: int | None = None, id_offset: int = 0) -> Any:
    """N ads as a DataFrame of the typed record columns, generated in the JVM (deterministic)."""
    from pyspark.sql import functions as F

    products = products or max(1, n // 40)

    def pick(words: Sequence[str], *salt: Any) -> Any:
        arr = F.array(*[F.lit(w) for w in words])
        h = F.xxhash64(*[F.lit(f"{seed}")], *salt)
        return F.element_at(arr, (F.pmod(h, F.lit(len(words))) + 1).cast("int"))

    ad = F.col("id") + F.lit(id_offset)
    product = F.pmod(F.xxhash64(F.lit(seed), F.lit("product"), ad), F.lit(products))
    brand = pick(BRANDS, F.lit("brand"), product)
    noun = pick(NOUNS, F.lit("noun"), product)
    title = F.concat_ws(
        " ", pick(ADJECTIVES, F.lit("a1"), ad), pick(ADJECTIVES, F.lit("a2"), ad), brand, noun,
        pick(QUALIFIERS, F.lit("q1"), ad), pick(QUALIFIERS, F.lit("q2"), ad),
    )
    keywords = F.array(brand, noun, pick(VOCABULARY, F.lit("k1"), ad), pick(VOCABULARY, F.lit("k2"), ad))
    r = F.pmod(F.xxhash64(F.lit(seed), F.lit("status"), ad), F.lit(100))
    status = F.when(r < 95, F.lit("active")).when(r < 98, F.lit("paused")).otherwise(F.lit("deleted"))
    bid = F.round(F.lit(0.05) + F.pmod(F.xxhash64(F.lit(seed), F.lit("bid"), ad), F.lit(2000)) / F.lit(100.0), 2)
    return spark.range(n).select(
        F.format_string("ad-%09d", ad).alias("ad_id"),
        F.format_string("camp-%05d", F.pmod(F.xxhash64(F.lit(seed), F.lit("camp"), ad), F.lit(500))).alias(
            "campaign_id"),
        F.format_string("prod-%07d", product).alias("product_id"),
        title.alias("title"),
        keywords.alias("keywords"),
        bid.cast("double").alias("bid"),
        status.alias("status"),
        (F.lit(T0).cast("timestamp") + F.make_interval(secs=(ad % 86400).cast("int"))).alias("updated_at"),
        ad.cast("long").alias("version"),
    )


def realistic_queries(q: int, seed: int = 7) -> list[str]:
    """Q user-like queries of 1-3 words (brand / noun / adjective / qualifier combinations)."""
    rng = random.Random(seed)
    out = []
    for _ in range(q):
        shape = rng.random()
        if shape < 0.35:
            words = [rng.choice(NOUNS)]
        elif shape < 0.6:
            words = [rng.choice(ADJECTIVES), rng.choice(NOUNS)]
        elif shape < 0.8:
            words = [rng.choice(BRANDS), rng.choice(NOUNS)]
        else:
            words = [rng.choice(ADJECTIVES), rng.choice(BRANDS), rng.choice(NOUNS)]
        out.append(" ".join(words))
    return out


def bench_session() -> tuple[Any, bool]:
    """The active session, or a new local one (returned flag: we own it and stop it)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    from freshidx.spark.session import build_local_session

    return build_local_session(conf=BENCH_SPARK_CONF), True
