"""The registry of delay correctors: their names, what each corrects, which lists are valid.

It is the one list: ``Delayed``, the config's ``--correction`` (its validation and its help
text), the engines' restrictions and the sweep modes all read it. It imports no torch (the
config and the command line read it); a corrector's class is imported when one is built.

**Adding a corrector** is one new file under ``delaylab/optim/`` (a
:class:`~delaylab.optim.corrector.Corrector` with the hooks it needs) and one line in
:data:`CORRECTORS`. Its position there is its place in the order of application within a hook
point (:mod:`delaylab.optim.corrector`).

**Valid lists.** Any list of distinct names with at most one corrector per target
(:data:`TARGETS`, each with the reason); ``none`` is the empty list. A corrector whose entry has an
``argument`` takes it after a colon, and needs it: ``drop:4`` (the staleness threshold K = 4).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence

from delaylab.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    path: str  # "module.Class" under delaylab.optim
    target: str  # what it corrects: a key of TARGETS
    summary: str  # for --help
    lagged: bool = False  # takes the gradients' staleness as ``lag``: runs in a pipeline stage (delay 0)
    argument: str | None = None  # the constructor parameter that ``name:value`` sets (an int)

    @property
    def factory(self) -> type:
        module, cls = self.path.rsplit(".", 1)
        return getattr(importlib.import_module(f"delaylab.optim.{module}"), cls)


# What a corrector corrects, and why two correctors of the same target cannot be combined.
TARGETS = {
    "update": "both would rewrite the applied update",
    "gradient": "each corrects the stale gradient for the drift of the weights since it was taken "
                "(prediction by taking it ahead, DC-ASGD by a Taylor step from the snapshot), so two "
                "would correct that drift twice",
    "lr": "both would set the lr of the delayed update",
    "staleness": "both would decide which stale gradients are discarded",
}

CORRECTORS = {
    "ef": Entry("error_feedback.ErrorFeedback", "update", "error feedback, x - (l+1) u_k + l u_{k-1}", lagged=True),
    "dc-asgd": Entry("dc_asgd.DCASGD", "gradient", "g + lambda g*g*(x_now - x_stale)"),
    "dc-asgd-a": Entry("dc_asgd.DCASGDAdaptive", "gradient", "dc-asgd with lambda = lambda0 / sqrt(EMA of g*g)"),
    "predict": Entry("prediction.WeightPrediction", "gradient", "gradient at predicted weights x - tau u_last"),
    "lookahead": Entry("prediction.Lookahead", "gradient", "gradient at the Nesterov point x - gamma u_last"),
    "predict-momentum": Entry("momentum_prediction.MomentumPrediction", "gradient",
                              "gradient at x - tau lr m, m the raw momentum (marin's variant)"),
    "damp": Entry("damping.LrDamping", "lr", "lr / (1 + c tau)"),
    "drop": Entry("stale_threshold.StalenessThreshold", "staleness",
                  "drop:K, a gradient older than K updates is discarded (Ringmaster; with --delay-dist)", argument="k"),
}

NAMES = CORRECTIONS = ("none", *CORRECTORS)  # the single names
PIPELINE = ("none", *(n for n, e in CORRECTORS.items() if e.lagged))  # what a pipeline stage can run


def _arguments(spec: str | Sequence) -> dict[str, int]:
    """``{name: value}`` of the items written ``name:value`` (checked: an int, for a corrector that
    takes one); a corrector that takes an argument and is named without one is an error."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = {}
    for item in items:
        if not isinstance(item, str) or not item.strip():
            continue
        name, colon, value = (x.strip() for x in item.partition(":"))
        entry = CORRECTORS.get(name)
        if entry is None:
            continue  # parse() names it
        if entry.argument is None and colon:
            raise ConfigError(f"correction {name} takes no argument, got {item.strip()!r}")
        if entry.argument is not None:
            try:
                out[name] = int(value)
            except ValueError:
                raise ConfigError(f"correction {name} needs an integer: {name}:K, got {item.strip()!r}") from None
    return out


