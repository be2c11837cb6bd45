"""RDMA counter names from utils/launch/rdma_providers.tsv (the one table of the NICs the project knows).

`is_rdma_retransmit(counter)`: whether a `hw_ib_port_transport_errors_total` `counter` label (a hw_counters
file name) counts retransmissions or their causes on any NIC in the table: mlx5 `roce_adp_retrans`,
`local_ack_timeout_err`; AMD Pensando ionic `tx_rdma_retx_pkts`, `tx_rdma_ack_timeout`; Broadcom bnxt_re
`to_retransmits`, `seq_err_naks_rcvd`; EFA `retrans_pkts`; ... (the table's `retransmit` column).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "launch" / "rdma_providers.tsv"


@functools.cache
def _retransmit_pattern() -> re.Pattern[str]:
    header: list[str] = []
    globs: list[str] = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("# pci_driver\t"):
            header = line[2:].split("\t")
        if not line.strip() or line.startswith("#"):
            continue
        cells = dict(zip(header, line.split("\t"), strict=False))
        globs += [g for g in cells.get("retransmit", "-").split() if g != "-"]
    if not globs:
        raise RuntimeError(f"{TABLE}: no retransmit column")
    return re.compile("|".join(fnmatch.translate(g) for g in globs))


def is_rdma_retransmit(counter: str) -> bool:
    """True when the hw_counters file `counter` counts retransmits (or ACK timeouts, NAKs, sequence errors)."""
    return _retransmit_pattern().fullmatch(counter) is not None
