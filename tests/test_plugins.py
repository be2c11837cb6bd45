"""Tests of the metrics plugins (utils/*_metrics_plugin.sh), the exporter's TensorBoard collector and docs/metrics.md.

This machine has no GPU, no InfiniBand HCA and no NVIDIA driver: the trees under tests/fixtures stand in for
that hardware (file names, layout, symlinks and contents copied in shape from real nodes). /proc is also
tested for real, since this machine has one.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.tbevents import MAXTEXT_TAGS, event_record, write_history
from observe import metrics_exporter as mx
from observe import tb_collector as tbc

REPO = Path(__file__).resolve().parents[1]
UTILS = REPO / "utils"
FIX = REPO / "tests" / "fixtures"


def run_plugin(
    name: str, env: dict[str, str] | None = None, args: tuple[str, ...] = (), timeout: float = 30
) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "LC_ALL": "C", "HOME": os.environ.get("HOME", "/tmp")}
    base.update(env or {})
    return subprocess.run(
        ["bash", str(UTILS / "observe" / "plugins" / f"{name}_metrics_plugin.sh"), *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(name, labels) -> value; fails on any line the exporter would reject."""
    parsed = mx.parse_exposition(text)
    assert parsed.rejected == 0, text
    out = {}
    for fam in parsed.families.values():
        assert fam.type != "untyped", f"{fam.name} has no TYPE"
        assert fam.help, f"{fam.name} has no HELP"
        for s in fam.samples:
            key = (s.name, frozenset(s.labels))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def val(got: dict, name: str, **labels: str) -> float:
    return got[(name, frozenset(labels.items()))]


def names(got: dict) -> set[str]:
    return {name for name, _ in got}


def machine_has_gpu() -> bool:
    amd = any(
        Path(c, "device/vendor").is_file() and Path(c, "device/vendor").read_text().strip() == "0x1002"
        for c in Path("/sys/class/drm").glob("card*")
    )
    return amd or any(Path("/proc/driver/nvidia/gpus").glob("*"))


# ---- host plugin ---------------------------------------------------------------------------------------


def host_fixture_env() -> dict[str, str]:
    """tests/fixtures/host/kmsg stands in for /dev/kmsg (records "prio,seq,usec,flags;message", continuation
    lines starting with a space: the kernel's Documentation/ABI/testing/dev-kmsg; the NVRM Xid text is NVIDIA's
    "Xid Errors" document's form); sys/bus/pci/drivers/nvidia/ holds GPU 0 (0000:3b:00.0); 0000:5d:00 fell off
    the bus and is bound to no driver."""
    return {
        "METRICS_PROCFS_ROOT": str(FIX / "host/proc"),
        "METRICS_SYSFS_ROOT": str(FIX / "host/sys"),
        "METRICS_KMSG": str(FIX / "host/kmsg"),
    }


def test_kernel_log_gpu_errors_are_counted_once_each(tmp_path):
    """Two polls of a growing kernel log (a stand-in for /dev/kmsg, see host_fixture_env): the first only
    takes the newest sequence number, the second counts what came after it, a third counts nothing again."""
    kmsg, state = tmp_path / "kmsg", tmp_path / "state"
    state.mkdir()
    kmsg.write_text((FIX / "host/kmsg").read_text())
    env = {**host_fixture_env(), "METRICS_KMSG": str(kmsg), "METRICS_STATE_DIR": str(state), "METRICS_KMSG_EVERY": "0"}
    got = samples(run_plugin("host", env).stdout)
    assert val(got, "hw_gpu_kernel_log_readable") == 1
    assert "hw_gpu_kernel_errors_total" not in names(got)  # in the log before the job: not the job's
    with kmsg.open("a") as f:  # amdgpu's texts: amdgpu_device.c "GPU reset begin!", amdgpu_ras.c's UE lines
        f.write(
            "4,1005,900000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=4711, name=python3, An uncorrectable double "
            "bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
            "3,1006,900000100,-;amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!\n"
            "3,1007,900000200,-;amdgpu 0000:c1:00.0: amdgpu: socket: 0, die: 1, 2 new uncorrectable hardware "
            "errors detected in UMC block\n"
            "3,1008,900000300,-;amdgpu 0000:c1:00.0: amdgpu: socket: 0, die: 1, 2 uncorrectable hardware errors "
            "detected in total in UMC block\n"
        )
    for _ in range(2):  # the second read finds nothing new: the same counts
        got = samples(run_plugin("host", env).stdout)
        assert val(got, "hw_gpu_kernel_errors_total", gpu="0", code="48") == 1
        assert val(got, "hw_gpu_kernel_errors_total", code="gpu_reset") == 1  # no amdgpu card here: no gpu label
        assert val(got, "hw_gpu_kernel_errors_total", code="ras_uncorrectable") == 1
        assert not any(n == "hw_gpu_kernel_errors_total" and dict(lb).get("code") == "79" for n, lb in got)


