"""The exported families: HAMi's names and exact label sets, values in bytes/percent/seconds, legacy names
only with --legacy-metrics, and the monitor's own counters; plus the command line's precedence."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.monitor import cli, regions
from device_plugin.monitor.host import FakeHost, HostGpu, NvidiaHost, device_type, parse_host_cards
from device_plugin.monitor.metrics import MonitorMetrics, render_snapshot
from device_plugin.monitor.options import MonitorOptions
from device_plugin.monitor.pods import PodRef
from device_plugin.monitor.scanner import ContainerSample, DeviceSample, Snapshot
from hami.errors import ConfigError

MIB = 1 << 20
POD = PodRef("team-a", "train-0", "uid-a")


def snapshot() -> Snapshot:
    full = DeviceSample(0, "GPU-a", 1000 * MIB, 300 * MIB, 20 * MIB, 5 * MIB, 275 * MIB, 37.5, 2.0)
    bare = DeviceSample(1, "GPU-b", None, 0, 0, 0, 0, None, None)
    return Snapshot(
        taken_at=1.0,
        containers=(ContainerSample(POD, "main", "libvgpu-2", (full, bare), 1),),
        host=(HostGpu(0, "GPU-a", "NVIDIA-NVIDIA H200", 4000 * MIB, 55.0, 12.0),),
    )


def samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def lbl(**kw: str) -> frozenset:
    return frozenset(kw.items())


def ctr(idx: str, uuid: str) -> dict[str, str]:
    return {"namespace": "team-a", "pod": "train-0", "container": "main", "vdevice_index": idx,
            "device_uuid": uuid, "zone": "vGPU"}  # fmt: skip


def test_container_and_host_families_with_hami_labels():
    got = samples(render_snapshot(snapshot(), node="node1"))
    a = lbl(**ctr("0", "GPU-a"))
    b = lbl(**ctr("1", "GPU-b"))
    assert got["hami_vgpu_memory_used_bytes", a] == 300 * MIB
    assert got["hami_container_device_memory_bytes", a] == 300 * MIB
    assert got["hami_vgpu_memory_limit_bytes", a] == 1000 * MIB
    assert got["hami_container_device_utilization_ratio", a] == 37.5
    assert got["hami_container_last_kernel_elapsed_seconds", a] == 2.0
    assert got["hami_vgpu_memory_context_bytes", a] == 20 * MIB
    assert got["hami_vgpu_memory_module_bytes", a] == 5 * MIB
    assert got["hami_vgpu_memory_buffer_bytes", a] == 275 * MIB
    assert got["hami_vgpu_memory_used_bytes", b] == 0
    # no limit, no measured utilisation, no kernel yet: those series are absent, not zero
    for name in ("hami_vgpu_memory_limit_bytes", "hami_container_device_utilization_ratio",
                 "hami_container_last_kernel_elapsed_seconds"):  # fmt: skip
        assert (name, b) not in got
    host = {"node": "node1", "device_index": "0", "device_uuid": "GPU-a", "device_type": "NVIDIA-NVIDIA H200",
            "zone": "vGPU"}  # fmt: skip
    assert got["hami_host_gpu_memory_used_bytes", lbl(**host)] == 4000 * MIB
    assert got["hami_host_gpu_utilization_ratio", lbl(**host)] == 55.0
    del host["node"]
    assert got["hami_host_gpu_memory_controller_utilization_ratio", lbl(**host)] == 12.0
    assert not any(name[0].isupper() or name.startswith(("vGPU", "Device")) for name, _ in got)


def test_legacy_names_only_on_request():
    got = samples(render_snapshot(snapshot(), node="node1", legacy=True))
    old = {
        "podnamespace": "team-a",
        "podname": "train-0",
        "ctrname": "main",
        "vdeviceid": "0",
        "deviceuuid": "GPU-a",
    }
    assert got["vGPU_device_memory_usage_in_bytes", lbl(**old)] == 300 * MIB
    assert got["vGPU_device_memory_limit_in_bytes", lbl(**old)] == 1000 * MIB
    assert got["Device_utilization_desc_of_container", lbl(**old)] == 37.5
    assert got["Device_last_kernel_of_container", lbl(**old)] == 2.0
    desc = lbl(**old, context=str(20 * MIB), module=str(5 * MIB), data=str(275 * MIB), offset="0")
    assert got["Device_memory_desc_of_container", desc] == 300 * MIB
    host = lbl(nodeid="node1", deviceidx="0", deviceuuid="GPU-a", devicetype="NVIDIA-NVIDIA H200")
    assert got["HostGPUMemoryUsage", host] == 4000 * MIB
    assert got["HostCoreUtilization", host] == 55.0
    assert got["hami_vgpu_memory_used_bytes", lbl(**ctr("0", "GPU-a"))] == 300 * MIB  # new names stay


def test_monitor_counters_start_at_zero_for_every_reason():
    m = MonitorMetrics(version="1.2.3")
    m.error(regions.TRUNCATED)
    m.error(regions.TRUNCATED)
    m.observe(Snapshot(taken_at=123.0, containers=(), unmatched_dirs=4, scan_s=0.002))
    got = samples(generate_latest(m.registry))
    for reason in regions.REASONS:
        want = 2.0 if reason == regions.TRUNCATED else 0.0
        assert got["hami_monitor_cache_errors_total", lbl(reason=reason)] == want
    assert got["hami_monitor_last_scan_timestamp_seconds", lbl()] == 123.0
    assert got["hami_monitor_containers", lbl(state="unmatched")] == 4
    assert got["hami_monitor_scan_duration_seconds_count", lbl()] == 1
    assert got["hami_build_info", lbl(version="1.2.3", implementation="python")] == 1


def test_host_type_is_always_prefixed_as_hami_does():
    assert device_type("NVIDIA H200") == "NVIDIA-NVIDIA H200"
    assert device_type("Tesla V100-PCIE-32GB") == "NVIDIA-Tesla V100-PCIE-32GB"


def test_fake_host_file_is_validated_and_re_read(tmp_path):
    f = tmp_path / "cards.yaml"
    f.write_text("cards:\n  - {uuid: GPU-a, model: NVIDIA H200, memory_used_mib: 10, utilization: 5}\n")
    host = FakeHost(str(f))
    assert host.read() == [HostGpu(0, "GPU-a", "NVIDIA-NVIDIA H200", 10 * MIB, 5.0, 0.0)]
    f.write_text("cards:\n  - {uuid: GPU-a, model: NVIDIA H200, memory_used_mib: 20, utilization: 7}\n")
    assert host.read()[0].memory_used_bytes == 20 * MIB
    f.write_text("cards: [{uuid: GPU-a, model: x, utilization: 101}]")
    assert host.read() == []  # logged, not raised
    with pytest.raises(ConfigError, match=r"cards\[0\].utilization: 101 must be a number between 0 and 100"):
        parse_host_cards({"cards": [{"uuid": "g", "model": "m", "utilization": 101}]}, source="f")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_host_cards({"cards": [{"uuid": "g", "model": "m", "colour": 1}]}, source="f")
    assert FakeHost(None).read() == []


class FakeNvml:
    class Mem:
        used = 123 * MIB
        total = 143771 * MIB

    class Util:
        gpu = 40
        memory = 9

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.Mem

    def nvmlDeviceGetUtilizationRates(self, h):
        return self.Util

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-real"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"


def test_nvidia_host_reads_nvml():
    host = NvidiaHost(FakeNvml())
    assert host.read() == [HostGpu(0, "GPU-real", "NVIDIA-NVIDIA H200", 123 * MIB, 40.0, 9.0, 143771 * MIB)]
    with pytest.raises(ConfigError, match="NVML init failed"):
        NvidiaHost(FakeNvml(fail_init=True))


# ---- command line ----------------------------------------------------------------------------------


def test_defaults_and_hami_environment():
    o = cli.parse_args([], env={"NODE_NAME": "node1"})
    assert o == MonitorOptions(node_name="node1")
    o = cli.parse_args([], env={"NODE_NAME": "n", "HOOK_PATH": "/opt/vgpu/", "HAMI_RESYNC_INTERVAL": "2m",
                                "KUBECONFIG": "/k"})  # fmt: skip
    assert (o.containers_dir, o.grace_period_s, o.kubeconfig) == ("/opt/vgpu/containers", 120.0, "/k")


def test_flag_beats_environment_beats_default():
    env = {"NODE_NAME": "from-alias", "HAMI_MONITOR_NODE_NAME": "from-env", "HAMI_MONITOR_SCAN_INTERVAL": "10s",
           "HAMI_MONITOR_PORT": "9500", "HAMI_MONITOR_LEGACY_METRICS": "true"}  # fmt: skip
    o = cli.parse_args(["--port", "9600"], env=env)
    assert (o.node_name, o.scan_interval_s, o.port, o.legacy_metrics) == ("from-env", 10.0, 9600, True)
    o = cli.parse_args(
        ["--node-name", "flag", "--metrics-bind-address", ":9394", "--address", "1.2.3.4"], env=env
    )
    assert (o.node_name, o.address, o.port) == ("flag", "0.0.0.0", 9394)
    o = cli.parse_args(["--node-name", "n", "--metrics-bind-address", "127.0.0.1:0"], env={})
    assert (o.address, o.port) == ("127.0.0.1", 0)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--node-name (or env NODE_NAME) is required"),
        (["--node-name", "n", "--scan-interval", "0"], {}, "--scan-interval 0s: must be > 0"),
        (["--node-name", "n"], {"HAMI_MONITOR_SCAN_INTERVAL": "soon"}, "HAMI_MONITOR_SCAN_INTERVAL"),
        (["--node-name", "n", "--backend", "amd"], {}, "invalid choice: 'amd'"),
        (["--node-name", "n", "--port", "70000"], {}, "not a port; valid: 0..65535"),
        (["--node-name", "n", "--metrics-bind-address", "9394"], {}, "want [HOST]:PORT"),
        (["--node-name", "n", "--proc", "/nonexistent"], {}, "--proc '/nonexistent': not a proc file system"),
        (
            ["--node-name", "n", "--proc", "/etc"],
            {},
            "--proc '/etc': not a proc file system (no /etc/1/stat)",
        ),
    ],
    ids=[
        "no-node-name",
        "scan-interval-0",
        "scan-interval-env",
        "unknown-backend",
        "port-out-of-range",
        "bind-address-no-colon",
        "proc-missing",
        "proc-not-procfs",
    ],
)
def test_bad_settings_exit_2_naming_the_field(capsys, argv, env, message):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv, env=env)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_build_parser_is_exposed_for_the_chart():
    p = cli.build_parser()
    assert p.prog == "hami-vgpu-monitor"
    dests = {a.dest for a in p._actions}
    assert {"containers_dir", "node_name", "kubeconfig", "address", "port", "backend", "scan_interval",
            "grace_period", "legacy_metrics"} <= dests  # fmt: skip


def test_label_values_from_files_are_escaped():
    # A HAMi-core uuid slot may hold any bytes; the text must still parse back to the same value.
    odd = 'GPU-"quoted"\\back\nline'
    dev = DeviceSample(0, odd, None, 5, 0, 0, 5, None, None)
    snap = Snapshot(containers=(ContainerSample(POD, "main", "hami-core-v1", (dev,), 1),))
    got = samples(render_snapshot(snap, node="n", legacy=True))
    assert got["hami_vgpu_memory_used_bytes", lbl(**ctr("0", odd))] == 5
    assert value_of(got, "vGPU_device_memory_usage_in_bytes", deviceuuid=odd) == 5


def value_of(got: dict, name: str, **labels: str) -> float:
    (v,) = [v for (n, lab), v in got.items() if n == name and set(labels.items()) <= set(lab)]
    return v


def _mig_pod(value: str) -> dict:
    return {
        "metadata": {"uid": "uid-m", "namespace": "team-a", "name": "mig-0", "annotations": {"hami.io/vgpu-mig-allocations": value}},
        "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "main-a"}, {"name": "main-b"}]},
    }  # fmt: skip


def test_mig_device_info_names_each_realised_instance_by_its_container():
    """HAMi's hami_mig_device_info labels, and TestMigAllocationContainerName: index 0 is the init
    container, 1 and 2 the app containers, 3 is none; entries without runtime identity are left out."""
    from device_plugin.monitor.pods import pod_ref

    value = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1},'
        '"migUUID":"MIG-i","gpuInstanceID":13,"computeInstanceID":0},'
        '{"containerIndex":2,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-b","gpuInstanceID":5,"computeInstanceID":0},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}},'
        '{"containerIndex":3,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":4,"size":1},'
        '"migUUID":"MIG-x","gpuInstanceID":9,"computeInstanceID":0}]'
    )
    ref = pod_ref(_mig_pod(value))
    text = render_snapshot(
        Snapshot(taken_at=1.0, containers=(), host=()), node="n1", pods={ref.uid: ref}, legacy=True
    )
    got = samples(text)
    base = {
        "namespace": "team-a",
        "pod": "mig-0",
        "device_uuid": "GPU-a",
        "compute_instance_id": "0",
        "zone": "vGPU",
    }
    assert {k: v for k, v in got.items() if k[0] == "hami_mig_device_info"} == {
        ("hami_mig_device_info", lbl(**base, container="init", vdevice_index="0", mig_uuid="MIG-i", profile="1g.5gb",
                                     gpu_instance_id="13")): 1.0,
        ("hami_mig_device_info", lbl(**base, container="main-b", vdevice_index="1", mig_uuid="MIG-b",
                                     profile="2g.10gb", gpu_instance_id="5")): 1.0,
    }  # fmt: skip
    legacy = lbl(
        podnamespace="team-a",
        podname="mig-0",
        ctrname="main-b",
        vdeviceid="1",
        deviceuuid="GPU-a",
        instanceid="5",
    )
    assert got["MigInfo", legacy] == 1.0
    assert pod_ref(_mig_pod("not json")).mig == ()
