"""The delta's executor-side code (runs inside Spark tasks)."""
