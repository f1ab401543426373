"""Dagster wiring of the full index: its job and schedule."""
