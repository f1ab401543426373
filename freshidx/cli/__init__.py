"""``freshidx`` command line, on click (the console script is :func:`main`).

Every command module here imports only click and the standard library at import time and imports
its implementation when it runs, so ``freshidx --help`` starts in a fraction of a second without
Spark or Dagster. Shared pieces (``--store``, ``--json``, lazy commands, argparse-compatible errors):
:mod:`freshidx.cli.base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click

__all__ = ["main", "parse"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``freshidx <argv>`` (default ``sys.argv[1:]``) and return its exit code."""
    from freshidx.cli.app import freshidx
    from freshidx.cli.base import run

    return run(freshidx, argv, "freshidx")


def parse(argv: Sequence[str]) -> click.Context:
    """The context (``.command``, ``.params``) of ``freshidx <argv>``, without running it; exits like
    argparse on a usage error."""
    from freshidx.cli import base
    from freshidx.cli.app import freshidx

    return base.parse(freshidx, argv, "freshidx")
