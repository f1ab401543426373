"""Tooling beside the pipeline: benchmarks, the demo, the ``dagster dev`` driver and the upstream simulator."""
