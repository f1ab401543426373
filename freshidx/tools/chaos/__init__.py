"""``freshidx bench chaos``'s parts: the fault proxy, the moto server, the kill plan, the demo's processes,
the pointer watch, the oracle and the verdict (:mod:`freshidx.tools.bench_chaos` is the command)."""
