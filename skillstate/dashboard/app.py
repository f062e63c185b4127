"""`skillstate dashboard`: a Starlette application over one database,
read-only, with server-rendered pages (Jinja2, autoescaped) and charts drawn
by the Chart.js copy vendored under `static/`.

Pages poll a version (the last sequence number of the runs they show) and,
when it changes, fetch themselves again and swap their live regions: no
reload, and no model text ever passes through `innerHTML` (the server
escapes it, and the browser parses the page with DOMParser).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import func, select
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skillstate import __version__
from skillstate.dashboard import pages
from skillstate.dashboard.review_page import ReviewDesk, review_routes
from skillstate.dashboard.store_view import RunCache
from skillstate.errors import CorruptLogError, NotFoundError, SkillstateError, UserError
from skillstate.storage.schema import events as events_table
from skillstate.storage.store import Store
from skillstate.util import parse_step

HERE = Path(__file__).resolve().parent

# Nothing but the package's own files: no inline script, no third-party
# origin, no framing. Model text is data, never markup.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
           (b"cache-control", b"no-store")]


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                path = scope.get("path", "")
                extra = HEADERS if not path.startswith("/static/") else HEADERS[:4]
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, with_headers)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _usd(value: Any) -> str:
    return "–" if value is None else f"${value:,.4f}"


def make_templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=_fmt, usd=_usd)
    env.globals.update(version=__version__)
    return env


def create_app(store: Store, *, allowed_hosts: list[str] | None = None, review: ReviewDesk | None = None) -> Starlette:
    """The dashboard over `store` (open it with `open_read_only`). With
    `allowed_hosts`, requests naming another Host are refused (a page on
    another site cannot reach the dashboard by rebinding its name to
    127.0.0.1). With `review` (`--review`), the review page decides too,
    through the desk's own store; every other page stays read-only."""
    cache = RunCache(store)
    env = make_templates()
    env.globals.update(review_desk=review is not None)

    def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(db=store.display_url, **context)
        return HTMLResponse(html, status_code=status)

    def guarded(fn):
        def endpoint(request: Request) -> Response:
            try:
                return fn(request)
            except (NotFoundError, UserError) as err:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": str(err)}, status_code=404)
                return render("error.html", 404, title="Not found", message=str(err))
            except (CorruptLogError, SkillstateError) as err:
                title = "Damaged log" if isinstance(err, CorruptLogError) else "Cannot show this"
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": f"{title}: {err}"}, status_code=500)
                return render("error.html", 500, title=title, message=str(err))
        return endpoint

    def version_of(run_ids: list[str] | None) -> str:
        stmt = select(events_table.c.run_id, func.max(events_table.c.seq)).group_by(events_table.c.run_id)
        if run_ids is not None:
            stmt = stmt.where(events_table.c.run_id.in_(run_ids))
        with store.engine.connect() as conn:
            rows = sorted(conn.execute(stmt).all())
        runs_count = len(store.list_runs()) if run_ids is None else 0
        return hashlib.sha256(repr((rows, runs_count)).encode()).hexdigest()[:16]

    def run_id_of(request: Request) -> str:
        return request.path_params["run_id"]

    def runs(request: Request) -> Response:
        live = version_of(None)  # before the data: an event appended meanwhile shows at the next poll
        return render("runs.html", rows=pages.runs_page(cache), live=live, live_scope="")

    def run(request: Request) -> Response:
        rid = run_id_of(request)
        live = version_of([rid])
        if pages.run_row(cache, rid)["kind"] == "policy":  # a policy training run: its curves and checkpoints
            from skillstate.dashboard.policy_page import policy_page

            return render("policy.html", **policy_page(cache, rid), live=live, live_scope=rid)
        if pages.run_row(cache, rid)["kind"] == "eval":  # an evaluation run has no steps: its report instead
            from skillstate.dashboard.items import eval_page

            return render("eval.html", run=pages.run_row(cache, rid), **eval_page(cache, rid),
                          config=pages.config_summary(dict(cache.get(rid).state.config)), live=live, live_scope=rid)
        data = pages.run_page(cache, rid, all_steps=request.query_params.get("steps") == "all")
        return render("run.html", **data, live=live, live_scope=rid)

    def step(request: Request) -> Response:
        rid = run_id_of(request)
        number = parse_step(request.path_params["step"])
        if number == 0:  # the baseline: no step events, its own page (as `show --step 0` has its own view)
            return render("step_zero.html", **pages.step_zero_page(cache, rid))
        return render("step.html", **pages.step_page(cache, rid, number))

    def item(request: Request) -> Response:
        from skillstate.dashboard.items import item_page

        rid, q = run_id_of(request), request.query_params
        step = parse_step(q["step"]) if q.get("step") else None
        sample = parse_step(q["sample"]) if q.get("sample") else None
        data = item_page(cache, rid, request.path_params["item_id"], step=step, test=q.get("test") or None,
                         sample=sample)
        return render("item.html", run=pages.run_row(cache, rid), **data)

    def skill(request: Request) -> Response:
        rid = run_id_of(request)
        row = pages.run_row(cache, rid)
        if row["mode"] == "bank" or row.get("bank"):  # a policy run trained with a bank shows the bank
            return RedirectResponse(f"/runs/{quote(rid)}/bank", status_code=303)
        which = request.query_params.get("which", "best")
        live = version_of([rid])
        return render("skill.html", **pages.skill_page(cache, rid, which), live=live, live_scope=rid)

    def lineage(request: Request) -> Response:
        rid = run_id_of(request)
        live = version_of(None)
        data = pages.lineage_page(cache, rid)
        return render("lineage.html", **data, run=pages.run_row(cache, rid), live=live, live_scope="")

    def bank(request: Request) -> Response:
        rid = run_id_of(request)
        live = version_of([rid])
        return render("bank.html", **pages.bank_page(cache, rid), live=live, live_scope=rid)

    def compare(request: Request) -> Response:
        a, b = request.query_params.get("a"), request.query_params.get("b")
        all_runs = [r.run_id for r in store.list_runs() if r.kind == "train"]
        if not a or not b:
            return render("compare.html", choices=all_runs, a=a, b=b, data=None)
        live = version_of([a, b])
        data = pages.compare_page(cache, a, b)
        return render("compare.html", choices=all_runs, a=a, b=b, data=data, live=live, live_scope=f"{a},{b}")

    def api_runs(request: Request) -> Response:
        return JSONResponse(pages.runs_page(cache))

    def api_run(request: Request) -> Response:
        if pages.run_row(cache, run_id_of(request))["kind"] == "policy":
            from skillstate.dashboard.policy_page import policy_page

            data = policy_page(cache, run_id_of(request))
            return JSONResponse({"run": data["run"], "policy": data["policy"]})
        data = pages.run_page(cache, run_id_of(request))
        return JSONResponse({"run": data["run"], "curves": data["curves"], "stage_cost": data["stage_cost"]})

    def api_why(request: Request) -> Response:
        text = request.query_params.get("text", "")
        return JSONResponse(pages.why(cache, run_id_of(request), text))

    def api_version(request: Request) -> Response:
        scope = request.query_params.get("runs", "")
        return JSONResponse({"version": version_of([r for r in scope.split(",") if r] or None)})

    routes = [
        Route("/", guarded(runs)),
        Route("/runs/{run_id}", guarded(run)),
        Route("/runs/{run_id}/steps/{step}", guarded(step)),
        Route("/runs/{run_id}/items/{item_id}", guarded(item)),
        Route("/runs/{run_id}/skill", guarded(skill)),
        Route("/runs/{run_id}/lineage", guarded(lineage)),
        Route("/runs/{run_id}/bank", guarded(bank)),
        Route("/compare", guarded(compare)),
        *review_routes(cache, render, guarded, review),
        Route("/api/runs", guarded(api_runs)),
        Route("/api/runs/{run_id}", guarded(api_run)),
        Route("/api/runs/{run_id}/why", guarded(api_why)),
        Route("/api/version", guarded(api_version)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    return Starlette(routes=routes, middleware=middleware)
