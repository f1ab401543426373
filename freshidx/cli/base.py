"""What every ``freshidx`` command shares.

* one definition of ``--store`` (:func:`store_option`) and of ``--json`` (:func:`json_option`);
* commands whose implementation (``"module:function"``) is imported only when the command runs
  (:class:`LazyCommand`, :class:`LazyGroup`): ``freshidx --help`` and ``freshidx <cmd> --help``
  import neither Spark nor Dagster, and ``freshidx search`` imports what searching needs, no more;
* one way to open a command's store (:func:`open_command_store`): a command that only reads opens it
  with ``must_exist`` (nothing is created, a missing store is an error);
* argparse's contract, which scripts and tests rely on: a usage error prints
  ``<prog>: error: argument --opt: <why>`` on stderr and exits 2 (``SystemExit``), a
  ``SettingsError`` prints ``freshidx: <message>`` and exits 2, and so does a store that cannot be used
  at all (``StoreAccessError``: unreachable, no or refused credentials, no bucket, no directory; the
  line names the setting to fix and where the store value came from), otherwise the command's return
  value is the exit code (:func:`run`).

The command modules (``freshidx.cli.*``) import only this module, click and the standard library at
import time; their option defaults that mirror a library constant are checked against it by
``freshidx_tests/cli/test_cli_imports.py``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from freshidx.settings import Settings
    from freshidx.store import ObjectStore

#: ``-h`` as well as ``--help``, as with argparse.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
STORE_HELP = "store URI (default: FRESHIDX_STORE or ./.freshidx/store)"
#: ``ctx.meta`` flag of :func:`parse`: resolve the command and its parameters, run nothing.
PARSE_ONLY = "freshidx.parse_only"
#: ``ctx.meta`` key: the ``--store`` value of the command that runs (``None``: not given), recorded before
#: it runs so that :func:`run` can say where the store of a ``StoreAccessError`` came from.
STORE_GIVEN = "freshidx.store_given"

#: A command's implementation: ``"package.module:function"`` (imported when the command runs) or the
#: function itself. It is called with the command's parameters as keyword arguments and returns the
#: exit code.
Target = str | Callable[..., int]


def store_option(help: str = STORE_HELP, *, type: click.ParamType | None = None,
                 metavar: str | None = None) -> click.Option:
    """``--store URI`` (default ``None``: ``FRESHIDX_STORE``, else the embedded default)."""
    return click.Option(["--store"], type=type, default=None, metavar=metavar or "URI", help=help)


def json_option(help: str | None = None) -> click.Option:
    """``--json``, passed to the implementation as ``as_json``."""
    return click.Option(["--json", "as_json"], is_flag=True, default=False, help=help)


class Parsed(click.ParamType):
    """A value parsed by ``parse(text)``; a ``ValueError`` becomes a usage error naming the option."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default, already of the right type
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def open_command_store(store: str | None, *, reads_only: bool, **overrides: Any) -> tuple[Settings, ObjectStore]:
    """The settings and the store of a command: ``store`` (its ``--store``), else ``FRESHIDX_STORE``, else
    the default; ``overrides`` are more :class:`~freshidx.settings.Settings` values (None = not given).

    ``reads_only``: the command never writes, so the store must exist and opening it creates nothing
    (``open_store(..., must_exist=True)``: a missing ``file://`` directory is an error, not a new empty
    store; an S3 store is checked with one short LIST). Otherwise (a writer) a ``file://`` store is created
    as needed. A store that cannot be used raises ``StoreAccessError``; :func:`run` prints it."""
    from freshidx.settings import Settings
    from freshidx.store import open_store

    settings = Settings.from_env(store=store, **overrides)
    return settings, open_store(settings.store_config(), must_exist=reads_only)


def _first_paragraph(text: str | None) -> str | None:
    """The listing's one-liner, whole (click would cut it at 45 characters; argparse did not)."""
    return text.split("\n\n", 1)[0] if text else None


def load(target: Target) -> Callable[..., int]:
    if callable(target):
        return target
    module, _, attr = target.partition(":")
    func: Callable[..., int] = getattr(importlib.import_module(module), attr)
    return func


