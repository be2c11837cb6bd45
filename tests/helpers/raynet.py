"""Helpers for the RAY=1 security tests: a job's processes, their listening sockets, and probes
that tell whether a port lets a caller in without the job's Ray token."""

import http.client
import ipaddress
import json
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

# One harmless read-only method of each Ray gRPC service that listens on a node: GCS, raylet (node
# manager), object manager, dashboard agent (reporter), core worker (drivers, actors, workers).
# A method of another service answers UNIMPLEMENTED before any authentication, so each is tried.
GRPC_METHODS = (
    "/ray.rpc.NodeInfoGcsService/GetClusterId",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.ReporterService/GetTraceback",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
)
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def job_processes(job_dir: Path) -> dict[int, str]:
    """pid -> command line of every process of one job: those with JOB_DIR=<job_dir> in their
    environment (unique, unlike a job id when several local clusters share a machine) and all
    their descendants (Ray's agents and workers overwrite their environment block with their
    process title, but their parent, the raylet, keeps it)."""
    marker = f"JOB_DIR={job_dir}".encode()
    parent, marked, cmd = {}, set(), {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd[int(p.name)] = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
        if marker in env:
            marked.add(int(p.name))
    grew = True
    while grew:
        new = {p for p, pp in parent.items() if pp in marked and p not in marked}
        marked |= new
        grew = bool(new)
    return {p: cmd[p] for p in marked if p in cmd}


@dataclass(frozen=True)
class Listener:
    addr: str
    port: int
    pid: int
    cmd: str

    def host(self, node_addr: str) -> str:
        """Where a caller on the network reaches it (the node address for a wildcard), URL-ready."""
        a = node_addr if self.addr in ("0.0.0.0", "::") else self.addr
        return f"[{a}]" if ":" in a else a

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.addr)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback


def listeners(procs: dict[int, str]) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) held by one of `procs`."""
    owner = {}
    for pid in procs:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[int(link[8:-1])] = pid
        except OSError:
            continue
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or int(f[9]) not in owner:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # kernel words are little-endian
            pid = owner[int(f[9])]
            out.append(Listener(socket.inet_ntop(family, raw), int(hexport, 16), pid, procs[pid]))
    return out


def http_status(method: str, url: str, token: str | None = None, body: bytes | None = None) -> tuple[int | None, str]:
    """(status, start of the body) of one request; (None, why) when nothing answers in HTTP/1.1."""
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with NO_PROXY.open(req, timeout=5) as r:
            return r.status, r.read(300).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(300).decode(errors="replace")
    except (OSError, ValueError, http.client.HTTPException) as e:  # refused, reset, or a gRPC (HTTP/2) server
        return None, f"{type(e).__name__}: {e}"


def grpc_code(host: str, port: int, method: str, token: str | None) -> grpc.StatusCode:
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(b"", metadata=[("authorization", f"Bearer {token}")] if token else [], timeout=5)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def probe(host: str, port: int, token: str) -> str:
    """What a caller without the token gets from one port:
    'metrics'        a read-only Prometheus page (GET /metrics answers 200 with metric text);
    'authenticated'  refused without the token (HTTP 401, gRPC UNAUTHENTICATED), let in with it;
    'unreachable'    nothing answers;
    anything else describes an answer that is neither (the port is open to anyone)."""
    status, text = http_status("GET", f"http://{host}:{port}/metrics")
    if status == 200 and ("# HELP" in text or "# TYPE" in text):
        return "metrics"
    if status is not None:
        with_token, _ = http_status("POST", f"http://{host}:{port}/api/job_agent/jobs/", token, b"{}")
        without, _ = http_status("POST", f"http://{host}:{port}/api/job_agent/jobs/", None, b"{}")
        if status == 401 and without == 401 and with_token not in (None, 401, 403):
            return "authenticated"
        return f"http: GET /metrics {status}, POST without token {without}, with token {with_token}"
    seen = []
    for method in GRPC_METHODS:
        code = grpc_code(host, port, method, None)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            with_token = grpc_code(host, port, method, token)
            return (
                "authenticated" if with_token != grpc.StatusCode.UNAUTHENTICATED else f"grpc: token refused ({method})"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return "unreachable"
        seen.append(f"{method.rsplit('/', 1)[1]}={code.name}")
    return "grpc without token: " + ", ".join(seen)


def target_ports(job_dir: Path) -> set[int]:
    """Ports of the Prometheus file_sd targets of a job (exporters and Ray metrics ports)."""
    ports = set()
    for f in (job_dir / "metrics" / "targets").glob("*.json"):
        for group in json.loads(f.read_text()):
            ports |= {int(t.rsplit(":", 1)[1]) for t in group["targets"]}
    return ports
