"""Run health never declares a run dead whose worker runs on another host or in another pid namespace
(K8sRunLauncher, DockerRunLauncher, a code location elsewhere): the worker pid is checked only where
the worker's own tag (freshidx/worker, written by the run's SparkResource) says it ran, and a run
without that tag only if this code location launched it. Real Dagster instance, no Spark, no mocks.
"""

from __future__ import annotations

import subprocess
import sys

import dagster as dg

from freshidx.defs.runs.health import reap_dead_runs, run_facts
from freshidx.defs.shared.resources import SparkResource
from freshidx.trigger import run_health
from freshidx.trigger.run_health import TAG_WORKER, RunFacts, here, judge, pid_alive, worker_identity

STARTED = dg.DagsterRunStatus.STARTED


@dg.asset
def touches_nothing(spark: SparkResource) -> None:
    """Requires the Spark resource (which is lazy: no session is made) and does nothing."""


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_judge_checks_a_pid_only_where_the_worker_ran() -> None:
    dead, at = _dead_pid(), 1e12  # recorded "now or later": only the pid's absence decides
    elsewhere = f"{dead}@another-host/pid:[4026531836]"
    facts = [
        RunFacts("here", "STARTED", dead, at, worker=f"{dead}@{here()}"),
        RunFacts("other-host", "STARTED", dead, at, worker=elsewhere),
        RunFacts("other-namespace", "STARTED", dead, at, worker=f"{dead}@{here().split('/')[0]}/pid:[1]"),
        RunFacts("untagged-ours", "STARTED", dead, at),
        RunFacts("untagged-elsewhere", "STARTED", dead, at, launched_here=False),
    ]
    assert sorted(v.run_id for v in judge(facts, pid_alive)) == ["here", "untagged-ours"]
    assert worker_identity().startswith(f"{__import__('os').getpid()}@") and worker_identity().endswith(here())


def test_the_run_worker_tags_where_it_runs_and_reap_leaves_runs_of_other_hosts_alone() -> None:
    defs = dg.Definitions(assets=[touches_nothing], resources={"spark": SparkResource()})
    with dg.instance_for_test() as instance:
        done = dg.materialize([touches_nothing], resources={"spark": SparkResource()}, instance=instance)
        ran = instance.get_run_by_id(done.run_id)
        assert ran is not None and ran.tags[TAG_WORKER] == worker_identity()

        job = defs.resolve_implicit_global_asset_job_def()
        dead = _dead_pid()
        runs = {}
        for name, tag in (("k8s", f"{dead}@run-pod-7f9c/pid:[4026531836]"), ("local", f"{dead}@{here()}")):
            run = instance.create_run_for_job(job, tags={TAG_WORKER: tag}, status=STARTED)
            # what `dagster api execute_run` writes in its own pod, and the gRPC server's worker here
            instance.report_engine_event(f"Started process for run (pid: {dead}).", run)
            runs[name] = run
        assert run_facts(instance, runs["k8s"]).worker == f"{dead}@run-pod-7f9c/pid:[4026531836]"
        verdicts = reap_dead_runs(instance, None, run_health.pid_alive)
        assert [v.run_id for v in verdicts] == [runs["local"].run_id]
        assert instance.get_run_by_id(runs["k8s"].run_id).status == STARTED  # type: ignore[union-attr]
        assert instance.get_run_by_id(runs["local"].run_id).status == dg.DagsterRunStatus.FAILURE  # type: ignore[union-attr]
