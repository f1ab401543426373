"""How freshidx's own code reaches the Python workers that run its tasks (docs/deployment.md).

The workers always run exactly the driver's code, never an installed copy: a code-location deploy needs
no worker restart and no version skew is possible. The code travels once per session as a zip of the
package's sources (:func:`package_zip`, named by its content hash), put ahead of any installed copy on
the workers' ``sys.path``:

* a cluster's driver: ``SparkContext.addPyFile`` (:func:`ship_to_cluster`);
* a Spark Connect client: a session ``pyfile`` artifact (:func:`ship_to_connect`). A session's workers
  are its own, so two clients with different code never share one. Pickling the package by value into
  every ``mapInArrow`` function instead (the fallback) serializes it on the client for every job, before
  its tasks can start (docs/benchmarks.md), and on a server without freshidx installed no worker can keep
  decoded state between tasks. A reused worker keeps the modules it imported, so a session serves one
  version of the code: a kept session (:mod:`freshidx.spark_server.kept_session`) records
  :func:`code_version` beside its id.

Workers still need the *dependencies* (pyarrow, tantivy, pydantic, pydantic-settings, boto3): run them
from the same image or environment.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def _package() -> tuple[bytes, str]:
    """The zip of this process's ``freshidx`` sources and its content hash (built once per process)."""
    import freshidx

    root = Path(freshidx.__file__).parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix not in (".pyc", ".pyo"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            info = zipfile.ZipInfo(str(Path("freshidx") / p.relative_to(root)), date_time=(2000, 1, 1, 0, 0, 0))
            z.writestr(info, p.read_bytes(), zipfile.ZIP_DEFLATED)  # fixed dates: same code → same bytes
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()[:16]


def code_version() -> str:
    """The content hash of the code :func:`package_zip` ships."""
    return _package()[1]


def package_zip(target_dir: str | None = None) -> Path:
    """A zip of the installed ``freshidx`` package (sources only), named by its content hash.

    The hash in the name means a code change is a new file: ``addPyFile`` refuses to replace a file
    of the same name with other content, and executors never run a stale copy.
    """
    data, version = _package()
    out_dir = Path(target_dir or os.path.join(tempfile.gettempdir(), "freshidx-pyfiles"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"freshidx-{version}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)  # concurrent runs may build the same zip: last rename wins, same bytes
    return out


def ship_to_cluster(session: Any) -> Path:
    """Put this process's ``freshidx`` on a classic session's executors' ``sys.path``."""
    path = package_zip()
    ctx = session.sparkContext
    # A later run in the same process reuses the context: add each zip once (Spark ignores a repeat
    # of the path anyway, but pyspark would list it twice in the workers' includes).
    if path.name not in (getattr(ctx, "_python_includes", None) or []):
        ctx.addPyFile(str(path))
    return path


def ship_to_connect(session: Any) -> bool:
    """Put this process's ``freshidx`` on a Spark Connect session's workers' ``sys.path`` (adding the same
    zip to a session again is harmless). A server that refuses the artifact gets the package pickled by
    value into every function instead (slower, and no decoded state kept between tasks), until a session
    of this process accepts it; returns whether the zip was shipped."""
    try:
        session.addArtifacts(str(package_zip()), pyfile=True)
    except Exception as exc:  # any refusal: the by-value path still runs every task correctly
        log.warning("Spark Connect server refused freshidx as a session artifact (%s); shipping it by value "
                    "with every job instead", exc)
        ship_by_value()
        return False
    ship_by_value(False)  # an earlier refusal in this process must not keep every later job by value
    return True


def ship_by_value(on: bool = True) -> None:
    """Make cloudpickle serialize freshidx functions/classes by value (for every session of this process),
    or (``on=False``) by reference again."""
    from pyspark import cloudpickle

    import freshidx

    if on:
        cloudpickle.register_pickle_by_value(freshidx)
    elif freshidx.__name__ in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.unregister_pickle_by_value(freshidx)
