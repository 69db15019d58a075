"""Graph rewriting as data (AnduIN, seed 003 §4.1–4.3): the rules the control plane may apply to a
running network when lanes cannot relieve a hot spot.

A :class:`Rule` is a row of :data:`RULES`: the step kind it applies to, its condition and its
effect in words (``eddyline explain --rules`` prints them), and the function that writes the
rewritten network. When a rule fits, it also says which state the new network starts from: a new
step may *inherit* an existing step's state (a copy of its key groups at the boundary), and a
changed step may keep its own state because the rule knows it still fits — what a hand-written
``eddyline apply`` of the same change could not claim (it would need ``--reset``).

When a rule fires is the hot-spot detector's business (:mod:`eddyline.control.hotspot`); the
engine applies the rewritten network like any live change (:mod:`eddyline.api.change`), at an
epoch boundary, logged in the plan, so a replay after a crash runs the very same network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.api.steps import StepSpec
from eddyline.errors import SpecError
from eddyline.kinds.base import resolve


@dataclass(frozen=True)
class Rewritten:
    """A rule's effect on one network."""

    network: dict[str, Any]  # the new network, as its spec dict
    #: new step -> the step whose state (at the boundary) it starts with
    inherit: dict[str, str] = field(default_factory=dict)
    #: changed stateful steps whose state still fits their new form
    fits: tuple[str, ...] = ()
    #: what changed, one line each (for the decision and ``explain``)
    summary: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # the step kind it rewrites
    condition: str
    effect: str
    #: (network as its spec dict, the network, the step) -> the rewritten network; raises
    #: :class:`SpecError` naming why the rule does not fit the step
    apply: Callable[[dict[str, Any], NetworkSpec, StepSpec], Rewritten]
    #: (the step's makespan before in ms, why it is a hot spot) -> what the rule expects after:
    #: ``stepMakespanMs`` per stateful step it makes, ``makespanMs`` of them all
    expect: Callable[[float, dict[str, Any]], dict[str, float]]


def _divided(before: float, why: dict[str, Any]) -> dict[str, float]:
    """Two stages, each with lanes of its own, divide the step's work between them; within one
    epoch they run one after the other, so their sum stays."""
    return {"stepMakespanMs": round(before / 2, 1), "makespanMs": round(before, 1)}


def _relieved(before: float, why: dict[str, Any]) -> dict[str, float]:
    """The hot key group's rows shrink to a partial per task chunk, so its lane falls toward a
    fair lane's load: the makespan by the hot group's share of a fair lane (seen by the
    detector; a planned rewrite without it claims nothing)."""
    shares = [e.get("hotShareOfFairLane", 1.0) for e in why.get("epochs", ())]
    after = before / max(1.0, min(shares)) if shares else before
    return {"stepMakespanMs": round(after, 1), "makespanMs": round(after, 1)}


STAGE1 = "{step}_stage1"


def _plus_element(step: StepSpec) -> str:
    """The first Kleene-plus element of a pattern step (where the pipeline splits)."""
    from eddyline.operators.pattern.dsl import PLUS

    p = step.params
    try:
        pattern = resolve(p.factory)(**p.args)
    except Exception as e:  # the factory runs user code
        raise SpecError(
            f"step '{step.name}': pattern.factory: cannot build the pattern: {e}"
        ) from e
    plus = [e.name for e in pattern.elements if e.quantifier == PLUS]
    if not plus:
        raise SpecError(f"step '{step.name}': the pattern has no Kleene-plus element to split at")
    return plus[0]


def _new_name(spec: NetworkSpec, step: StepSpec, name: str, what: str) -> str:
    """``name`` for the new step ``what``, refused if the network uses it already."""
    if name in {n.name for n in (*spec.sources, *spec.steps, *spec.sinks)}:
        raise SpecError(f"step '{step.name}': the name '{name}' for {what} is taken")
    return name