def test_the_kernel_log_is_read_at_most_every_kmsg_every_seconds(tmp_path):
    """Reading /dev/kmsg costs a read(2) per record: within METRICS_KMSG_EVERY seconds of the last read a
    poll gives the state's counts without reading; the first poll after it counts what came meanwhile."""
    kmsg, state = tmp_path / "kmsg", tmp_path / "state"
    state.mkdir()
    kmsg.write_text((FIX / "host/kmsg").read_text())
    env = {**host_fixture_env(), "METRICS_KMSG": str(kmsg), "METRICS_STATE_DIR": str(state), "METRICS_KMSG_EVERY": "2"}
    run_plugin("host", env)  # the first poll reads (and takes the newest sequence number)
    with kmsg.open("a") as f:
        f.write(
            "4,1005,900000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4711, name=python3, GPU has fallen off the bus.\n"
        )
    got = samples(run_plugin("host", env).stdout)
    assert val(got, "hw_gpu_kernel_log_readable") == 1 and "hw_gpu_kernel_errors_total" not in names(got)
    time.sleep(2.1)
    for _ in range(2):  # read now; then the counts from the state
        got = samples(run_plugin("host", env).stdout)
        assert val(got, "hw_gpu_kernel_errors_total", gpu="0", code="79") == 1


def test_unreadable_kernel_log_is_tried_once(tmp_path):
    """No /dev/kmsg to read (a container without it; kernel.dmesg_restrict for a non-root user): no failure,
    readable 0, and the state remembers it so later polls do not try again."""
    state = tmp_path / "state"
    state.mkdir()
    env = {**host_fixture_env(), "METRICS_KMSG": str(tmp_path / "none"), "METRICS_STATE_DIR": str(state)}
    r = run_plugin("host", env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert val(samples(r.stdout), "hw_gpu_kernel_log_readable") == 0
    (tmp_path / "none").write_text((FIX / "host/kmsg").read_text())  # readable now, but not tried again
    got = samples(run_plugin("host", env).stdout)
    assert val(got, "hw_gpu_kernel_log_readable") == 0 and "hw_gpu_kernel_errors_total" not in names(got)


def test_host_plugin_on_fixture():
    """The fixture stands in for a GPU node's /proc and its two mlx5 HCAs (one InfiniBand, one RoCE port that
    is down); this machine has no InfiniBand."""
    r = run_plugin("host", host_fixture_env())
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    assert val(got, "hw_net_receive_bytes_total", device="eno12399np0") == 885522934413
    assert val(got, "hw_net_transmit_drops_total", device="ib0") == 3
    assert val(got, "hw_net_receive_drops_total", device="eno12399np0") == 1245
    assert not any(dict(lbl).get("device") == "lo" for _, lbl in got)
    assert val(got, "hw_tcp_retransmits_total") == 48211
    # Ip OutRequests and OutTransmits (the fixture's kernel has OutTransmits, Linux 6.3+)
    assert val(got, "hw_ip_out_requests_total") == 951120442
    assert val(got, "hw_ip_out_transmits_total") == 951120421
    assert val(got, "hw_tcp_estab_resets_total") == 2087
    assert val(got, "hw_tcp_out_resets_total") == 9133
    assert val(got, "hw_tcp_timeouts_total") == 6621
    assert val(got, "hw_tcp_current_established") == 148
    assert val(got, "hw_procs_running") == 53
    assert val(got, "hw_procs_blocked") == 2
    assert val(got, "hw_context_switches_total") == 61204433098
    assert val(got, "hw_cpu_seconds_total", mode="iowait") == pytest.approx(2011.33)
    assert val(got, "hw_oom_kills_total") == 3
    assert val(got, "hw_memory_dirty_bytes") == 7332 * 1024
    assert val(got, "hw_memory_available_bytes") == 1942012208 * 1024
    assert val(got, "hw_cpu_pressure_some_pct") == 3.15
    assert val(got, "hw_io_pressure_full_pct") == 10.94
    assert val(got, "hw_io_pressure_full_seconds_total") == pytest.approx(2930.113204)
    assert val(got, "hw_load1") == 52.31
    ib0 = {"device": "mlx5_0", "port": "1"}
    assert val(got, "hw_ib_port_transmit_bytes_total", **ib0) == 1830021133904 * 4
    assert val(got, "hw_ib_port_receive_bytes_total", **ib0) == 1829930021187 * 4
    assert val(got, "hw_ib_port_errors_total", counter="symbol_error", **ib0) == 12
    assert val(got, "hw_ib_port_errors_total", counter="link_downed", **ib0) == 1
    assert val(got, "hw_ib_port_transport_errors_total", counter="local_ack_timeout_err", **ib0) == 41
    assert val(got, "hw_ib_port_transport_errors_total", counter="out_of_sequence", **ib0) == 122
    assert val(got, "hw_ib_port_state", **ib0) == 4
    assert val(got, "hw_ib_port_rate_gbps", **ib0) == 400
    roce = {"device": "mlx5_1", "port": "1"}
    assert val(got, "hw_ib_port_congestion_events_total", counter="np_cnp_sent", **roce) == 9120
    assert val(got, "hw_ib_port_transport_errors_total", counter="roce_adp_retrans", **roce) == 31
    assert val(got, "hw_ib_port_state", **roce) == 1
    assert not any(dict(lbl).get("counter") == "lifespan" for _, lbl in got)  # a setting, not a counter
    assert val(got, "hw_gpu_kernel_errors_total", gpu="0", code="48") == 1  # run by hand: the whole kernel log
    assert val(got, "hw_gpu_kernel_errors_total", code="79") == 1  # its GPU left the bus: no index
    assert not any(dict(lbl).get("code") == "12028" for _, lbl in got)  # an NVSwitch SXid is no GPU's


def test_host_plugin_on_real_proc():
    """This machine's own /proc (and /sys, which has no InfiniBand)."""
    before = int(re.search(r"^ctxt (\d+)", Path("/proc/stat").read_text(), re.M).group(1))
    r = run_plugin("host")
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    after = int(re.search(r"^ctxt (\d+)", Path("/proc/stat").read_text(), re.M).group(1))
    assert before <= val(got, "hw_context_switches_total") <= after
    assert val(got, "hw_procs_running") >= 1
    assert 0 < val(got, "hw_memory_available_bytes") <= val(got, "hw_memory_total_bytes")
    assert val(got, "hw_tcp_retransmits_total") >= 0
    assert val(got, "hw_cpu_seconds_total", mode="idle") > 0
    assert "hw_load1" in names(got)
    nics = {line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]} - {"lo"}
    assert {dict(lbl)["device"] for n, lbl in got if n == "hw_net_receive_bytes_total"} == nics
    if Path("/proc/pressure/cpu").exists():
        assert "hw_cpu_pressure_some_pct" in names(got)
        assert "hw_io_pressure_some_seconds_total" in names(got)
    if "oom_kill " in Path("/proc/vmstat").read_text():
        assert "hw_oom_kills_total" in names(got)


