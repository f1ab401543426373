"""docker/docker-compose.yml read the way Compose reads it, and rewritten for one machine.

* :func:`interpolate` is Compose's variable interpolation (``${VAR:-default}``, ``${VAR-default}``,
  ``${VAR}``, ``$VAR``, ``$$``); YAML anchors and ``<<`` merges are resolved by the YAML loader, so
  :func:`service` returns a service as Compose would run it.
* :class:`Loopback` is the one rewrite from the compose network to this machine, applied to every
  command, environment value and health check that runs: service host names (and ``localhost``,
  ``0.0.0.0``) become 127.0.0.1, every container port a free loopback port, every container path a
  directory of that service under a root (a named volume: one directory shared by the services that
  mount it), and the image's interpreter the virtualenv standing in for the image.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
#: Where the Dockerfile puts the interpreter every freshidx container runs (PYSPARK_PYTHON).
IMAGE_PYTHON = "/usr/local/bin/python"
#: What the Dockerfile's ENV lines give every container besides PATH (test_docker_static checks them).
IMAGE_ENV = {"PYSPARK_PYTHON": IMAGE_PYTHON, "DAGSTER_HOME": "/opt/dagster/home"}
#: Options whose next argument is a port a process listens on.
PORT_FLAGS = ("--port", "-p", "--webui-port", "--control-port")

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))")
_HOST_PORT = re.compile(r"(?<![\w.-])(?P<host>[A-Za-z0-9][\w.-]*):(?P<port>\d{2,5})(?![\w.-])")
_NUMBER = re.compile(r"(?<![\w.-])(\d{2,5})(?![\w.-])")


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation of one string; ``env`` holds the variables (empty: every default)."""

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg, val = m.group("op"), m.group("arg") or "", env.get(name)
        missing = not val if op in (":-", ":?") else val is None  # ":" also counts an empty value
        if op and missing:
            if op.endswith("?"):
                raise ValueError(f"required variable {name} is missing: {arg}")
            return arg
        return val or ""

    return _VAR.sub(sub, value)


def resolved(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` with every string in it interpolated."""
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, list):
        return [resolved(v, env) for v in value]
    if isinstance(value, dict):
        return {k: resolved(v, env) for k, v in value.items()}
    return value


def service(compose: Mapping[str, Any], name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The service ``name`` as Compose runs it: anchors merged, variables interpolated."""
    return dict(resolved(compose["services"][name], env or {}))


def environment(svc: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (a mapping or a list of ``KEY=VALUE``) as strings."""
    raw = svc.get("environment") or {}
    if isinstance(raw, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in raw.items()}


def command(svc: Mapping[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]


def healthcheck(svc: Mapping[str, Any]) -> list[str] | None:
    """The health check as an argv (``CMD-SHELL`` through ``sh -c``), or None."""
    test = (svc.get("healthcheck") or {}).get("test")
    if not test or (svc.get("healthcheck") or {}).get("disable"):
        return None
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *rest = test
    if kind == "NONE":
        return None
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else list(rest)


def volume_mounts(svc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(source, container path)`` of a service's volumes (short syntax)."""
    return [(v.split(":")[0], v.split(":")[1]) for v in svc.get("volumes") or []]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def container_ports(compose: Mapping[str, Any]) -> set[int]:
    """Every port a container listens on or is reached at: ``host:port`` of a service (or localhost),
    the argument after a port option, and the container side of published ``ports``."""
    hosts = {*compose["services"], "localhost", "0.0.0.0"}
    ports: set[int] = set()
    for name in compose["services"]:
        svc = service(compose, name)
        for s in _strings(svc):
            ports.update(int(m["port"]) for m in _HOST_PORT.finditer(s) if m["host"] in hosts)
        for args in (command(svc), healthcheck(svc) or []):
            ports.update(int(b) for a, b in itertools.pairwise(args) if a in PORT_FLAGS and b.isdigit())
        ports.update(int(str(p).split(":")[-1].split("/")[0]) for p in svc.get("ports") or [])
    return ports


@dataclass
class Loopback:
    """The rewrite from the compose network and the containers' file systems to this machine."""

    hosts: frozenset[str]
    ports: dict[int, int]
    root: Path
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)  # service -> {container path: volume}
    image_paths: dict[str, str] = field(default_factory=dict)  # e.g. the image's python -> a venv's

    def __post_init__(self) -> None:
        names = "|".join(re.escape(h) for h in sorted(self.hosts, key=len, reverse=True))
        self._host = re.compile(rf"(?<![\w.-])(?:{names})(?![\w.-])")

    def port(self, container_port: int) -> int:
        return self.ports[container_port]

    def apply(self, svc: str, value: str) -> str:
        """``value`` (an argument, an environment value, a health check) as it runs here for ``svc``."""
        if value.startswith("/"):
            return self.path(svc, value)
        value = self._host.sub("127.0.0.1", value)
        return _NUMBER.sub(lambda m: str(self.ports.get(int(m[1]), m[1])), value)

    def path(self, svc: str, container_path: str) -> str:
        if container_path in self.image_paths:
            return self.image_paths[container_path]
        for target, volume in sorted(self.volumes.get(svc, {}).items(), key=lambda kv: -len(kv[0])):
            if container_path == target or container_path.startswith(target + "/"):
                return str(self.root / "volumes" / volume) + container_path[len(target):]
        return str(self.root / svc) + container_path

    def apply_yaml(self, svc: str, value: Any, key: str = "") -> Any:
        """A mounted YAML file's content rewritten (strings, and ``port:`` numbers)."""
        if isinstance(value, str):
            return self.apply(svc, value)
        if isinstance(value, int) and not isinstance(value, bool) and key == "port":
            return self.ports.get(value, value)
        if isinstance(value, list):
            return [self.apply_yaml(svc, v) for v in value]
        if isinstance(value, dict):
            return {k: self.apply_yaml(svc, v, str(k)) for k, v in value.items()}
        return value


def loopback_for(compose: Mapping[str, Any], root: Path, free_port: Any, image_paths: dict[str, str]) -> Loopback:
    """One :class:`Loopback` for the whole compose file: a free loopback port per container port."""
    volumes = {name: {target: src for src, target in volume_mounts(service(compose, name))
                      if src in (compose.get("volumes") or {})}
               for name in compose["services"]}
    return Loopback(hosts=frozenset({*compose["services"], "localhost", "0.0.0.0"}),
                    ports={p: free_port() for p in sorted(container_ports(compose))},
                    root=root, volumes=volumes, image_paths=image_paths)
