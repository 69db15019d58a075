"""The dashboard's web application (FastAPI): the page, its sections, ``/metrics`` and the
control API.

::

    GET  /                      the page (static HTML + a small script that polls /api/view)
    GET  /api/view?since=N      {"epoch", "sections": {id: html}} (only when an epoch newer than N
                                was reported, or the status, the control calls or the network's
                                graph changed)
    GET  /api/progress          the recent progress records, as JSON
    GET  /metrics               Prometheus text format (eddyline.observe.metrics)
    POST /api/control/set       {"settings": {"STEP.PARAM": value}}   a control line
    POST /api/control/rebalance {"step"}                              balance the step's lanes now
    POST /api/control/rescale   {"step", "lanes"}                     give the step that many lanes
    POST /api/control/move      {"step", "move": {key group: lane}}   move key groups
    POST /api/control/pause     {}                                    no epoch until resume
    POST /api/control/resume    {}

(every POST: ``Content-Type: application/json``)

A control call is checked (400 naming the problem, nothing queued), then queued for the next
epoch boundary like ``eddyline control set``: the engine checks it again, logs it in the epoch's
plan or refuses it, and the page's "control calls" section shows the outcome. Who may call what,
and from where, is :mod:`.access` (a token by default, the Host checked, control calls JSON from
the same origin only), enforced before any route. A stopped run (``eddyline ui CHECKPOINT``) has
no control API: 409.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from eddyline.api.network import NetworkSpec
from eddyline.api.validate import spec_from_raw
from eddyline.errors import EddylineError
from eddyline.observe.dashboard import views
from eddyline.observe.dashboard.access import Access, Guard
from eddyline.observe.metrics import Metrics


def cookie_name(request: Request) -> str:
    """The page's token cookie, one per port: a browser sends a host's cookies to all its ports,
    and two dashboards on one machine have different tokens."""
    return f"eddyline_token_{request.url.port or 80}"


@dataclass
class Feed:
    """What the dashboard shows and does, whatever runs it (a live driver or a checkpoint).

    ``network``: the network in force, asked again for every view (a live ``apply``, an undo or
    a replay with another network puts another in force while the page is open; None: unknown);
    ``records``: the recent progress records, oldest first; ``status``: ``{"live": bool,
    "paused": bool, "lease": {...}}``; ``commands``: control calls with their outcomes;
    ``submit``: queue a command, returning its id (None: read-only); ``check``: raise an
    :class:`EddylineError` naming what does not fit in a command, before it is queued."""

    network: Callable[[], NetworkSpec | None]
    records: Callable[[], list[dict[str, Any]]]
    status: Callable[[], dict[str, Any]] = lambda: {}
    commands: Callable[[], list[dict[str, Any]]] = lambda: []
    submit: Callable[[dict[str, Any]], str] | None = None
    check: Callable[[dict[str, Any]], None] = lambda command: None
    metrics: Metrics = field(default_factory=Metrics)


def following(in_force: Callable[[], str | None], read: Callable[[str], dict[str, Any]],
              first: NetworkSpec | None) -> Callable[[], NetworkSpec | None]:
    """A :attr:`Feed.network` that follows a checkpoint: ``in_force`` names the network it runs
    now (a hash; None before any run), ``read`` gives that network's spec. Each network is parsed
    once; while the checkpoint cannot be read (a run being started elsewhere) the last one known
    stays, ``first`` at the start."""
    parsed: dict[str, NetworkSpec] = {}
    last = [first]

    def now() -> NetworkSpec | None:
        try:
            digest = in_force()
            if digest is not None and digest not in parsed:
                parsed[digest] = spec_from_raw(read(digest))
        except (OSError, EddylineError):
            return last[0]
        if digest is not None:
            last[0] = parsed[digest]
        return last[0]

    return now


class Settings(BaseModel):
    settings: dict[str, Any] = Field(min_length=1, description="STEP.PARAM -> value")


class Step(BaseModel):
    step: str


class Rescale(Step):
    lanes: int = Field(ge=1)


class Move(Step):
    move: dict[int, int] = Field(min_length=1, description="key group -> lane")


class Nothing(BaseModel):
    """The body of pause and resume: ``{}``, sent as JSON like every other control call."""

    model_config = ConfigDict(extra="forbid")


def create_app(feed: Feed, access: Access) -> FastAPI:
    app = FastAPI(title="Eddyline", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, access=access)
    token = access.token

    def given(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.query_params.get("token") or request.cookies.get(cookie_name(request))

    def may_read(request: Request) -> None:
        if token is not None and not hmac.compare_digest((given(request) or "").encode(), token.encode()):
            raise HTTPException(401, "this dashboard needs its token: open the URL with ?token= that the command printed "
                                     "when it started, or send Authorization: Bearer TOKEN")

    def may_control(request: Request) -> None:
        auth = request.headers.get("authorization", "")  # a header only: a cookie would let other sites call
        if token is not None and not (auth.lower().startswith("bearer ")
                                      and hmac.compare_digest(auth[7:].strip().encode(), token.encode())):
            raise HTTPException(401, "control calls need the token: Authorization: Bearer TOKEN")
        if feed.submit is None:
            raise HTTPException(409, "this network is not running here (a checkpoint being browsed): nothing to control")

    def queue(command: dict[str, Any]) -> JSONResponse:
        try:
            feed.check(command)
        except EddylineError as e:
            raise HTTPException(400, str(e)) from None
        assert feed.submit is not None
        return JSONResponse({"id": feed.submit(command), "queued": views.describe_command(command),
                             "note": "takes effect at the next epoch boundary"})

    @app.get("/", response_class=HTMLResponse, dependencies=[Depends(may_read)])
    def page(request: Request) -> Response:
        html = (resources.files("eddyline.observe.dashboard") / "static" / "index.html").read_text("utf-8")
        net = feed.network()
        name = net.name if net is not None else "eddyline"
        response = HTMLResponse(html.replace("{{name}}", views._e(name)))
        if token is not None and request.query_params.get("token"):
            response.set_cookie(cookie_name(request), request.query_params["token"], httponly=True, samesite="strict")
        return response

    @app.get("/static/{name}", dependencies=[Depends(may_read)])
    def static(name: str) -> Response:
        kinds = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
        if name not in kinds:
            raise HTTPException(404, f"no static file {name!r}")
        body = (resources.files("eddyline.observe.dashboard") / "static" / name).read_text("utf-8")
        return Response(body, media_type=kinds[name])

    @app.get("/api/view", dependencies=[Depends(may_read)])
    def view(since: int = -1, state: str = "") -> JSONResponse:
        net, records, status, commands = feed.network(), feed.records(), feed.status(), feed.commands()
        epoch = records[-1]["batchId"] if records else 0
        # what the sections are drawn from: a change of network is drawn before its first epoch reports
        key = f"{epoch}:{status.get('paused')}:{len(commands)}:{views.graph_shape(net)}"
        if epoch <= since and key == state:
            return JSONResponse({"epoch": epoch, "state": key, "sections": {}})
        return JSONResponse({"epoch": epoch, "state": key,
                             "sections": views.sections(net, records, status, commands)})

    @app.get("/api/progress", dependencies=[Depends(may_read)])
    def progress() -> JSONResponse:
        return JSONResponse(feed.records())

    @app.get("/metrics", dependencies=[Depends(may_read)])
    def metrics() -> Response:
        feed.metrics.set_paused(bool(feed.status().get("paused")))
        return Response(feed.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/api/control/set", dependencies=[Depends(may_control)])
    def control_set(body: Settings) -> JSONResponse:
        return queue({"set": body.settings, "from": "dashboard"})

    @app.post("/api/control/rebalance", dependencies=[Depends(may_control)])
    def rebalance(body: Step) -> JSONResponse:
        return queue({"route": {"step": body.step, "rebalance": True}, "from": "dashboard"})

    @app.post("/api/control/rescale", dependencies=[Depends(may_control)])
    def rescale(body: Rescale) -> JSONResponse:
        return queue({"route": {"step": body.step, "lanes": body.lanes}, "from": "dashboard"})

    @app.post("/api/control/move", dependencies=[Depends(may_control)])
    def move(body: Move) -> JSONResponse:
        return queue({"route": {"step": body.step, "move": {str(k): v for k, v in body.move.items()}},
                      "from": "dashboard"})

    @app.post("/api/control/pause", dependencies=[Depends(may_control)])
    def pause(body: Nothing) -> JSONResponse:
        return queue({"pause": True, "from": "dashboard"})

    @app.post("/api/control/resume", dependencies=[Depends(may_control)])
    def resume(body: Nothing) -> JSONResponse:
        return queue({"resume": True, "from": "dashboard"})

    return app
