"""The dashboard's review page (`review`): what a reviewer reads for the step a run waits on, and, only when
the dashboard was started with `--review`, the form that decides it.

Reading goes through the dashboard's read-only store like every other page. A decision goes through
`skillstate.engine.review_desk.decide`, the one writer of decisions, on a second store opened for writing
(`ReviewDesk.store`), so that no other page can write. The form is guarded against requests forged by
other sites: it carries a token only this server's pages hold (compared in constant time), and a request a
browser says comes from another site (Sec-Fetch-Site, Origin) is refused; the server listens on localhost
unless told otherwise, where its allowed Host names keep a rebound name out too."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from skillstate.dashboard.pages import run_row, skill_diff
from skillstate.dashboard.store_view import RunCache
from skillstate.errors import UserError
from skillstate.reading.review import review_view
from skillstate.reading.skill_text import skill_text, stored_files
from skillstate.storage.store import Store
from skillstate.util import parse_step

MAX_FORM_BYTES = 64 * 1024


@dataclass
class ReviewDesk:
    """What `--review` gives the dashboard: a store it may append decisions to, the reviewer's default name
    (the form's first value), and the token its forms carry."""

    store: Store
    reviewer: str = ""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


def review_page(cache: RunCache, run_id: str, step: int | None) -> dict[str, Any]:
    """The review of `step` (default: the one the run waits on, else its last review), with the diff the
    step page draws."""
    loaded = cache.get(run_id)
    try:
        view = review_view(cache.store, run_id, step, loaded=loaded)
    except UserError:
        if step is not None:
            raise
        from skillstate.reading.review import find

        view = review_view(cache.store, run_id, find(loaded, None)[0].step, loaded=loaded)  # its last review
    store = cache.store
    base, cand = view["base_skill"], view["candidate"]
    diff = skill_diff(skill_text(store, base), skill_text(store, cand), stored_files(store, base),
                      stored_files(store, cand))
    return {"run": run_row(cache, run_id), "review": view, "diff": diff, "tab": "review"}


def _origin_ok(request: Request) -> bool:
    """Not a request another site's page made: a browser that says where a request comes from
    (Sec-Fetch-Site) must say this origin, and an Origin header must be this server's (the pages' no-referrer
    policy makes a browser send `null` for its own forms, which the token alone vouches for)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def review_routes(cache: RunCache, render: Callable[..., Response], guarded: Callable[[Callable], Callable],
                  desk: ReviewDesk | None) -> list[Route]:
    """The review page's routes: reading it always; deciding only with a desk (`--review`)."""

    def page(request: Request) -> Response:
        rid = request.path_params["run_id"]
        q = request.query_params
        step = parse_step(q["step"]) if q.get("step") else None
        return render("review.html", **review_page(cache, rid, step), desk=desk,
                      decided=q.get("decided") == "1")

    async def decide(request: Request) -> Response:
        assert desk is not None  # the route exists only with a desk
        rid = request.path_params["run_id"]
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return render("error.html", 413, title="Too large", message="the review form is at most 64 KB")
        form = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)

        def one(name: str) -> str:
            return (form.get(name) or [""])[0]

        if not _origin_ok(request) or not hmac.compare_digest(one("token").encode(), desk.token.encode()):
            return render("error.html", 403, title="Refused",
                          message="this form did not come from this dashboard's review page (or the dashboard was "
                                  "started again since): reload the review page and decide there")
        try:
            step = parse_step(one("step"))
            decision = one("decision")
            drops = []
            for value in form.get("drop", []):
                if not value.isdigit() or int(value) < 1:
                    raise UserError(f"not an edit's number: {value!r}")
                drops.append(int(value) - 1)
            if drops and decision != "approve":
                raise UserError("edits are left out of an approved candidate: approve, or reject without leaving "
                                "any out")
            from skillstate.engine.review_desk import decide as record

            await run_in_threadpool(record, desk.store, rid, decision, step=step, dropped=drops,
                                    comment=one("comment"), reviewer=one("reviewer"))
        except UserError as err:
            return render("error.html", 409, title="Not recorded", message=str(err),
                          back=f"/runs/{quote(rid)}/review")
        return RedirectResponse(f"/runs/{quote(rid)}/review?step={step}&decided=1", status_code=303)

    routes = [Route("/runs/{run_id}/review", guarded(page))]
    if desk is not None:
        routes.append(Route("/runs/{run_id}/review", decide, methods=["POST"]))
    return routes
