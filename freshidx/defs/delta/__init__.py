"""Dagster wiring of the delta pipeline: delta_index's sensor, continuous mode, compaction."""
