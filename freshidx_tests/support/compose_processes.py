"""The services of docker/docker-compose.yml as local processes (freshidx_tests/deployment/test_compose_deployment.py).

:class:`Deployment` starts a service from its compose ``command`` and ``environment`` through the one
:class:`~freshidx_tests.support.compose_file.Loopback` rewrite, in dependency order (``depends_on``), each in its own
session with a log file; the image is stood in for by a virtualenv whose ``bin`` leads ``PATH`` (the
project's, or the instance virtualenv without freshidx for the webserver and daemon); a service's compose
health check is run the same way. :func:`instance_venv` builds that second virtualenv once.

Every service has a private ``HOME`` and temporary directory (``TMPDIR``, and Spark's scratch space)
under its own directory, as a container has: nothing is shared between services but what the compose
file says (the network, and a named volume only with the services that mount it):
:meth:`Deployment.foreign_paths` says where a service's environment or command points elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from freshidx_tests.support.cluster_fixture import kill_session, spark_home
from freshidx_tests.support.compose_file import (
    DOCKER,
    IMAGE_ENV,
    REPO,
    Loopback,
    command,
    environment,
    healthcheck,
    service,
    volume_mounts,
)
from freshidx_tests.support.polling import poll_until

#: What the webserver and daemon need for docker/dagster.postgres.yaml: stock Dagster only.
INSTANCE_PACKAGES = ("dagster", "dagster-webserver", "dagster-postgres", "dagster-aws")


def instance_venv() -> Path:
    """A virtualenv with :data:`INSTANCE_PACKAGES` at the versions of requirements.lock and no freshidx,
    under ~/.cache/freshidx, named by a hash of the lock and the package list. Built beside it and
    renamed into place (relocatable, so its scripts survive the rename): an interrupted build is never
    reused."""
    lock = REPO / "requirements.lock"
    digest = hashlib.sha256(lock.read_bytes() + " ".join(INSTANCE_PACKAGES).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "freshidx"
    target = cache / f"instance-venv-{digest}"
    if (target / "bin" / "dagster-webserver").exists():
        return target
    uv = Path(sys.executable).parent / "uv"
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv")
    if uv_cmd is None:
        raise RuntimeError("uv is needed to build the instance virtualenv (scripts/bootstrap.sh installs it)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".instance-venv-build-") as build:
        venv = Path(build) / "venv"
        for args in (["venv", "-q", "--relocatable", "--python", sys.executable, str(venv)],
                     ["pip", "install", "-q", "--compile-bytecode", "--python", str(venv / "bin" / "python"),
                      "-c", str(lock), *INSTANCE_PACKAGES]):
            subprocess.run([uv_cmd, *args], check=True, capture_output=True, timeout=900, cwd=build)
        with contextlib.suppress(OSError):  # another process renamed its build into place first
            venv.rename(target)
    return target


def base_env(venv: Path) -> dict[str, str]:
    """A container's environment before the compose file's: the image's PATH (its interpreter and
    scripts first, spark-class of the pyspark install) and SPARK_HOME; Spark listeners on loopback."""
    env = {"PATH": os.pathsep.join([str(venv / "bin"), str(spark_home() / "bin"), "/usr/bin", "/bin"]),
           "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "SPARK_HOME": str(spark_home()),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    for var in ("JAVA_HOME", "PYTHONDONTWRITEBYTECODE", "TZ"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


@dataclass
class Deployment:
    """Services of ``compose`` run as processes; ``venvs`` maps a service to the virtualenv that stands in
    for its image (default: the project's), ``extra_env`` adds the test's own settings to a service."""

    compose: dict[str, Any]
    loopback: Loopback
    venvs: dict[str, Path] = field(default_factory=dict)
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)

    def venv(self, name: str) -> Path:
        return self.venvs.get(name, Path(sys.executable).parent.parent)

    def cwd(self, name: str) -> Path:
        path = self.loopback.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, name: str) -> Path:
        return self.loopback.root / "logs" / f"{name}.log"

    def private_dirs(self, name: str) -> dict[str, str]:
        """The service's own HOME and temporary directory (a container's are its own)."""
        home, tmp = self.cwd(name) / "home", self.cwd(name) / "tmp"
        for path in (home, tmp):
            path.mkdir(parents=True, exist_ok=True)
        return {"HOME": str(home), "TMPDIR": str(tmp), "SPARK_LOCAL_DIRS": str(tmp)}

    def env(self, name: str) -> dict[str, str]:
        lb = self.loopback
        image = {k: lb.apply(name, v) for k, v in IMAGE_ENV.items()}
        svc = {k: lb.apply(name, v) for k, v in environment(service(self.compose, name)).items()}
        return {**base_env(self.venv(name)), **self.private_dirs(name), **image, **svc,
                **self.extra_env.get(name, {})}

    def foreign_paths(self, name: str) -> list[str]:
        """Paths under the deployment's root in ``name``'s environment or command that are not its own:
        neither under its directory nor in a named volume only it mounts."""
        root = self.loopback.root
        own = [root / name] + [root / "volumes" / vol for vol in self.loopback.volumes.get(name, {}).values()
                               if all(vol not in mounts.values() for other, mounts in self.loopback.volumes.items()
                                      if other != name)]
        values = [*self.env(name).values(), *self.argv(name, command(service(self.compose, name)))]
        found = [Path(p) for v in values for p in v.split(os.pathsep) if p.startswith(str(root))]
        return [str(p) for p in found if not any(p == d or d in p.parents for d in own)]

    def argv(self, name: str, args: list[str]) -> list[str]:
        return [self.loopback.apply(name, a) for a in args]

    def mount_files(self, name: str) -> None:
        """The service's bind-mounted files at their mapped container paths (YAML rewritten by the loopback)."""
        for src, target in volume_mounts(service(self.compose, name)):
            if not src.startswith("."):
                continue  # a named volume: a directory the loopback shares
            source, dest = (DOCKER / src).resolve(), Path(self.loopback.path(name, target))
            dest.parent.mkdir(parents=True, exist_ok=True)
            content = yaml.safe_load(source.read_text())
            rewritten = self.loopback.apply_yaml(name, content)
            if rewritten == content:
                shutil.copyfile(source, dest)  # byte for byte, as the container sees it
            else:
                dest.write_text(yaml.safe_dump(rewritten, sort_keys=False))

    def one_shots(self) -> set[str]:
        """Services the others wait for to complete successfully (init containers)."""
        return {dep for name in self.compose["services"]
                for dep, cond in (service(self.compose, name).get("depends_on") or {}).items()
                if isinstance(cond, dict) and cond.get("condition") == "service_completed_successfully"}

    def start(self, name: str, timeout: float = 300) -> subprocess.Popen[bytes]:
        """Start ``name`` from its compose command once its ``depends_on`` conditions hold; a one-shot
        service is waited for (exit 0) like Compose's ``service_completed_successfully``."""
        self.wait_dependencies(name)
        self.mount_files(name)
        proc = self.spawn(name, self.argv(name, command(service(self.compose, name))))
        if name in self.one_shots():
            code = proc.wait(timeout)
            assert code == 0, f"{name} failed ({code}): {self.tail(name)}"
            self.healthy.add(name)  # completed successfully
        return proc

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log(name), "ab") as log:
            proc = subprocess.Popen(argv, env=self.env(name), cwd=self.cwd(name), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_dependencies(self, name: str, timeout: float = 600) -> None:
        deps = service(self.compose, name).get("depends_on") or {}
        for dep, cond in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            condition = (cond or {}).get("condition", "service_started")
            if condition == "service_healthy":
                self.wait_healthy(dep, timeout)
            elif condition == "service_started":
                assert dep in self.procs or dep in self.healthy, f"{name} needs {dep} started first"
            else:
                assert dep in self.healthy, f"{name} needs {dep} completed first"

    def check(self, name: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the service's compose health check once, as it runs here."""
        args = healthcheck(service(self.compose, name))
        assert args, f"{name} has no health check"
        return subprocess.run(self.argv(name, args), env=self.env(name), cwd=self.cwd(name), text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def wait_healthy(self, name: str, timeout: float = 600) -> None:
        if name in self.healthy:
            return

        def ok() -> bool:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}): {self.tail(name)}")
            return self.check(name).returncode == 0

        poll_until(ok, timeout=timeout, interval=2, what=f"{name}'s health check (log: {self.log(name)})")
        self.healthy.add(name)

    def tail(self, name: str, chars: int = 3000) -> str:
        try:
            return self.log(name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 90) -> None:
        """SIGTERM each service, the last started first (the Connect supervisor drains and stops its JVM);
        then SIGKILL whatever is left of its session."""
        for name in reversed(list(self.procs)):
            self.stop_service(name, grace_s)

    def stop_service(self, name: str, grace_s: float = 90) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace_s)
        kill_session(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)


def run_in(env: Mapping[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), env=dict(env), cwd=cwd, text=True, capture_output=True, timeout=120)
