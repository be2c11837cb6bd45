"""Profiler traces of a job (what JAX's profiler and Nsight write under its directory): found newest
first, read as a stream (trace.json[.gz] events, xplane.pb through the installed xprof/tensorboard
plugin when there is one), and summed per lane into top ops, compute, collectives and idle time.
utils/diagnosis/perf.py reports it (docs/perf.md); nothing here imports the diagnosis tools."""

from __future__ import annotations

import gzip
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLLECTIVE = re.compile(
    r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|collective[-_]permute|collective[-_]broadcast"
    r"|nccl|rccl|sendrecv|^(?:send|recv)(?:-done)?(?:\.\d+)?$",
    re.I,
)
TRACE_SKIP_DIRS = {"artifact", "prometheus", ".stages", "checkpoints", ".snapshots", ".jax_cache"}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _kind_of(name: str) -> str | None:
    if name.endswith((".trace.json.gz", ".trace.json")) or name == "perfetto_trace.json.gz":
        return "trace_json"
    if name.endswith(".xplane.pb"):
        return "xplane"
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys"
    return None


def find_traces(dirs: list[Path]) -> list[dict]:
    """Profiler output under the directories, newest first."""
    seen: set[str] = set()
    found = []
    for top in dirs:
        for root, dnames, fnames in os.walk(top):
            dnames[:] = [d for d in dnames if d not in TRACE_SKIP_DIRS and not (Path(root) / d).is_symlink()]
            for f in fnames:
                kind = _kind_of(f)
                p = Path(root) / f
                if not kind or str(p.resolve()) in seen:
                    continue
                seen.add(str(p.resolve()))
                st = p.stat()
                host = f
                for suffix in (".trace.json.gz", ".trace.json", ".xplane.pb", ".nsys-rep", ".qdrep"):
                    host = host.removesuffix(suffix)
                found.append(
                    {
                        "path": str(p),
                        "kind": kind,
                        "host": None if f == "perfetto_trace.json.gz" else host,
                        "session": p.parent.name,
                        "bytes": st.st_size,
                        "mtime": st.st_mtime,
                        "summary": None,
                        "same_as": None,
                        "view": [],
                    }
                )
    found.sort(key=lambda t: (-t["mtime"], t["path"]))
    return found


def iter_json_events(path: Path, chunk: int = 1 << 20) -> Iterator[dict]:
    """The objects of a Chrome trace's "traceEvents" array, streamed (constant memory; a trace can
    be gigabytes once decompressed)."""
    dec = json.JSONDecoder()
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        buf, eof = f.read(chunk), False
        start = -1
        while start < 0:
            k = buf.find('"traceEvents"')
            if k >= 0:
                start = buf.find("[", k)
            elif buf.lstrip().startswith("["):
                start = buf.find("[")
            if start >= 0:
                break
            more = f.read(chunk)
            if not more:
                raise ValueError("no traceEvents array")
            buf += more
        pos = start + 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buf) - 1 and not eof:
                more = f.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if pos >= len(buf) or buf[pos] == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # a truncated trace: keep what was read
                more = f.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if isinstance(obj, dict):
                yield obj
            pos = end
            if pos > len(buf) - 4096 and not eof:
                more = f.read(chunk)
                eof = not more
                buf, pos = buf[pos:] + more, 0


def _json_lanes(path: Path) -> tuple[dict, dict, dict]:
    """(process names, thread names, events per (pid, tid): [(ts_us, end_us, name, hlo_op or None)])."""
    procs: dict = {}
    threads: dict = {}
    lanes: dict = {}
    for e in iter_json_events(path):
        ph = e.get("ph")
        if ph == "M":
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str(name)
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(name)
        elif ph == "X":
            try:
                ts, dur = float(e["ts"]), float(e.get("dur") or 0.0)
            except (KeyError, TypeError, ValueError):
                continue
            op = (e.get("args") or {}).get("hlo_op")
            lanes.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, str(e.get("name") or "?"), op))
    return procs, threads, lanes


