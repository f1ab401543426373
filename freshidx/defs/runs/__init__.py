"""Runs: status vocabulary and the run-health sensor (pools and priorities: :mod:`freshidx.defs.shared.lanes`)."""
