"""diagnose.py names the hosts whose RDMA NICs retransmit, whatever the NIC's vendor.

The corpus's rdma_retransmits jobs count retransmits in the hw_counters names of the job's NICs
(tests/helpers/corpus.py RDMA_NICS): ConnectX (mlx5) on NVIDIA nodes, AMD Pensando Pollara (ionic) or
Broadcom Thor (bnxt_re) on AMD nodes. diagnose knows them from utils/launch/rdma_providers.tsv.
"""

from __future__ import annotations

import re

import pytest
from test_diagnose import diag

from helpers import corpus

# seed -> (NIC, the counter the culprits' NICs raise); each drawn by the corpus from the seed
CASES = {
    2: ("mlx5", "roce_adp_retrans"),
    6: ("ionic", "tx_rdma_ack_timeout"),
    16: ("ionic", "tx_rdma_retx_pkts"),
    4: ("bnxt_re", "seq_err_naks_rcvd"),
    14: ("bnxt_re", "to_retransmits"),
}


@pytest.mark.parametrize("seed", list(CASES), ids=[f"{n}-{c}" for n, c in CASES.values()])
def test_retransmit_culprits_per_vendor(tmp_path, seed):
    nic, counter = CASES[seed]
    inc = corpus.build("rdma_retransmits", tmp_path, seed)
    assert corpus._rdma_nic(corpus._Sim("rdma_retransmits", seed, corpus.SMALL))[0] == nic  # the seed's NIC
    r = diag(inc.job_dir)
    why = f"{nic} seed {seed}: {r['summary']}\n" + "\n".join(f"  {f['kind']}: {f['summary']}" for f in r["findings"])
    assert r["verdict"] == "network", why
    assert sorted(r["culprit_hosts"]) == sorted(inc.culprits), why
    top = r["findings"][0]
    shown = " ".join([top["summary"], *top["queries"]])
    assert re.search(rf"\b{counter}\b", shown), f"the finding does not name {counter}: {shown}"
