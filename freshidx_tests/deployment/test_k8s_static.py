"""docker/k8s/ checked without a cluster: the Helm values for Dagster's chart and the Spark Connect manifest.

* Every key values.yaml sets is one the chart has. The chart is not vendored: CHART_KEYS lists the keys
  this project relies on, read from the chart of dagster 1.13.x (dagster-io/dagster, ``helm/dagster``:
  ``schema/schema/charts/dagster/values.py`` and ``subschema/*.py``, ``charts/dagster-user-deployments``,
  ``templates/helpers/instance/*.tpl``; top-level ``concurrency`` is recent: older charts lack it).
* The instance the chart renders from these values names stock Dagster classes only and keeps the
  one-machine dagster.yaml's limits, queue, monitoring and sensor settings.
* Every FRESHIDX_* variable is a setting with a valid value; the code server serves freshidx.definitions.
* The Spark Connect Deployment shares no volume with other pods, its probes and Service match the ports
  its command listens on, and the runs point at that Service; both files name the same image.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from freshidx.cli import parse
from freshidx.defs.shared.lanes import POOL_LIMITS
from freshidx.settings import Settings
from freshidx_tests.deployment.test_docker_static import freshidx_classes

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "docker" / "k8s"
VALUES: dict[str, Any] = yaml.safe_load((K8S / "values.yaml").read_text())
MANIFESTS: list[dict[str, Any]] = [d for d in yaml.safe_load_all((K8S / "spark-connect.yaml").read_text()) if d]
UD = "dagster-user-deployments.deployments[]"
K8S_LAUNCHER = "runLauncher.config.k8sRunLauncher"
S3_LOGS = "computeLogManager.config.s3ComputeLogManager"
QUEUE = "dagsterDaemon.runCoordinator.config.queuedRunCoordinator"
#: Chart keys (dotted; ``[]`` = an item of a list) values.yaml may set, as the chart of dagster 1.13.x has them.
CHART_KEYS = {
    "global.postgresqlSecretName", "generatePostgresqlPasswordSecret", "telemetry.enabled",
    *(f"dagster-user-deployments.{k}" for k in ("enabled", "enableSubchart", "deployments")),
    *(f"{UD}.{k}" for k in ("name", "image", "image.repository", "image.tag", "image.pullPolicy", "dagsterApiGrpcArgs",
                            "codeServerArgs", "port", "includeConfigInLaunchedRuns",
                            "includeConfigInLaunchedRuns.enabled", "env", "envConfigMaps", "envSecrets", "resources")),
    "dagsterWebserver.replicaCount", "dagsterWebserver.env", "dagsterWebserver.envSecrets",
    "runLauncher.type", "runLauncher.config", K8S_LAUNCHER,
    *(f"{K8S_LAUNCHER}.{k}" for k in ("envSecrets", "envConfigMaps", "envVars", "jobNamespace", "resources")),
    "postgresql.enabled", "postgresql.postgresqlHost", "postgresql.postgresqlUsername", "postgresql.postgresqlPassword",
    "postgresql.postgresqlDatabase", "postgresql.service", "postgresql.service.port",
    "computeLogManager.type", "computeLogManager.config", S3_LOGS,
    *(f"{S3_LOGS}.{k}" for k in ("bucket", "prefix", "region", "endpointUrl", "localDir", "uploadInterval")),
    "dagsterDaemon.env", "dagsterDaemon.envSecrets", "dagsterDaemon.runCoordinator",
    "dagsterDaemon.runCoordinator.enabled", "dagsterDaemon.runCoordinator.type", "dagsterDaemon.runCoordinator.config",
    QUEUE, f"{QUEUE}.dequeueIntervalSeconds", f"{QUEUE}.maxConcurrentRuns", f"{QUEUE}.tagConcurrencyLimits",
    "dagsterDaemon.runMonitoring", *(f"dagsterDaemon.runMonitoring.{k}" for k in (
        "enabled", "startTimeoutSeconds", "cancelTimeoutSeconds", "maxResumeRunAttempts", "pollIntervalSeconds",
        "freeSlotsAfterRunEndSeconds")),
    "dagsterDaemon.sensors", "dagsterDaemon.sensors.useThreads", "dagsterDaemon.sensors.numWorkers",
    "concurrency", "concurrency.enabled", "concurrency.pools", "concurrency.pools.defaultLimit",
    "concurrency.pools.granularity", "concurrency.runs", "concurrency.runs.maxConcurrentRuns",
    "concurrency.runs.tagConcurrencyLimits",
    "retention.enabled", "retention.sensor", "retention.sensor.purgeAfterDays",
}
#: Chart keys whose value is handed on whole (Kubernetes objects, argument lists): not descended into.
OPAQUE = {"env", "envSecrets", "envConfigMaps", "resources", "dagsterApiGrpcArgs", "codeServerArgs",
          "tagConcurrencyLimits", "purgeAfterDays"}
#: Volume kinds local to one pod; anything else (a PVC, hostPath, NFS, ...) could be shared.
POD_LOCAL_VOLUMES = {"emptyDir", "configMap", "secret", "downwardAPI", "projected"}
#: Variables the pods read that are not FRESHIDX_* settings.
KNOWN_ENV = {"AWS_REGION"}


def chart_keys(value: Any, prefix: str = "") -> Iterator[str]:
    """Every key path of a values mapping, down to the chart's leaves (OPAQUE keys are leaves)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            if key not in OPAQUE:
                yield from chart_keys(sub, path)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for item in value:
            yield from chart_keys(item, f"{prefix}[]")


