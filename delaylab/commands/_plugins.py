"""Plug-ins named on the command line: ``--optimizer package.module:factory``."""

from __future__ import annotations

import functools
import importlib
import os
import sys

from delaylab.errors import ConfigError


def load_optimizer(spec: str, kwargs: dict | None = None):
    """The factory named by ``spec``: ``package.module:name`` (a function or an optimizer class,
    called as ``name(params, **kwargs)``) or a method of ``toy rates``' registry (``kwargs``:
    ``lr``, ``beta``). Raises ConfigError for anything that does not resolve."""
    from delaylab.toy.profile import registry_optimizer
    from delaylab.toy.runs import METHODS

    kwargs = dict(kwargs or {})
    if spec in METHODS:
        bad = set(kwargs) - {"lr", "beta"}
        if bad:
            raise ConfigError(f"registry method {spec} takes lr and beta, not {', '.join(sorted(bad))}")
        try:
            lr, beta = float(kwargs.get("lr", 0.02)), float(kwargs.get("beta", 0.9))
        except (TypeError, ValueError):
            raise ConfigError(f"registry method {spec}: lr and beta must be numbers, got {kwargs}") from None
        return registry_optimizer(spec, lr, beta)
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"--optimizer must be package.module:factory or one of {', '.join(METHODS)}; "
                          f"got {spec!r}")
    _importable_from_cwd()
    try:
        obj = importlib.import_module(module)
    except Exception as err:  # ImportError, or an error raised by the module itself
        raise ConfigError(f"cannot import {module!r} (from {spec!r}): {type(err).__name__}: {err}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{spec!r} does not resolve: {module} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a callable factory")
    factory = functools.partial(obj, **kwargs) if kwargs else obj
    if kwargs:
        factory.__qualname__ = spec
        if getattr(obj, "declared", None) is not None:
            factory.declared = obj.declared
    return factory


def _importable_from_cwd() -> None:
    """Put the working directory first on sys.path, as ``python -m`` does: the ``delaylab`` script's
    sys.path starts at its own bin folder, so ``mymod:make`` in the current folder would not import."""
    cwd = os.getcwd()
    if not any(p in ("", cwd) or (p and os.path.abspath(p) == cwd) for p in sys.path):
        sys.path.insert(0, cwd)
