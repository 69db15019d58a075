"""Live network changes (``eddyline apply``): what differs between the running network and a
new one, and whether the new one can take over at an epoch boundary.

A change keeps what did not change: an unchanged step keeps its state and routing, an unchanged
sink its output. Added sources, steps and sinks start at the boundary (a new source from its
first offset); removed ones stop there. A changed stateless step (a filter, a select, a udf's
function, another ``module:function``) simply runs its new form from the boundary. A changed stateful step keeps
its state when only its live parameters changed (:mod:`eddyline.api.live`); otherwise its state
would not fit the new step, and the change is refused unless the step is named in ``reset``
(it then starts with no state); so is a change that reads more of a join's output than it
stores (a join keeps only the columns read after it). What cannot change in place is refused
with the reason: the
network's name and key groups (every key-group state is cut by them), a source's kind or
parameters (its offsets mean something else), a changed stateful step that is not reset.

Added steps may start from a kept epoch instead (``--from-epoch``): an added source with the
parameters of a running one starts where that one was (:func:`history_starts`), and an added
step that reads a running source reads a copy of it that does (:func:`catch_ups`), until the
copy has caught up with the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.errors import SpecError


@dataclass
class NetworkDiff:
    added: list[str] = field(default_factory=list)  # "step 'x'", "sink 'y'", "source 'z'"
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # with what changed
    #: stateful steps whose state does not fit their new form
    incompatible: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def lines(self) -> list[str]:
        out = [f"+ {a}" for a in self.added] + [f"- {r}" for r in self.removed] + [f"~ {c}" for c in self.changed]
        return out or ["(no change)"]


def _dump(node: Any) -> dict[str, Any]:
    return node.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def network_diff(
    old: NetworkSpec, new: NetworkSpec, reset: tuple[str, ...] = (), fits: tuple[str, ...] = ()
) -> NetworkDiff:
    """What ``new`` adds, removes and changes against ``old``, and the problems that keep it
    from taking over a running ``old`` (``reset``: stateful steps that may start empty;
    ``fits``: changed stateful steps whose state is known to fit, as a rewrite rule vouches)."""
    d = NetworkDiff()
    if new.name != old.name:
        d.problems.append(f"name: the running network is '{old.name}'; a change keeps the name")
    if new.key_groups != old.key_groups:
        d.problems.append(f"key_groups: the running network has {old.key_groups}; state is cut by them, so they stay")
    for what, olds, news in (("source", old.sources, new.sources), ("step", old.steps, new.steps), ("sink", old.sinks, new.sinks)):
        before, after = {n.name: n for n in olds}, {n.name: n for n in news}
        d.added += [f"{what} '{n}'" for n in after if n not in before]
        d.removed += [f"{what} '{n}'" for n in before if n not in after]
        for name in before.keys() & after.keys():
            a, b = _dump(before[name]), _dump(after[name])
            if a == b:
                continue
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            d.changed.append(f"{what} '{name}': {', '.join(_detail(a, b, k) for k in fields)}")
            if what == "source":
                d.problems.append(f"source '{name}': its offsets would mean something else; remove it and add one with another name")
            elif what == "step" and before[name].stateful and name not in fits:
                _check_state(d, before[name], after[name], reset)
    _check_read_columns(d, old, new, reset, fits)
    unknown = [r for r in reset if not any(s.name == r and s.stateful for s in old.steps)]
    if unknown:
        d.problems.append(f"reset: {', '.join(unknown)}: not a stateful step of the running network")
    d.changed.sort()
    return d


def _detail(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
        inner = sorted(k for k in a[key].keys() | b[key].keys() if a[key].get(k) != b[key].get(k))
        return ", ".join(f"{key}.{k}" for k in inner)
    return key


def _check_state(d: NetworkDiff, before: Any, after: Any, reset: tuple[str, ...]) -> None:
    if before.kind != after.kind:
        fields = [f"its kind ({before.kind} -> {after.kind})"]
    elif before.inputs != after.inputs:
        fields = ["input"]
    else:
        a, b = _dump(before)[before.kind], _dump(after)[after.kind]
        a, b = (a, b) if isinstance(a, dict) else ({}, {})
        fields = [f"{before.kind}.{_detail(a, b, k)}" for k in sorted(a.keys() | b.keys())
                  if a.get(k) != b.get(k) and k not in before.info.live_params]
    if fields and before.name not in reset:
        d.incompatible.append(before.name)
        d.problems.append(
            f"step '{before.name}': {', '.join(fields)} changed, and its state would not fit the changed step; "
            f"give --reset {before.name} to start it with no state"
        )


def _check_read_columns(d: NetworkDiff, old: NetworkSpec, new: NetworkSpec, reset: tuple[str, ...],
                        fits: tuple[str, ...]) -> None:
    """A step that stores only the columns read after it (a join) cannot give the rows it already
    stores columns it left out: a change that reads more of its output needs it reset."""
    before, after = old.columns_read(), new.columns_read()
    for step in old.steps:
        if not step.info.stores_read_columns or step.name in (*reset, *fits, *d.incompatible):
            continue
        if step.name not in after:
            continue
        had, wants = before.get(step.name), after[step.name]
        if had is None or (wants is not None and wants <= had):
            continue
        more = "every column" if wants is None else ", ".join(sorted(wants - had))
        d.incompatible.append(step.name)
        d.problems.append(
            f"step '{step.name}': it stores only the columns read after it ({', '.join(sorted(had)) or 'none'} besides "
            f"its keys and times), and the change reads more ({more}); give --reset {step.name} to start it with "
            "no state"
        )


def history_starts(old: NetworkSpec, new: NetworkSpec) -> dict[str, str]:
    """The sources ``new`` adds that read exactly what a source of ``old`` reads (same kind and
    parameters): each may start where that one was at a kept epoch (``--from-epoch``), so the
    query added on it sees the input from there on."""
    running = {s.name: _dump(s) for s in old.sources}
    out: dict[str, str] = {}
    for s in new.sources:
        if s.name in running or not s.info.offsets_shared:
            continue
        mine = {k: v for k, v in _dump(s).items() if k != "name"}
        match = next((n for n, d in running.items() if {k: v for k, v in d.items() if k != "name"} == mine), None)
        if match is not None:
            out[s.name] = match
    return out


#: the name of the copy of a running source that added steps catch up on
CATCH_UP = "{source}__from_{epoch}"


def catch_ups(old: NetworkSpec, new: NetworkSpec, epoch: int) -> dict[str, tuple[str, tuple[str, ...]]]:
    """For ``apply --from-epoch``: the added steps that read a running source directly. They
    read a copy of it instead (``<source>__from_<epoch>``, same kind and parameters), which
    starts where the source was at ``epoch`` and catches up behind it; once the copy has read as
    far as the source, the steps read the source itself (``Engine``). Returns copy -> (running
    source, its added readers). A step that reads a running source among several inputs is
    refused: it cannot be given a copy for one of them."""
    running = {s.name for s in old.sources}
    before = {s.name for s in old.steps}
    taken = {n.name for n in (*new.sources, *new.steps, *new.sinks)}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for step in new.steps:
        if step.name in before:
            continue
        shared = [i for i in step.inputs if i in running]
        if not shared:
            continue
        if len(step.inputs) > 1:
            raise SpecError(f"apply --from-epoch: step '{step.name}' reads running source '{shared[0]}' among other "
                            "inputs; to start it from a kept epoch, read the source through a step of its own "
                            "(e.g. select: ['*'])")
        copy = CATCH_UP.format(source=shared[0], epoch=epoch)
        if copy in taken:
            raise SpecError(f"apply --from-epoch: the name '{copy}' for the copy of source '{shared[0]}' is taken")
        out[copy] = (shared[0], (*out.get(copy, ("", ()))[1], step.name))
    return out


def with_catch_ups(spec: NetworkSpec, copies: dict[str, tuple[str, tuple[str, ...]]]) -> NetworkSpec:
    """``spec`` as it runs while added steps catch up (see :func:`catch_ups`): each copy a source
    of its own, its steps reading it. Copies whose source or steps are gone are left out."""
    from eddyline.api.validate import spec_from_raw

    copies = still_catching_up(spec, copies)
    if not copies:
        return spec
    raw = spec.as_dict()
    sources = {s["name"]: s for s in raw["sources"]}
    steps = {s["name"]: s for s in raw["steps"]}
    for copy, (source, readers) in copies.items():
        raw["sources"].append({**sources[source], "name": copy})
        for r in readers:
            steps[r]["input"] = copy
    return spec_from_raw(raw)


def still_catching_up(
    spec: NetworkSpec, copies: dict[str, tuple[str, tuple[str, ...]]]
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The copies of :func:`catch_ups` that still apply to ``spec``: their source is there and
    so is one of their steps, still reading it."""
    sources = {s.name for s in spec.sources}
    reads = {s.name: s.inputs for s in spec.steps}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for copy, (source, readers) in copies.items():
        kept = tuple(r for r in readers if reads.get(r) == (source,))
        if source in sources and kept:
            out[copy] = (source, kept)
    return out


