"""One publication flow for every publishing IO manager: gate → manifest → compare-and-swap → ledger.

The asset bodies stage shards and hand over drafts; :class:`PublishingIOManager` publishes them
(through :func:`freshidx.publish.commit.publish`), lets the subclass record the ledger entries and build
the metadata, and fails the run if something could not be published. Template method, as in
Dagster's ``UPathIOManager``: ``handle_output`` is the base's, the subclasses fill in small hooks.
Dagster's blocking asset checks run only after ``handle_output``, so the gate must be here.
"""

import dataclasses
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import dagster as dg

from freshidx.defs.shared.resources import ObjectStoreResource, SparkResource
from freshidx.publish.commit import DraftManifest, Pointer, PublishResult, Rebase, publish, read_pointer
from freshidx.store import ObjectStore, layout

S = TypeVar("S")

#: Outcomes that fail the run: the previous version keeps serving and the work must be retried.
FAILING_OUTCOMES = frozenset({"invalid", "not_ready"})


@dataclass(frozen=True)
class PublishPolicy:
    """How strict the validation gate is for one publication (what :func:`publish` is told)."""

    allow_empty: bool = False
    #: Refuse a document count that fell by more than this fraction versus the serving version.
    max_drop_fraction: float | None = None
    #: The launchpad's ``force``: turns the drop guard off, never monotonicity.
    force: bool = False
    #: Create-once of ``CURRENT``: a catch-up hour is processed exactly once.
    only_if_absent: bool = False
    #: How the pipeline moves its draft onto a version published meanwhile (publication knows no pipeline).
    rebase: Rebase | None = None

    @property
    def drop_guard(self) -> float | None:
        return None if self.force else self.max_drop_fraction

    def run_record(self) -> dict[str, Any]:
        """The policy as a draft's ``run`` record carries it to the IO manager (and the manifest keeps it)."""
        return {"force": self.force, "max_drop_fraction": self.max_drop_fraction}

    def with_run_record(self, draft: DraftManifest) -> "PublishPolicy":
        """This policy with the per-run part (:meth:`run_record`) of the draft's ``run`` record."""
        return dataclasses.replace(self, force=draft.forced, max_drop_fraction=draft.max_drop_fraction)

    def publish(self, store: ObjectStore, draft: DraftManifest) -> PublishResult:
        return publish(store, draft, allow_empty=self.allow_empty, max_drop_fraction=self.drop_guard,
                       only_if_absent=self.only_if_absent, rebase=self.rebase)


@dataclass
class Publication(Generic[S]):
    """One publication a ``handle_output`` call attempts, and what became of it."""

    subject: S  # what the subclass made it from (the draft itself, an hour's bucket)
    draft: DraftManifest | None  # None: nothing was built, a hook settles it before publishing
    #: None: the subclass publishes through its pipeline's own step after the build (the index IO manager).
    policy: PublishPolicy | None = None
    outcome: str = ""  # publish()'s outcome, or a refusal decided before publishing ("not_ready", …)
    reason: str = ""
    result: PublishResult | None = None

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING_OUTCOMES

    def settle(self, outcome: str, reason: str) -> None:
        """Decided without publishing (a hook recorded why)."""
        self.outcome, self.reason = outcome, reason


def running_step() -> dg.AssetExecutionContext | None:
    """The asset step whose output is being handled (still current in ``handle_output``), if any."""
    try:
        return dg.AssetExecutionContext.get()
    except dg.DagsterInvariantViolationError:  # no step is executing (IO manager driven by hand)
        return None


def spark_metadata(step: dg.AssetExecutionContext | None) -> dict[str, dg.MetadataValue]:
    """The Spark application the step's ``spark`` resource ran it on (:meth:`SparkResource.spark_metadata`):
    every Spark asset's materialization says which application (and UI) built it."""
    spark = getattr(step.resources, "spark", None) if step is not None else None
    return spark.spark_metadata() if isinstance(spark, SparkResource) else {}


def manifest_link(store: ObjectStore, draft: DraftManifest) -> dg.MetadataValue:
    return dg.MetadataValue.path(f"{store.uri}/{layout.manifest_key(draft.index, draft.version)}")


def serving_pointer(store: ObjectStore, name: str, missing: str) -> Pointer:
    """What downstream assets load: the *published* version, never a staged one."""
    pointer, _ = read_pointer(store, name)
    if pointer is None:
        raise dg.Failure(missing)
    return pointer


class PublishingIOManager(dg.ConfigurableIOManager):
    """Publishes what the asset staged and records every outcome; subclasses fill in the hooks."""

    store: dg.ResourceDependency[ObjectStoreResource]

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        publications = self.publications(obj)
        store = self.store.open()
        for pub in publications:
            if not self.settled_before_publish(store, pub, context.run_id):
                self.publish_one(store, pub, context.run_id)
        tags = self.run_tags(publications)
        step = running_step()
        if tags and step is not None:
            # Through the running step's instance, not OutputContext's internal step_context.
            step.instance.add_run_tags(context.run_id, tags)
        self.report(context, store, publications)
        context.add_output_metadata(spark_metadata(step))
        failed = [p for p in publications if p.failed]
        if failed:
            # The previous version keeps serving; fail the run so it is visible and retried (by a
            # sensor, as a new attempt: a step retry would rebuild the same inputs).
            description, metadata = self.describe_failure(failed)
            raise dg.Failure(description=description, metadata=metadata, allow_retries=False)

    def publish_one(self, store: ObjectStore, pub: Publication[Any], run_id: str) -> None:
        assert pub.draft is not None, "a publication without a draft is settled before publishing"
        assert pub.policy is not None, "a publication without a policy is published by the subclass"
        self.before_publish(pub)
        result = pub.policy.publish(store, pub.draft)
        pub.outcome, pub.reason, pub.result = result.outcome, result.reason, result
        self.record(store, pub, result, run_id)

    # ---------------------------------------------------------------------------------- hooks

    @abstractmethod
    def publications(self, obj: Any) -> Sequence[Publication[Any]]:
        """What the asset's output asks to publish, each with its policy."""

    def settled_before_publish(self, store: ObjectStore, pub: Publication[Any], run_id: str) -> bool:
        """Settle (and record) a publication that must not be attempted; True if it was."""
        return False

    def before_publish(self, pub: Publication[Any]) -> None:
        """Called right before :func:`publish` (crash-safety tests stop the process here)."""

    def record(self, store: ObjectStore, pub: Publication[Any], result: PublishResult, run_id: str) -> None:
        """The ledger entries of one publication attempt (:meth:`publish_one` calls it; a subclass that
        publishes through its pipeline's own step overrides :meth:`publish_one`, and that step records)."""
        raise NotImplementedError(f"{type(self).__name__} records no publication")

    @abstractmethod
    def metadata(self, store: ObjectStore, publications: Sequence[Publication[Any]]) -> dict[str, Any]:
        """What the output's materialization shows."""

    def run_tags(self, publications: Sequence[Publication[Any]]) -> dict[str, str]:
        """Tags the run list should show about the outcome (none by default)."""
        return {}

    def report(self, context: dg.OutputContext, store: ObjectStore,
               publications: Sequence[Publication[Any]]) -> None:
        """Attach the metadata (subclasses may scope it, or add warnings)."""
        context.add_output_metadata(self.metadata(store, publications))

    @abstractmethod
    def describe_failure(self, failed: Sequence[Publication[Any]]) -> tuple[str, dict[str, Any]]:
        """The run failure's headline and metadata when some publication failed."""
