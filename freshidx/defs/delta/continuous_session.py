"""The continuous loop's Spark session (docs/architecture.md#continuous-mode): warmed up before the first tick,
let go of while a supervised Connect server drains, kept usable by a standby across a server restart, and the
back-off after a failed micro-batch, cut short when the failure was the server going away and it answers again.
"""

import time
from collections.abc import Callable

import dagster as dg

from freshidx.defs.shared.resources import SparkResource
from freshidx.trigger import continuous_rules
from freshidx.trigger.continuous_standby import SessionStep, standby_session_step
from freshidx.trigger.latest_only import PIPELINE

#: After a micro-batch failed because the Spark Connect server went away: how often to ask whether it answers.
SERVER_POLL_SECONDS = 0.5
#: How often a standby asks whether the Spark Connect server answers (its session must survive a restart).
STANDBY_SESSION_CHECK_SECONDS = 2.0


def warm_up(context: dg.OpExecutionContext, spark: SparkResource) -> None:
    """Start (or attach to) the Spark session now, so the first micro-batch finds it warm."""
    t0 = time.monotonic()
    try:
        with spark.session(keep_as=PIPELINE):
            pass
    except Exception as exc:  # the micro-batch retries; a failed warm-up is not a failed attempt
        context.log.warning(f"Spark session warm-up failed ({exc}); the first micro-batch will retry")
        return
    context.log.info(f"Spark session ready in {time.monotonic() - t0:.1f} s")


def release_if_draining(context: dg.OpExecutionContext, spark: SparkResource) -> bool:
    """A supervised Connect server that drains for a planned restart waits for leases: an idle loop lets
    go of its session (and lease) at once; the next micro-batch leases and connects afresh."""
    if not spark.server_draining():
        return False
    spark.discard()
    context.log.info("Spark Connect server is draining for a restart: session and lease released")
    return True


class StandbySession:
    """A standby's Spark session stays usable for its takeover: let go of it (and its lease) while the
    Connect server does not answer, drains for a restart, or was replaced (a promoted spare), so the first
    micro-batch after a takeover does not fail on a session the serving server does not know
    (:func:`freshidx.trigger.continuous_standby.standby_session_step`). After a restart it attaches again only
    once the active run has published (``version()``, the serving delta version, moved): both attach to the
    pipeline's kept session, and two clients registering its data sources at the same moment on a new server
    collide (``DATA_SOURCE_ALREADY_EXISTS``), which would fail the active run's first micro-batch. It runs no
    Spark job while it waits (a warm-up job of the state would hold up a takeover for as long as it runs)."""

    def __init__(self, context: dg.OpExecutionContext, spark: SparkResource,
                 version: Callable[[], str | None]) -> None:
        self.context, self.spark, self.version = context, spark, version
        self.released_at: str | None = None  # the serving version when the session was let go of
        self.released = False
        self.checked = 0.0
        self.attached_to = spark.serving_server()  # the server the warmed-up session lives on

    def __call__(self) -> None:
        if time.monotonic() - self.checked < STANDBY_SESSION_CHECK_SECONDS:
            return
        self.checked = time.monotonic()
        answers, server = self.spark.server_answers(), self.spark.serving_server()
        step = standby_session_step(answers=answers, server=server, attached_to=self.attached_to,
                                    released=self.released,
                                    published_since=self.released and self.version() != self.released_at)
        if step is SessionStep.RELEASE:
            self.spark.discard()
            self.released, self.released_at = True, self.version()
            self.context.log.info("standby: Spark Connect server not answering or replaced (restart, drain, "
                                  "promoted spare): session and lease released until it answers again and "
                                  "the active run has published")
        elif step is SessionStep.ATTACH:
            self.released = False
            warm_up(self.context, self.spark)
            self.attached_to = self.spark.serving_server()


def back_off(context: dg.OpExecutionContext, spark: SparkResource, wait: Callable[[float], None], deadline: float,
             failure: str, stopping: Callable[[], bool]) -> None:
    """After a failed micro-batch: wait until ``deadline`` (monotonic), unless the failure was the Spark Connect
    server's (it does not answer now, or the error says it went away): then retry as soon as it answers again
    (asked every :data:`SERVER_POLL_SECONDS`), at the latest at ``deadline``. ``stopping()`` ends the wait."""
    answers = spark.server_answers()
    if answers is None or (answers and not continuous_rules.server_lost(failure)):
        wait(deadline - time.monotonic())
        return
    t_fail = time.monotonic()
    while not answers and not stopping() and time.monotonic() < deadline:
        wait(min(SERVER_POLL_SECONDS, deadline - time.monotonic()))
        answers = spark.server_answers()
    if answers:
        context.log.info(f"Spark Connect server answers {time.monotonic() - t_fail:.1f} s after the failed "
                         "micro-batch: retrying now")
