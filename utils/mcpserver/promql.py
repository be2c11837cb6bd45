"""query_tsdb: one PromQL query over a job's saved TSDB (utils/prometheus.sh serve, on a copy), bounded.

Instant (at `time`, default the last sample) or range (`start`..`end`, default the TSDB's whole span,
`step` default span / 480). A range of more than MAX_POINTS points per series is refused with the step
that would fit; at most MAX_SERIES series come back, and the result says how many there were.
"""

from __future__ import annotations

import math
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from diagnosis import tsdb
from mcpserver.cache import fingerprint
from mcpserver.reports import Context, Hit

PROG = "query_tsdb"
MAX_POINTS = 11_000  # per series of a range query
MAX_SERIES = 50
POINTS = 480  # the default step: the span in this many points (as diagnose.py)


def _finite(name: str, x: float | None) -> None:
    if x is not None and not math.isfinite(x):
        raise ToolError(f"{PROG}: {name} must be a finite number (unix seconds)")


def _query(
    db: Any, query: str, mode: str, time: float | None, start: float | None, end: float | None, step: float | None
) -> dict[str, Any]:
    with tsdb.Served(db) as prom:
        if prom.first is None or prom.last is None:
            return {"result_type": None, "series": [], "series_total": 0, "truncated": False, "note": "empty TSDB"}
        span = {"first": prom.first, "last": prom.last}
        if mode == "instant":
            at = prom.last if time is None else time
            rows = prom.query(query, at)
            info: dict[str, Any] = {"time": at}
        else:
            lo = prom.first if start is None else start
            hi = prom.last if end is None else end
            if hi < lo:
                raise ToolError(f"{PROG}: end {hi} is before start {lo}")
            st = step or max(1.0, (hi - lo) / POINTS)
            points = int((hi - lo) // st) + 1
            if points > MAX_POINTS:
                need = (hi - lo) / (MAX_POINTS - 1)
                raise ToolError(
                    f"{PROG}: range too large: {points} points per series (at most {MAX_POINTS}); "
                    f"give step >= {math.ceil(need)} s or a shorter start..end"
                )
            rows = prom.query_range(query, lo, hi, st)
            info = {"start": lo, "end": hi, "step": st, "points_per_series_max": points}
    rtype = "vector" if mode == "instant" else "matrix"
    if rows and not isinstance(rows[0], dict):  # a scalar or string: [time, "value"]
        return {"result_type": "scalar", "value": rows, "series": [], "series_total": 0, "truncated": False, **info}
    return {
        "result_type": rtype,
        "tsdb_span": span,
        **info,
        "series": rows[:MAX_SERIES],
        "series_total": len(rows),
        "truncated": len(rows) > MAX_SERIES,
        **(
            {"note": f"{len(rows)} series; only the first {MAX_SERIES} are returned: aggregate (sum/avg by ...)"}
            if len(rows) > MAX_SERIES
            else {}
        ),
    }


def query_tsdb(
    ctx: Context,
    job: str,
    query: str,
    mode: str = "instant",
    time: float | None = None,
    start: float | None = None,
    end: float | None = None,
    step: float | None = None,
) -> Hit:
    found = ctx.find(PROG, job)
    if not query.strip():
        raise ToolError(f"{PROG}: empty query: give a PromQL expression")
    for name, x in (("time", time), ("start", start), ("end", end), ("step", step)):
        _finite(name, x)
    if step is not None and step <= 0:
        raise ToolError(f"{PROG}: step must be a positive number of seconds")
    if mode == "range" and start is not None and end is not None and step is not None:
        points = int((end - start) // step) + 1
        if points > MAX_POINTS:  # refused before a Prometheus starts
            raise ToolError(
                f"{PROG}: range too large: {points} points per series (at most {MAX_POINTS}); "
                f"give step >= {math.ceil((end - start) / (MAX_POINTS - 1))} s or a shorter start..end"
            )
    try:
        db = tsdb.resolve(found.dir or found.path)
    except tsdb.TSDBError as e:
        raise ToolError(f"{PROG}: {e}") from None
    key = (fingerprint(found), query, mode, time, start, end, step)
    return ctx.run(PROG, "query_tsdb", key, lambda: _query(db, query, mode, time, start, end, step))
