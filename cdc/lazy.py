"""Names a package exports but imports only on first use (PEP 562), and modules kept under an old path.

A package's ``__init__.py`` names its public classes without importing them, so that importing one light
module of it (a wire format, a position type) loads neither pydantic, pyspark nor a client SDK::

    __getattr__, __dir__ = lazy_exports(__name__, {"LocalBackend": ".backend", "LocalLog": ".log"})

A module that moved keeps its old path for one release as an alias that warns::

    __getattr__, __dir__ = moved_module(__name__, "cdc.backends.pulsar.connection")
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

Exports = tuple[Callable[[str], Any], Callable[[], list[str]]]
"""A module's ``__getattr__`` and ``__dir__``."""


def lazy_exports(package: str, names: Mapping[str, str], *, moved: Mapping[str, str] | None = None) -> Exports:
    """``__getattr__`` and ``__dir__`` for ``package``: each of ``names`` is imported from its module (absolute,
    or relative to ``package`` when it starts with a dot) on first use, then kept in the package's globals.

    ``moved`` maps names that are no longer exported here to the module that holds them now: they still
    resolve, with a :class:`DeprecationWarning` that names the new place."""
    moved = dict(moved or {})

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            setattr(sys.modules[package], name, value)  # later look-ups skip this function
            return value
        if name in moved:
            target = importlib.import_module(moved[name], package)
            warnings.warn(
                f"{package}.{name} is deprecated and will be removed: import it from {target.__name__}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(target, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__


def moved_module(old: str, new: str, *, elsewhere: Mapping[str, str] | None = None) -> Exports:
    """``__getattr__`` and ``__dir__`` for a module ``old`` that moved to ``new``: every name resolves in ``new``
    (or, for the names of ``elsewhere``, in the module it maps them to), with a :class:`DeprecationWarning`
    that names the new place."""
    elsewhere = dict(elsewhere or {})

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = elsewhere.get(name, new)
        warnings.warn(
            f"module {old} is deprecated and will be removed: import {name} from {target}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(target), name)

    def __dir__() -> list[str]:
        return sorted(vars(importlib.import_module(new)))

    return __getattr__, __dir__
