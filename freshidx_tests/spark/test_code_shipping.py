"""freshidx reaches a Connect session's workers once, as a zip of this process's code
(freshidx.spark.code_shipping), not pickled by value into every job.

Against the suite's real supervised Spark Connect server (whose workers could import the installed
freshidx: the zip must win over it), and without Spark for the zip itself.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from freshidx.delta.executor import one_pass
from freshidx.spark.code_shipping import code_version, package_zip, ship_to_connect
from freshidx.spark.session import WORKER_ARROW_POOL, build_connect_session, close_session, task_slots


def test_the_zip_holds_the_package_and_is_named_by_its_content(tmp_path: Path) -> None:
    import freshidx

    path = package_zip(str(tmp_path))
    assert path.name == f"freshidx-{code_version()}.zip"
    names = zipfile.ZipFile(path).namelist()
    assert "freshidx/__init__.py" in names and "freshidx/delta/executor/one_pass.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    source = (Path(freshidx.__file__).parent / "spark" / "code_shipping.py").read_bytes()
    assert zipfile.ZipFile(path).read("freshidx/spark/code_shipping.py") == source
    assert package_zip(str(tmp_path)) == path  # same code, same file


class _Session:
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.added: list[str] = []

    def addArtifacts(self, *paths: str, pyfile: bool = False) -> None:  # pyspark's name
        if self.refuse:
            raise RuntimeError("artifacts are disabled on this server")
        assert pyfile
        self.added.extend(paths)


def test_a_refused_artifact_falls_back_to_by_value_until_one_is_accepted() -> None:
    import freshidx

    try:
        assert ship_to_connect(_Session(refuse=True)) is False
        assert "freshidx" in cloudpickle.list_registry_pickle_by_value()
        accepted = _Session(refuse=False)
        assert ship_to_connect(accepted) is True
        assert accepted.added == [str(package_zip())]
        assert "freshidx" not in cloudpickle.list_registry_pickle_by_value()
    finally:
        if "freshidx" in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(freshidx)


@pytest.mark.timeout(600)
def test_a_connect_session_runs_the_clients_code_from_its_zip(shared_spark_connect: dict[str, str]) -> None:
    session = build_connect_session(shared_spark_connect["FRESHIDX_SPARK_REMOTE"])
    try:
        def where(batches):  # type: ignore[no-untyped-def]  # nested: pickled by value for the server
            import os

            import freshidx
            from freshidx.delta.executor.decoded_cache import resolve_worker_cache

            for _ in batches:
                pass
            cache = resolve_worker_cache(1 << 20)
            yield pa.RecordBatch.from_pydict({"file": [freshidx.__file__], "pid": [os.getpid()],
                                              "cache": [id(cache)], "budget": [cache.max_bytes],
                                              "pool": [pa.default_memory_pool().backend_name]})

        rows = [r.asDict() for _ in range(2)
                for r in session.range(0, 1, 1, 1).mapInArrow(where, "file string, pid long, cache long, "
                                                               "budget long, pool string").collect()]
        slots = task_slots(session)
    finally:
        close_session(session, release=True)
    assert slots == 2  # the server's default master, local[2,4], as the client reads it over Connect
    assert all(f"freshidx-{code_version()}.zip" in r["file"] for r in rows), rows
    assert all(r["budget"] == 1 << 20 for r in rows), rows  # the installed-module cache, not the no-op one
    assert all(r["pool"] == WORKER_ARROW_POOL for r in rows), rows  # the environment the server started with
    if rows[0]["pid"] == rows[1]["pid"]:  # a reused worker keeps its decoded state between jobs
        assert rows[0]["cache"] == rows[1]["cache"]
    # A job carries a reference to the code, not the code: a micro-batch's task pickles to a few KB.
    job = one_pass.MicroBatchJob("{}", [], [], 0, 0, "delta", "v", 2, "src", "run", 3600)
    assert len(cloudpickle.dumps(one_pass._task(job, None))) < 20_000


def test_a_session_pyspark_closed_or_one_half_made_does_not_hold_the_next_ones_place(
        shared_spark_connect: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark binds a local checkpoint to the process's default Connect session: a client it closed on an
    error (stopped, yet still the default) or a session whose set-up failed must not keep that place."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from freshidx.spark import session as session_module

    remote = shared_spark_connect["FRESHIDX_SPARK_REMOTE"]
    closed = build_connect_session(remote)
    closed.client.close()  # what pyspark does when the server lost the session: stopped, not emptied
    with monkeypatch.context() as m:
        def refuse(spark: object) -> None:
            raise RuntimeError("registering the data sources failed")

        m.setattr(session_module, "register_sources", refuse)
        with pytest.raises(RuntimeError, match="data sources"):
            build_connect_session(remote)
    assert ConnectSession.getActiveSession() is None  # the half-made one was stopped, not left active
    fresh = build_connect_session(remote)
    try:
        assert fresh.range(3).localCheckpoint(eager=True).count() == 3
        assert ConnectSession.active() is fresh
    finally:
        close_session(fresh, release=True)
        close_session(closed, release=False)