def required_history_starts(old: NetworkSpec, new: NetworkSpec, epoch: int) -> dict[str, str]:
    """:func:`history_starts` for ``apply --from-epoch``, also the copies :func:`catch_ups`
    makes (copy -> running source): refused when there is neither."""
    starts = history_starts(old, new) | {c: s for c, (s, _) in catch_ups(old, new, epoch).items()}
    if not starts:
        raise SpecError("apply --from-epoch: no added step reads a running source and no added source reads what a "
                        "running one reads, so nothing would start from a kept epoch")
    return starts


def check_change(
    old: NetworkSpec, new: NetworkSpec, reset: tuple[str, ...] = (), fits: tuple[str, ...] = ()
) -> NetworkDiff:
    """The diff, or a :class:`SpecError` with every reason the change cannot be applied."""
    d = network_diff(old, new, reset, fits)
    if d.problems:
        raise SpecError([f"apply: {p}" for p in d.problems])
    return d


def check_restart(in_force: NetworkSpec, given: NetworkSpec, checkpoint: str) -> NetworkDiff:
    """A run started with ``given`` on a checkpoint whose network in force is ``in_force``: the
    change it makes, to be applied at the next epoch boundary as ``eddyline apply`` would, or a
    :class:`SpecError` (before anything runs) naming each step and field whose state would not
    fit, and what to do instead. The state is never read as another network's."""
    d = network_diff(in_force, given)
    if d.problems:
        raise SpecError([
            *(f"run: {p.replace('give --reset', 'apply with --reset')}" for p in d.problems),
            f"run: checkpoint {checkpoint!r} holds network '{in_force.name}' as it ran until now, and this spec "
            "changes it in a way its state cannot follow; nothing was run. Change it live with 'eddyline apply "
            f"SPEC --checkpoint {checkpoint}' (with --reset STEP for a step that may start with no state), or "
            "run this spec on a new checkpoint",
        ])
    return d
