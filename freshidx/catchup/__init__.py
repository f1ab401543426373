"""Catch-up mode (ads_hourly): every closed hour exactly once, late data, readiness, the hourly bucket build."""
