"""Control commands as an operator reads them: what one asks for (:func:`describe_command`) and
what it did (:func:`command_effects`).

An inbox closes a command as ``applied`` when the plan of its epoch is logged, before that epoch
runs; what it then changed is only in the epoch's progress record: the commands the epoch applied
(``applied``, each with its id) and the controller's decisions (``decisions``, an operator's
carrying the command's id in ``why.command``). A routing request can change nothing — a rebalance
of lanes already even, a move of key groups already there — and is still ``applied``; reading
the effect from the record lets the dashboard say so instead of leaving "applied" beside an empty
list of decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def describe_command(c: dict[str, Any]) -> str:
    """What a control command did (or will do), in a few words."""
    if isinstance(c.get("route"), dict):
        r = c["route"]
        what = ("rebalance" if "rebalance" in r else f"rescale to {r.get('lanes')} lane{'' if r.get('lanes') == 1 else 's'}" if "lanes" in r
                else f"move key groups {r.get('move')}")
        return f"{what} of {r.get('step')}"
    if "pause" in c or "resume" in c:
        return "pause" if "pause" in c else "resume"
    if c.get("set"):
        return ", ".join(f"{t} = {v!r}" for t, v in c["set"].items())
    if "rewrite" in c:
        return f"network rewritten by {c['rewrite']} ({c.get('network', '?')})"
    if "undo" in c:
        return f"undid the replay of epoch {c['undo']}"
    if "replay" in c:
        return f"replayed from epoch {c['replay']}" + (f" with network {c['network']}" if "network" in c else "")
    if "network" in c:
        net = c["network"] if isinstance(c["network"], str) else "(a new network)"
        return f"network {net}" + (f", reset {', '.join(c['reset'])}" if c.get("reset") else "")
    return str(c)


@dataclass(frozen=True)
class Effect:
    """What one applied command did in ``epoch``: ``text`` for the operator, and the decisions it
    made (empty for a command that is not a routing request, or one that changed nothing)."""

    command: dict[str, Any]
    epoch: int
    text: str
    decisions: tuple[dict[str, Any], ...] = ()


def command_effects(records: list[dict[str, Any]]) -> dict[str, Effect]:
    """Every command the records' epochs applied, by id, with what it did."""
    out: dict[str, Effect] = {}
    for r in records:
        for c in r.get("applied") or []:
            made = tuple(d for d in r.get("decisions") or [] if (d.get("why") or {}).get("command") == c.get("id"))
            out[str(c.get("id"))] = Effect(c, r["batchId"], _effect(c, made, r), made)
    return out


def _effect(c: dict[str, Any], made: tuple[dict[str, Any], ...], record: dict[str, Any]) -> str:
    route = c.get("route")
    if not isinstance(route, dict):
        return describe_command(c)
    if made:
        return "; ".join(_decision_effect(d) for d in made)
    lanes = ((record.get("routing") or {}).get(route.get("step")) or {}).get("lanes")
    if "lanes" in route:
        return f"nothing changed: {route.get('step')} already ran on {route['lanes']} lane{'' if route['lanes'] == 1 else 's'}"
    if "move" in route:
        return "nothing moved: those key groups were already on those lanes"
    if lanes == 1:
        return f"nothing moved: {route.get('step')} runs on one lane"
    return "nothing moved: no move of a key group would even out its lanes' load"


def _decision_effect(d: dict[str, Any]) -> str:
    action = d.get("action") or {}
    if d.get("kind") == "rescale" and isinstance(action.get("lanes"), list):
        before, after = action["lanes"]
        return f"rescaled from {before} to {after} lanes ({action.get('keyGroupsMoved', '?')} key groups moved)"
    moves = action.get("moves")
    if isinstance(moves, list):
        return f"moved {len(moves)} key group{'' if len(moves) == 1 else 's'}"
    return str(d.get("kind"))
