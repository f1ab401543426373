"""A store that cannot be used is one line naming the setting to fix, exit 2; read-only commands create nothing.

Each row runs the real CLI in a child process, in a clean environment (``PATH``, a temp ``HOME``, the row's
variables), with its working directory in a temp dir, against real servers on loopback: nothing listening
(unreachable), moto (missing bucket, no credentials), moto with its IAM check on
(``INITIAL_NO_AUTH_ACTION_COUNT=0``: an unknown access key gets S3's ``InvalidAccessKeyId``). Every row
checks: exit 2, exactly one line on stderr naming the setting and where the store value came from, no
traceback, and no file created in the working directory, ``HOME`` or at the store's path.

The S3 check of a read-only command uses a client with one retry and short timeouts
(``freshidx.store.s3_clients.CHECK_ATTEMPTS`` / ``CHECK_TIMEOUTS``), and botocore's backoff between attempts of a
refused connection is under 0.05 s, so the unreachable row costs no more than the others (~1 s: the
child's start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
)

from freshidx.store import StoreConfig, open_store
from freshidx.store.errors import Origin, Problem, StoreAccessError, classify
from freshidx.store.s3 import S3Store
from freshidx.store.s3_clients import s3_client
from freshidx_tests.conftest import MOTO_ACCESS_KEY, MOTO_SECRET_KEY, free_port, make_s3_config, wait_for_port

CLI = Path(sys.executable).with_name("freshidx")
COMMAND = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "freshidx.cli"]
#: The commands that only read, as a user types them (the store comes from --store or FRESHIDX_STORE).
READ_ONLY = (["status"], ["search", "x"], ["ledger"], ["gc", "delta", "--dry-run"], ["quarantine", "list"],
             ["quarantine", "export", "--partition", "20261124T0148", "--out", "-"])


@dataclass
class Dirs:
    cwd: Path
    home: Path
    watched: list[Path] = field(default_factory=list)

    def tree(self) -> dict[str, list[str]]:
        roots = [self.cwd, self.home, *self.watched]
        return {str(r): sorted(str(p.relative_to(r)) for p in r.rglob("*")) if r.exists() else ["<absent>"]
                for r in roots}


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    (tmp_path / "cwd").mkdir()
    (tmp_path / "home").mkdir()
    return Dirs(tmp_path / "cwd", tmp_path / "home")


def freshidx(args: list[str], dirs: Dirs, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ["PATH"], "HOME": str(dirs.home),
             "AWS_EC2_METADATA_DISABLED": "true",  # no credentials means none: do not ask a metadata service
             **env}
    return subprocess.run([*COMMAND, *args], cwd=dirs.cwd, env=clean, capture_output=True, text=True, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("freshidx: the object store "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def moto_with_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto checking credentials from the first request (its IAM emulation: unknown keys are refused)."""
    log = tmp_path_factory.mktemp("moto-auth") / "moto.log"
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, 30, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def creds(key: str = MOTO_ACCESS_KEY, secret: str = MOTO_SECRET_KEY) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}


def new_bucket_name() -> str:
    return f"fx-missing-{uuid.uuid4().hex[:12]}"


# ---- one row per problem: the CLI in a child process ----

def test_unreachable_endpoint(dirs: Dirs) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    before = dirs.tree()
    line = one_line_error(freshidx(["status"], dirs, FRESHIDX_STORE="s3://fx-b/p", FRESHIDX_S3_ENDPOINT_URL=endpoint,
                                   **creds()))
    assert line == (f"freshidx: the object store s3://fx-b/p (from FRESHIDX_STORE) is unreachable at {endpoint} "
                    "(FRESHIDX_S3_ENDPOINT_URL): connection refused")
    assert dirs.tree() == before


def test_missing_credentials(dirs: Dirs, moto_endpoint: str) -> None:
    before = dirs.tree()
    line = one_line_error(freshidx(["ledger", "--store", "s3://fx-b/p"], dirs, FRESHIDX_S3_ENDPOINT_URL=moto_endpoint))
    assert "(from --store)" in line and "AWS_ACCESS_KEY_ID" in line and "AWS_SECRET_ACCESS_KEY" in line, line
    assert "needs AWS credentials: none found" in line
    assert dirs.tree() == before


def test_wrong_credentials(dirs: Dirs, moto_with_auth: str) -> None:
    before = dirs.tree()
    proc = freshidx(["search", "x"], dirs, FRESHIDX_STORE="s3://fx-b/p", FRESHIDX_S3_ENDPOINT_URL=moto_with_auth,
                    **creds("AKIAFRESHIDXWRONGKEY", "not-the-secret"))
    line = one_line_error(proc)
    assert "(from FRESHIDX_STORE)" in line and "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in line, line
    assert f"refused the AWS credentials at {moto_with_auth}" in line and "InvalidAccessKeyId" in line
    assert dirs.tree() == before  # the search cache is made only once the store answered


