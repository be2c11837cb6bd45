"""The host plugin's RDMA counters on each NIC vendor's sysfs tree (tests/fixtures/sysfs/{mlx5,bnxt,ionic}-roce).

Each tree has one port with the hw_counters files its driver creates (names: tests/fixtures/sysfs/README.md);
the plugin must export every retransmit, ACK-timeout, sequence-error/NAK and congestion counter in the families
of docs/metrics.md, bytes and packets once per port, and nothing for files that are settings or resources.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_plugins import FIX, run_plugin, samples, val

from diagnosis.rdma import is_rdma_retransmit

TRANSPORT = "hw_ib_port_transport_errors_total"
CONGESTION = "hw_ib_port_congestion_events_total"

# node, device, retransmit-like counters (with their values), congestion counters, bytes sent
VENDORS = {
    "mlx5": (
        "mlx5-roce",
        "mlx5_0",
        {"roce_adp_retrans": 212, "local_ack_timeout_err": 31, "out_of_sequence": 17, "packet_seq_err": 9},
        {"np_cnp_sent": 5990, "np_ecn_marked_roce_packets": 6012, "rp_cnp_handled": 5521},
    ),
    "bnxt_re": (
        "bnxt-roce",
        "bnxt_re0",
        {"to_retransmits": 44, "seq_err_naks_rcvd": 12, "oos_drop_count": 21, "dup_req": 3},
        {},
    ),
    "ionic": (
        "ionic-roce",
        "ionic_0",
        {"tx_rdma_retx_pkts": 320, "tx_rdma_ack_timeout": 57, "req_rx_pkt_seq_err": 6, "resp_rx_outouf_seq": 7},
        {"tx_rdma_cnp_pkts": 733, "rx_rdma_cnp_pkts": 812, "rx_rdma_ecn_pkts": 790},
    ),
}


def scrape(sys_root: Path) -> dict:
    r = run_plugin("host", {"METRICS_PROCFS_ROOT": "/nonexistent", "METRICS_SYSFS_ROOT": str(sys_root)})
    assert r.returncode == 0, r.stderr
    return samples(r.stdout)


@pytest.mark.parametrize("vendor", list(VENDORS))
def test_vendor_tree_gives_the_documented_series(vendor):
    node, dev, retrans, congestion = VENDORS[vendor]
    got = scrape(FIX / "sysfs" / node / "sys")
    port = {"device": dev, "port": "1"}
    for counter, value in retrans.items():
        assert val(got, TRANSPORT, counter=counter, **port) == value, counter
        assert is_rdma_retransmit(counter), f"diagnose does not read {vendor}'s {counter} as a retransmit"
    for counter, value in congestion.items():
        assert val(got, CONGESTION, counter=counter, **port) == value, counter
        assert not is_rdma_retransmit(counter), f"diagnose reads {vendor}'s {counter} as a retransmit"
    # bytes and packets: one series per port (bnxt_re has them in counters/ and hw_counters/; ionic only in
    # hw_counters/), the same totals on every tree
    assert val(got, "hw_ib_port_transmit_bytes_total", **port) == 10_000_000_000
    assert val(got, "hw_ib_port_receive_bytes_total", **port) == 9_600_000_000
    assert val(got, "hw_ib_port_transmit_packets_total", **port) == 91_000_000
    assert val(got, "hw_ib_port_receive_packets_total", **port) == 90_000_000
    exported = {dict(lbl).get("counter") for name, lbl in got if name in (TRANSPORT, CONGESTION)}
    # settings, resource gauges, request counts and the byte/packet counters are not errors or congestion
    for not_a_counter in ("lifespan", "active_qps", "rx_write_requests", "tx_bytes", "tx_rdma_ucast_pkts"):
        assert not_a_counter not in exported


def test_a_driver_the_table_lacks_gets_every_vendors_names(tmp_path):
    """A device whose PCI driver is not in rdma_providers.tsv still has its known counter names exported."""
    tree = tmp_path / "sys"
    shutil.copytree(FIX / "sysfs" / "ionic-roce" / "sys", tree, symlinks=True)
    link = next((tree / "devices").rglob("0000:09:00.0/driver"))
    link.unlink()
    got = scrape(tree)
    port = {"device": "ionic_0", "port": "1"}
    assert val(got, TRANSPORT, counter="tx_rdma_retx_pkts", **port) == 320
    assert val(got, CONGESTION, counter="rx_rdma_ecn_pkts", **port) == 790
    assert ("hw_ib_port_transmit_bytes_total", frozenset(port.items())) not in got  # traffic names are per driver
