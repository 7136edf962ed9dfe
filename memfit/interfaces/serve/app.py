"""`memfit serve`'s FastAPI app: the page at / and the JSON API under /api (OpenAPI description at /openapi.json).

Every answer is one of memfit's own documents (`estimate --json`, `plan --json`, the HTML report); every error is
{"error": one line, "field": the knob it is about or null}: 422 for a value memfit refuses, 400 for a body that
is not JSON, 413 over the size limit, 403 for a Host or Origin that is not this server's, 415 for a body that is
not Content-Type application/json (limits.py). Bodies are parsed here (not by FastAPI) so that malformed, deep or huge
JSON gets memfit's one-line answer. Imported only by `memfit serve` (fastapi is the optional extra memfit[serve]).
"""
from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from memfit.errors import MemfitError
from memfit.interfaces.formats.base import shown
from memfit.interfaces.serve import requests, uploads
from memfit.interfaces.serve.limits import MAX_BODY, BodyLimit, SameOrigin, error_body
from memfit.interfaces.serve.schema import request_body


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


def _estimate_doc(body) -> dict:
    """The document `memfit estimate --json` prints: the memory answer and the step-time model's (no run size
    here: the page has no --tokens field)."""
    from memfit.planner.throughput import speed_json
    from memfit.roles.estimate import estimate

    result = estimate(requests.scenario(body))
    return result.to_json() | {"speed": speed_json(result.scenario, None)}


def _plan_doc(body) -> dict:
    from memfit.interfaces.cli.plan import plan_json
    from memfit.planner.plan import Options, baseline, closest_miss, search_plans

    base = requests.scenario(body, requests.EXTRA_KEYS["plan"])
    b = requests.canonical(body, requests.EXTRA_KEYS["plan"])
    allow = b.get("allow") or []
    allow = allow.split(",") if isinstance(allow, str) else allow
    if not isinstance(allow, list) or not all(isinstance(x, str) for x in allow):
        raise requests.FieldError("allow: a list of changes you accept (lora, qlora, 8bit)", "allow")
    allow = {x.strip() for x in allow if x.strip()}
    batch = _positive(b, "global_batch", None)
    top = min(_positive(b, "top", 5), 20)
    options = Options(code_edits=not b.get("no_code_edits"), resume=not b.get("no_resume"))
    searched = search_plans(base, allow, batch, top_k=top, options=options)
    rows = searched.rows
    start = baseline(base, batch, options)
    miss = None if rows else closest_miss(base, allow, batch, options)
    return plan_json(start, rows, miss, options, searched)


def _export(body) -> dict:
    keys = requests.EXTRA_KEYS["export"]
    fmt = requests.canonical(body, keys).get("format", "deepspeed")
    return uploads.export(requests.scenario(body, keys), fmt)


def _positive(b: dict, key: str, default):
    value = b.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**31:
        raise requests.FieldError(f"{key} must be a positive integer up to 2^31, got {shown(value)}", key)
    return value


def create_app(max_body: int = MAX_BODY, allowed_hosts: tuple[str, ...] = ()) -> FastAPI:
    """The app; `allowed_hosts`: Host names it answers besides localhost, 127.0.0.1 and ::1 (the bound address)."""
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

    _routes(app)
    return app


def _routes(app: FastAPI) -> None:
    from memfit.interfaces.render.html import estimate_body, estimate_page, plan_table
    from memfit.interfaces.serve.page import page

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index():
        return page()

    @app.post("/api/estimate", openapi_extra=request_body("estimate"),
              summary="the document `memfit estimate --json` prints")
    async def estimate_route(request: Request):
        return await run_in_threadpool(_estimate_doc, await _json_body(request))

    @app.post("/api/chart", response_class=HTMLResponse, openapi_extra=request_body("estimate"),
              summary="the estimate's verdict, bars and tables as an HTML fragment (the page's live view)")
    async def chart_route(request: Request):
        return await run_in_threadpool(lambda body: "\n".join(estimate_body(_estimate_doc(body))),
                                       await _json_body(request))

    @app.post("/api/report.html", response_class=HTMLResponse, openapi_extra=request_body("estimate"),
              summary="the self-contained HTML report (`memfit estimate --html`)")
    async def report_route(request: Request):
        return await run_in_threadpool(lambda body: estimate_page(_estimate_doc(body)), await _json_body(request))

    @app.post("/api/plan", openapi_extra=request_body("plan"),
              summary="the document `memfit plan --json` prints")
    async def plan_route(request: Request):
        return await run_in_threadpool(_plan_doc, await _json_body(request))

    @app.post("/api/plan.html", response_class=HTMLResponse, openapi_extra=request_body("plan"),
              summary="the plan as an HTML table: each configuration that fits, its changes, savings and speed")
    async def plan_table_route(request: Request):
        return await run_in_threadpool(lambda body: plan_table(_plan_doc(body)), await _json_body(request))

    @app.post("/api/import", openapi_extra=request_body("import"),
              summary="the knobs memfit reads from a framework file sent as text")
    async def import_route(request: Request):
        return await run_in_threadpool(uploads.read_upload, await _json_body(request))

    @app.post("/api/export", openapi_extra=request_body("export"),
              summary="the run's knobs as a framework file (DeepSpeed JSON, LLaMA-Factory YAML, ...)")
    async def export_route(request: Request):
        return await run_in_threadpool(_export, await _json_body(request))

