"""Dagster wiring of the full index: its asset, job and schedule."""