def _split_step(
    raw: dict[str, Any], step: StepSpec, into: Callable[[dict[str, Any]], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The network's steps (spec dicts) with ``step`` replaced, in place, by ``into(its dict)``."""
    return [new for s in raw["steps"] for new in (into(s) if s["name"] == step.name else [s])]


def _pattern_split(raw: dict[str, Any], spec: NetworkSpec, step: StepSpec) -> Rewritten:
    """One pattern step becomes stage 1 (``<step>_stage1``, new, the runs up to the first
    ``P``) and stage 2 (the step itself, its output unchanged, extending stage 1's seeds)."""
    p = step.params
    if p.split is not None:
        raise SpecError(f"step '{step.name}': the pattern is split already (stage {p.split.stage})")
    first = _new_name(spec, step, STAGE1.format(step=step.name), "stage 1")
    at = _plus_element(step)
    steps = _split_step(raw, step, lambda s: [
        {**s, "name": first, "pattern": {**s["pattern"], "split": {"stage": 1, "at": at}}},
        {**s, "pattern": {**s["pattern"], "split": {"stage": 2, "at": at}, "seeds": first}},
    ])
    control = dict(raw.get("control") or {})
    if step.name in (control.get("steps") or ()):
        control["steps"] = [*control["steps"], first]
    network = {**raw, "steps": steps, **({"control": control} if control else {})}
    return Rewritten(
        network,
        inherit={first: step.name},
        fits=(step.name,),
        summary=(
            f"+ step '{first}': pattern up to the first '{at}', emitting the partial matches (seeds)",
            f"~ step '{step.name}': extends the seeds of '{first}' (P+ = P v (P P+) at '{at}')",
        ),
    )


PATTERN_SPLIT = Rule(
    name="pattern-pipeline-split",
    kind="pattern",
    condition="a pattern step with a Kleene-plus element P, not split yet, is the hot spot",
    effect="split its pipeline at the first P: stage 1 matches up to P and emits seeds, the step "
    "itself (stage 2) extends them; both start from the step's state, each keeps the runs of its part",
    apply=_pattern_split,
    expect=_divided,
)

LOCAL = "{step}_local"


def _aggregate_split(raw: dict[str, Any], spec: NetworkSpec, step: StepSpec) -> Rewritten:
    """A ``combine`` step (``<step>_local``, new, stateless) in front of the aggregate, which
    then merges its partials (``combined: true``) into the state it has."""
    p = step.params
    if p.combined:
        raise SpecError(f"step '{step.name}': the aggregate takes combined partials already")
    local = _new_name(spec, step, LOCAL.format(step=step.name), "the local step")
    overload = spec.control.overload
    if overload is not None and overload.shedding != "off":
        raise SpecError(f"step '{step.name}': overload shedding would shed partial rows, each standing for many rows")
    steps = _split_step(raw, step, lambda s: [
        {"name": local, "input": s["input"], "combine": {k: v for k, v in s["aggregate"].items() if k != "combined"}},
        {**s, "input": local, "aggregate": {**s["aggregate"], "combined": True}},
    ])
    return Rewritten(
        {**raw, "steps": steps},
        fits=(step.name,),
        summary=(
            f"+ step '{local}': combine — one partial row per key and task chunk, before the shuffle",
            f"~ step '{step.name}': merges the partials of '{local}' into the state it has (combined)",
        ),
    )


AGGREGATE_SPLIT = Rule(
    name="aggregate-local-global-split",
    kind="aggregate",
    condition="an aggregate step, not split yet and not behind overload shedding, is the hot spot",
    effect="combine each key's rows where they are read (a new stateless step), so the lane that owns "
    "a hot key merges one partial per task chunk instead of every row; the step keeps its state",
    apply=_aggregate_split,
    expect=_relieved,
)

#: Every rule, by name.
RULES: dict[str, Rule] = {r.name: r for r in (PATTERN_SPLIT, AGGREGATE_SPLIT)}


def rewrite(spec: NetworkSpec, raw: dict[str, Any], rule: str, step: str) -> Rewritten:
    """``rule`` applied to ``step`` of the network ``spec`` (``raw``: its spec dict); raises
    :class:`SpecError` with the reason when it does not fit."""
    if rule not in RULES:
        raise SpecError(f"rewrite: unknown rule '{rule}'; rules: {', '.join(RULES)}")
    node = next((s for s in spec.steps if s.name == step), None)
    if node is None:
        raise SpecError(f"rewrite: no step '{step}' in network '{spec.name}'")
    r = RULES[rule]
    if node.kind != r.kind:
        raise SpecError(
            f"rewrite: rule '{rule}' rewrites {r.kind} steps; '{step}' is a {node.kind}"
        )
    return r.apply(raw, spec, node)


def fitting(
    spec: NetworkSpec, raw: dict[str, Any], step: str, rules: tuple[str, ...]
) -> tuple[str, Rewritten] | None:
    """The first of ``rules`` that fits ``step``, with its effect (None: none does)."""
    for name in rules:
        try:
            return name, rewrite(spec, raw, name, step)
        except SpecError:
            continue
    return None
