"""``python -m freshidx.tools.dagster_main <dagster args>``: ``python -m dagster <args>`` that stops on
SIGINT and SIGTERM whatever signal dispositions it inherited.

A process started in the background by a non-interactive shell (``cmd &``, ``nohup … &``, CI
wrappers) inherits SIGINT *ignored*. Python then installs no KeyboardInterrupt handler, and
``dagster dev`` maps SIGTERM to whatever SIGINT does: it ignores both, so only SIGKILL stops it,
which leaves its runs STARTED and its children to be reaped by hand (measured: a stop that should
take 2-6 s waited 90 s and ended in SIGKILL). Restoring Python's handler first gives ``dagster dev``
and every process it starts (a handled signal is reset to the default on exec) the normal behaviour.
"""

import runpy
import signal
import sys


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["dagster", *sys.argv[1:]]
    runpy.run_module("dagster", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
