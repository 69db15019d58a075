"""A leader frozen past its lease between its stages and its publish (``--freeze-at E:after_stage``:
its lease check passed, its outputs are staged), woken after a ``--standby`` took over and
published: every store refuses what it writes then — the files sink's file system, PostgreSQL,
the NATS server — so nothing of it is visible, its staging is gone, and it stops saying it was
taken over. And the hazard that makes it matter: the new leader replays the epochs from the
frozen one on (taking their output back) before the old one wakes; they stay taken back.

Real ``eddyline run`` processes, a real PostgreSQL and NATS server; the outputs are compared with
an uninterrupted run's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine
from eddyline.storage import staging_leftovers

from ...io.natsread import consume, read_stream
from .drivers import err, frozen, start, wait_for
from .helpers import bids_window_spec, read_windows, write_bid_files

pytestmark = pytest.mark.slow

FROZEN = 3  # the epoch the leader freezes in, after its stages


def sinks(kinds: list[str], out: Path, postgres: Any, nats: Any, tag: str) -> list[dict[str, Any]]:
    made = []
    for kind in kinds:
        if kind == "files":
            made.append({"name": "files_out", "input": "per_auction", "files": {"path": str(out), "format": "parquet"}})
        elif kind == "postgres":
            made.append({"name": "pg_out", "input": "per_auction",
                         "postgres": {"url": postgres.url, "table": f"z_{tag}", "rewind": True}})
        else:
            made.append({"name": "nats_out", "input": "per_auction",
                         "nats": {"url": nats.url, "stream": f"Z{tag}", "subject": f"Z{tag}.windows"}})
    return made


def network(tmp: Path, kinds: list[str], postgres: Any, nats: Any, tag: str) -> dict[str, Any]:
    raw = bids_window_spec(tmp / "in", tmp / "unused").model_dump(mode="json", by_alias=True, exclude_none=True)
    return raw | {"trigger": 500, "history": 100, "sinks": sinks(kinds, tmp / f"out-{tag}", postgres, nats, tag)}


def outputs(tmp: Path, kinds: list[str], postgres: Any, nats: Any, tag: str) -> dict[str, list]:
    """What a reader of each sink sees (NATS: with the corrections applied), sorted."""
    got: dict[str, list] = {}
    for kind in kinds:
        if kind == "files":
            got[kind] = read_windows(tmp / f"out-{tag}")
        elif kind == "postgres":
            with psycopg.connect(postgres.url, autocommit=True) as conn:
                got[kind] = sorted(conn.execute(
                    f"SELECT auction, window_start, n, total, hi, round(mean::numeric, 6) FROM z_{tag}").fetchall())
        else:
            _, stable = consume(read_stream(nats.url, f"Z{tag}"))
            got[kind] = sorted(json.dumps(r, sort_keys=True) for r in stable)
    return got


def zombie_writes(tmp: Path, kinds: list[str], postgres: Any, nats: Any, tag: str, ckpt: Path) -> dict[str, int]:
    """What lease generation 1 wrote, visibly, of the epochs from the frozen one on: each store
    says who wrote what (a files epoch's ``_generation``, ``eddyline_epochs.generation``, the
    ``Eddyline-Generation`` header)."""
    count: dict[str, int] = {}
    for kind in kinds:
        if kind == "files":
            count[kind] = sum(1 for d in (tmp / f"out-{tag}").glob("epoch=*")
                              if int(d.name[6:]) >= FROZEN and (d / "_generation").read_text() == "1")
        elif kind == "postgres":
            checkpoint = json.loads((ckpt / "metadata.json").read_text())["id"]
            with psycopg.connect(postgres.url, autocommit=True) as conn:
                (count[kind],) = conn.execute(
                    "SELECT count(*) FROM eddyline_epochs WHERE sink = 'pg_out' AND checkpoint = %s AND epoch >= %s "
                    "AND generation = 1", (checkpoint, FROZEN)).fetchone()
        else:
            count[kind] = sum(1 for h, body in read_stream(nats.url, f"Z{tag}") if h.get("Eddyline-Generation") == "1"
                              and (json.loads(body)["at_epoch"] if "Eddyline-Retract" in h
                                   else int(h["Nats-Msg-Id"].split("/")[-2])) >= FROZEN)
    return count


def committed_by(ckpt: Path, generation: int) -> list[int]:
    out = []
    for p in (ckpt / "commits").glob("*.json"):
        try:
            if json.loads(p.read_text())["generation"] == generation:
                out.append(int(p.name[:-5]))
        except FileNotFoundError:  # (cleaned up meanwhile)
            continue
    return sorted(out)


def run_reference(spark, tmp: Path, kinds: list[str], postgres: Any, nats: Any) -> tuple[str, dict[str, list]]:
    tag = "r" + uuid.uuid4().hex[:6]
    # (the drivers' trigger paces them for the freeze and the takeover; the slices, and so the
    # output, do not depend on it)
    raw = network(tmp, kinds, postgres, nats, tag) | {"trigger": 0}
    Engine(load_spec(raw), spark, str(tmp / f"ckpt-{tag}")).run(until_idle=True)
    return tag, outputs(tmp, kinds, postgres, nats, tag)


# (the files sink's file system refusing: tests/ha/test_fault_matrix.py's woken leader, and the
# taken-back epochs below, where a files sink is one of three)
@pytest.mark.parametrize("kind", ["postgres", "nats"])
def test_a_woken_leader_has_its_publish_refused_by_the_store(spark, postgres, nats_server, tmp_path: Path,
                                                             kind: str) -> None:
    write_bid_files(tmp_path / "in", files=10, rows=60, seed=11)
    _, expected = run_reference(spark, tmp_path, [kind], postgres, nats_server)
    tag = "z" + uuid.uuid4().hex[:6]
    spec = tmp_path / "net.yaml"
    spec.write_text(yaml.safe_dump(network(tmp_path, [kind], postgres, nats_server, tag)))
    ckpt = tmp_path / "ckpt"
    leader = start(spec, ckpt, "--freeze-at", f"{FROZEN}:after_stage")
    wait_for(lambda: leader.poll() is None and frozen(leader), 180, "the leader to freeze after staging")
    standby = start(spec, ckpt, "--standby")
    wait_for(lambda: FROZEN in committed_by(ckpt, 2) or standby.poll() is not None, 180,
             "the standby to publish and commit the frozen epoch")
    leader.send_signal(signal.SIGCONT)  # wakes straight into its publish: its lease check is behind it
    leader.communicate(timeout=120)
    standby.communicate(timeout=300)
    assert standby.returncode == 0, err(standby)[-3000:]
    assert leader.returncode != 0
    woke = err(leader)
    assert "lease generation 1 was taken over by generation 2" in woke and "refuses its writes" in woke, woke[-3000:]
    assert {"postgres": f"z_{tag}", "nats": f"stream Z{tag}"}[kind] in woke
    assert outputs(tmp_path, [kind], postgres, nats_server, tag) == expected
    assert zombie_writes(tmp_path, [kind], postgres, nats_server, tag, ckpt) == {kind: 0}
    assert staging_leftovers(ckpt) == []


def test_epochs_the_new_leader_took_back_stay_taken_back_when_the_old_one_wakes(
        spark, postgres, nats_server, tmp_path: Path) -> None:
    """The old leader runs resident lanes (frozen after its lanes ran the epoch), the new one
    per-epoch jobs; the woken one's writes are refused all the same."""
    kinds = ["files", "postgres", "nats"]
    write_bid_files(tmp_path / "in", files=24, rows=60, seed=12)
    _, expected = run_reference(spark, tmp_path, kinds, postgres, nats_server)
    tag = "h" + uuid.uuid4().hex[:6]
    spec, resident = tmp_path / "net.yaml", tmp_path / "net-resident.yaml"
    raw = network(tmp_path, kinds, postgres, nats_server, tag)
    spec.write_text(yaml.safe_dump(raw))
    resident.write_text(yaml.safe_dump(raw | {"execution": "resident"}))
    ckpt = tmp_path / "ckpt"
    leader = start(resident, ckpt, "--freeze-at", f"{FROZEN}:after_stage")
    wait_for(lambda: leader.poll() is None and frozen(leader), 180, "the leader to freeze after staging")
    standby = start(spec, ckpt, "--standby")
    wait_for(lambda: max(committed_by(ckpt, 2), default=0) >= 5, 300, "the standby's commit of epoch 5")
    # the new leader takes the epochs from the frozen one on back and runs them again
    replay = subprocess.run([sys.executable, "-m", "eddyline.cli", "replay", str(spec), "--checkpoint", str(ckpt),
                             "--from-epoch", str(FROZEN)], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr

    def replayed() -> int | None:
        for e in committed_by(ckpt, 2):
            plan = json.loads((ckpt / "plans" / f"{e:010d}.json").read_text())
            if any("replay" in a for a in plan.get("applied", [])):
                return e
        return None

    wait_for(lambda: replayed() is not None, 300, "the replay's commit")
    assert standby.poll() is None, "the standby ended before the old leader woke"
    leader.send_signal(signal.SIGCONT)
    leader.communicate(timeout=120)
    standby.communicate(timeout=300)
    assert standby.returncode == 0, err(standby)[-3000:]
    assert leader.returncode != 0 and "refuses its writes" in err(leader), err(leader)[-3000:]
    # epoch 3's first output, taken back by the replay, did not come back: each window once
    assert outputs(tmp_path, kinds, postgres, nats_server, tag) == expected
    assert zombie_writes(tmp_path, kinds, postgres, nats_server, tag, ckpt) == dict.fromkeys(kinds, 0)
    assert staging_leftovers(tmp_path / f"out-{tag}") == [] and staging_leftovers(ckpt) == []
    assert (ckpt / "resident").is_dir()  # (the old leader's stage)
