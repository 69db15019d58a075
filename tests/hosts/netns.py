"""Separate hosts on one machine: each host a Linux network namespace with its own address on a
bridge and its own ``/tmp`` (a mount namespace), sharing nothing with the others but the network
(the code and the Python installation are read from where they are installed). The tests in this
folder and ``bench/hosts.py`` build their clusters with it.

Needs root and ``ip`` (iproute2). This kernel has no ``netem`` queueing discipline, so faults are
made without it: a host cut off is its link set down; a host cut off from one peer is a blackhole
route on the peer (its packets arrive, the answers vanish, as in a one-way partition); a slow or
lossy store is :mod:`tests.hosts.slowlink`, a TCP relay on the store's host in front of the
server. Every process a host started is killed and every namespace and link removed by
:meth:`Hosts.close`, also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def available() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "separate hosts need root (network and mount namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "separate hosts need iproute2's ip and util-linux's unshare"
    probe = f"edlprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


class Host:
    """One host: its namespace :attr:`ns`, its address :attr:`ip`, and :attr:`tmp`, the folder this
    machine sees as the host's ``/tmp``."""

    def __init__(self, hosts: Hosts, name: str, index: int):
        self.hosts, self.name = hosts, name
        self.ns = f"{hosts.tag}-{name}"
        self.ip = f"{hosts.subnet}.{index + 2}"
        self.link = f"{hosts.tag}v{index}"  # this machine's end of the host's link, on the bridge
        self.tmp = hosts.base / name / "tmp"
        self.tmp.mkdir(parents=True)
        self.procs: list[subprocess.Popen] = []
        subprocess.run(["ip", "netns", "add", self.ns], check=True, capture_output=True)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _ip("link", "set", self.link, "master", hosts.bridge, "up")
        _ip("addr", "add", f"{self.ip}/24", "dev", "eth0", ns=self.ns)
        _ip("link", "set", "eth0", "up", ns=self.ns)
        _ip("link", "set", "lo", "up", ns=self.ns)

    def command(self, args: list[str]) -> list[str]:
        """``args`` as run on this host: in its network namespace, in a mount namespace of its own
        whose ``/tmp`` is :attr:`tmp` (the code stays where it is, even if it lives under /tmp)."""
        script = []
        for keep in self.hosts.keep:  # what lives under /tmp but every host must still see
            inside = self.tmp / keep.relative_to("/tmp")
            inside.mkdir(parents=True, exist_ok=True)
            script.append(f"mount --rbind {shlex.quote(str(keep))} {shlex.quote(str(inside))}")
        script.append(f"mount --rbind {shlex.quote(str(self.tmp))} /tmp")
        script.append('cd /tmp && exec "$@"')
        return ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", " && ".join(script), "host", *args]

    def start(self, args: list[str], log: str, env: dict[str, str] | None = None,
              **popen: object) -> subprocess.Popen:
        """Start ``args`` on this host; its output goes to ``log`` in the host's /tmp unless
        ``popen`` says otherwise."""
        out = (self.tmp / log).open("ab")
        popen = {"stdout": out, "stderr": subprocess.STDOUT, **popen}
        proc = subprocess.Popen(self.command(args), env={**os.environ, **(env or {})}, **popen)  # type: ignore[call-overload]
        out.close()
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process running in this host's network namespace."""
        done = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def kill(self) -> list[int]:
        """SIGKILL every process of this host, as when the machine dies; the pids killed."""
        killed = []
        for _ in range(5):  # a process may start another between listing and killing
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.1)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        return killed

    def down(self) -> None:
        """Cut the host off the network (its link down: nothing in, nothing out, no reset)."""
        _ip("link", "set", self.link, "down")

    def up(self) -> None:
        _ip("link", "set", self.link, "up")

    def drop_from(self, other: Host) -> None:
        """This host stops answering ``other``: what ``other`` sends arrives and the answers
        vanish, so ``other`` sees silence, not a refusal (a blackhole route here)."""
        _ip("route", "add", "blackhole", f"{other.ip}/32", ns=self.ns)

    def answer(self, other: Host) -> None:
        _ip("route", "del", "blackhole", f"{other.ip}/32", ns=self.ns, check=False)


class Hosts:
    """A bridge on this machine and the hosts on it; :meth:`close` removes it all."""

    def __init__(self, base: Path):
        self.base = base
        n = os.getpid() % 200 + 20
        self.tag = f"edl{os.getpid() % 100000}"
        self.subnet = f"10.{213 + n // 100}.{n}"  # 10.213-215.x: one /24 per test process
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self.keep = [p for p in {ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
                     if p.is_relative_to("/tmp")]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> Host:
        host = Host(self, name, len(self.hosts))
        self.hosts[name] = host
        return host

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def close(self) -> None:
        for host in self.hosts.values():
            host.kill()
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
