"""Finding new input and deciding what to run: listing, the latest-only rule, continuous mode's loop decisions,
the trigger lifecycle and its ledger, run health.
"""
