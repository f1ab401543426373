"""The chaos bench's S3 store: a real moto server in its own process on a free loopback port, with one
fresh bucket (:class:`MotoServer`)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from freshidx.store import StoreConfig
from freshidx.tools.devserver import free_port

#: moto accepts any key unless its IAM emulation is on; these are what the bench's children get.
ACCESS_KEY = "chaos-access-key"
SECRET_KEY = "chaos-secret-key"
REGION = "us-east-1"
START_TIMEOUT_S = 120.0


class MotoServer:
    """``with MotoServer(log) as moto: moto.endpoint, moto.config(endpoint)``"""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.bucket = f"chaos-{uuid.uuid4().hex[:12]}"

    def __enter__(self) -> MotoServer:
        for _ in range(3):  # the free port can be taken between probe and bind: retry on a new one
            port = free_port()
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            if _listening(port, self.proc):
                self.endpoint = f"http://127.0.0.1:{port}"
                self.config(self.endpoint).boto3_client().create_bucket(Bucket=self.bucket)
                return self
            self._stop()
        raise RuntimeError(f"could not start the moto S3 server; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def uri(self) -> str:
        return f"s3://{self.bucket}/store"

    def config(self, endpoint: str) -> StoreConfig:
        """The store as seen through ``endpoint`` (moto itself, or the fault proxy in front of it)."""
        return StoreConfig(uri=self.uri(), endpoint_url=endpoint, region=REGION, access_key_id=ACCESS_KEY,
                           secret_access_key=SECRET_KEY)

    def env(self, endpoint: str) -> dict[str, str]:
        """What makes every freshidx entry point see the store through ``endpoint``."""
        return {"FRESHIDX_STORE": self.uri(), "FRESHIDX_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def _stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.proc = None


def _listening(port: int, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)  # polling a port that is not bound yet
    return False
