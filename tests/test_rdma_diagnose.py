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


# the fast loop runs each vendor's first counter; the whole suite every counter (~1 CPU-s a diagnosis)
SECOND_COUNTERS = {16, 14}


@pytest.mark.parametrize(
    "seed",
    [pytest.param(s, marks=[pytest.mark.slow] if s in SECOND_COUNTERS else []) for s in CASES],
    ids=[f"{n}-{c}" for n, c in CASES.values()],
)
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


# --- which end of a lossy link: send side and receive side, per vendor --------------------------------
# rdma_send_side: the culprits' requester side rises (retransmits, ACK timeouts, NAKs received), their
# peers' responder side more (out-of-sequence drops); rdma_recv_side the mirror image. The NIC is the
# seed's (seed % 3: mlx5, ionic, bnxt_re), so six seeds give each vendor two jobs; the counter names are
# the drivers' (tests/helpers/corpus.py SIDE_COUNTERS cites the files). Before the sides were read, the
# peers' larger responder counts were blamed (send side: precision 0, recall 0 on all six seeds).
# Seeds 1-3 (one job per vendor) run in the fast loop, seeds 4-6 (the second job of each) in the whole suite.
SIDE_SEEDS = {"1-3": range(1, 4), "4-6": pytest.param(range(4, 7), marks=pytest.mark.slow, id="4-6")}


@pytest.mark.parametrize("seeds", SIDE_SEEDS.values(), ids=SIDE_SEEDS)
@pytest.mark.parametrize("family", ["rdma_send_side", pytest.param("rdma_recv_side", marks=pytest.mark.slow)])
def test_the_faulty_end_is_named_on_every_vendor(tmp_path, family, seeds):
    named = right = want = 0
    nics, misses = set(), []
    for seed in seeds:
        inc = corpus.build(family, tmp_path / str(seed), seed)
        nics.add(inc.notes["nic"])
        peers = set(inc.notes["peers"])
        r = diag(inc.job_dir)
        got = set(r["culprit_hosts"])
        named, right, want = named + len(got), right + len(got & set(inc.culprits)), want + len(inc.culprits)
        top = r["findings"][0] if r["findings"] else {}
        side = "requester" if family == "rdma_send_side" else "responder"
        if r["verdict"] != "network" or got != set(inc.culprits) or top["values"].get("side") != side:
            misses.append(
                f"{inc.notes['nic']} seed {seed}: {r['verdict']} {sorted(got)} (want {inc.culprits}): {r['summary']}"
            )
        else:  # the other side's counters are higher on the peers than the culprits' own, and the finding says so
            other = top["values"]["peers_other_side_per_s"]
            assert peers <= set(other) | got, (peers, other)
            assert f"{side} side" in top["summary"], top["summary"]
    assert nics == {"mlx5", "ionic", "bnxt_re"}
    precision, recall = right / max(named, 1), right / want
    assert (precision, recall) == (1.0, 1.0) and not misses, "\n".join(misses)


def test_the_peers_count_more_than_the_culprit(tmp_path):
    """The corpus's premise (the issue's): on a send-side fault each peer's responder counters are higher
    than the culprit's requester counters, so a rate ranking alone names the peers."""
    inc = corpus.build("rdma_send_side", tmp_path, 4)  # ionic, one culprit
    r = diag(inc.job_dir)
    top = r["findings"][0]
    mine = sum(top["values"]["rate_per_s"].values())
    peers = [top["values"]["peers_other_side_per_s"][p] for p in inc.notes["peers"]]
    assert min(peers) > mine, (peers, mine)
    assert r["culprit_hosts"] == inc.culprits, r["summary"]


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_a_clean_ionic_job_is_not_network(tmp_path, seed):
    """AMD Pensando (ionic) on a fabric that sprays packets over many paths: every host counts out-of-
    sequence arrivals (responder side), one host ten times more, and no sender retransmits: reordering,
    not loss. (The rate ranking read it as `network` on that host.)"""
    inc = corpus.build("healthy_ionic", tmp_path, seed)
    r = diag(inc.job_dir)
    assert r["verdict"] == "none" and r["culprit_hosts"] == [], r["summary"]
    assert "network" in {c["check"] for c in r["ruled_out"]}


@pytest.mark.parametrize("family", ["rdma_send_side", "rdma_recv_side"])
def test_triage_blames_no_peer(tmp_path, family):
    """The log of a lossy-link job shows a completed run: triage names no culprit (no wrong peer), and its
    hand-over sends the slow phase to the metrics, where diagnose names the faulty end."""
    from diagnosis import triage

    inc = corpus.build(family, tmp_path, 1)
    t = triage.triage(str(inc.log), tmp_path)
    assert t["status"] == "completed" and t["failure_class"] is None and t["culprit_hosts"] == [], t["summary"]
    assert t["scope"] is None and t["affected_hosts"] == []