def with_parents(keys: set[str]) -> set[str]:
    """The keys and every mapping that holds one (``a.b[].c`` is held by ``a.b`` and ``a``)."""
    parts = [k.split(".") for k in keys]
    return {".".join(p[:n]).removesuffix("[]") for p in parts for n in range(1, len(p) + 1)}


def get(path: str) -> Any:
    value: Any = VALUES
    for key in path.split("."):
        value = value[key]
    return value


def deployment() -> dict[str, Any]:
    (only,) = get("dagster-user-deployments.deployments")
    return dict(only)


def run_env() -> dict[str, str]:
    """What the code server and (includeConfigInLaunchedRuns) every run pod get as env values."""
    return {e["name"]: e["value"] for e in deployment()["env"]}


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [m for m in MANIFESTS if m["kind"] == kind]
    return found


def container() -> dict[str, Any]:
    (only,) = manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(only)


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_values_set_only_keys_the_chart_has() -> None:
    known = with_parents(CHART_KEYS)
    unknown = sorted(set(chart_keys(VALUES)) - known)
    assert not unknown, f"not keys of the dagster chart (or missing from CHART_KEYS after checking it): {unknown}"
    misspelt = {"dagsterDaemon": {"runMonitoring": {"pollIntervalSecond": 30}}}
    assert set(chart_keys(misspelt)) - known == {"dagsterDaemon.runMonitoring.pollIntervalSecond"}


def test_the_instance_names_stock_dagster_classes_only() -> None:
    assert get("runLauncher.type") == "K8sRunLauncher"  # dagster_k8s
    assert get("computeLogManager.type") == "S3ComputeLogManager"  # dagster_aws.s3.compute_log_manager
    assert get("dagsterDaemon.runCoordinator.type") == "QueuedRunCoordinator"
    assert "additionalInstanceConfig" not in VALUES
    for block in ("runLauncher", "computeLogManager", "dagsterDaemon", "concurrency", "retention"):
        assert not freshidx_classes(VALUES[block]), block
        assert "freshidx." not in yaml.safe_dump(VALUES[block]), f"{block} names something of freshidx"


def test_the_instance_keeps_the_one_machine_settings() -> None:
    base = yaml.safe_load((REPO / "dagster.yaml").read_text())
    pools, runs = get("concurrency.pools"), get("concurrency.runs")
    assert get("concurrency.enabled") is True
    assert {"default_limit": pools["defaultLimit"], "granularity": pools["granularity"]} == base["concurrency"]["pools"]
    assert {"max_concurrent_runs": runs["maxConcurrentRuns"],
            "tag_concurrency_limits": runs["tagConcurrencyLimits"]} == base["concurrency"]["runs"]
    # the default limit is the limit each pool of the definitions needs
    assert set(POOL_LIMITS.values()) == {pools["defaultLimit"]}, POOL_LIMITS
    # Dagster refuses run limits in the run coordinator once the instance has a concurrency block
    assert not {"maxConcurrentRuns", "tagConcurrencyLimits"} & set(get(QUEUE)), get(QUEUE)
    assert get(f"{QUEUE}.dequeueIntervalSeconds") == base["run_queue"]["dequeue_interval_seconds"]
    monitoring = get("dagsterDaemon.runMonitoring")
    assert monitoring["enabled"] is True and base["run_monitoring"]["enabled"] is True
    assert monitoring["pollIntervalSeconds"] == base["run_monitoring"]["poll_interval_seconds"]
    assert monitoring["maxResumeRunAttempts"] == 0  # a dead run is replaced by freshidx's sensors, not resumed
    sensors = get("dagsterDaemon.sensors")
    assert {"use_threads": sensors["useThreads"], "num_workers": sensors["numWorkers"]} == base["sensors"]
    assert base["retention"]["sensor"]["purge_after_days"].items() <= get("retention.sensor.purgeAfterDays").items()
    assert get("telemetry.enabled") is base["telemetry"]["enabled"]


