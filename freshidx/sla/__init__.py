"""Data-aware SLA checks (pure)."""
