"""Runs: status vocabulary, pools and priorities, the run-health sensor."""
