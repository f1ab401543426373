"""docker/ checked without a container engine: the compose file parses, everything it names exists in
the project (Dockerfile and what it copies, mounted files, modules, CLI commands and options, FRESHIDX_*
settings), the instance config keeps the one-machine dagster.yaml's settings, and the containers run the
commands that test_cluster.py and test_postgres_e2e.py exercise."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml

from freshidx.cli import parse
from freshidx.settings import Settings
from freshidx_tests.test_postgres_e2e import grpc_command

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = {n: s for n, s in SERVICES.items() if s.get("image") == "freshidx:latest"}
#: Variables the containers read that are not FRESHIDX_* settings, and who reads them.
KNOWN_ENV = {
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",  # boto3 / pyarrow.fs
    "DAGSTER_HOME", "DAGSTER_CURRENT_IMAGE", "DAGSTER_POSTGRES_URL",  # dagster, dagster.postgres.yaml
    "PYSPARK_PYTHON", "SPARK_LOCAL_HOSTNAME", "SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY",  # Spark, resources.py
    "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",  # images
}


def command(name: str) -> list[str]:
    cmd = SERVICES[name]["command"]
    if cmd[:2] == ["sh", "-c"]:
        return [a.strip('"') for a in cmd[2].replace("exec ", "", 1).split()]
    return list(cmd)


def env(name: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in (SERVICES[name].get("environment") or {}).items()}


def test_compose_services_and_names() -> None:
    assert {"freshidx-postgresql", "freshidx-store", "spark-master", "spark-worker", "spark-connect",
            "freshidx-user-code", "freshidx-webserver", "freshidx-daemon"} <= set(SERVICES)
    for name in SERVICES:  # they are host names in spark:// and sc:// URLs: java.net.URI rejects "_"
        assert re.fullmatch(r"[a-z0-9-]+", name), name
    for s in SERVICES.values():
        for dep in s.get("depends_on") or []:
            assert dep in SERVICES, dep


def test_dockerfile_and_every_mounted_or_copied_file_exist() -> None:
    builds = [s["build"] for s in SERVICES.values() if "build" in s]
    assert builds, "the freshidx image is built by the compose file"
    for b in builds:
        context = (DOCKER / b["context"]).resolve()
        dockerfile = context / b["dockerfile"]
        assert context == REPO and dockerfile.is_file()
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile.name} copies missing {src}"
    for s in SERVICES.values():
        for vol in s.get("volumes") or []:
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (DOCKER / src).is_file(), vol
            else:
                assert src in (COMPOSE.get("volumes") or {}), f"undeclared volume {src}"


def test_commands_exist_in_the_project() -> None:
    for name in OURS:
        cmd = command(name)
        if cmd[0] == "freshidx":
            parse(cmd[1:])  # exits (SystemExit) on an unknown subcommand or option
        elif cmd[:3] == ["dagster", "api", "grpc"]:
            module = cmd[cmd.index("--module-name") + 1]
            assert importlib.util.find_spec(module) is not None, module
        elif cmd[0] in ("dagster-webserver", "dagster-daemon"):
            workspace = cmd[cmd.index("-w") + 1]
            mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
            assert workspace in mounted, f"{name}: {workspace} is not mounted"
        else:
            assert cmd[0] == "spark-class", cmd
    assert 'ENV PATH=$SPARK_HOME/bin' in (DOCKER / "Dockerfile").read_text()  # spark-class on PATH


def test_containers_run_what_the_tests_exercise() -> None:
    from freshidx_tests import cluster_fixture

    src = Path(cluster_fixture.__file__).read_text()
    for name, cls in (("spark-master", "org.apache.spark.deploy.master.Master"),
                      ("spark-worker", "org.apache.spark.deploy.worker.Worker")):
        cmd = command(name)
        assert cmd[:2] == ["spark-class", cls] and f'"{cls}"' in src, cmd
    assert command("spark-worker")[2] == "spark://spark-master:7077"
    # the code location: the same `dagster api grpc` invocation as test_postgres_e2e (host/port aside)
    grpc = command("freshidx-user-code")
    assert grpc[:5] == grpc_command(0)[2:7], grpc
    # the workspace the webserver/daemon load points at that gRPC server
    ws = yaml.safe_load((DOCKER / "workspace.grpc.yaml").read_text())["load_from"][0]["grpc_server"]
    assert ws["host"] == "freshidx-user-code" and str(ws["port"]) == grpc[grpc.index("--port") + 1]
    # spark-connect: `freshidx spark-server --master spark://…` attached to the cluster, as in test_cluster.py
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
                field = var.removeprefix("FRESHIDX_").lower()
                if "${" not in value:
                    Settings.from_env({}, **{field: value})  # a valid value for that setting
    # the same variable wired into the code location and the Spark workers (executors open the store)
    assert env("freshidx-user-code")["FRESHIDX_STORE"] == env("spark-worker")["FRESHIDX_STORE"]
    assert "DAGSTER_POSTGRES_URL" in (DOCKER / "dagster.postgres.yaml").read_text()


def test_postgres_instance_config_keeps_the_one_machine_settings() -> None:
    pg = yaml.safe_load((DOCKER / "dagster.postgres.yaml").read_text())
    base = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert pg["storage"] == {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}
    for key, value in base.items():  # a block added to dagster.yaml must be carried over here too
        assert pg.get(key) == value, f"docker/dagster.postgres.yaml differs from dagster.yaml in {key!r}"
    assert pg["run_launcher"]["class"] == "DefaultRunLauncher"
    import dagster_postgres

    assert dagster_postgres.__version__ == "0.29.27"
