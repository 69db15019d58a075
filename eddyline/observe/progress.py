"""Per-epoch progress: a live terminal table and JSON lines.

Field names follow Spark's ``StreamingQueryProgress`` where one exists (``batchId``,
``numInputRows``, ``inputRowsPerSecond``, ``processedRowsPerSecond``, ``durationMs``,
``eventTime.watermark``, ``stateOperators[].numRowsTotal`` / ``memoryUsedBytes`` /
``numRowsDroppedByWatermark``, ``sources[]``, ``sink``); Eddyline's own additions are
``deadLetters``, ``lateRows``, ``routing`` (per step: lanes, key groups per lane, split key
groups), ``load`` (per step: lane busy times and shares of the makespan, per key group load),
``decisions`` (the control plane's decisions taking effect in the epoch), ``recentDecisions``
(the last few, with what they measured once known) and ``stateOperators[].customMetrics``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from eddyline.observe.commands import command_effects, describe_command


def _human(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


class ProgressReporter:
    """Receives one progress record per epoch; prints and/or writes it."""

    def __init__(self, *, console: Console | None = None, live: bool = True, json_path: str | None = None, keep: int = 12):
        self.console = console or Console(stderr=True)
        self.live_enabled = live
        self.rows: deque[dict[str, Any]] = deque(maxlen=keep)
        self._json: IO[str] | None = open(json_path, "a", encoding="utf-8") if json_path else None  # noqa: SIM115
        self._live: Live | None = None
        #: called with every record (the dashboard, the metrics)
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def __enter__(self) -> ProgressReporter:
        if self.live_enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)
            self._live = None
        if self._json is not None:
            self._json.close()
            self._json = None

    def note(self, text: str) -> None:
        """A line for the operator beside the progress (a change the run made on its own)."""
        self.console.print(f"[yellow]note:[/yellow] {text}", highlight=False, soft_wrap=True)

    def report(self, record: dict[str, Any]) -> None:
        self.rows.append(record)
        if self._json is not None:
            self._json.write(json.dumps(record, default=str) + "\n")
            self._json.flush()
        if self._live is not None:
            self._live.update(self._render())
        for listener in self.listeners:
            listener(record)

    def _render(self) -> Group:
        t = Table(title="eddyline · epochs", expand=False)
        for col in ("epoch", "input", "in/s", "proc/s", "duration / trigger", "watermark", "state rows", "state MB", "late", "dead"):
            t.add_column(col, justify="right")
        for r in self.rows:
            state_rows = sum(s["numRowsTotal"] for s in r["stateOperators"])
            state_bytes = sum(s["memoryUsedBytes"] for s in r["stateOperators"])
            d = r["durationMs"]["triggerExecution"]
            trig = r.get("triggerMs") or 0
            flag = " [red]![/red]" if trig and d > trig else ""
            t.add_row(
                str(r["batchId"]) + (" (replay)" if r.get("replayed") else "")
                + (" tentative" if r.get("tentative") else "") + (" corrects" if r.get("retracts") else ""),
                _human(r["numInputRows"]),
                _human(r["inputRowsPerSecond"]),
                _human(r["processedRowsPerSecond"]),
                f"{d / 1000:.2f}s / {trig / 1000:.1f}s{flag}",
                (r["eventTime"].get("watermark") or "-")[11:23] if r["eventTime"].get("watermark") not in (None, "end-of-stream") else (r["eventTime"].get("watermark") or "-"),
                _human(state_rows),
                f"{state_bytes / 1e6:.1f}",
                str(r["lateRows"]),
                str(r["deadLetters"]),
            )
        parts: list[Any] = [t]
        if self.rows:
            last = self.rows[-1]
            sinks = ", ".join(f"{s['description']}={s['numOutputRows']}" for s in last.get("sinks", []))
            parts.append(f"[dim]output rows this epoch: {sinks or '-'}[/dim]")
            for step, v in last.get("routing", {}).items():
                load = last.get("load", {}).get(step, {})
                shares = " ".join(f"{x:.2f}" for x in load.get("laneShareOfMakespan", []))
                spread = f" · split: {v['spread']}" if v.get("spread") else ""
                parts.append(
                    f"[dim]{step}: routing v{v['version']}, {v['lanes']} lanes, key groups per lane "
                    f"{v.get('keyGroupsPerLane')}, lane busy / makespan {shares or '-'}{spread}[/dim]"
                )
            recent = list(self.rows)[-5:]
            effects = command_effects(recent)
            for r in recent:  # control lines: what took effect (a routing request: what it did), what was refused
                for c in r.get("applied", []):
                    effect = effects[str(c.get("id"))].text if "route" in c else ""
                    parts.append(f"[green]epoch {r['batchId']}: control {c['id']} applied: {describe_command(c)}"
                                 f"{' — ' + effect if effect else ''}[/green]")
                for c in r.get("refused", []):
                    parts.append(f"[red]epoch {r['batchId']}: control {c['id']} refused: {c['reason']}[/red]")
            for d in last.get("recentDecisions", [])[-3:]:
                measured = d.get("measured") or {}
                parts.append(
                    f"[cyan]epoch {d['epoch']} {d['step']}: {d['kind']} {_brief(d['action'])} · why: {_brief(d['why'])} · "
                    f"expected makespan {d['expected'].get('makespanMs', '-')} ms · measured "
                    f"{measured.get('makespanMs', 'pending')}[/cyan]"
                )
        return Group(*parts)


def _brief(d: dict[str, Any], limit: int = 90) -> str:
    text = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("laneLoadMs", "scores"))
    return text if len(text) <= limit else text[: limit - 1] + "…"
