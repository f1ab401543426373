"""``python -m freshidx.spark.server [options]``: the same command as ``freshidx spark-server``.

Kept as an entry point only, because the demo, the test fixtures and operators' scripts start the
supervisor with this command line. The code lives in modules of one job each:

* :mod:`freshidx.spark.server_config` – :class:`~freshidx.spark.server_config.ServerConfig`, defaults;
* :mod:`freshidx.spark.server_state` – ``state.json`` (:func:`~freshidx.spark.server_state.read_state`);
* :mod:`freshidx.spark.lease` – the client side (:func:`~freshidx.spark.lease.acquire_lease`);
* :mod:`freshidx.spark.server_launch`, :mod:`~freshidx.spark.cds`, :mod:`~freshidx.spark.jvm`,
  :mod:`~freshidx.spark.connect_client` – launching the JVM, its class archive, ``jcmd`` and heap
  samples, the supervisor's own client sessions;
* :mod:`freshidx.spark.server_process` – one JVM started, warmed up, probed and stopped;
* :mod:`freshidx.spark.supervisor` – :class:`~freshidx.spark.supervisor.SparkConnectSupervisor`,
  the watchdog (health, progress, planned restarts with draining);
* :mod:`freshidx.cli.spark_server` – the command's options and signal handling.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from freshidx.cli.spark_server import main

    sys.exit(main())
