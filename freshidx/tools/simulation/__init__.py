"""Deterministic simulation of the commit protocol (docs/architecture.md#deterministic-simulation).

The real publish / ledger / compaction / gc / rollback code runs as actors over an in-memory object store
(:mod:`~freshidx.tools.simulation.memstore`); every store call is a point where a seeded scheduler
(:mod:`~freshidx.tools.simulation.scheduler`) picks which actor goes on and whether the call is answered,
lost, failed or the actor killed. :mod:`~freshidx.tools.simulation.invariants` checks the protocol's
invariants after every step; :mod:`~freshidx.tools.simulation.world` runs one schedule;
:mod:`~freshidx.tools.simulation.memos` answers the code's pure computations from memos while it runs.
"""
