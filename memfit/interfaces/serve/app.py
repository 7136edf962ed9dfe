"""`memfit serve`'s FastAPI app: the page at / and the JSON API under /api (OpenAPI description at /openapi.json).

Every answer is one of memfit's own documents (`estimate --json`, `plan --json`, the HTML report) or the page's
views of them (/api/answer, /api/plan_view); every error is {"error": one line, "field": the knob it is about or
null}: 422 for a value memfit refuses, 400 for a body that is not JSON, 413 over the size limit, 403 for a Host or
Origin that is not this server's, 415 for a body that is not Content-Type application/json (limits.py), 503 for a
request stopped at the time limit or with no idle worker (workers.py). Bodies are parsed here (not by FastAPI) so
that malformed, deep or huge JSON gets memfit's one-line answer; the work runs in worker processes (jobs.py).
Imported only by `memfit serve` (fastapi is the optional extra memfit[serve]).
"""
from __future__ import annotations

import json
import os

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from memfit.errors import MemfitError
from memfit.interfaces.serve import requests
from memfit.interfaces.serve.limits import MAX_BODY, BodyLimit, SameOrigin, error_body
from memfit.interfaces.serve.schema import request_body
from memfit.interfaces.serve.workers import TIME_LIMIT, Pool, TimeLimit


class BadRequest(Exception):
    """A body that is not a JSON object (400)."""


async def _json_body(request: Request):
    raw = await request.body()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except ValueError as e:  # int() refuses more than 4300 digits
        raise BadRequest(f"malformed JSON: {str(e).split(';')[0][:120]}") from None


def create_app(max_body: int = MAX_BODY, allowed_hosts: tuple[str, ...] = (), workers: int | None = None,
               time_limit: float = TIME_LIMIT) -> FastAPI:
    """The app; `allowed_hosts`: Host names it answers besides localhost, 127.0.0.1 and ::1 (the bound address);
    `workers` processes (default: the CPU count, 2 to 4) run the requests, each stopped past `time_limit` s."""
    app = FastAPI(title="memfit", summary="Will this LLM fine-tuning run fit in GPU and host memory?",
                  version="1", docs_url=None, redoc_url=None)  # the docs pages load their JS from a CDN
    app.add_middleware(BodyLimit, limit=max_body)
    app.add_middleware(SameOrigin, allowed_hosts=allowed_hosts)  # added last, so it runs first: before any body is read

    @app.exception_handler(MemfitError)
    async def _memfit_error(request, e: MemfitError):
        field = getattr(e, "field", None) or requests.field_of(str(e))
        return JSONResponse(error_body(str(e), field), status_code=422)

    @app.exception_handler(BadRequest)
    async def _bad_request(request, e: BadRequest):
        return JSONResponse(error_body(str(e)), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail)), status_code=e.status_code)

    @app.exception_handler(TimeLimit)
    async def _time_limit(request, e: TimeLimit):
        return JSONResponse(error_body(str(e)), status_code=503)

    pool = Pool(workers or min(4, max(2, os.cpu_count() or 2)), time_limit)
    app.router.on_startup.append(pool.warm)  # memfit serve answers its first request at once
    app.router.on_shutdown.append(pool.close)
    app.state.pool = pool
    _routes(app, pool)
    return app


# route -> (job in jobs.py / answer.py, request schema, response is HTML, summary)
ROUTES = {
    "/api/estimate": ("estimate", "estimate", False, "the document `memfit estimate --json` prints"),
    "/api/answer": ("answer", "estimate", False, "the page's view of an estimate: the first line, the run, its "
                                                 "defaults and warnings, next steps that fit as form fields, the charts"),
    "/api/chart": ("chart", "estimate", True, "the estimate's verdict, bars and tables as an HTML fragment"),
    "/api/report.html": ("report", "estimate", True, "the self-contained HTML report (`memfit estimate --html`)"),
    "/api/plan": ("plan", "plan", False, "the document `memfit plan --json` prints"),
    "/api/plan.html": ("plan_table", "plan", True, "the plan as the HTML report's table (`memfit plan --html`)"),
    "/api/plan_view": ("plan_view", "plan", False, "the page's plan: heading, an HTML table with rows to apply, "
                                                    "and the GPUs needed when nothing fits"),
    "/api/import": ("import", "import", False, "the knobs memfit reads from a framework file sent as text"),
    "/api/export": ("export", "export", False, "the run's knobs as a framework file (DeepSpeed JSON, LLaMA-Factory "
                                               "YAML, ...)"),
}


def _routes(app: FastAPI, pool: Pool) -> None:
    from memfit.interfaces.serve.page import page

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index():
        return page()

    for path, (job, schema, html, summary) in ROUTES.items():
        _route(app, pool, path, job, schema, html, summary)


def _route(app: FastAPI, pool: Pool, path: str, job: str, schema: str, html: bool, summary: str) -> None:
    async def handler(request: Request):
        body = await _json_body(request)  # parsed here: a malformed body never reaches a worker
        answer = await run_in_threadpool(pool.run, job, body)
        return HTMLResponse(answer) if html else Response(answer, media_type="application/json")

    app.post(path, response_class=HTMLResponse if html else JSONResponse, openapi_extra=request_body(schema),
             summary=summary, name=job)(handler)
