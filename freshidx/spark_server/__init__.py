"""The operations of a supervised Spark Connect server (``freshidx spark-server``): an optional component.

The pipeline's builds need a Spark session only (:mod:`freshidx.spark`). A deployment that runs
``freshidx spark-server`` also gets leases (a planned restart drains the runs first) and sessions the
server keeps between runs. The pipeline reaches this package through the functions below only, and only
where it is configured for it: :class:`~freshidx.defs.shared.resources.SparkResource` when ``server_url``
or ``server_state_dir`` is set. The engine (:mod:`freshidx.spark`) never imports it: this package depends on
the engine, not the reverse (``[tool.importlinter]`` in pyproject.toml checks both). A local session maps
the class archive ``freshidx spark-cds`` prepared through the engine's :mod:`freshidx.spark.local_archive`;
a cluster, or a Connect server of its own, imports nothing from here. Importing this package is cheap:
each function imports what it uses.

The modules, one job each:

* :mod:`~freshidx.spark_server.server_config` – :class:`~freshidx.spark_server.server_config.ServerConfig`;
* :mod:`~freshidx.spark_server.server_state` – ``state.json``;
* :mod:`~freshidx.spark_server.lease` and :mod:`~freshidx.spark_server.kept_session` – the client side,
  through :mod:`~freshidx.spark_server.control_client` (the state directory, or the supervisor's control
  endpoint :mod:`~freshidx.spark_server.control_server` when nothing but the network is shared);
* :mod:`~freshidx.spark_server.server_launch`, :mod:`~freshidx.spark_server.cds`,
  :mod:`~freshidx.spark_server.jvm`, :mod:`~freshidx.spark_server.connect_client`,
  :mod:`~freshidx.spark_server.job_progress` – launching the JVM, its class archive (the primitives are the
  engine's, :mod:`freshidx.spark.class_archive`), ``jcmd`` and heap samples, the supervisor's own client
  sessions, its hang detector;
* :mod:`~freshidx.spark_server.server_process` – one JVM started, warmed up, probed and stopped
  (:mod:`~freshidx.spark_server.state_dir`: who owns the state dir; :mod:`~freshidx.spark_server.warm_up`);
* :mod:`~freshidx.spark_server.supervisor` – the watchdog (health, progress, planned restarts), with its warm
  spare JVM :mod:`~freshidx.spark_server.spare` (clients follow a promotion:
  :mod:`~freshidx.spark_server.follow_server`);
* :mod:`~freshidx.spark_server.local_cds` – making the class archive local-mode JVMs map (``freshidx spark-cds``);
* :mod:`~freshidx.spark_server.server` – ``python -m freshidx.spark_server.server``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def open_connect_session(remote: str, where: str | Path, run_id: str, *, build: Callable[[str], Any],
                         keep_as: str | None = None, lease_timeout_s: float = 300.0) -> Iterator[Any]:
    """A Connect session on the supervised server, under a lease held until the block ends.

    ``where`` is the supervisor's state directory or its control endpoint (``http://host:port``,
    :mod:`~freshidx.spark_server.control_client`). ``build(url)`` makes the session (the lease says the
    server's current URL, else ``remote``). With ``keep_as`` it attaches to the session the server keeps
    under that name (:mod:`~freshidx.spark_server.kept_session`) and leaves it open at the end; otherwise
    the session is released. Waits up to ``lease_timeout_s`` for a server that is restarting.
    """
    from freshidx.spark.session import close_session
    from freshidx.spark_server.control_client import control_for
    from freshidx.spark_server.follow_server import follow_promotions
    from freshidx.spark_server.kept_session import attach
    from freshidx.spark_server.lease import acquire_lease

    control = control_for(where)
    with acquire_lease(control, run_id, timeout_s=lease_timeout_s) as lease:
        url = lease.url or remote
        session = attach(url, control, keep_as, build) if keep_as else build(url)
        follow_promotions(session, control, url)  # a promoted spare serves elsewhere: stop retrying this URL
        try:
            yield session
        finally:
            close_session(session, release=not keep_as)  # never raises: the server may be gone


def supervisor_state(where: str | Path) -> dict[str, Any] | None:
    """The supervisor's state from its state directory or control endpoint; None without one (or when
    the endpoint does not answer)."""
    from freshidx.spark_server.control_client import ControlUnreachable, control_for

    try:
        return control_for(where).state()
    except ControlUnreachable:
        return None


def server_status(where: str | Path) -> str | None:
    """The supervisor's status (``up``, ``draining``, …; see ``STATUSES``), None without a state."""
    return (supervisor_state(where) or {}).get("status")


def server_ui_url(where: str | Path) -> str | None:
    """The Spark UI of the supervised server's application, as its state records it (None if unknown)."""
    return (supervisor_state(where) or {}).get("ui_url") or None