def test_host_plugin_tolerates_missing_files(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/loadavg").write_text("0.50 0.40 0.30 2/300 1234\n")
    env = {"METRICS_PROCFS_ROOT": str(tmp_path / "proc"), "METRICS_SYSFS_ROOT": str(tmp_path)}
    r = run_plugin("host", {**env, "METRICS_KMSG": str(tmp_path / "no_kmsg")})
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    assert names(got) == {"hw_load1", "hw_load5", "hw_load15", "hw_gpu_kernel_log_readable"}
    assert val(got, "hw_gpu_kernel_log_readable") == 0


# ---- GPU plugin ----------------------------------------------------------------------------------------


def nvidia_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    env = {
        "METRICS_SYSFS_ROOT": str(FIX / "nvidia_h100/sys"),
        "METRICS_PROCFS_ROOT": str(FIX / "nvidia_h100/proc"),
        "NVIDIA_SMI": str(FIX / "nvidia_h100/bin/nvidia-smi"),
        "METRICS_STATE_DIR": str(state),
        "FAKE_NVIDIA_SMI_LOG": str(tmp_path / "smi.log"),
    }
    env.update(extra)
    return env


def amd_env(**extra: str) -> dict[str, str]:
    return {
        "METRICS_SYSFS_ROOT": str(FIX / "amd_mi300x/sys"),
        "METRICS_PROCFS_ROOT": str(FIX / "no_gpu/proc"),
        "METRICS_AMDGPU_IDS": str(FIX / "amd_mi300x/amdgpu.ids"),  # libdrm's table (excerpt)
        **extra,
    }


def test_gpu_plugin_amd_fixture():
    """Two MI300X cards (one as recent kernels expose it: no edge sensor, power1_input; one with edge,
    power1_average and deferred RAS counts) behind an ASPEED BMC VGA card: this machine has no AMD GPU."""
    r = run_plugin("gpu", amd_env())
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    g0, g1 = {"gpu": "0", "vendor": "amd"}, {"gpu": "1", "vendor": "amd"}
    assert {dict(lbl)["gpu"] for _, lbl in got} == {"0", "1"}  # the BMC's card0 is not a GPU
    assert val(got, "hw_gpu_temperature_celsius", sensor="junction", **g0) == 71
    assert val(got, "hw_gpu_temperature_celsius", sensor="mem", **g0) == 58
    assert ("hw_gpu_temperature_celsius", frozenset({**g0, "sensor": "edge"}.items())) not in got
    assert val(got, "hw_gpu_temperature_celsius", sensor="edge", **g1) == 49
    assert val(got, "hw_gpu_power_watts", **g0) == 682  # power1_input
    assert val(got, "hw_gpu_power_watts", **g1) == 540  # power1_average
    assert val(got, "hw_gpu_power_limit_watts", **g0) == 750
    assert val(got, "hw_gpu_utilization_pct", **g1) == 97
    assert val(got, "hw_gpu_memory_utilization_pct", **g0) == 38
    assert val(got, "hw_gpu_clock_mhz", type="core", **g0) == 1420
    assert val(got, "hw_gpu_clock_mhz", type="memory", **g0) == 1300
    assert val(got, "hw_gpu_vram_used_bytes", **g0) == 180388626432
    assert val(got, "hw_gpu_vram_total_bytes", **g0) == 206141652992
    assert val(got, "hw_gpu_ras_errors_total", kind="ce", block="umc", **g0) == 3
    assert val(got, "hw_gpu_ras_errors_total", kind="ce", block="xgmi_wafl", **g0) == 1
    assert val(got, "hw_gpu_ras_errors_total", kind="ue", block="umc", **g1) == 1
    assert val(got, "hw_gpu_ras_errors_total", kind="de", block="umc", **g1) == 2
    assert val(got, "hw_gpu_pcie_aer_errors_total", severity="correctable", **g0) == 3
    assert val(got, "hw_gpu_pcie_aer_errors_total", severity="nonfatal", **g1) == 1
    assert val(got, "hw_gpu_pcie_link_width", **g0) == 16
    assert val(got, "hw_gpu_pcie_link_speed_gts", **g0) == 32.0


def test_gpu_plugin_nvidia_fixture(tmp_path):
    """8 x H100 80GB HBM3: nvidia-smi is a stand-in printing a recorded answer; this machine has no NVIDIA GPU."""
    r = run_plugin("gpu", nvidia_env(tmp_path))
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "smi.log").read_text().splitlines()
    assert len(calls) == 1 and "--format=csv,noheader,nounits" in calls[0]  # one call per poll
    got = samples(r.stdout)
    g = {i: {"gpu": str(i), "vendor": "nvidia"} for i in range(8)}
    assert {dict(lbl)["gpu"] for _, lbl in got} == {str(i) for i in range(8)}
    assert val(got, "hw_gpu_temperature_celsius", sensor="gpu", **g[0]) == 56
    assert val(got, "hw_gpu_temperature_celsius", sensor="mem", **g[0]) == 64
    assert ("hw_gpu_temperature_celsius", frozenset({**g[5], "sensor": "mem"}.items())) not in got  # [N/A]
    assert val(got, "hw_gpu_power_watts", **g[2]) == 698.95
    assert val(got, "hw_gpu_power_limit_watts", **g[2]) == 700
    assert val(got, "hw_gpu_throttle_reasons", **g[2]) == 4  # SW power cap
    assert val(got, "hw_gpu_throttle_reasons", **g[0]) == 0
    assert val(got, "hw_gpu_clock_mhz", type="core", **g[2]) == 1755
    assert val(got, "hw_gpu_clock_mhz", type="memory", **g[2]) == 2619
    assert val(got, "hw_gpu_vram_used_bytes", **g[4]) == 74111 * 1048576
    assert val(got, "hw_gpu_vram_total_bytes", **g[4]) == 81559 * 1048576
    assert val(got, "hw_gpu_utilization_pct", **g[1]) == 100
    assert val(got, "hw_gpu_ras_errors_total", kind="ce", block="total", **g[4]) == 2
    assert val(got, "hw_gpu_ras_errors_total", kind="ue", block="total", **g[4]) == 0
    assert val(got, "hw_gpu_pcie_aer_errors_total", severity="correctable", **g[3]) == 1  # sysfs via pci.bus_id
    assert val(got, "hw_gpu_pcie_link_speed_gts", **g[7]) == 32.0