def _xplane_lanes(path: Path) -> tuple[dict, dict, dict] | None:
    """The same from an .xplane.pb, decoded by jaxlib's profiler data reader when this Python has
    jaxlib (the job environment's .venv does); None otherwise."""
    try:
        from jax._src.lib import _profile_data  # type: ignore[import-not-found]  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (any import problem: no decoder)
        return None
    procs: dict = {}
    threads: dict = {}
    lanes: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jaxlib's event_stats type warns about a missing __module__
        try:
            pd = _profile_data.ProfileData.from_file(str(path))
            for pid, plane in enumerate(pd.planes):
                procs[pid] = plane.name
                for tid, line in enumerate(plane.lines):
                    threads[(pid, tid)] = line.name
                    evs = []
                    for ev in line.events:
                        op = dict(ev.stats).get("hlo_op")
                        ts = ev.start_ns / 1e3
                        evs.append((ts, ts + ev.duration_ns / 1e3, str(ev.name), None if op is None else str(op)))
                    if evs:
                        lanes[(pid, tid)] = evs
        except Exception as e:  # noqa: BLE001  (jaxlib raises its own types for a corrupt file)
            raise ValueError(f"not a readable XSpace: {e}") from None
    return procs, threads, lanes


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    i = j = 0
    tot = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            tot += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return tot


def summarize_lanes(procs: dict, threads: dict, lanes: dict, top: int = 10) -> dict:
    """Top ops by device self time and the compute / collective / idle split of the trace window.
    Device ops: the "XLA Ops" line of each /device:* process (else its "Stream" lines); on the CPU
    backend (no device process) the host threads' events that carry an hlo_op."""
    devices = sorted(p for p, n in procs.items() if str(n).startswith("/device:") and "CUSTOM" not in str(n))
    chosen: dict = {}  # device -> [lane keys]
    if devices:
        for p in devices:
            keys = [k for k in lanes if k[0] == p]
            ops = [k for k in keys if threads.get(k, "") == "XLA Ops"]
            streams = [k for k in keys if str(threads.get(k, "")).startswith("Stream")]
            chosen[p] = ops or streams
        where = (
            "XLA Ops lines of the device processes"
            if any(threads.get(k) == "XLA Ops" for ks in chosen.values() for k in ks)
            else "stream lines (kernels) of the device processes"
        )
        kind = "device"
        filt = None
    else:
        host = {k for k, evs in lanes.items() if any(e[3] is not None for e in evs)}
        for k in host:
            chosen.setdefault(k[0], []).append(k)
        where = "host threads' XLA op events (CPU backend)"
        kind = "host"
        filt = True
    agg: dict[str, list] = {}
    is_coll: dict[tuple, bool] = {}
    window = busy = comp_t = coll_t = both = 0.0
    n_ev = 0
    for _dev, keys in chosen.items():
        comp_iv: list[tuple[float, float]] = []
        coll_iv: list[tuple[float, float]] = []
        for k in keys:
            evs = [
                e for e in lanes[k] if (not filt or e[3] is not None) and not e[2].startswith("end: ") and e[1] >= e[0]
            ]
            n_ev += len(evs)
            per_kind: dict[bool, list] = {True: [], False: []}
            for a, b, name, op in evs:
                c = is_coll.get((name, op))
                if c is None:
                    c = is_coll[(name, op)] = bool(COLLECTIVE.search(name) or (op and COLLECTIVE.search(op)))
                per_kind[c].append((a, b, name))
                (coll_iv if c else comp_iv).append((a, b))
            for c, items in per_kind.items():
                for name, (t, cnt) in self_times(items).items():
                    slot = agg.setdefault(name, [0.0, 0, c])
                    slot[0] += t
                    slot[1] += cnt
        if not comp_iv and not coll_iv:
            continue
        cu, ku = _union(comp_iv), _union(coll_iv)
        lo = min(iv[0] for iv in (cu[:1] + ku[:1]))
        hi = max(iv[-1][1] for iv in (cu, ku) if iv)
        window += hi - lo
        c_len, k_len, ov = _length(cu), _length(ku), _intersect(cu, ku)
        comp_t += c_len
        coll_t += k_len
        both += ov
        busy += c_len + k_len - ov
    if not n_ev or window <= 0:
        return {
            "source": where,
            "backend": kind,
            "devices": len(chosen),
            "events": n_ev,
            "window_ms": None,
            "busy_ms": None,
            "split": None,
            "collective_ms": None,
            "top_ops": [],
            "top_kinds": [],
        }
    total_self = sum(v[0] for v in agg.values()) or 1.0
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][0])
    top_ops = [
        {
            "name": n[:160],
            "kind": "collective" if v[2] else "compute",
            "ms": _r(v[0] / 1e3, 3),
            "share": _r(v[0] / total_self),
            "count": v[1],
        }
        for n, v in ranked[:top]
    ]
    kinds: dict[tuple[str, bool], list] = {}
    for n, v in agg.items():
        base = re.sub(r"(?:[._]\d+)+$", "", n)[:80]
        slot = kinds.setdefault((base, v[2]), [0.0, 0])
        slot[0] += v[0]
        slot[1] += v[1]
    top_kinds = [
        {
            "name": b,
            "kind": "collective" if c else "compute",
            "ms": _r(v[0] / 1e3, 3),
            "share": _r(v[0] / total_self),
            "count": v[1],
        }
        for (b, c), v in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]
    ]
    return {
        "source": where,
        "backend": kind,
        "devices": len(chosen),
        "events": n_ev,
        "window_ms": _r(window / 1e3, 3),
        "busy_ms": _r(busy / 1e3, 3),
        "split": {
            "compute": _r((comp_t - both) / window),
            "collective_exposed": _r((coll_t - both) / window),
            "overlap": _r(both / window),
            "idle": _r(1 - busy / window),
        },
        "collective_ms": _r(coll_t / 1e3, 3),
        "top_ops": top_ops,
        "top_kinds": top_kinds,
    }


