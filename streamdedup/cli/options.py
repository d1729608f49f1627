"""Click options for :class:`~streamdedup.settings.Settings` fields.

The options are generated from the Settings table, take strings (the bool one is a
``--x/--no-x`` pair) and default to None, so :meth:`Settings.from_sources` sees only the flags
that were given and does all parsing and checking itself.  Click's own ``envvar`` is not used:
the environment is resolved by Settings, so an error can name both the flag and the env var.
Each command gets the settings it uses: the worker all of them, the crawler's commands the
connection and their topics (:data:`PRODUCE`, :data:`VERDICTS`), so ``--help`` shows no
option that would do nothing.

    @main.command()
    @settings_options
    def worker(**params):
        settings = settings_from_click(params)  # bad value: usage error, exit 2
        run_worker(settings)

    @main.command()
    @settings_options(only=PRODUCE)
    def produce(**params): ...
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

import click

from streamdedup.errors import SettingsError
from streamdedup.settings import SECURITY_FIELDS, Settings

__all__ = ["CONNECTION", "PRODUCE", "SCAN", "VERDICTS", "settings_from_click", "settings_options"]

F = TypeVar("F", bound=Callable[..., Any])

#: How to reach Kafka, and how much the client logs: every command that talks to Kafka.
CONNECTION = ("brokers", "security_protocol", *SECURITY_FIELDS, "ssl_check_hostname", "log_level")
#: ``streamdedup produce``: the pages topic, and the size limit it checks before sending.
PRODUCE = CONNECTION + ("pages_topic", "max_page_bytes")
#: ``streamdedup scan``: the algorithm and its parameters, and the batch and page size limits.
SCAN = ("algorithm", "k", "design", "threshold", "num_perm", "cluster_n", "max_page_bytes", "batch_size")
#: ``streamdedup verdicts``: the output topics it reads.
VERDICTS = CONNECTION + ("verdicts_topic", "unique_topic", "near_duplicate_topic", "dead_letter_topic")


def _help(f: Any, text: str | None = None) -> str:
    m, default = f.metadata, f.default
    text = text or m["help"]
    if default is None or m["secret"]:
        return f"{text} [env: {m['env']}]"
    if isinstance(default, tuple):
        default = ",".join(default)
    elif isinstance(default, bool):
        default = str(default).lower()
    return f"{text} [default: {default}; env: {m['env']}]"


def settings_options(
    command: F | None = None, *, only: tuple[str, ...] | None = None, help: Mapping[str, str] | None = None
) -> Any:
    """Add one option per Settings field (``only``: those fields) to a click command (a decorator,
    bare or called); ``help`` replaces a field's help text where the command uses it differently.

    Each option's parameter name is the field name, so ``settings_from_click(params)`` can pick
    them out of the command's keyword arguments.
    """
    if command is None:
        return lambda c: _add_options(c, only, help or {})
    return _add_options(command, only, help or {})


def _add_options(command: F, only: tuple[str, ...] | None, texts: Mapping[str, str]) -> F:
    chosen = [f for f in fields(Settings) if only is None or f.name in only]
    if only is not None and (unknown := set(only) - {f.name for f in chosen}):
        raise TypeError(f"not Settings fields: {', '.join(sorted(unknown))}")
    for f in reversed(chosen):  # decorators apply bottom-up: keep the table's order in --help
        m = f.metadata
        if isinstance(f.default, bool):
            flag = m["flag"].removeprefix("--")
            option = click.option(f"--{flag}/--no-{flag}", f.name, default=None, help=_help(f, texts.get(f.name)))
        else:
            text = _help(f, texts.get(f.name))
            option = click.option(m["flag"], f.name, type=str, default=None, metavar=m["metavar"], help=text)
        command = option(command)
    return command


def settings_from_click(params: Mapping[str, Any]) -> Settings:
    """Build the Settings from a command's parameters (other parameters are ignored) and ``os.environ``
    (only the variables of the command's own settings: those of other commands are not read).

    A bad setting becomes a ``click.UsageError``: exit status 2, a one-line message, no traceback.
    """
    names = {f.name for f in fields(Settings)}
    flags = {k: v for k, v in params.items() if k in names and v is not None}
    try:  # (the command's own settings: params holds each of its options, None when not given)
        return Settings.from_sources(flags, os.environ, fields_used={k for k in params if k in names})
    except SettingsError as e:
        raise click.UsageError(" ".join(str(e).splitlines())) from None
