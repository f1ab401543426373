"""Dagster wiring of the SLA: asset checks and the SLA sensor."""