def test_missing_bucket(dirs: Dirs, moto_endpoint: str) -> None:
    bucket = new_bucket_name()
    before = dirs.tree()
    line = one_line_error(freshidx(["quarantine", "list", "--store", f"s3://{bucket}/p"], dirs,
                                   FRESHIDX_S3_ENDPOINT_URL=moto_endpoint, **creds()))
    assert line == (f"freshidx: the object store s3://{bucket}/p (from --store) does not exist: no bucket {bucket} "
                    f"at {moto_endpoint} (fix --store, or FRESHIDX_S3_ENDPOINT_URL if that is the wrong server)")
    assert dirs.tree() == before


def test_missing_bucket_for_a_writing_command(dirs: Dirs, moto_endpoint: str) -> None:
    """A writer is not checked up front: its first call meets the error, said the same way."""
    bucket = new_bucket_name()
    before = dirs.tree()
    proc = freshidx(["generate", "--count", "1", "--every", "0"], dirs, FRESHIDX_STORE=f"s3://{bucket}/p",
                    FRESHIDX_S3_ENDPOINT_URL=moto_endpoint, **creds())
    line = one_line_error(proc)
    assert f"(from FRESHIDX_STORE) does not exist: no bucket {bucket}" in line and "fix FRESHIDX_STORE" in line
    assert dirs.tree() == before


@pytest.mark.parametrize("via", ["--store", "FRESHIDX_STORE"])
def test_file_store_that_does_not_exist(dirs: Dirs, tmp_path: Path, via: str) -> None:
    # /does/not/exist, unless this machine has a /does (then a path under the test's temp dir).
    top = Path("/does") if not Path("/does").exists() else tmp_path / "does"
    path = top / "not" / "exist"
    dirs.watched.append(top)
    before = dirs.tree()
    args, env = (["status", "--store", path.as_uri()], {}) if via == "--store" else (["gc", "delta", "--dry-run"],
                                                                                     {"FRESHIDX_STORE": str(path)})
    line = one_line_error(freshidx(args, dirs, **env))
    assert line == (f"freshidx: the object store {path.as_uri()} (from {via}) does not exist: no directory {path} "
                    f"(fix {via}; commands that only read create nothing)")
    assert dirs.tree() == before


def test_read_only_commands_create_nothing(dirs: Dirs, tmp_path: Path) -> None:
    """Every read-only command, on the default store (./.freshidx/store) and on a --store that does not
    exist: exit 2, one line, nothing created (one child process runs them all, stderr per command)."""
    missing = tmp_path / "missing" / "store"
    dirs.watched.append(tmp_path / "missing")
    runs = [list(c) for c in READ_ONLY] + [[*c, "--store", missing.as_uri()] for c in READ_ONLY]
    code = ("import contextlib, io, json, sys\nfrom freshidx.cli import main\nout = []\n"
            f"for argv in {runs!r}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        rc = main(argv)\n"
            "    out.append([argv, rc, err.getvalue()])\n"
            "print(json.dumps(out))\n")
    before = dirs.tree()
    proc = subprocess.run([sys.executable, "-c", code], cwd=dirs.cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": str(dirs.home)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert len(results) == 2 * len(READ_ONLY)
    for argv, rc, err in results:
        assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, rc, err)
        if "--store" in argv:
            assert f"{missing.as_uri()} (from --store) does not exist" in err and "fix --store" in err, (argv, err)
        else:
            assert "(the default: neither --store nor FRESHIDX_STORE is set) does not exist" in err, (argv, err)
            assert "fix FRESHIDX_STORE or --store" in err, (argv, err)
    assert dirs.tree() == before
    assert not (dirs.cwd / ".freshidx").exists() and not missing.parent.exists()


# ---- the library side: what a Dagster run sees, and what opening creates ----