def parse(spec: str | Sequence) -> tuple[str, ...]:
    """The names in ``spec`` (``"ef,damp"``, ``["ef", "damp"]``, corrector objects, ``"none"``,
    ``"drop:4"``) in the registry's order; an unknown name or an invalid list is a one-line ConfigError."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [(i.partition(":")[0].strip() if isinstance(i, str) else getattr(i, "name", repr(i))) for i in items]
    names = [n for n in names if n]
    _arguments(spec)
    if names == ["none"]:
        return ()
    for n in names:
        if n not in CORRECTORS:
            raise ConfigError(f"unknown correction {n!r}; expected {', '.join(NAMES)} or a comma list of them")
    if len(set(names)) != len(names):
        raise ConfigError(f"correction {','.join(names)} names one corrector twice")
    for target, why in TARGETS.items():
        clash = [n for n in names if CORRECTORS[n].target == target]
        if len(clash) > 1:
            raise ConfigError(f"corrections {' and '.join(clash)} cannot be combined: {why}")
    return tuple(n for n in CORRECTORS if n in names)


def canonical(spec: str | Sequence) -> str:
    """``spec`` as the config stores it: the names in the registry's order (with their arguments),
    or ``"none"``."""
    args = _arguments(spec)
    return ",".join(f"{n}:{args[n]}" if n in args else n for n in parse(spec)) or "none"


def help_text() -> str:
    """The ``--correction`` help: every name and the rule for combining them."""
    names = "; ".join(f"{n} ({e.summary})" for n, e in CORRECTORS.items())
    rules = "; ".join(f"at most one of {', '.join(n for n, e in CORRECTORS.items() if e.target == t)}"
                      for t in TARGETS if sum(e.target == t for e in CORRECTORS.values()) > 1)
    return (f"none, or a comma list of: {names}. Any combination with {rules}. The pipeline engine runs "
            f"{' and '.join(PIPELINE)}; see docs/correctors.md")


def build(spec: str | Sequence, **keywords) -> list:
    """The correctors of ``spec`` in the registry's order, ready for ``Delayed``.

    An item of ``spec`` may be a corrector object; a name is built with ``keywords``, the names
    ``Delayed`` took before correctors were objects and the config uses (``dc_lambda``,
    ``ef_dtype``, ...: each corrector class declares its own in ``Corrector.keywords``; ``None``
    is the default). A keyword of a corrector that ``spec`` does not name is still checked, by
    building that corrector, and then unused.
    """
    from delaylab.optim.corrector import Corrector

    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = parse(items)
    objects = {}
    for item in items:
        if not isinstance(item, str):
            if not isinstance(item, Corrector):
                raise TypeError(f"a correction is a name or a Corrector, got {type(item).__name__}")
            objects[item.name] = item
    classes = {n: e.factory for n, e in CORRECTORS.items()}
    owner = {kw: n for n, cls in classes.items() for kw in cls.keywords}
    args: dict[str, dict] = {}
    for kw, value in keywords.items():
        if kw not in owner:
            raise TypeError(f"unexpected keyword argument {kw!r} (corrector keywords: {', '.join(owner)})")
        if value is not None:
            args.setdefault(owner[kw], {})[classes[owner[kw]].keywords[kw]] = value
    for n, value in _arguments(items).items():
        args.setdefault(n, {})[CORRECTORS[n].argument] = value
    built = {n: classes[n](**a) for n, a in args.items()}
    twice = sorted(set(objects) & set(built))
    if twice:
        raise ConfigError(f"{twice[0]} is given both as an object and by keywords; configure it once")
    unset = [n for n in names if CORRECTORS[n].argument is not None and n not in objects and n not in built]
    if unset:
        raise ConfigError(f"correction {unset[0]} needs its argument: {unset[0]}:K")
    return [objects.get(n) or built.get(n) or classes[n]() for n in names]


def for_stage(spec: str, lag: int) -> list:
    """The correctors of a pipeline stage whose gradients arrive ``lag`` updates stale (it runs
    them at delay 0): each with that lag. ``spec`` must name only lagged correctors."""
    names = parse(spec)
    unfit = [n for n in names if not CORRECTORS[n].lagged]
    if unfit:
        raise ConfigError(f"a pipeline stage runs correction {' or '.join(PIPELINE)}, got {','.join(unfit)}")
    return [CORRECTORS[n].factory(lag=lag) for n in names]
