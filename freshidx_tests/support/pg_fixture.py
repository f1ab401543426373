"""A real PostgreSQL server for a test: Debian's ``postgresql`` binaries, ``initdb`` into a temp dir, a free
loopback port, started and stopped with ``pg_ctl``. PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` user (``runuser``) in a directory handed to it."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from freshidx_tests.conftest import free_port


def pg_bin_dir() -> Path | None:
    """Where ``initdb``/``pg_ctl`` are: on PATH, or Debian's versioned directory (newest)."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(dirs[-1]).parent if dirs else None


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path
    port: int = 0
    user: str = "dagster"
    db: str = "dagster"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{self.db}"

    def _run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:  # postgres will not run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    def start(self, port: int | None = None) -> PostgresServer:
        """initdb, start and create the database; on ``port`` if given (e.g. the port a test mapped a
        compose service's to), else on a free loopback port."""
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        # trust auth on loopback only: a throw-away server for one test
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        for _ in range(1 if port else 3):  # the probed port can be taken before the server binds it: retry
            self.port = port or free_port()
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "120",
                          "-o", f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off", "start")
                break
            except RuntimeError:
                if "already in use" not in self.log():
                    raise
        else:
            raise RuntimeError(f"could not start PostgreSQL: {self.log()}")
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, self.db)
        return self

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def log(self) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def make_server(user: str = "dagster", db: str = "dagster") -> PostgresServer | None:
    """A not yet started server in a fresh /tmp dir (pytest's tmp dirs are root-only), or None."""
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        return None
    return PostgresServer(bin_dir, Path(tempfile.mkdtemp(prefix="freshidx-pg-")), user=user, db=db)
