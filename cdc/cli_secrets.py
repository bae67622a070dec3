"""Secrets of the ``cdc`` command come from the environment or a file, never from the command line (where
``ps`` and shell histories show them).

``@secret_option("auth_token", "PULSAR_AUTH_TOKEN", "JWT of the query's role")`` gives a command the option
``--auth-token-file FILE`` and the parameter ``auth_token``: the file's content (stripped), else the
variable's value, else None. ``--help`` names both.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def read_secret_file(path: str, option: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc.strerror}", param_hint=option) from None


def secret_option(name: str, envvar: str, what: str, *, default: str | None = None) -> Callable[[F], F]:
    """Add ``--<name>-file`` to a command; its parameter ``name`` gets the secret (file, else ``$envvar``)."""
    flag = "--" + name.replace("_", "-") + "-file"

    def resolve(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
        if path is not None:
            return read_secret_file(path, flag)
        return os.environ.get(envvar, default)

    return click.option(
        flag,
        name,
        metavar="FILE",
        callback=resolve,
        help=f"{what}: read from FILE; without it, from the environment variable {envvar}.",
    )


def options_from(pairs: tuple[str, ...], from_env: tuple[str, ...], from_file: tuple[str, ...]) -> dict[str, str]:
    """Source options given as ``-o key=value``, ``--option-from-env key=VARIABLE``, ``--option-from-file key=FILE``."""
    out = {}
    kinds = [(p, "") for p in pairs] + [(p, "env") for p in from_env] + [(p, "file") for p in from_file]
    for pair, kind in kinds:
        key, sep, value = pair.partition("=")
        flag = {"": "--option", "env": "--option-from-env", "file": "--option-from-file"}[kind]
        if not sep or not key.strip():
            expected = {"": "value", "env": "VARIABLE", "file": "FILE"}[kind]
            raise click.BadParameter(f"{pair!r}: expected key={expected}", param_hint=flag)
        if kind == "env":
            if value not in os.environ:
                raise click.BadParameter(f"environment variable {value!r} is not set", param_hint=flag)
            value = os.environ[value]
        elif kind == "file":
            value = read_secret_file(value, flag)
        out[key.strip()] = value
    return out
