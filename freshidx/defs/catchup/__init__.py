"""Dagster wiring of the catch-up: ads_hourly, its sensor and IO manager."""
