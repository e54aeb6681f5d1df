"""Statistics asked for by spec: ``"lens"``, ``"lens:every=16"``, ``"survival:granularity=head"``.

``parse_spec`` makes the accumulator a spec names (its options are the statistic's ``OPTIONS``,
its constructor's keywords); ``Accumulator.spec`` writes the spec back. ``make_accumulators``
makes a scan's accumulators from specs or accumulators, once per spec.
"""

from __future__ import annotations

from ..errors import InputError
from .accumulators import STATS, Accumulator, SubspaceStats, _FlowStats

__all__ = ["make_accumulators", "parse_spec"]


def make_accumulators(stats) -> dict[str, Accumulator]:
    """Accumulators for ``stats``, keyed by their specs (``Accumulator.spec``).

    ``stats``: one or a list of statistic names from ``STATS``, specs with options
    (``"lens:every=16"``, ``"survival:granularity=head"``, ``"subspaces:pca_k=8:unembed_k=16"``;
    ``parse_spec``) or accumulators already made, with no sums yet. A spec asked for twice
    is kept once.
    """
    accepted = (f"a statistic's name or spec (choose from {sorted(STATS)}; options as in "
                "'lens:every=16'), an accumulator, or a list of them")
    try:
        items = [stats] if isinstance(stats, str | Accumulator) else list(stats)
    except TypeError:
        raise InputError(f"stats is {accepted}, not {stats!r} (of type {type(stats).__name__})") from None
    if not items:
        raise InputError(f"no statistics asked for: choose from {sorted(STATS)}")
    odd = [(i, s) for i, s in enumerate(items) if not isinstance(s, str | Accumulator)]
    if odd:
        i, item = odd[0]
        raise InputError(f"stats item {i} is {item!r} (of type {type(item).__name__}): "
                         f"each item is {accepted.removesuffix(', or a list of them')}")
    unknown = [s for s in items if isinstance(s, str) and s.split(":")[0].strip() not in STATS]
    if unknown:
        raise InputError(f"unknown statistics {unknown}: choose from {sorted(STATS)}")
    held = [f"{s.spec!r} ({s.tokens:,} tokens)" for s in items if isinstance(s, Accumulator) and s.sums]
    if held:
        raise InputError(f"the accumulators {', '.join(held)} already hold an earlier scan's sums, "
                         "which this scan would add to: pass acc.empty_like() (or the spec) to "
                         "start afresh; to combine two scans, merge their accumulators (acc.merge)")
    accs: dict[str, Accumulator] = {}
    for item in items:
        acc = item if isinstance(item, Accumulator) else parse_spec(item)
        accs.setdefault(acc.spec, acc)
    shared = [a for a in accs.values() if a.lean and isinstance(a, _FlowStats | SubspaceStats)]
    for name in {a.name for a in shared}:
        specs = [a.spec for a in shared if a.name == name]
        if len(specs) > 1:  # one FlowSums a batch carries one of each
            raise InputError(f"{specs}: {name} is computed in a pass shared with the other flow "
                             "statistics, once per scan; ask for one of these")
    return accs


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_spec(spec: str) -> Accumulator:
    """The accumulator ``spec`` names: ``name`` or ``name:option=value[:option=value...]``.

    Options are the statistic's ``OPTIONS`` (its constructor's keywords), each value read as
    the type of its default (a bool from true/false, yes/no or 1/0 only), each at most once.
    Raises ``InputError`` naming the options a statistic takes.
    """
    name, *options = (part.strip() for part in spec.split(":"))
    if name not in STATS:
        raise InputError(f"unknown statistics [{spec!r}]: choose from {sorted(STATS)}")
    cls = STATS[name]
    defaults = cls.option_defaults()
    takes = ", ".join(f"{k}=<{type(d).__name__}> (default {d})" for k, d in defaults.items()) \
        or "no options"
    kwargs = {}
    for option in options:
        key, eq, value = (part.strip() for part in option.partition("="))
        if key not in defaults or not eq or key in kwargs:  # an option given twice too
            raise InputError(f"statistic spec {spec!r}: {name} takes {takes}, each once")
        kind = type(defaults[key])
        try:
            kwargs[key] = _BOOLS[value.lower()] if kind is bool else kind(value)
        except (ValueError, KeyError):
            raise InputError(f"statistic spec {spec!r}: {key}={value!r} does not read as "
                             f"{kind.__name__}; {name} takes {takes}") from None
    return cls(**kwargs)