def gpu_info(text: str) -> dict[str, tuple[str, str]]:
    """gpu -> (model, driver) of the hw_gpu_info series (each of value 1)."""
    got = samples(text)
    out = {}
    for (name, lbl), v in got.items():
        if name == "hw_gpu_info":
            d = dict(lbl)
            assert v == 1 and set(d) == {"gpu", "vendor", "model", "driver"}, d
            out[d["gpu"]] = (d["model"], d["driver"])
    return out


def test_gpu_info_names_the_model_and_driver(tmp_path):
    """hw_gpu_info: AMD by the PCI ids in libdrm's amdgpu.ids (else product_name, else the id), NVIDIA from
    the same nvidia-smi call; the stand-in trees (no GPU on this machine) of MI300X and H100 nodes."""
    r = run_plugin("gpu", nvidia_env(tmp_path))
    assert r.returncode == 0 and len((tmp_path / "smi.log").read_text().splitlines()) == 1, r.stderr
    assert gpu_info(r.stdout) == {str(i): ("NVIDIA H100 80GB HBM3", "535.161.08") for i in range(8)}
    state = tmp_path / "amd-state"
    state.mkdir()
    r = run_plugin("gpu", amd_env(METRICS_STATE_DIR=str(state)))
    assert r.returncode == 0, r.stderr
    assert gpu_info(r.stdout) == {"0": ("AMD Instinct MI300X", "6.10.5"), "1": ("AMD Instinct MI300X", "6.10.5")}
    # the name is remembered per id pair: the table is not read again at the next poll
    r = run_plugin("gpu", amd_env(METRICS_STATE_DIR=str(state), METRICS_AMDGPU_IDS="/nonexistent"))
    assert gpu_info(r.stdout)["0"] == ("AMD Instinct MI300X", "6.10.5")
    # no table (or an old one without the device): the board's product_name, else the PCI device id
    r = run_plugin("gpu", amd_env(METRICS_AMDGPU_IDS="/nonexistent"))
    assert gpu_info(r.stdout) == {"0": ("AMD device 0x74a1", "6.10.5"), "1": ("AMD Instinct MI300X OAM", "6.10.5")}
    # label values are escaped (a quote and a backslash in product_name); in-tree driver: the kernel release
    tree = tmp_path / "amd"
    shutil.copytree(FIX / "amd_mi300x/sys", tree / "sys", symlinks=True)
    shutil.rmtree(tree / "sys/module")
    (tree / "proc/sys/kernel").mkdir(parents=True)
    (tree / "proc/sys/kernel/osrelease").write_text("6.8.0-49-generic\n")
    card = next((tree / "sys/devices").glob("*/*/0000:26:00.0"))
    (card / "product_name").write_text('MI300X "OAM" \\ rev A\n')
    env = {"METRICS_SYSFS_ROOT": str(tree / "sys"), "METRICS_PROCFS_ROOT": str(tree / "proc")}
    r = run_plugin("gpu", {**env, "METRICS_AMDGPU_IDS": ""})
    assert r.returncode == 0, r.stderr
    assert gpu_info(r.stdout)["1"] == ('MI300X "OAM" \\ rev A', "6.8.0-49-generic")