def test_a_run_sees_the_same_message_without_an_origin() -> None:
    """The Dagster store resource builds ``S3Store(s3_client(...), ...)``: its calls raise the message."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store(s3_client(endpoint_url=endpoint, aws_access_key_id="a", aws_secret_access_key="b"), "fx-b", "p",
                    "s3://fx-b/p")
    with pytest.raises(StoreAccessError) as caught:
        store.get("indexes/delta/CURRENT")
    assert str(caught.value) == (f"the object store s3://fx-b/p is unreachable at {endpoint} "
                                 "(FRESHIDX_S3_ENDPOINT_URL): connection refused")


def test_refused_credentials_are_not_a_verdict_on_conditional_writes(moto_with_auth: str) -> None:
    cfg = StoreConfig(uri="s3://fx-b/p", endpoint_url=moto_with_auth, access_key_id="AKIAFRESHIDXWRONGKEY",
                      secret_access_key="x")
    for _ in range(2):  # no verdict was cached: the same answer again
        with pytest.raises(StoreAccessError) as caught:
            open_store(cfg, for_writing=True)
        assert caught.value.problem is Problem.BAD_CREDENTIALS


def test_opening_an_existing_store_for_reading_creates_nothing_in_it(tmp_path: Path, moto_endpoint: str) -> None:
    root = tmp_path / "store"
    root.mkdir()
    store = open_store(StoreConfig(uri=root.as_uri()), must_exist=True)
    assert store.list("").objects == [] and list(root.iterdir()) == []
    store.put("a/b.json", b"{}")  # a write still works: it makes the store's work dirs then
    assert store.create("c", b"1") and store.swap("c", b"2", store.get("c").etag)
    assert store.get("a/b.json").data == b"{}"
    # An S3 store that is there (an empty prefix is an empty store, not an error).
    assert open_store(make_s3_config(moto_endpoint), must_exist=True).list("").objects == []


# ---- the classification, row by row (botocore's own exception objects) ----

def client_error(code: str, message: str = "") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "ListObjectsV2")


@pytest.mark.parametrize(("exc", "problem", "setting"), [
    (EndpointConnectionError(endpoint_url="http://h:1/b", error="[Errno 111] Connection refused"),
     Problem.UNREACHABLE, "FRESHIDX_S3_ENDPOINT_URL"),
    (ConnectTimeoutError(endpoint_url="http://h:1/b"), Problem.UNREACHABLE, "FRESHIDX_S3_ENDPOINT_URL"),
    (NoCredentialsError(), Problem.NO_CREDENTIALS, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), Problem.NO_CREDENTIALS,
     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (client_error("InvalidAccessKeyId"), Problem.BAD_CREDENTIALS, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (client_error("SignatureDoesNotMatch"), Problem.BAD_CREDENTIALS, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (client_error("AccessDenied", "Access Denied"), Problem.BAD_CREDENTIALS,
     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (client_error("403", "Forbidden"), Problem.BAD_CREDENTIALS, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    (client_error("ExpiredToken"), Problem.EXPIRED_TOKEN, "AWS_SESSION_TOKEN"),
    (client_error("AuthorizationHeaderMalformed"), Problem.WRONG_REGION, "AWS_REGION"),
    (client_error("NoSuchBucket"), Problem.NO_BUCKET, "FRESHIDX_STORE"),
])
def test_classify_s3(exc: Exception, problem: Problem, setting: str) -> None:
    error = classify(exc, uri="s3://b/p", endpoint="http://h:1")
    assert error is not None and error.problem is problem
    assert error.with_origin(Origin("FRESHIDX_STORE")).setting == setting
    text = str(error.with_origin(Origin("FRESHIDX_STORE")))
    assert setting.split(" / ")[0] in text and "(from FRESHIDX_STORE)" in text and "\n" not in text


@pytest.mark.parametrize("exc", [client_error("NoSuchKey"), client_error("PreconditionFailed"),
                                 client_error("InternalError"), ValueError("x"), FileNotFoundError("x")])
def test_classify_leaves_other_errors_alone(exc: Exception) -> None:
    assert classify(exc, uri="s3://b/p") is None


def test_classify_local_and_origins() -> None:
    error = classify(FileNotFoundError(2, "No such file or directory", "/x/y"), uri="file:///x/y")
    assert error is not None and error.problem is Problem.NO_DIRECTORY and error.setting == "FRESHIDX_STORE"
    assert classify(NotADirectoryError(20, "Not a directory", "/f"), uri="file:///f").problem is Problem.NO_DIRECTORY
    assert classify(PermissionError(13, "Permission denied", "/p"), uri="file:///p").problem is Problem.UNREADABLE
    assert Origin.of("s3://b", {"FRESHIDX_STORE": "s3://c"}) == Origin("--store")
    assert Origin.of(None, {"freshidx_store": "s3://c"}) == Origin("FRESHIDX_STORE")
    assert Origin.of(None, {"FRESHIDX_STORE": ""}) == Origin("default")
    assert Origin.of(None, {"AWS_ENDPOINT_URL": "http://m"}).endpoint == "AWS_ENDPOINT_URL"
    # what the CLI adds is a copy; the error raised by the store stays as it was
    assert "(from" not in str(error) and "(from --store)" in str(error.with_origin(Origin("--store")))
