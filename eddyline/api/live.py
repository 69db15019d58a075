"""Control lines: parameters of a running network that may change between two epochs.

A setting is ``STEP.PARAM=VALUE`` (``expensive.filter=price > 200``, ``top.k=3``,
``per_auction.watermark_delay=5s``), ``SINK.PARAM=VALUE`` for where a sink writes
(``out.path=/data/v2``, ``alerts.subject=alerts.v2``, ``totals.table=totals_v2``), or ``control.SECTION.FIELD=VALUE`` for the control plane's
policies (``control.balance.threshold=0.3``, ``control.overload.mode=semantic``; see
:data:`LIVE_CONTROL`). Which parameters may change is each step kind's
``live_params``: what a kind can take at an epoch boundary without its state changing shape (a
filter's or a select's expressions, a watermark delay, a window's allowed lateness, a top-k's k).
For kinds whose parameters are one value (``filter``, ``select``) the parameter is the kind's
own name.

:func:`with_settings` gives the network with settings applied, validated as a whole as if it
had been written so (structure, graph, SQL syntax): a bad value is refused with the reason
before anything changes. The runtime keeps the settings in force in every epoch plan, so a
replay runs each epoch with the parameters it first ran with.
"""

from __future__ import annotations

from typing import Any

import yaml

from eddyline.api.network import NetworkSpec
from eddyline.errors import SpecError


def parse_setting(text: str) -> tuple[str, Any]:
    """``"top.k=3"`` → ``("top.k", 3)``: the value is read as YAML (numbers, booleans, lists,
    text)."""
    target, sep, value = text.partition("=")
    target = target.strip()
    step, dot, param = target.partition(".")
    if not sep or not dot or not step or not param:
        raise SpecError(f"control: expected STEP.PARAM=VALUE (e.g. expensive.filter=price > 200), got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as e:
        raise SpecError(f"control {target}: the value is not valid YAML: {e}") from None
    return target, parsed


def with_settings(spec: NetworkSpec, settings: dict[str, Any]) -> NetworkSpec:
    """``spec`` with every ``STEP.PARAM → value`` of ``settings`` in force (raises
    :class:`SpecError` naming the setting when one cannot be)."""
    if not settings:
        return spec
    from eddyline.api.validate import spec_from_raw

    raw = spec.as_dict()
    for target, value in settings.items():
        if target.startswith("control."):
            _set_control(spec, raw, target, value)
            continue
        name, _, param = target.partition(".")
        sink = next((s for s in spec.sinks if s.name == name), None)
        if sink is not None:
            _set_sink(raw, sink, target, param, value)
            continue
        step = next((s for s in spec.steps if s.name == name), None)
        if step is None:
            raise SpecError(f"control {target}: no step or sink '{name}'; steps: "
                            f"{', '.join(s.name for s in spec.steps) or '-'}; sinks: {', '.join(s.name for s in spec.sinks)}")
        live = step.info.live_params
        if param not in live:
            what = f"one of {', '.join(live)}" if live else "none: its parameters shape its state or its output"
            raise SpecError(f"control {target}: '{param}' of a {step.kind} step cannot change while it runs (can: {what})")
        node = next(n for n in raw["steps"] if n["name"] == name)
        if param == step.kind:
            node[step.kind] = value
        else:
            node[step.kind] = {**node[step.kind], param: value}
    try:
        return spec_from_raw(raw)
    except SpecError as e:
        raise SpecError(f"control {', '.join(f'{t}={v!r}' for t, v in settings.items())}: {e}") from None


def _set_sink(raw: dict[str, Any], sink: Any, target: str, param: str, value: Any) -> None:
    """A sink's target (``out.path=/data/v2``): the sink is opened on it at the boundary."""
    live = sink.info.live_params
    if param not in live:
        what = f"one of {', '.join(live)}" if live else "none"
        raise SpecError(f"control {target}: '{param}' of a {sink.kind} sink cannot change while it runs (can: {what})")
    node = next(n for n in raw["sinks"] if n["name"] == sink.name)
    node[sink.kind] = {**node[sink.kind], param: value}


def sink_settings(spec: NetworkSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``settings`` that name a sink's target."""
    sinks = {s.name for s in spec.sinks}
    return {t: v for t, v in settings.items() if t.partition(".")[0] in sinks}


def carried(old: NetworkSpec, new: NetworkSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that stay in force when network ``new`` replaces ``old`` (a live change, a
    replay with another network, a rewrite): those whose parameter ``new`` has as ``old`` had
    it — a new network that sets a parameter itself overrides the setting — and that still fit."""
    kept: dict[str, Any] = {}
    for target, value in settings.items():
        before, after = _written(old, target), _written(new, target)
        if before is _ABSENT or before != after:
            continue
        try:
            with_settings(new, {**kept, target: value})
        except SpecError:
            continue
        kept[target] = value
    return kept


_ABSENT = object()


def _written(spec: NetworkSpec, target: str) -> Any:
    """The value of a setting's parameter as the network is written (``_ABSENT``: no such one)."""
    parts = target.split(".")
    if parts[0] == "control":
        section = getattr(spec.control, parts[1], None) if len(parts) == 3 else None
        return _ABSENT if section is None else getattr(section, parts[2], _ABSENT)
    sink = next((s for s in spec.sinks if s.name == parts[0]), None)
    if sink is not None and len(parts) == 2:
        return (sink.kind, getattr(sink.params, parts[1], _ABSENT))
    step = next((s for s in spec.steps if s.name == parts[0]), None)
    if step is None or len(parts) != 2:
        return _ABSENT
    value = step.params if parts[1] == step.kind else getattr(step.params, parts[1], _ABSENT)
    return (step.kind, value.model_dump(mode="json") if hasattr(value, "model_dump") else value)


#: The control plane's settings that may change while it runs (``control.<section>.<field>``):
#: its policies read them at every decision.
LIVE_CONTROL = {
    "balance": ("threshold", "period", "max_moves", "cooldown", "patience", "window"),
    "scale": ("min_lanes", "max_lanes", "target_utilization", "cooldown", "tolerance", "auto"),
    "overload": ("shedding", "mode", "headroom", "min_keep", "seed", "probe_rows"),
}


def _set_control(spec: NetworkSpec, raw: dict[str, Any], target: str, value: Any) -> None:
    parts = target.split(".")
    section, field = (parts[1], parts[2]) if len(parts) == 3 else ("", "")
    live = LIVE_CONTROL.get(section, ())
    if field not in live:
        can = ", ".join(f"control.{s}.{f}" for s, fs in LIVE_CONTROL.items() for f in fs)
        raise SpecError(f"control {target}: cannot change while it runs (can: {can})")
    if getattr(spec.control, section) is None:
        raise SpecError(f"control {target}: the network has no control.{section}; it cannot be turned on while it runs")
    raw.setdefault("control", {}).setdefault(section, {})[field] = value