def test_gpu_metric_names_are_the_same_for_both_vendors(tmp_path):
    """Both GPU fixtures (stand-ins for MI300X and H100 nodes) give one set of names and label names."""
    amd = samples(run_plugin("gpu", amd_env()).stdout)
    nv = samples(run_plugin("gpu", nvidia_env(tmp_path)).stdout)
    assert names(nv) - names(amd) == {"hw_gpu_throttle_reasons"}  # no AMD sysfs equivalent
    assert names(amd) - names(nv) == set()
    for name in names(amd):
        keys = {frozenset(k for k, _ in lbl) for n, lbl in {**amd, **nv} if n == name}
        assert len(keys) == 1, f"{name} has different label names per vendor: {keys}"


def test_gpu_plugin_learns_renamed_nvidia_field(tmp_path):
    """A driver that only knows clocks_event_reasons.* (the fake nvidia-smi stands in for it, no NVIDIA GPU
    here): one retry, then the working name is remembered in the state dir."""
    env = nvidia_env(tmp_path, FAKE_NVIDIA_SMI_NEW_DRIVER="1")
    r = run_plugin("gpu", env)
    assert r.returncode == 0, r.stderr
    assert val(samples(r.stdout), "hw_gpu_throttle_reasons", gpu="2", vendor="nvidia") == 4
    assert len((tmp_path / "smi.log").read_text().splitlines()) == 2
    assert (tmp_path / "state/nvidia_throttle_field").read_text().strip() == "clocks_event_reasons.active"
    (tmp_path / "smi.log").unlink()
    r = run_plugin("gpu", env)
    assert r.returncode == 0 and len((tmp_path / "smi.log").read_text().splitlines()) == 1


def test_gpu_plugin_nvidia_smi_failure(tmp_path):
    """The fake nvidia-smi (no NVIDIA GPU here) fails like a GPU that fell off the bus: a counted failure."""
    r = run_plugin("gpu", nvidia_env(tmp_path, FAKE_NVIDIA_SMI_FAIL="1"))
    assert r.returncode == 1
    assert "Unable to determine the device handle" in r.stderr
    assert samples(r.stdout) == {}


def test_gpu_plugin_never_again_without_gpu():
    """Only the BMC's VGA card and no NVIDIA driver: exit with the never-again code."""
    r = run_plugin(
        "gpu", {"METRICS_SYSFS_ROOT": str(FIX / "no_gpu/sys"), "METRICS_PROCFS_ROOT": str(FIX / "no_gpu/proc")}
    )
    assert r.returncode == mx.NEVER_AGAIN_EXIT
    assert r.stdout == ""
    if not machine_has_gpu():
        assert run_plugin("gpu").returncode == mx.NEVER_AGAIN_EXIT  # the real /sys and /proc


@pytest.mark.parametrize("name", ["gpu", "host"])
def test_plugin_help(name):
    r = run_plugin(name, args=("--help",))
    assert r.returncode == 0
    assert "Usage:" in r.stdout and "docs/plugins.md" in r.stdout


def test_plugin_discovery_finds_gpu_and_host_only(tmp_path):
    """TensorBoard is read inside the exporter: no tb plugin (and no FIFO bridge) is found or run."""
    poller = mx.Poller(mx.Config(plugin_dir=str(UTILS / "observe" / "plugins"), state_dir=str(tmp_path), host="n1"))
    assert set(poller.discover()) == {"gpu", "host"}


# ---- TensorBoard collector of the exporter --------------------------------------------------------------


class TB:
    """The exporter's TensorBoard collector over one job dir, read like Prometheus reads it."""

    def __init__(self, tmp_path: Path) -> None:
        self.job = tmp_path / "job"
        self.job.mkdir()
        self.collector = mx.TensorBoardCollector(str(self.job), "n1")
        self.seen: dict[tuple[str, frozenset], int] = {}  # series -> newest timestamp a scrape served

    def scrape(self) -> list[mx.Family]:
        text = mx.generate_latest(self.collector).decode()
        parsed = mx.parse_exposition(text)
        assert parsed.rejected == 0, text
        return [f for f in parsed.families.values() if f.name.startswith("tb_")]

    def poll(self, scrape: bool = True) -> dict[tuple[str, frozenset], list[tuple[float, int]]]:
        """One exporter poll and then one scrape: what Prometheus ingests as new, (name, labels) -> [(value,
        timestamp ms), ...] in exposition order (the newest sample of a series served again is not new)."""
        self.collector.poll()
        out: dict[tuple[str, frozenset], list[tuple[float, int]]] = {}
        for fam in self.scrape() if scrape else []:
            assert fam.type == "gauge" and fam.help
            for s in fam.samples:
                assert s.ts_ms is not None
                key = (s.name, frozenset(s.labels))
                if s.ts_ms > self.seen.get(key, -1):
                    out.setdefault(key, []).append((s.value, s.ts_ms))
                    self.seen[key] = s.ts_ms
                else:
                    assert s.ts_ms == self.seen[key]  # the exact duplicate Prometheus drops
        return out