def self_times(items: list[tuple[float, float, str]]) -> dict[str, tuple[float, int]]:
    """{name: (self time, count)} for one lane's events of one kind: an event fully inside another
    (an op inside a while loop on the CPU backend) is subtracted from its parent's time."""
    out: dict[str, list] = {}
    stack: list[list] = []  # [start, end, name, time of direct children]

    def close(fr: list) -> None:
        slot = out.setdefault(fr[2], [0.0, 0])
        slot[0] += max(0.0, fr[1] - fr[0] - fr[3])
        slot[1] += 1
        if stack:
            stack[-1][3] += fr[1] - fr[0]

    for a, b, name in sorted(items, key=lambda e: (e[0], -(e[1] - e[0]))):
        while stack and not (a >= stack[-1][0] and b <= stack[-1][1]):
            close(stack.pop())
        stack.append([a, b, name, 0.0])
    while stack:
        close(stack.pop())
    return {k: (v[0], v[1]) for k, v in out.items()}


def _venv_has(module: str) -> bool:
    return any((REPO / ".venv" / "lib").glob(f"python3*/site-packages/{module}/__init__.py"))


def view_commands(t: dict) -> list[str]:
    p = Path(t["path"])
    cmds = []
    if t["kind"] == "trace_json":
        cmds.append(f"open https://ui.perfetto.dev and load {p} (Open trace file; it is read in the browser)")
    if t["kind"] in ("trace_json", "xplane"):
        logdir = p.parent.parent.parent.parent if p.parent.parent.name == "profile" else p.parent
        tb = ".venv/bin/tensorboard" if (REPO / ".venv" / "bin" / "tensorboard").exists() else "tensorboard"
        prefix = ""
        if not _venv_has("fsspec"):
            cmds.append(
                ".venv/bin/python -m pip install --target ~/.cache/maxtext-slurm/tb-fsspec fsspec"
                "   # once: the profile plugin "
                "(xprof) needs fsspec, which the pinned .venv lacks"
            )
            prefix = "PYTHONPATH=~/.cache/maxtext-slurm/tb-fsspec "
        cmds.append(
            f"{prefix}{tb} --logdir {logdir} --host 127.0.0.1 --port 6006   # then http://127.0.0.1:6006/#profile"
        )
    if t["kind"] == "nsys":
        cmds.append(f"nsys stats {p}")
    return cmds


def analyse_traces(traces: list[dict], max_traces: int, top: int, notes: list[str]) -> None:
    done = 0
    json_by_dir = {(Path(t["path"]).parent, t["host"]): t for t in traces if t["kind"] == "trace_json"}
    for t in traces:
        t["view"] = view_commands(t)
        if t["kind"] == "nsys":
            continue
        if t["kind"] == "xplane":
            twin = json_by_dir.get((Path(t["path"]).parent, t["host"]))
            if twin:
                t["same_as"] = twin["path"]
                continue
        if done >= max_traces:
            continue
        try:
            if t["kind"] == "trace_json":
                lanes = _json_lanes(Path(t["path"]))
            else:
                lanes = _xplane_lanes(Path(t["path"]))
                if lanes is None:
                    notes.append(
                        f"{t['path']}: no decoder for .xplane.pb in this Python (jaxlib); open it with "
                        "TensorBoard (see its view commands) or run perf.py with .venv/bin/python"
                    )
                    continue
        except (OSError, EOFError, ValueError, RuntimeError) as e:
            notes.append(f"{t['path']}: cannot read the trace ({e})")
            continue
        t["summary"] = summarize_lanes(*lanes, top=top)
        done += 1
    left = [t for t in traces if t["summary"] is None and t["same_as"] is None and t["kind"] != "nsys"]
    if left and done >= max_traces:
        notes.append(f"{len(left)} older trace file(s) not summarised (--max-traces {max_traces})")


# --- the report ---------------------------------------------------------------------------
