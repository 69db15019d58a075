"""``explain`` on every Nexmark spec, offline: each step with what it becomes in one epoch."""

from __future__ import annotations

from pathlib import Path

from eddyline.api.validate import load_spec


def test_every_nexmark_spec_validates_offline_and_explains() -> None:
    from eddyline.plan.explain import explain

    specs = sorted((Path(__file__).resolve().parents[2] / "examples" / "nexmark").glob("q*.yaml"))
    assert len(specs) == 11
    for path in specs:
        spec = load_spec(path)
        text = explain(spec, 2)
        for step in spec.steps:
            assert f"{step.name} ← " in text
            if step.stateful:
                assert f"the {step.kind} kernel" in text or step.kind == "window_aggregate"