@pytest.fixture
def tb(tmp_path):
    return TB(tmp_path)


def run_label(name: str) -> frozenset:
    return frozenset({("host", "n1"), ("run", name)})


def settle(writer: object, logdir: Path, scalars: int) -> None:
    """Flush until the event files in `logdir` hold `scalars` scalar values: tensorboardX's SummaryWriter writes
    from a background thread, and its flush() does not wait for that queue (tensorboard's own reader counts)."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    deadline = time.monotonic() + 10
    while True:
        writer.flush()
        n = sum(
            len(e.summary.value)
            for p in logdir.glob("events.out.tfevents.*")
            for e in LegacyEventFileLoader(str(p)).Load()
        )
        if n >= scalars or time.monotonic() > deadline:
            assert n == scalars
            return
        time.sleep(0.02)


def test_tb_collector_reads_only_new_events(tb):
    """Events written by tensorboardX's SummaryWriter, the writer MaxText uses."""
    from tensorboardX import SummaryWriter

    logdir = tb.job / "out/run1/tensorboard/run1"
    w = SummaryWriter(str(logdir))
    t0 = 1763779480.123
    for step in range(3):
        w.add_scalar("learning/loss", 6.5 - step, step, walltime=t0 + step)
        w.add_scalar("perf/step_time_seconds", 0.25, step, walltime=t0 + step + 0.001)
    settle(w, logdir, 6)
    got = tb.poll()
    run1 = run_label("run1")
    assert got[("tb_learning_loss", run1)] == [(6.5, 1763779480123), (5.5, 1763779481123), (4.5, 1763779482123)]
    assert got[("tb_perf_step_time_seconds", run1)] == [
        (0.25, 1763779480124),
        (0.25, 1763779481124),
        (0.25, 1763779482124),
    ]
    assert got[("tb_step", run1)] == [(0, 1763779480123), (1, 1763779481123), (2, 1763779482123)]

    assert tb.poll() == {}  # nothing appended
    w.add_scalar("learning/loss", 3.25, 3, walltime=t0 + 3)
    w.add_scalar("learning/moe_lb_loss", 0.01, 3, walltime=t0 + 3)
    settle(w, logdir, 8)
    got = tb.poll()
    assert got == {
        ("tb_learning_loss", run1): [(3.25, 1763779483123)],
        ("tb_learning_moe_lb_loss", run1): [(0.01, 1763779483123)],  # as written, not float32's 0.0099999998
        ("tb_step", run1): [(3, 1763779483123)],
    }
    w.close()

    w2 = SummaryWriter(str(tb.job / "out/run2/tensorboard/run2"))  # a new file appears
    w2.add_scalar("learning/loss", 7.0, 0, walltime=t0 + 10)
    w2.close()
    got = tb.poll()
    deadline = time.monotonic() + 5  # a directory walk costing t is not repeated for 100 t
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
        got = tb.poll()
    assert got == {
        ("tb_learning_loss", run_label("run2")): [(7.0, 1763779490123)],
        ("tb_step", run_label("run2")): [(0, 1763779490123)],
    }
    assert tb.collector.samples_read == 14 and tb.collector.errors == 0


def test_tb_events_read_between_two_scrapes_are_all_served(tb):
    from tensorboardX import SummaryWriter

    t0 = int(time.time()) - 60  # the newest sample is served again for 15 minutes after its time
    w = SummaryWriter(str(tb.job / "r"))
    w.add_scalar("learning/loss", 1.0, 1, walltime=t0)
    settle(w, tb.job / "r", 1)
    tb.poll(scrape=False)  # Prometheus scrapes less often than the exporter polls
    w.add_scalar("learning/loss", 0.5, 2, walltime=t0 + 1)
    w.close()
    assert tb.poll()[("tb_learning_loss", run_label("r"))] == [(1.0, t0 * 1000), (0.5, t0 * 1000 + 1000)]
    assert tb.poll() == {}
    again = [(f.name, s.value, s.ts_ms) for f in tb.scrape() for s in f.samples if f.name == "tb_learning_loss"]
    assert again == [("tb_learning_loss", 0.5, t0 * 1000 + 1000)]  # the newest again, the same sample


def test_tb_collector_waits_for_a_partial_record(tb):
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir = tb.job / "tb"
    writer = EventFileWriter(str(logdir))  # writes the file_version event
    writer.close()
    path = next(logdir.glob("events.out.tfevents.*"))
    assert tb.poll() == {}
    first, second = (
        event_record("learning/loss", 2.0, 1, 1763779500.0),
        event_record("learning/loss", 1.5, 2, 1763779501.0),
    )
    with open(path, "ab") as f:
        f.write(first + second[:10])  # the second record is cut inside its header
    assert tb.poll()[("tb_learning_loss", run_label("tb"))] == [(2.0, 1763779500000)]
    with open(path, "ab") as f:
        f.write(second[10:30])  # header complete, data not
    assert tb.poll() == {}
    with open(path, "ab") as f:
        f.write(second[30:])
    assert tb.poll()[("tb_learning_loss", run_label("tb"))] == [(1.5, 1763779501000)]