class LazyCommand(click.Command):
    """A command that imports its implementation (``target``) only when it runs."""

    def __init__(self, name: str, target: Target, *params: click.Parameter, help: str | None = None,
                 short_help: str | None = None) -> None:
        super().__init__(name, callback=self._call, params=list(params), help=help,
                         short_help=short_help or _first_paragraph(help), context_settings=CONTEXT_SETTINGS)
        self.target = target

    def load(self) -> Callable[..., int]:
        """The implementation this command runs."""
        return load(self.target)

    def _call(self, **params: Any) -> Any:
        ctx = click.get_current_context()
        if ctx.meta.get(PARSE_ONLY):
            return ctx
        _record_store(ctx, params)
        return self.load()(**params)


class LazyGroup(click.Group):
    """Sub-commands, listed in the order given; with a ``target``, the group alone runs it
    (``freshidx ledger`` vs ``freshidx ledger retry``)."""

    def __init__(self, name: str, commands: Sequence[click.Command], *params: click.Parameter,
                 target: Target | None = None, help: str | None = None,
                 short_help: str | None = None) -> None:
        super().__init__(name, commands=list(commands), callback=self._call, params=list(params),
                         invoke_without_command=target is not None, help=help,
                         short_help=short_help or _first_paragraph(help), context_settings=CONTEXT_SETTINGS)
        self.target = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def load(self) -> Callable[..., int]:
        if self.target is None:
            raise LookupError(f"{self.name} runs only through its sub-commands")
        return load(self.target)

    def _call(self, **params: Any) -> Any:
        ctx = click.get_current_context()
        if ctx.invoked_subcommand is not None or self.target is None:
            return None
        if ctx.meta.get(PARSE_ONLY):
            return ctx
        _record_store(ctx, params)
        return self.load()(**params)


def _record_store(ctx: click.Context, params: dict[str, Any]) -> None:
    if "store" in params:
        ctx.meta[STORE_GIVEN] = params["store"]


def _usage_error(exc: click.UsageError) -> NoReturn:
    """argparse's behaviour: usage and ``<prog>: error: <message>`` on stderr, exit 2."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        exc.show()
        raise SystemExit(2)
    ctx = exc.ctx
    message = exc.format_message()
    if type(exc) is click.BadParameter and exc.param is not None:
        param = exc.param
        name = "/".join(param.opts) if isinstance(param, click.Option) else param.name
        message = f"argument {name}: {exc.message}"
    if ctx is not None:
        click.echo(ctx.get_usage(), err=True)
    click.echo(f"{ctx.command_path if ctx is not None else 'freshidx'}: error: {message}", err=True)
    raise SystemExit(2)


def run(command: click.Command, argv: Sequence[str] | None, prog_name: str) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    meta: dict[str, Any] = {}
    try:
        with command.make_context(prog_name, args) as ctx:
            meta = ctx.meta  # shared by the sub-commands' contexts
            rv = command.invoke(ctx)
    except click.exceptions.Exit as exc:  # --help
        return int(exc.exit_code)
    except click.UsageError as exc:
        _usage_error(exc)
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except Exception as exc:
        from freshidx.settings import SettingsError  # imported already if it is one

        if isinstance(exc, SettingsError):
            print(f"freshidx: {exc}", file=sys.stderr)
            return 2
        from freshidx.store.errors import Origin, StoreAccessError  # light: no boto, no pydantic

        if isinstance(exc, StoreAccessError):
            origin = Origin.of(meta[STORE_GIVEN], os.environ) if STORE_GIVEN in meta else None
            print(f"freshidx: {exc.with_origin(origin)}", file=sys.stderr)
            return 2
        raise
    return int(rv or 0)


def parse(command: click.Command, argv: Sequence[str], prog_name: str) -> click.Context:
    """The context of the command ``argv`` names, with its parsed ``params``, without running it.

    A usage error exits like :func:`run` (``SystemExit(2)``), ``--help`` with ``SystemExit(0)``.
    """
    try:
        ctx = command.make_context(prog_name, list(argv))
        ctx.meta[PARSE_ONLY] = True
        with ctx:
            found = command.invoke(ctx)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.UsageError as exc:
        _usage_error(exc)
    if not isinstance(found, click.Context):
        raise LookupError(f"{' '.join(argv)!r} names no runnable command")
    return found
