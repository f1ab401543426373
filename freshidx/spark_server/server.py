"""``python -m freshidx.spark_server.server [options]``: the same command as ``freshidx spark-server``.

Kept as an entry point only, because the demo, the test fixtures and operators' scripts start the
supervisor with this command line. The code lives in the modules of :mod:`freshidx.spark_server`
(its docstring lists them) and :mod:`freshidx.cli.spark_server` (the command's options and signal
handling).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from freshidx.cli.spark_server import main

    sys.exit(main())