def test_tb_collector_skips_a_corrupt_file_and_rereads_a_replaced_one(tb):
    good, bad = tb.job / "good", tb.job / "bad"
    good.mkdir()
    bad.mkdir()
    rec = event_record("learning/loss", 2.0, 1, 1763779550.0)
    (bad / "events.out.tfevents.1.n1").write_bytes(rec + b"\xff" * 20)  # a header whose checksum is wrong
    (good / "events.out.tfevents.1.n1").write_bytes(rec)
    got = tb.poll()
    assert got[("tb_learning_loss", run_label("bad"))] == [(2.0, 1763779550000)]  # what came before it
    assert got[("tb_learning_loss", run_label("good"))] == [(2.0, 1763779550000)]
    assert tb.collector.errors == 1
    replaced = good / "events.out.tfevents.1.n1.new"
    replaced.write_bytes(event_record("learning/loss", 1.0, 2, 1763779551.0))
    replaced.rename(good / "events.out.tfevents.1.n1")  # a new inode under the old name: read from the start
    assert tb.poll() == {
        ("tb_learning_loss", run_label("good")): [(1.0, 1763779551000)],
        ("tb_step", run_label("good")): [(2, 1763779551000)],
    }


def test_tb_collector_decodes_tensor_scalars(tb):
    """tf.summary-style events keep scalars in a TensorProto (float_val, double_val or tensor_content)."""
    import struct

    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def value(tag: str, **tensor: object) -> summary_pb2.Summary.Value:
        return summary_pb2.Summary.Value(
            tag=tag, tensor=tensor_pb2.TensorProto(tensor_shape=tensor_shape_pb2.TensorShapeProto(), **tensor)
        )

    writer = EventFileWriter(str(tb.job / "tf"))
    writer.add_event(
        event_pb2.Event(
            wall_time=1763779600.5,
            step=7,
            summary=summary_pb2.Summary(
                value=[
                    value("a/float", dtype=types_pb2.DT_FLOAT, float_val=[2.5]),
                    value("a/double", dtype=types_pb2.DT_DOUBLE, double_val=[0.1]),
                    value("a/content", dtype=types_pb2.DT_FLOAT, tensor_content=struct.pack("<f", 1.25)),
                    value("a/int", dtype=types_pb2.DT_INT64, int64_val=[42]),
                    value("a/text", dtype=types_pb2.DT_STRING, string_val=[b"not a scalar"]),
                ]
            ),
        )
    )
    writer.close()
    got = tb.poll()
    run = run_label("tf")
    assert got[("tb_a_float", run)] == [(2.5, 1763779600500)]
    assert got[("tb_a_double", run)] == [(0.1, 1763779600500)]
    assert got[("tb_a_content", run)] == [(1.25, 1763779600500)]
    assert got[("tb_a_int", run)] == [(42, 1763779600500)]
    assert ("tb_a_text", run) not in got


