"""Requests bounded in CPU time: each heavy request (estimate, plan, export, import, HTML) runs in a worker process,
and a worker that passes the time limit is killed and replaced, so one slow request never holds a core or blocks
another (Python threads cannot be interrupted; processes can).

A pool of `size` idle workers (started on first use, with the "spawn" method: no copy of the server's threads);
`run(job, body)` takes an idle one, sends it the job's name and the parsed body, and waits up to `seconds`. Jobs
are named (JOBS), never pickled functions. A worker answers ("ok", value) or ("error", message, field); the error
is raised here as requests.FieldError, so the app answers it as it answers any of memfit's errors.
"""
from __future__ import annotations

import json
import multiprocessing
import queue
import threading

from memfit.interfaces.serve.requests import FieldError

TIME_LIMIT = 30.0  # seconds of one request; the largest plan in the tests takes ~2 s on one core
BUSY_WAIT = 60.0  # seconds a request waits for an idle worker before it is answered "busy"
START_LIMIT = 120.0  # seconds a fresh worker may take to import memfit (its start-up is not the request's time)


class TimeLimit(Exception):
    """A request that ran past the time limit (its worker was killed), or found no idle worker in time."""


def _jobs() -> dict:
    from memfit.interfaces.serve import jobs, uploads
    from memfit.interfaces.serve.answer import answer
    from memfit.interfaces.serve.plan_view import plan_answer

    return {"estimate": jobs.estimate_doc, "chart": jobs.chart_html, "report": jobs.report_html,
            "plan": jobs.plan_doc, "plan_table": jobs.plan_table_html, "plan_view": plan_answer, "import": uploads.read_upload,
            "export": jobs.export_doc, "answer": answer, "ping": lambda body: body}


def _serve(conn) -> None:
    """A worker's loop: one job at a time until the pipe closes."""
    from memfit.errors import MemfitError

    jobs = _jobs()
    conn.send(("ready",))  # imported: the time limit counts from here, not over the start-up
    while True:
        try:
            job, body = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = jobs[job](body)
            # a document goes back as its JSON text: a string crosses the pipe faster than a deep dict, and the
            # server sends it as it is
            conn.send(("json", json.dumps(answer)) if isinstance(answer, (dict, list)) else ("ok", answer))
        except MemfitError as e:
            conn.send(("error", str(e), getattr(e, "field", None)))
        except Exception as e:  # a bug: one line to the page, as the command line prints its internal errors
            conn.send(("error", f"internal error in memfit ({type(e).__name__}: {str(e)[:200]}); please report it",
                       None))


class Json(str):
    """A document's JSON text, as a worker encoded it."""


class _Worker:
    def __init__(self, context):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self) -> None:
        """Until the worker has imported memfit (a fresh one: a second or two)."""
        if not self.ready:
            if not self.conn.poll(START_LIMIT):
                raise TimeLimit(f"a worker process did not start within {START_LIMIT:g} s; restart memfit serve")
            self.conn.recv()
            self.ready = True

    def stop(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class Pool:
    def __init__(self, size: int = 2, seconds: float = TIME_LIMIT):
        self.size, self.seconds = size, seconds
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Start every worker and wait until each has imported memfit (the first request then answers at once)."""
        workers = [self._take() for _ in range(self.size - self._idle.qsize())]
        for w in workers:
            self._idle.put(w)
        for _ in range(self.size):
            self.run("ping", None)

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle.empty() and self._started < self.size:
                self._started += 1
                return _Worker(self._context)
        try:
            return self._idle.get(timeout=BUSY_WAIT)
        except queue.Empty:
            raise TimeLimit(f"the server is busy: {self.size} requests are running; try again in a minute") from None

    def run(self, job: str, body):
        """The job's answer, from a worker: a str (HTML), or Json (a document's JSON text); blocks (call it from
        a thread, not the event loop)."""
        worker = self._take()
        try:
            worker.wait_ready()
            worker.conn.send((job, body))
            if not worker.conn.poll(self.seconds):
                raise TimeLimit(f"this request ran past the server's time limit of {self.seconds:g} s and was "
                                "stopped; ask for less (a plan with fewer allowed changes or rows), or run the same "
                                "command with memfit on the command line")
            answer = worker.conn.recv()
        except BaseException:
            worker.stop()  # killed mid-job (or its pipe broke): a fresh one takes its place on the next request
            with self._lock:
                self._started -= 1
            raise
        self._idle.put(worker)
        if answer[0] == "error":
            raise FieldError(answer[1], answer[2])
        return Json(answer[1]) if answer[0] == "json" else answer[1]

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get_nowait().stop()
