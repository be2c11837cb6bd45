"""RDMA counter names from utils/launch/rdma_providers.tsv (the one table of the NICs the project knows).

`is_rdma_retransmit(counter)`: whether a `hw_ib_port_transport_errors_total` `counter` label (a hw_counters
file name) counts retransmissions or their causes on any NIC in the table: mlx5 `roce_adp_retrans`,
`local_ack_timeout_err`; AMD Pensando ionic `tx_rdma_retx_pkts`, `tx_rdma_ack_timeout`; Broadcom bnxt_re
`to_retransmits`, `seq_err_naks_rcvd`; EFA `retrans_pkts`; ... (the table's `retransmit` column).
`side_of(counter)`: which end of a connection counts it, `requester` (the sender: retransmits, ACK
timeouts, NAKs received) or `responder` (the receiver: out-of-sequence drops, duplicate requests),
from the table's `sides` column; None for a counter that is not a retransmit one.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "launch" / "rdma_providers.tsv"
SIDES = ("requester", "responder")


@functools.cache
def _rows() -> tuple[tuple[int, dict[str, str]], ...]:
    """The table's rows as (line number, {column: cell}), its columns named by its `# pci_driver` line."""
    header: list[str] = []
    rows = []
    for n, line in enumerate(TABLE.read_text().splitlines(), 1):
        if line.startswith("# pci_driver\t"):
            header = line[2:].split("\t")
        if line.strip() and not line.startswith("#"):
            rows.append((n, dict(zip(header, line.split("\t"), strict=False))))
    return tuple(rows)


def _sided(cells: dict[str, str]) -> list[tuple[str, str]]:
    """A row's `sides` column: [(glob, side), ...]."""
    return [(g, s) for g, _, s in (e.partition("=") for e in cells.get("sides", "-").split() if e != "-")]


@functools.cache
def _sides() -> tuple[re.Pattern[str], tuple[tuple[re.Pattern[str], str], ...]]:
    """(every retransmit glob in one pattern, ((glob pattern, side), ...) in the table's order)."""
    globs: list[str] = []
    sided: list[tuple[re.Pattern[str], str]] = []
    for n, cells in _rows():
        row = [g for g in cells.get("retransmit", "-").split() if g != "-"]
        sides = dict(_sided(cells))
        for g in row:
            if sides.get(g) not in SIDES:
                raise RuntimeError(f"{TABLE}:{n}: retransmit counter {g} has no side (sides: {g}=requester|responder)")
            sided.append((re.compile(fnmatch.translate(g)), sides[g]))
        globs += row
    if not globs:
        raise RuntimeError(f"{TABLE}: no retransmit column")
    return re.compile("|".join(fnmatch.translate(g) for g in globs)), tuple(sided)


def side_globs(side: str) -> list[str]:
    """The retransmit counter globs the table gives SIDE (requester or responder), in its order, once each."""
    out: list[str] = []
    for _, cells in _rows():
        out += [g for g, s in _sided(cells) if s == side and g not in out]
    return out


def is_rdma_retransmit(counter: str) -> bool:
    """True when the hw_counters file `counter` counts retransmits (or ACK timeouts, NAKs, sequence errors)."""
    return _sides()[0].fullmatch(counter) is not None


def side_of(counter: str) -> str | None:
    """`requester` or `responder`: the end of a connection whose NIC counts `counter` (the first row of
    the table whose retransmit glob matches it decides); None when it is not a retransmit counter."""
    return next((side for pat, side in _sides()[1] if pat.fullmatch(counter)), None)