def f32(x: float) -> float:
    """x rounded to float32, as a writer's simple_value holds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_tb_first_poll_of_a_long_history(tb, monkeypatch):
    """A job's whole history read at once (the exporter started late): every scalar of every MaxText tag is
    served with its value as written and its event's time, and tb_step once per step; also when the values are
    converted in bulk with numpy (a first poll of tens of thousands of values)."""
    monkeypatch.setattr(tbc, "_NUMPY_IMPORT_FROM", 256)  # the bulk path for this smaller history too
    steps, t0 = 300, 1763779480.0
    write_history(tb.job / "run", steps * len(MAXTEXT_TAGS), t0)
    got = tb.poll()
    assert tbc._numpy, "the values were converted with numpy"
    run = run_label("run")
    for i, tag in enumerate(MAXTEXT_TAGS):
        want = [
            (tbc.float32_value(f32(6.0 / (step + 1) + i)), round((t0 + step + i / 1000) * 1000))
            for step in range(steps)
        ]
        assert got[(tbc.metric_name_for_tag(tag), run)] == want, tag
    assert got[("tb_step", run)] == [(step, round((t0 + step) * 1000)) for step in range(steps)]
    assert tb.poll() == {}


def test_tb_values_converted_in_bulk_are_each_as_written():
    """float32_values (numpy, all values at once) gives exactly what float32_value gives one value at a time:
    float32s of every bit pattern (NaN, infinities, subnormals), of every magnitude a scalar has, and the edges
    (zeros, powers of two, the largest float32, values a digit away from a tie)."""
    import random

    rng = random.Random(8)
    xs = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(20000)]
    xs += [f32(rng.uniform(-1, 1) * 10.0 ** rng.randint(-12, 12)) for _ in range(20000)]
    xs += [f32(round(rng.uniform(0, 10), rng.randint(0, 8))) for _ in range(5000)]  # written with few digits
    xs += [sign * 2.0**e for e in range(-149, 128) for sign in (1, -1)] + [0.0, -0.0, f32(0.01), f32(6.123)]
    xs += [f32(10.0**d + n + 0.5) for d in range(5, 9) for n in range(50)]  # ties at 6-8 digits (from 2**24: none)
    xs += [struct.unpack("<f", struct.pack("<I", b))[0] for b in (0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x00800000)]
    got = tbc.float32_values(xs)
    assert tbc._numpy, "numpy did the conversion"
    assert list(map(repr, got)) == [repr(tbc.float32_value(x)) for x in xs]
    assert tbc.float32_values([f32(0.01)] * 300) == [0.01] * 300  # as written, not 0.009999999776482582


def exporter_once(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    plugins = tmp_path / "plugins"  # one trivial plugin, so that the per-plugin self-metrics have samples
    plugins.mkdir(exist_ok=True)
    (plugins / "noop_metrics_plugin.sh").write_text("exit 0\n")
    r = subprocess.run(
        [
            sys.executable,
            str(UTILS / "observe" / "metrics_exporter.py"),
            "--once",
            "--plugin-dir",
            str(plugins),
            "--state-dir",
            str(tmp_path / "xs"),
            "--host",
            "n1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_tb_read_on_node_rank_0_only(tb, tmp_path):
    (tb.job / "r").mkdir()
    (tb.job / "r/events.out.tfevents.1.n1").write_bytes(event_record("learning/loss", 2.0, 1, 1763779560.25))
    line = 'tb_learning_loss{host="n1",run="r"} 2.0 1763779560250'
    assert line in exporter_once(tmp_path, "--job-dir", str(tb.job), "--node-rank", "0").splitlines()
    off = exporter_once(tmp_path, "--job-dir", str(tb.job), "--node-rank", "1", env={"TB_METRICS_ALL_NODES": ""})
    assert "tb_" not in off and "exporter_tensorboard" not in off
    assert (
        line
        in exporter_once(
            tmp_path, "--job-dir", str(tb.job), "--node-rank", "1", env={"TB_METRICS_ALL_NODES": "1"}
        ).splitlines()
    )
    assert "tb_" not in exporter_once(tmp_path, "--job-dir", str(tb.job), "--tensorboard", "off")


def test_maxtext_tags_map_to_documented_names():
    documented = documented_metrics()
    for tag in MAXTEXT_TAGS:
        name = tbc.metric_name_for_tag(tag)
        assert name in documented, f"{tag} -> {name} is not in docs/metrics.md"
        assert f"tag `{tag}`" in documented[name][2], f"docs/metrics.md does not map {tag} to {name}"
    assert tbc.metric_name_for_tag("learning/moe_lb_loss") == "tb_learning_moe_lb_loss"
    assert tbc.metric_name_for_tag("perf/step_time_seconds") == "tb_perf_step_time_seconds"
    assert tbc.metric_name_for_tag("eval/avg loss-1") == "tb_eval_avg_loss_1"


# ---- docs/metrics.md agrees with what is emitted -------------------------------------------------------


def documented_metrics() -> dict[str, tuple[str, set[str], str]]:
    """name -> (type, label names, source text) from the tables of docs/metrics.md."""
    out = {}
    for line in (REPO / "docs/metrics.md").read_text().splitlines():
        m = re.match(r"\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|[^|]*\|([^|]*)\|([^|]*)\|", line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} documented twice"
            out[m.group(1)] = (m.group(2), set(re.findall(r"`(\w+)`", m.group(3))), m.group(4))
    return out


def emitted_families(text: str, into: dict[str, tuple[str, set[str]]]) -> None:
    for fam in mx.parse_exposition(text).families.values():
        typ, labels = into.setdefault(fam.name, (fam.type, set()))
        assert typ == fam.type
        for s in fam.samples:
            labels.update(k for k, _ in s.labels if k != "host")


def test_docs_list_exactly_the_emitted_metrics(tmp_path, tb):
    """Every plugin on the fixtures that stand in for the hardware this machine lacks (AMD and NVIDIA GPUs,
    InfiniBand HCAs), TensorBoard events with every MaxText tag, and the exporter's self-metrics."""
    emitted: dict[str, tuple[str, set[str]]] = {}
    for name, env in (("host", host_fixture_env()), ("gpu", amd_env()), ("gpu", nvidia_env(tmp_path))):
        r = run_plugin(name, env)
        assert r.returncode == 0, r.stderr
        emitted_families(r.stdout, emitted)

    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tb.job / "run"))
    for tag in MAXTEXT_TAGS:
        w.add_scalar(tag, 1.0, 1, walltime=1763779900.0)
    w.close()
    emitted_families(exporter_once(tmp_path, "--job-dir", str(tb.job)), emitted)  # the collector and self-metrics

    # less the series the job's Prometheus writes itself (its alert rules: tests/test_alert_rules.py)
    documented = {k: v for k, v in documented_metrics().items() if not k.startswith("mst:") and k != "ALERTS"}
    assert set(emitted) - set(documented) == set(), "emitted but not documented"
    assert set(documented) - set(emitted) == set(), "documented but not emitted on the fixtures"
    for name, (typ, labels) in emitted.items():
        assert documented[name][0] == typ, f"{name}: documented as {documented[name][0]}, emitted as {typ}"
        assert documented[name][1] == labels, f"{name}: documented labels {documented[name][1]}, emitted {labels}"
