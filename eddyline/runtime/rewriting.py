"""Graph rewriting while the network runs: the hot-spot detector's finding
(:mod:`eddyline.control.hotspot`) meets the rules (:mod:`eddyline.kinds.rewrite`).

After an epoch, :func:`propose_rewrites` asks the detector which steps are hot spots lanes cannot
fix; for each, the first enabled rule that fits writes a new network, which goes to the
checkpoint's inbox as a live change (``{"network": …, "inherit": …, "rewrite": …}``) — the path
``eddyline apply`` takes, so it is applied at the next epoch boundary, logged in that epoch's
plan (a replay after a crash applies it at the same epoch) and recorded in the checkpoint's
metadata. Before applying, :func:`checked_rewrite` runs the rule again on the network then in
force: only a command that is exactly the rule's effect may carry state over as the rule says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eddyline.api.network import NetworkSpec
from eddyline.control.controller import Controller
from eddyline.control.decisions import Decision, DecisionKind
from eddyline.control.hotspot import hot_spots
from eddyline.errors import SpecError
from eddyline.kinds.rewrite import RULES, Rewritten, fitting, rewrite
from eddyline.runtime.checkpoint import network_hash
from eddyline.runtime.inbox import Inbox


def propose_rewrites(
    spec: NetworkSpec,
    controller: Controller,
    inbox: Inbox,
    next_epoch: int,
    max_lanes: int,
    skip: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Queue a rewrite for a hot spot that a rule fits (one per boundary, none while one waits,
    none for the steps in ``skip``: their rewrite was refused); returns the steps rewritten."""
    cfg = spec.control.rewrite
    if cfg is None:
        return []
    history = controller.manager.history
    spots = hot_spots(spec, history, next_epoch, max_lanes)
    if not spots:
        return []
    waiting = {
        c["rewrite"].get("step") for c in inbox.pending() if isinstance(c.get("rewrite"), dict)
    }
    raw, queued = spec.as_dict(), []
    for spot in spots:
        if spot.step in waiting or spot.step in skip or queued:
            continue  # one rewrite per boundary: the next one judges the rewritten network
        found = fitting(spec, raw, spot.step, cfg.rules)
        if found is None:
            continue
        rule, done = found
        recent = [x.makespan_ms for x in history.epochs(spot.step)[-3:]]
        before = float(np.mean(recent)) if recent else 0.0
        inbox.submit_command(
            {
                "network": done.network,
                "reset": [],
                "inherit": done.inherit,
                "rewrite": {
                    "rule": rule,
                    "step": spot.step,
                    "steps": [*done.inherit, spot.step],
                    "summary": list(done.summary),
                    "why": {**spot.why, "makespanMs": round(before, 1)},
                    # what the rule expects (an estimate, judged by ``measured``)
                    "expected": RULES[rule].expect(before, spot.why),
                },
            },
            origin="rewrite",
        )
        queued.append(spot.step)
    return queued


def checked_rewrite(spec: NetworkSpec, command: dict[str, Any]) -> Rewritten:
    """The effect of the rule a rewrite command names, applied to ``spec`` (the network in
    force); refused unless it is exactly the command's network."""
    r = command["rewrite"]
    if not isinstance(r, dict):
        raise SpecError("rewrite: expected a mapping with the rule and the step")
    done = rewrite(spec, spec.as_dict(), str(r.get("rule")), str(r.get("step")))
    if network_hash(done.network) != network_hash(command["network"]) or done.inherit != (
        command.get("inherit") or {}
    ):
        raise SpecError(
            f"rewrite: the network is not what rule '{r.get('rule')}' makes of the running one"
        )
    return done


def decision(command: dict[str, Any], epoch: int) -> Decision:
    """The rewrite as a control-plane decision of ``epoch`` (the first epoch it runs in)."""
    r = command["rewrite"]
    action = {
        "rule": r["rule"],
        "steps": r["steps"],
        "inherit": command.get("inherit") or {},
        "plan": r["summary"],
    }
    return Decision(epoch, r["step"], DecisionKind.REWRITE, action, r["why"], r["expected"])