def test_every_freshidx_variable_is_a_setting_with_a_valid_value() -> None:
    settings = {Settings.env_name(f) for f in Settings.model_fields}
    env = run_env()
    for var, value in env.items():
        assert var in settings or var in KNOWN_ENV, f"{var} is neither a FRESHIDX_* setting nor known"
        if var in settings:
            Settings.from_env({}, **{var.removeprefix("FRESHIDX_").lower(): value})
    assert env["FRESHIDX_STORE"].startswith("s3://")
    assert env["FRESHIDX_DELTA_MODE"] == "continuous"
    assert "FRESHIDX_SPARK_SERVER_STATE" not in env, "no shared filesystem: the control endpoint instead"
    assert "env" not in container(), "the Connect server needs no settings and no store credentials"


def test_secrets_reach_every_process_that_touches_s3() -> None:
    secret = [{"name": "freshidx-aws"}]
    assert deployment()["envSecrets"] == secret  # the code server and its run pods: the index store
    assert deployment()["includeConfigInLaunchedRuns"] == {"enabled": True}
    for holder in ("dagsterWebserver", "dagsterDaemon", K8S_LAUNCHER):  # the run logs on S3
        assert get(f"{holder}.envSecrets") == secret, holder
    assert not re.search(r"AWS_SECRET_ACCESS_KEY|AWS_ACCESS_KEY_ID|AWS_SESSION_TOKEN", yaml.safe_dump(VALUES))
    assert "postgresqlPassword" not in get("postgresql"), "the password comes from global.postgresqlSecretName"


def test_the_code_server_serves_freshidx_definitions() -> None:
    d = deployment()
    args = d["dagsterApiGrpcArgs"]
    module = args[args.index("--module-name") + 1]
    assert module == "freshidx.definitions" and importlib.util.find_spec(module) is not None
    assert not {"-h", "--host", "-p", "--port"} & set(args), "the chart adds the host and port itself"
    assert isinstance(d["port"], int)


def test_the_spark_connect_deployment_shares_nothing_and_probes_its_ports() -> None:
    dep = manifest("Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    c = container()
    cmd = c["command"]
    assert cmd[:2] == ["freshidx", "spark-server"]
    parse(cmd[1:])  # exits on an unknown option
    Settings.from_env({}, spark_master=option(cmd, "--master"))
    assert option(cmd, "--host") == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"spark-connect": int(option(cmd, "--port")), "control": int(option(cmd, "--control-port"))}
    # the supervisor's port for liveness (it answers while the JVM restarts), the JVM's for readiness
    assert c["startupProbe"]["tcpSocket"]["port"] == c["livenessProbe"]["tcpSocket"]["port"] == "control"
    assert c["readinessProbe"]["tcpSocket"]["port"] == "spark-connect"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    volumes = dep["spec"]["template"]["spec"].get("volumes") or []
    for v in volumes:
        kinds = set(v) - {"name"}
        assert kinds <= POD_LOCAL_VOLUMES, f"volume {v['name']} may be shared with other pods: {kinds}"
    assert {m["name"] for m in c.get("volumeMounts") or []} <= {v["name"] for v in volumes}
    assert option(cmd, "--state-dir") in {m["mountPath"] for m in c["volumeMounts"]}


def test_the_runs_point_at_the_spark_connect_service() -> None:
    svc, dep = manifest("Service"), manifest("Deployment")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["publishNotReadyAddresses"] is True  # the control endpoint while the JVM restarts
    container_ports = {p["name"] for p in container()["ports"]}
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    assert {p["targetPort"] for p in by_name.values()} <= container_ports
    host = svc["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9-]+", host)  # a host name of sc:// URLs: java.net.URI rejects "_"
    env = run_env()
    assert env["FRESHIDX_SPARK_REMOTE"] == f"sc://{host}:{by_name['spark-connect']['port']}"
    assert env["FRESHIDX_SPARK_SERVER_URL"] == f"http://{host}:{by_name['control']['port']}"


def test_both_files_name_the_same_image() -> None:
    image = deployment()["image"]
    assert f"{image['repository']}:{image['tag']}" == container()["image"]
    assert image["tag"] != "latest", "run pods start from the tag the code server reports: a unique tag"


def test_the_docs_set_the_limits_of_every_pool() -> None:
    section = (REPO / "docs" / "deployment.md").read_text().split("\n## Kubernetes", 1)[1].split("\n## ", 1)[0]
    for pool, limit in POOL_LIMITS.items():
        assert f"dagster instance concurrency set {pool} {limit}" in section, pool
    for name in ("values.yaml", "spark-connect.yaml"):
        assert f"docker/k8s/{name}" in section, name


def test_the_image_has_what_a_run_pod_loads() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    extras = set(re.findall(r"extras\['(\w+)'\]", dockerfile))
    installed = [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    names = {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in installed}
    assert {"dagster-postgres", "dagster-aws", "dagster-k8s"} <= names, names
