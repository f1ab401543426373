"""Dagster wiring of the delta pipeline: delta_index and its job, its sensor, continuous mode, compaction."""
