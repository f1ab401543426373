"""Delta runs attach to one Connect session the server keeps between runs (freshidx.spark_server.kept_session).

Against the suite's real supervised Spark Connect server: two runs (two resource instances, as two Dagster
run processes have) asking for the same kept session see the same server-side session, and the first
run's end does not close it; a run without ``keep_as``, or with ``keep_sessions=False``, gets a session of
its own; a kept session the server has closed is replaced by a new id and the run still gets a working
session. Each test uses a kept-session name of its own: the suite's delta runs share the server and its
``delta`` session.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from freshidx.defs.shared.resources import SparkResource
from freshidx.spark.code_shipping import code_version
from freshidx.spark_server.kept_session import new_session_id, read_session_id, session_file, with_session_id


def test_the_session_id_goes_into_the_connection_string() -> None:
    sid = str(uuid.uuid4())
    assert with_session_id("sc://h:15002", sid) == f"sc://h:15002/;session_id={sid}"
    assert with_session_id("sc://h:15002/", sid) == f"sc://h:15002/;session_id={sid}"
    assert with_session_id("sc://h:1/;user_id=u;token=t", sid) == f"sc://h:1/;user_id=u;token=t;session_id={sid}"
    assert with_session_id(f"sc://h:1/;session_id={uuid.uuid4()};user_id=u", sid) == (
        f"sc://h:1/;user_id=u;session_id={sid}")


def test_an_unreadable_id_file_means_a_new_session(tmp_path: Path) -> None:
    assert read_session_id(tmp_path, "delta", "c1") is None
    session_file(tmp_path, "delta").parent.mkdir()
    for junk in ("", "{}", '{"session_id": "not-a-uuid", "code": "c1"}', "[1]",
                 f'{{"session_id": "{uuid.uuid4()}"}}'):  # no code: written by an older freshidx
        session_file(tmp_path, "delta").write_text(junk)
        assert read_session_id(tmp_path, "delta", "c1") is None, junk
    sid = new_session_id(tmp_path, "delta", "c1")
    assert read_session_id(tmp_path, "delta", "c1") == sid
    assert new_session_id(tmp_path, "delta", "c1") != sid
    assert [p.name for p in session_file(tmp_path, "delta").parent.iterdir()] == ["delta.json"]  # no temp file left


def test_a_session_kept_for_other_code_is_not_attached(tmp_path: Path) -> None:
    # Its reused workers hold the modules of the code they first imported.
    sid = new_session_id(tmp_path, "delta", "c1")
    assert read_session_id(tmp_path, "delta", "c2") is None
    assert read_session_id(tmp_path, "delta", "c1") == sid


def _resource(env: dict[str, str], **kw: object) -> SparkResource:
    return SparkResource(remote=env["FRESHIDX_SPARK_REMOTE"], server_state_dir=env["FRESHIDX_SPARK_SERVER_STATE"],
                         **kw)  # type: ignore[arg-type]


@pytest.mark.timeout(600)
def test_two_runs_share_the_kept_session_and_a_closed_one_is_replaced(shared_spark_connect: dict[str, str]) -> None:
    name = f"test-{uuid.uuid4().hex[:8]}"
    view = f"kept_{uuid.uuid4().hex[:8]}"
    state_dir = shared_spark_connect["FRESHIDX_SPARK_SERVER_STATE"]

    first = _resource(shared_spark_connect)
    with first.session(keep_as=name) as s1:
        s1.range(3).createOrReplaceTempView(view)  # session-scoped: visible only in the same server session
        sid = s1.session_id
    # What the run's materializations carry: the server's application, and its UI as the supervisor
    # recorded it (the server picks a free UI port, which its confs do not say).
    meta = first.spark_metadata()
    assert str(meta["spark_app_id"].value).startswith("local-"), meta
    assert str(meta["spark_ui"].value).startswith("http://"), meta
    first.discard()  # the run ends: its client goes, the kept session stays on the server
    assert read_session_id(state_dir, name, code_version()) == sid

    second = _resource(shared_spark_connect)
    with second.session(keep_as=name) as s2:
        assert s2.sql(f"SELECT count(*) AS n FROM {view}").collect()[0]["n"] == 3
        assert s2.session_id == sid

    # Not asked to keep (full, hourly), or keeping turned off: a session of its own.
    for other in (_resource(shared_spark_connect), _resource(shared_spark_connect, keep_sessions=False)):
        with other.session(keep_as=None if other.keep_sessions else name) as s3:
            assert view not in {t.name for t in s3.catalog.listTables()}
            assert s3.session_id != sid
        other.discard()

    # The server closes the kept session (as after its idle timeout): the next run starts a new one.
    s2.release_session_on_close = True
    s2.stop()
    second.discard()
    third = _resource(shared_spark_connect)
    with third.session(keep_as=name) as s4:
        assert s4.range(5).count() == 5
        new_sid = s4.session_id
    third.discard()
    assert new_sid != sid and read_session_id(state_dir, name, code_version()) == new_sid
