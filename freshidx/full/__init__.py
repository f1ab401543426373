"""The full index: its build plan and builds (from state or from every raw partition)."""
