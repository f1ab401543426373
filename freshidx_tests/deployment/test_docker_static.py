"""docker/ checked without a container engine.

* The compose file validates against the Compose specification's JSON schema. That schema is vendored
  unchanged as freshidx_tests/data/compose-spec.json: ``schema/compose-spec.json`` of the public
  repository compose-spec/compose-spec (JSON has no comments, so its origin is recorded here).
* Everything the compose file names exists in the project (Dockerfile and what it copies, mounted files,
  modules, CLI commands and options, FRESHIDX_* settings), and every variable the instance reads is set.
* Every shipped Dagster instance config names stock classes only (no ``module``/``class`` under
  freshidx), and docker/dagster.postgres.yaml keeps the one-machine dagster.yaml's settings.
* The image builds from a base pinned to a Debian release, with a JRE that release has; the
  dependencies are installed from wheels before the freshidx code is copied.
* Long-running services restart and have health checks, which probe the ports they listen on; MinIO is
  pinned to a release with conditional writes (2024-05-07 or later).
* test_compose_deployment.py can run every service: its command, or a stand-in for the three images
  that cannot run here.
"""

from __future__ import annotations

import copy
import datetime as dt
import importlib.util
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from freshidx.cli import parse
from freshidx.settings import Settings
from freshidx_tests.support import compose_file
from freshidx_tests.support.compose_file import IMAGE_ENV, PORT_FLAGS, environment, healthcheck, load_compose, service

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE: dict[str, Any] = load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = {n: s for n, s in SERVICES.items() if s.get("image") == "freshidx:latest"}
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
#: Variables the containers read that are not FRESHIDX_* settings, and who reads them.
KNOWN_ENV = {
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",  # boto3 / pyarrow.fs
    "DAGSTER_HOME", "DAGSTER_CURRENT_IMAGE", "DAGSTER_POSTGRES_URL",  # dagster, dagster.postgres.yaml
    "DAGSTER_COMPUTE_LOGS_BUCKET", "DAGSTER_COMPUTE_LOGS_PREFIX",  # dagster.postgres.yaml's compute_logs
    "DAGSTER_COMPUTE_LOGS_ENDPOINT_URL", "DAGSTER_COMPUTE_LOGS_LOCAL_DIR",
    "PYSPARK_PYTHON", "SPARK_LOCAL_HOSTNAME", "SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY",  # Spark, resources
    "SPARK_WORKER_DIR",
    "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",  # images
}
#: The JRE each Debian release has (Spark 4 runs on 17 or 21): bookworm has 17, trixie only 21.
DEBIAN_JRE = {"bookworm": "openjdk-17-jre-headless", "trixie": "openjdk-21-jre-headless"}
#: Instance configs the project ships (any other dagster*.yaml under docker/ or freshidx_tests/ too).
INSTANCE_CONFIGS = [REPO / "dagster.yaml", REPO / "freshidx" / "dagster_home" / "dagster.yaml",
                    DOCKER / "dagster.postgres.yaml"]
#: The first MinIO release with conditional writes (If-None-Match: *), which the pointer swap needs.
MINIO_CONDITIONAL_WRITES = dt.date(2024, 5, 7)


def command(name: str) -> list[str]:
    cmd = SERVICES[name]["command"]
    if cmd[:2] == ["sh", "-c"]:
        return [a.strip('"') for a in cmd[2].replace("exec ", "", 1).split()]
    return list(cmd)


def pool_limits_set(name: str) -> dict[str, int]:
    """The pool limits a service's command sets (``dagster instance concurrency set POOL LIMIT``)."""
    found = re.findall(r"dagster instance concurrency set (\S+) (\d+)", " ".join(SERVICES[name]["command"]))
    return {pool: int(limit) for pool, limit in found}


def env(name: str) -> dict[str, str]:
    """The service's environment, interpolated with every default."""
    return environment(service(COMPOSE, name))


def one_shot() -> set[str]:
    """Services others wait for to complete (the bucket init), not to keep running."""
    return {dep for s in SERVICES.values() for dep, c in _depends_on(s).items()
            if c.get("condition") == "service_completed_successfully"}


