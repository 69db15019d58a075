"""Who may reach the dashboard: every control call sent the way a foreign web page could send it
(a form, ``text/plain``, a foreign ``Origin``, ``Sec-Fetch-Site: cross-site``, a rebinding
``Host``), without the token and with a wrong one, is refused and queues nothing; the same calls
from the dashboard's own origin with the token are queued. Then the real thing: ``eddyline ui``
as a subprocess, its printed URL, and the issue's ``curl`` against it."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.observe.dashboard.access import Access
from eddyline.observe.dashboard.app import Feed, create_app
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.inbox import Inbox

RAW = {
    "name": "shop", "key_groups": 8, "lanes": 2,
    "sources": [{"name": "bids", "generator": {}}],
    "steps": [{"name": "per_key", "input": "bids", "aggregate": {"key": "key", "aggregates": {"n": "count(*)"}}}],
    "sinks": [{"name": "counts", "input": "per_key", "memory": {}}],
    "control": {"scale": {"auto": False}},
}
NET = load_spec(RAW)
ORIGIN = "http://127.0.0.1:8475"
TOKEN = "s3cret-t0ken"
#: every control call with a body the route would accept
CALLS = {
    "set": {"settings": {"per_key.key": "key"}},
    "rebalance": {"step": "per_key"},
    "rescale": {"step": "per_key", "lanes": 1},
    "move": {"step": "per_key", "move": {"0": 1}},
    "pause": {},
    "resume": {},
}


def client(inbox: Inbox, access: Access) -> TestClient:
    def submit(c: dict) -> str:
        return inbox.submit_command({k: v for k, v in c.items() if k != "from"}, origin=c["from"])

    feed = Feed(network=lambda: NET, records=lambda: [], commands=inbox.done, submit=submit, check=lambda c: None)
    return TestClient(create_app(feed, access), base_url=ORIGIN)


def attacks(body: dict, token: str | None) -> dict[str, dict]:
    """What a page on another site (or a local process without the token) can send."""
    import json

    bearer = {"Authorization": f"Bearer {token}"} if token else {}
    text = json.dumps(body)
    return {
        # <form method=post enctype=text/plain>: no script, no preflight, the body is JSON-looking
        "form text/plain": {"content": text, "headers": {"Content-Type": "text/plain", "Origin": "http://evil.example",
                                                         "Sec-Fetch-Site": "cross-site"}},
        # <form method=post>: form-encoded
        "form urlencoded": {"content": "x=1", "headers": {"Content-Type": "application/x-www-form-urlencoded",
                                                           "Origin": "http://evil.example"}},
        # a client that sends no Origin but a simple content type (a local process, an old browser)
        "text/plain, no origin": {"content": text, "headers": {"Content-Type": "text/plain", **bearer}},
        # JSON from a foreign origin: a browser would preflight it, and a bearer it cannot know
        "json, foreign origin": {"content": text, "headers": {"Content-Type": "application/json",
                                                               "Origin": "http://evil.example", **bearer}},
        "json, cross-site fetch": {"content": text, "headers": {"Content-Type": "application/json",
                                                                 "Sec-Fetch-Site": "cross-site", **bearer}},
        # a page on localhost:3000 is the same site as 127.0.0.1:8475 to no one, but same-site to localhost:8475
        "json, same-site": {"content": text, "headers": {"Content-Type": "application/json",
                                                          "Sec-Fetch-Site": "same-site", **bearer}},
        # DNS rebinding: the page's own name, now pointing at 127.0.0.1
        "rebinding host": {"content": text, "headers": {"Content-Type": "application/json",
                                                         "Host": "evil.example:8475", **bearer}},
        "no token": {"content": text, "headers": {"Content-Type": "application/json"}},
        "wrong token": {"content": text, "headers": {"Content-Type": "application/json",
                                                      "Authorization": "Bearer guess"}},
        "token in the query": {"content": text, "params": {"token": token or "x"},
                               "headers": {"Content-Type": "application/json"}},
    }


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token on loopback"])
def test_cross_site_and_tokenless_control_calls_are_refused_and_queue_nothing(tmp_path: Path, token: str | None) -> None:
    inbox = Inbox(str(tmp_path / "ckpt"))
    api = client(inbox, Access.open_loopback(token))
    refused: dict[tuple[str, str], int] = {}
    for call, body in CALLS.items():
        for name, request in attacks(body, token).items():
            if token is None and name in ("no token", "wrong token", "token in the query"):
                continue  # the operator chose no token: these are the same-origin calls below
            r = api.post(f"/api/control/{call}", **request)
            refused[call, name] = r.status_code
    assert all(code in (400, 401, 403, 415) for code in refused.values()), {k: v for k, v in refused.items()
                                                                           if v not in (400, 401, 403, 415)}
    assert inbox.pending() == []
    # the same calls from the dashboard's own origin, as its page sends them, are queued
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    for call, body in CALLS.items():
        r = api.post(f"/api/control/{call}", json=body,
                     headers={**auth, "Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 200, (call, r.text)
    assert len(inbox.pending()) == len(CALLS)


def test_each_rule_is_what_refuses(tmp_path: Path) -> None:
    inbox = Inbox(str(tmp_path / "ckpt"))
    api = client(inbox, Access.open_loopback(TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    r = api.post("/api/control/pause", content="{}", headers={**auth, "Host": "evil.example:8475"})
    assert r.status_code == 400 and "does not serve the host 'evil.example:8475'" in r.text
    r = api.post("/api/control/pause", content="{}", headers={**auth, "Origin": "http://evil.example"})
    assert r.status_code == 403 and "origin 'http://evil.example'" in r.text
    r = api.post("/api/control/pause", content="{}", headers={**auth, "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and "another site (cross-site)" in r.text
    r = api.post("/api/control/pause", content="{}", headers={**auth, "Content-Type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: application/json (got 'text/plain')" in r.text
    r = api.post("/api/control/pause", content="", headers=auth)
    assert r.status_code == 422  # pause takes {} like every other call takes its body
    assert inbox.pending() == []
    # reads: the Host is checked too (a rebinding page could read them), and the token
    assert api.get("/api/view", headers={"Host": "evil.example:8475"}).status_code == 400
    assert api.get("/metrics").status_code == 401
    assert api.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200  # Prometheus
    assert api.get("/api/progress", headers={"Host": "localhost:8475", "Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert api.get("/api/progress", headers={"Host": "[::1]:8475", "Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_page_keeps_its_token_in_a_cookie_of_its_own_port(tmp_path: Path) -> None:
    api = client(Inbox(str(tmp_path / "ckpt")), Access.open_loopback(TOKEN))
    assert api.get("/").status_code == 401
    page = api.get(f"/?token={TOKEN}")
    assert page.status_code == 200
    cookie = page.headers["set-cookie"]
    assert cookie.startswith(f"eddyline_token_8475={TOKEN}") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert api.get("/api/view").status_code == 200  # the cookie, for reads
    assert api.post("/api/control/pause", json={}).status_code == 401  # never for control calls


def test_the_rules_a_binding_gets() -> None:
    made = Access.bind("127.0.0.1")
    assert made.generated and made.token and len(made.token) >= 24
    assert Access.bind("127.0.0.1").token != made.token  # random each start
    given = Access.bind("127.0.0.1", "mine")
    assert given.token == "mine" and not given.generated
    assert Access.bind("::1", no_token=True).token is None
    for host in ("0.0.0.0", "192.168.1.5", "example.org"):
        with pytest.raises(SpecError, match="--ui-no-token is only allowed on 127.0.0.1"):
            Access.bind(host, no_token=True)
        assert Access.bind(host).token  # beyond loopback: a token, made here or given
    with pytest.raises(SpecError, match="contradict"):
        Access.bind("127.0.0.1", "mine", no_token=True)
    wide = Access.bind("0.0.0.0", allow_hosts=("eddy.internal:8080",))
    import socket

    assert {"localhost", "127.0.0.1", "::1", "eddy.internal", socket.gethostname()} <= wide.hosts
    assert "0.0.0.0" not in wide.hosts and "evil.example" not in wide.hosts
    assert Access.bind("10.1.2.3").hosts == {"localhost", "127.0.0.1", "::1", "10.1.2.3"}


def test_eddyline_ui_makes_a_token_prints_its_url_once_and_refuses_the_cross_site_pause(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ck = Checkpoint(str(ckpt))
    ck.open({}, created=ck.store_network(RAW))
    eddyline = Path(sys.executable).parent / "eddyline"
    proc = subprocess.Popen([str(eddyline), "ui", str(ckpt), "--port", "0"], stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "EDDYLINE_UI_TOKEN"})
    try:
        out, url = "", None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 1.0)[0]:
                out += proc.stderr.readline()
                found = re.search(r"dashboard: (http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)) · metrics: http://\S+/metrics\n", out)
                url = found and found.group(1)
        assert url is not None, out
        port, token = found.group(2), found.group(3)
        base = f"http://127.0.0.1:{port}"
        assert out.count(token) == 1  # printed once
        with httpx.Client(base_url=base, timeout=10) as api:
            assert api.get("/api/view").status_code == 401
            assert api.get("/api/view", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            assert api.get(url).status_code == 200
            assert api.get("/api/view").status_code == 200  # the page's cookie
            # the request, as a page on another site sends it
            r = api.post("/api/control/pause", headers={"Origin": "http://evil.example", "Host": f"evil.example:{port}",
                                                        "Content-Type": "text/plain"}, content="x")
            assert r.status_code == 400 and "does not serve the host" in r.text
            r = api.post("/api/control/pause", headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
                         content="x")
            assert r.status_code == 403
            # with the token, from its own origin: a browsed checkpoint has nothing to control (409), past every rule
            r = api.post("/api/control/pause", json={}, headers={"Authorization": f"Bearer {token}", "Origin": base})
            assert r.status_code == 409
        assert Inbox(str(ckpt)).pending() == [] and Inbox(str(ckpt)).paused() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