def _depends_on(svc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = svc.get("depends_on") or {}
    return {d: {} for d in deps} if isinstance(deps, list) else {d: c or {} for d, c in deps.items()}


def test_compose_file_validates_against_the_compose_spec() -> None:
    schema = json.loads((Path(__file__).parents[1] / "data" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert not errors, errors
    broken = copy.deepcopy(COMPOSE)  # the schema is strict: a misspelt key does not pass
    broken["services"]["spark-master"]["healthcheck"]["intervall"] = "5s"
    assert not validator.is_valid(broken)


def test_compose_services_and_names() -> None:
    assert {"freshidx-postgresql", "freshidx-store", "spark-master", "spark-worker", "spark-connect",
            "freshidx-user-code", "freshidx-webserver", "freshidx-daemon"} <= set(SERVICES)
    for name in SERVICES:  # they are host names in spark:// and sc:// URLs: java.net.URI rejects "_"
        assert re.fullmatch(r"[a-z0-9-]+", name), name
    for s in SERVICES.values():
        for dep in _depends_on(s):
            assert dep in SERVICES, dep


def test_dockerfile_and_every_mounted_or_copied_file_exist() -> None:
    builds = [s["build"] for s in SERVICES.values() if "build" in s]
    assert builds, "the freshidx image is built by the compose file"
    for b in builds:
        context = (DOCKER / b["context"]).resolve()
        dockerfile = context / b["dockerfile"]
        assert context == REPO and dockerfile.is_file()
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for src in [a for a in line.split()[1:-1] if not a.startswith("--")]:
                    assert (context / src).exists(), f"{dockerfile.name} copies missing {src}"
    for s in SERVICES.values():
        for vol in s.get("volumes") or []:
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (DOCKER / src).is_file(), vol
            else:
                assert src in (COMPOSE.get("volumes") or {}), f"undeclared volume {src}"


def _stages() -> list[list[str]]:
    """The Dockerfile's stages as lists of instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    stages: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages and line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_dockerfile_base_is_a_pinned_debian_release_with_its_jre() -> None:
    stages = _stages()
    bases = [s[0].split()[1] for s in stages]
    releases = {m[1] if (m := re.fullmatch(r"python:3\.11-slim-(\w+)", b)) else b for b in bases}
    assert len(releases) == 1 and next(iter(releases)) in DEBIAN_JRE, f"unpinned or unknown base: {bases}"
    release = next(iter(releases))
    installs = [i for i in stages[-1] if "apt-get install" in i]
    assert installs and DEBIAN_JRE[release] in installs[0], (release, installs)
    others = set(DEBIAN_JRE.values()) - {DEBIAN_JRE[release]}
    assert not any(jre in installs[0] for jre in others), installs


def test_dependencies_are_installed_from_wheels_before_the_code_is_copied() -> None:
    stages = _stages()
    assert len(stages) >= 2, "a builder stage makes the wheels"
    builder, final = stages[0], stages[-1]
    # the builder makes wheels from the lock, and never sees the code (a code change rebuilds nothing)
    assert any("pip wheel" in i and "requirements.lock" in i for i in builder), builder
    assert not any(i.startswith("COPY") and "freshidx" in i.split()[1:-1] for i in builder), builder
    deps = next(n for n, i in enumerate(final) if "pip install" in i and "--find-links" in i)
    assert "--no-index" in final[deps] and "from=builder" in final[deps], final[deps]
    code = next(n for n, i in enumerate(final) if re.match(r"COPY (\S+ )*freshidx\b", i))
    assert deps < code, "the dependencies' layer comes before COPY freshidx"
    own = [i for i in final[code:] if "pip install" in i]
    assert own and all("--no-deps" in i for i in own), own
    # the image environment test_compose_deployment stands in for
    env_lines = " ".join(i for i in final if i.startswith("ENV "))
    for var, value in IMAGE_ENV.items():
        assert f"{var}={value}" in env_lines, var
    assert "PATH=$SPARK_HOME/bin" in env_lines  # spark-class on PATH


def test_commands_exist_in_the_project() -> None:
    for name in OURS:
        cmd = command(name)
        if cmd[0] == "freshidx":
            parse(cmd[1:])  # exits (SystemExit) on an unknown subcommand or option
        elif cmd[:3] == ["dagster", "api", "grpc"]:
            module = cmd[cmd.index("--module-name") + 1]
            assert importlib.util.find_spec(module) is not None, module
        elif cmd[:3] == ["dagster", "instance", "concurrency"]:
            from freshidx.defs.shared.lanes import POOL_LIMITS

            assert pool_limits_set(name) == POOL_LIMITS, "the limits of the pools the assets use"
        elif cmd[0] in ("dagster-webserver", "dagster-daemon"):
            workspace = cmd[cmd.index("-w") + 1]
            mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
            assert workspace in mounted, f"{name}: {workspace} is not mounted"
        else:
            assert cmd[0] == "spark-class", cmd


def test_the_deployment_test_runs_every_service() -> None:
    from freshidx_tests.deployment import test_compose_deployment
    from freshidx_tests.support import cluster_fixture, compose_processes

    stand_ins = {test_compose_deployment.POSTGRES, test_compose_deployment.STORE, test_compose_deployment.STORE_INIT}
    assert stand_ins == set(SERVICES) - set(OURS), "every image but ours has a stand-in"
    assert set(test_compose_deployment.start_order(COMPOSE)) == set(SERVICES)
    # the webserver and daemon run from the instance virtualenv: what the stock instance needs
    assert {"dagster-webserver", "dagster-postgres", "dagster-aws"} <= set(compose_processes.INSTANCE_PACKAGES)
    src = Path(cluster_fixture.__file__).read_text()
    for name, cls in (("spark-master", "org.apache.spark.deploy.master.Master"),
                      ("spark-worker", "org.apache.spark.deploy.worker.Worker")):
        cmd = command(name)
        assert cmd[:2] == ["spark-class", cls] and f'"{cls}"' in src, cmd  # the classes test_cluster starts
    assert command("spark-worker")[2] == "spark://spark-master:7077"
    grpc = command("freshidx-user-code")
    # the workspace the webserver/daemon load points at that gRPC server
    ws = yaml.safe_load((DOCKER / "workspace.grpc.yaml").read_text())["load_from"][0]["grpc_server"]
    assert ws["host"] == "freshidx-user-code" and str(ws["port"]) == grpc[grpc.index("--port") + 1]
    connect = command("spark-connect")
    assert connect[:2] == ["freshidx", "spark-server"]
    assert connect[connect.index("--master") + 1] == "spark://spark-master:7077"
    port = connect[connect.index("--port") + 1]
    assert env("freshidx-user-code")["FRESHIDX_SPARK_REMOTE"] == f"sc://spark-connect:{port}"


def test_every_env_var_is_a_setting_or_known() -> None:
    settings = {Settings.env_name(f) for f in Settings.model_fields}
    for name in SERVICES:
        for var, value in env(name).items():
            assert var in settings or var in KNOWN_ENV, f"{name}: {var} is neither a FRESHIDX_* setting nor known"
            if var in settings:
                Settings.from_env({}, **{var.removeprefix("FRESHIDX_").lower(): value})  # a valid value
    # the same variable wired into the code location and the Spark workers (executors open the store)
    assert env("freshidx-user-code")["FRESHIDX_STORE"] == env("spark-worker")["FRESHIDX_STORE"]
    # every variable the instance reads is set wherever the instance is loaded
    instance = yaml.safe_load((DOCKER / "dagster.postgres.yaml").read_text())
    wanted = set(_env_refs(instance))
    assert {"DAGSTER_POSTGRES_URL", "DAGSTER_COMPUTE_LOGS_BUCKET"} <= wanted
    for name in ("freshidx-user-code", "freshidx-webserver", "freshidx-daemon"):
        assert wanted <= set(env(name)), f"{name} lacks {wanted - set(env(name))}"


def _env_refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {"env"}:
            yield value["env"]
        for v in value.values():
            yield from _env_refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _env_refs(v)


def test_compute_logs_go_to_a_bucket_of_the_store_the_init_container_creates() -> None:
    init = " ".join(SERVICES["freshidx-store-init"]["command"])
    made = set(re.findall(r"mc mb (?:-p )?\w+/([\w.-]+)", init))
    web = env("freshidx-webserver")
    assert web["DAGSTER_COMPUTE_LOGS_BUCKET"] in made, (web, made)
    assert env("freshidx-user-code")["FRESHIDX_STORE"].split("/")[2] in made
    assert web["DAGSTER_COMPUTE_LOGS_ENDPOINT_URL"] == env("freshidx-user-code")["FRESHIDX_S3_ENDPOINT_URL"]
    instance = yaml.safe_load((DOCKER / "dagster.postgres.yaml").read_text())
    assert instance["compute_logs"]["module"] == "dagster_aws.s3.compute_log_manager"
    assert instance["compute_logs"]["class"] == "S3ComputeLogManager"


def freshidx_classes(value: Any) -> list[str]:
    """Every ``module:``/``class:`` value in an instance config that names something under freshidx."""
    found: list[str] = []
    if isinstance(value, dict):
        for key in ("module", "class"):
            if isinstance(value.get(key), str) and re.match(r"freshidx(\b|_)", value[key]):
                found.append(f"{key}: {value[key]}")
        for v in value.values():
            found.extend(freshidx_classes(v))
    elif isinstance(value, list):
        for v in value:
            found.extend(freshidx_classes(v))
    return found


def test_no_instance_config_names_a_freshidx_class() -> None:
    assert freshidx_classes({"run_coordinator": {"module": "freshidx.defs.x", "class": "Lane"}})  # it finds them
    configs = {*INSTANCE_CONFIGS, *DOCKER.rglob("dagster*.yaml"), *(REPO / "freshidx_tests").rglob("dagster*.yaml")}
    for path in sorted(configs):
        assert path.is_file(), path
        found = freshidx_classes(yaml.safe_load(path.read_text()))
        assert not found, f"{path.relative_to(REPO)} is not a stock Dagster instance: {found}"


def _queue(cfg: dict[str, Any]) -> Any:
    """The run queue's settings, however spelled (``run_queue`` or Dagster's QueuedRunCoordinator)."""
    coordinator = cfg.get("run_coordinator") or {}
    if coordinator.get("class") == "QueuedRunCoordinator":
        return coordinator.get("config") or {}
    return cfg.get("run_queue", coordinator or None)


def test_postgres_instance_config_keeps_the_one_machine_settings() -> None:
    pg = yaml.safe_load((DOCKER / "dagster.postgres.yaml").read_text())
    base = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert pg["storage"] == {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}
    assert _queue(pg) == _queue(base), "the run queue's settings"
    deployment_only = {"storage", "compute_logs", "run_launcher", "run_queue", "run_coordinator"}
    for key, value in base.items():  # a block added to dagster.yaml must be carried over here too
        if key not in deployment_only:
            assert pg.get(key) == value, f"docker/dagster.postgres.yaml differs from dagster.yaml in {key!r}"
    assert pg["run_launcher"]["class"] == "DefaultRunLauncher"
    assert pg["concurrency"]["pools"] == {"default_limit": 1, "granularity": "run"}
    import tomllib

    import dagster_postgres
    from packaging.requirements import Requirement

    # The installed dagster-postgres reads this config: one of the releases pyproject.toml declares.
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["postgres"]
    assert Requirement(declared[0]).specifier.contains(dagster_postgres.__version__)


def test_long_running_services_restart_and_have_health_checks() -> None:
    once = one_shot()
    assert once == {"freshidx-store-init", "freshidx-instance-init"}
    assert "freshidx-instance-init" in _depends_on(SERVICES["freshidx-daemon"])  # limits before the first run
    for name, svc in SERVICES.items():
        if name in once:
            continue
        assert svc.get("restart") in ("unless-stopped", "on-failure", "always"), f"{name}: restart policy"
        assert healthcheck(service(COMPOSE, name)), f"{name}: health check"
        for dep, cond in _depends_on(svc).items():  # wait for a dependency's health, not its start
            assert cond.get("condition") == ("service_completed_successfully" if dep in once
                                             else "service_healthy"), (name, dep, cond)


def test_health_checks_probe_the_ports_their_services_listen_on() -> None:
    for name in set(OURS) - one_shot():
        cmd = compose_file.command(service(COMPOSE, name))
        args = " ".join(cmd).split()  # the worker's command is one shell string
        listens = {b for a, b in itertools.pairwise(args) if a in PORT_FLAGS}
        check = healthcheck(service(COMPOSE, name)) or []
        probed = {m[1] for a in check for m in re.finditer(r"localhost:(\d+)", a)}
        probed |= {b for a, b in itertools.pairwise(check) if a in PORT_FLAGS}
        if check[:1] == ["dagster-daemon"]:
            assert check == ["dagster-daemon", "liveness-check"]  # heartbeats, no port
            continue
        assert probed and probed <= listens, (name, probed, listens)


def test_minio_is_pinned_to_a_release_with_conditional_writes() -> None:
    images = {n: s["image"] for n, s in SERVICES.items() if re.search(r"minio/(minio|mc):", s.get("image", ""))}
    assert {"freshidx-store", "freshidx-store-init"} <= set(images), images
    for name, image in images.items():
        tag = re.fullmatch(r"(?:[\w.-]+/)?minio/(?:minio|mc):RELEASE\.(\d{4}-\d{2}-\d{2})T\d{2}-\d{2}-\d{2}Z", image)
        assert tag, f"{name}: {image} is not a pinned MinIO release"
        assert dt.date.fromisoformat(tag[1]) >= MINIO_CONDITIONAL_WRITES, image
