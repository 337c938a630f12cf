import pytest

from hami.config import load_config, load_config_file
from hami.errors import ConfigError, InvalidRequest
from hami.model import PERCENTAGE_UNSET, ContainerRequest, Device
from hami.quota import QuotaState, pod_demand
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor, model_type
from tests.builders import ctr

NV = NvidiaVendor()


def test_config_defaults_are_hamis():
    c = load_config(None)
    assert (c.nvidia.deviceSplitCount, c.nvidia.deviceMemoryScaling, c.nvidia.defaultGPUNum) == (10, 1.0, 1)
    assert (c.scheduler.nodeSchedulerPolicy, c.scheduler.gpuSchedulerPolicy) == ("binpack", "spread")


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^nvidia.deviceSplitCount: 0 is invalid; valid: an integer >= 1"):
        load_config({"nvidia": {"deviceSplitCount": 0}})
    with pytest.raises(ConfigError, match=r"^nvidia.deviceSplitCount: 'ten' must be an integer"):
        load_config({"nvidia": {"deviceSplitCount": "ten"}})
    with pytest.raises(ConfigError, match=r"^scheduler.gpuSchedulerPolicy: 'packed' is invalid"):
        load_config({"scheduler": {"gpuSchedulerPolicy": "packed"}})
    with pytest.raises(ConfigError, match=r"^nvidiaa: unknown top-level key"):
        load_config({"nvidiaa": {}})
    f = tmp_path / "c.yaml"
    f.write_text("nvidia: [")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config_file(f)
    # HAMi's other vendor sections are accepted and ignored.
    assert (
        load_config({"cambricon": {"resourceCountName": "cambricon.com/vmlu"}}).nvidia.deviceSplitCount == 10
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"preConfiguredDeviceMemory": -1},
         r"^nvidia\.preConfiguredDeviceMemory: -1 is invalid; valid: MiB >= 0 \(0 = the memory NVML reports\)$"),
        ({"libCudaLogLevel": 9}, r"^nvidia\.libCudaLogLevel: 9 is invalid; valid: 0 \(silent\), 1 \(errors\), "),
        ({"libCudaLogLevel": "-3"}, r"^nvidia\.libCudaLogLevel: -3 is invalid; valid: 0 \(silent\)"),
    ],
    ids=["negative-preconfigured-memory", "log-level-9", "log-level-negative-quoted"],
)  # fmt: skip
def test_nvidia_values_the_device_plugin_and_libvgpu_would_misread(section, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"nvidia": section})
    assert (
        load_config(
            {"nvidia": {"libCudaLogLevel": "4", "preConfiguredDeviceMemory": 0}}
        ).nvidia.libCudaLogLevel
        == 4
    )


def test_hamis_whole_per_node_entry_loads_and_its_nvidia_keys_apply():
    entry = {"name": "n1", "operatingmode": "hami-core", "devicesplitcount": 4, "devicememoryscaling": 1,
             "devicecorescaling": 1, "preconfigureddevicememory": 8000, "libcudaloglevel": "3",
             "enablenumatopology": True, "migstrategy": "none", "filterdevices": {"uuid": [], "index": []},
             "enablegetpreferredallocation": False}  # fmt: skip
    n = load_config({"nodeconfig": [entry]}).nvidia_for_node("n1")
    assert (n.deviceSplitCount, n.preConfiguredDeviceMemory, n.libCudaLogLevel, n.enableNumaTopology) == (
        4, 8000, 3, True)  # fmt: skip
    # zero values (a quoted "0" too) mean "not overridden"
    zero = load_config({"nodeconfig": [{"name": "n1", "libcudaloglevel": "0", "devicesplitcount": 0}]})
    assert zero.nvidia_for_node("n1") == zero.nvidia


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"devicesplitcont": 2}, r"^nodeconfig\[0\]\.devicesplitcont: unknown key; valid keys: name, devicesplitcount, "),
        ({"libcudaloglevel": "9"}, r"^nodeconfig\[n1\]\.libcudaloglevel: 9 is invalid; valid: 0\.\.4$"),
        ({"preconfigureddevicememory": -5}, r"^nodeconfig\[n1\]\.preconfigureddevicememory: -5 is invalid; valid: MiB >= 0$"),
        ({"enablenumatopology": "yes"}, r"^nodeconfig\[0\]\.enablenumatopology: 'yes' must be true or false$"),
    ],
    ids=["typo", "log-level", "negative-memory", "numa-not-bool"],
)  # fmt: skip
def test_per_node_errors_name_the_entry_and_key(entry, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"nodeconfig": [{"name": "n1", **entry}]})


def test_config_per_node_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "nvidia:\n  deviceSplitCount: 10\n  defaultMem: 2000\n"
        "nodeconfig:\n- name: big\n  devicesplitcount: 20\n  devicememoryscaling: 1.5\n  operatingmode: hami-core\n"
    )
    c = load_config_file(f)
    assert c.nvidia.defaultMemory == 2000
    assert c.nvidia_for_node("big").deviceSplitCount == 20
    assert c.nvidia_for_node("big").deviceMemoryScaling == 1.5
    assert c.nvidia_for_node("small").deviceSplitCount == 10


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (dict(gpu=1, mem=8000, cores=10), ContainerRequest("NVIDIA", 1, 8000, PERCENTAGE_UNSET, 10)),
        (dict(gpu=2, pct=50), ContainerRequest("NVIDIA", 2, 0, 50, 0)),
        (dict(gpu=1), ContainerRequest("NVIDIA", 1, 0, 100, 0)),
        (dict(gpu=1, pct=0), ContainerRequest("NVIDIA", 1, 0, 100, 0)),  # zero percentage = whole card
        (dict(gpu=1, mem="16Gi"), ContainerRequest("NVIDIA", 1, 16384, PERCENTAGE_UNSET, 0)),
    ],
    ids=["mem-and-cores", "percentage", "gpu-only", "zero-percentage", "mem-quantity"],
)
def test_nvidia_container_request(limits, expected):
    assert NV.container_request(ctr(**limits)) == expected


def test_nvidia_request_defaults_and_memory_factor():
    v = NvidiaVendor(
        load_config({"nvidia": {"defaultMemory": 3000, "defaultCores": 20, "memoryFactor": 2}}).nvidia
    )
    assert v.container_request(ctr(gpu=1)) == ContainerRequest("NVIDIA", 1, 3000, PERCENTAGE_UNSET, 20)
    assert v.container_request(ctr(gpu=1, mem=100)).memreq == 200
    assert v.container_request(ctr(cpu=1)) is None
    assert v.container_request(ctr(gpu=0)) is None


def test_nvidia_request_errors_name_container_and_resource():
    with pytest.raises(
        InvalidRequest, match=r"^container main: nvidia.com/gpucores: '150' is outside the valid range 0..100"
    ):
        NV.container_request(ctr("main", gpu=1, cores=150))


def test_requests_read_limits_then_requests():
    c = {
        "name": "c",
        "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpumem": "100"}},
    }
    assert NV.container_request(c) == ContainerRequest("NVIDIA", 2, 100, PERCENTAGE_UNSET, 0)


def test_model_type_rule():
    assert model_type("Tesla V100-PCIE-32GB") == "NVIDIA-Tesla V100-PCIE-32GB"
    assert model_type("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"


def test_type_matches_substring_case_insensitive_and_mode():
    from hami.model import Selection

    d = Device("GPU-a", 0, 10, 1, 100, "NVIDIA-Tesla V100-PCIE-32GB")
    assert NV.type_matches(d, Selection(use_types=("v100", "A100")))
    assert not NV.type_matches(d, Selection(nouse_types=("V100",)))
    assert NV.type_matches(d, Selection(mode="hami-core"))
    assert not NV.type_matches(d, Selection(mode="mig"))


def test_selection_numa_bind_must_be_boolean():
    assert NV.selection({"nvidia.com/numa-bind": "true"}).numa_bind
    with pytest.raises(InvalidRequest, match="nvidia.com/numa-bind: 'yes please' is not a boolean"):
        NV.selection({"nvidia.com/numa-bind": "yes please"})


def test_mutate_bare_gpu_is_exclusive_and_16gi_normalised():
    pod = {"spec": {}}
    c = ctr(gpu=1)
    assert NV.mutate_container(c, pod=pod).uses_device
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}
    c = ctr(gpu=1, mem="16Gi")
    NV.mutate_container(c, pod=pod)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16384"}


def test_mutate_priority_env_default_gpu_num_and_conflicts():
    c = ctr(mem=1000, **{"nvidia.com/priority": "1"})
    r = NV.mutate_container(c, pod={"spec": {}})
    assert r.uses_device
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]
    with pytest.raises(
        InvalidRequest, match="nvidia.com/gpumem and nvidia.com/gpumem-percentage are both set"
    ):
        NV.mutate_container(ctr(gpu=1, mem=1000, pct=50), pod={"spec": {}})
    with pytest.raises(
        InvalidRequest,
        match=r"container x: resources.limits\[nvidia.com/gpumem-percentage\]: '120' is outside",
    ):
        NV.mutate_container(ctr("x", gpu=1, pct=120), pod={"spec": {}})


def test_mutate_runtime_class_and_core_policy():
    v = NvidiaVendor(load_config({"nvidia": {"runtimeClassName": "nvidia", "gpuCorePolicy": "force"}}).nvidia)
    pod = {"spec": {}}
    c = ctr(gpu=1, mem=10)
    v.mutate_container(c, pod=pod)
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"} in c["env"]


def test_hygon_vendor_colon_registration_and_requests():
    dcu = build_vendors()["DCU"]
    node = {"metadata": {"annotations": {"hami.io/node-dcu-register": "DCU-1,4,16368,100,DCU-Z100,0,true:"}}}
    (d,) = dcu.node_devices(node)
    assert (d.uuid, d.vendor, d.devmem) == ("DCU-1", "DCU", 16368)
    r = dcu.container_request(
        {"name": "c", "resources": {"limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000"}}}
    )
    assert r == ContainerRequest("DCU", 1, 2000, PERCENTAGE_UNSET, 100)
    assert dcu.allocation_annotations([[]]) == {
        "hami.io/dcu-devices-to-allocate": ";",
        "hami.io/dcu-devices-allocated": ";",
    }


def test_quota_state_and_pod_demand():
    q = QuotaState(build_vendors())
    q.upsert_quota(
        {
            "metadata": {"namespace": "a", "name": "q1"},
            "spec": {
                "hard": {"limits.nvidia.com/gpumem": "10000", "limits.nvidia.com/gpucores": "50", "pods": "3"}
            },
        }
    )
    q.upsert_quota(
        {"metadata": {"namespace": "a", "name": "q2"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "8Gi"}}}
    )
    assert q.limit("a", "nvidia.com/gpumem") == 8192
    assert (
        q.fits("a", "NVIDIA", 8192, 50)
        and not q.fits("a", "NVIDIA", 8193, 0)
        and not q.fits("a", "NVIDIA", 0, 51)
    )
    assert q.fits("other", "NVIDIA", 10**6, 10**6)
    demand = pod_demand(
        [[ContainerRequest("NVIDIA", 1, 9000, PERCENTAGE_UNSET, 10)]],
        [[ContainerRequest("NVIDIA", 2, 2000, PERCENTAGE_UNSET, 30)], []],
    )
    assert demand == {"NVIDIA": (9000, 60)}
    assert "needs 9000 MiB of nvidia.com/gpumem" in q.exceeds_alone("a", demand)
    q.remove_quota("a", "q2")
    assert q.limit("a", "nvidia.com/gpumem") == 10000


def test_mutate_keeps_the_api_servers_canonical_mib_form_and_idempotent():
    # The API server stores gpumem: 3000 as "3k"; rewriting it to "3000" would patch on every review.
    c = ctr(gpu=1, mem="3k")
    NV.mutate_container(c, pod={"spec": {}})
    assert c["resources"]["limits"]["nvidia.com/gpumem"] == "3k"
    c = ctr(gpu=1, mem="2Gi")
    NV.mutate_container(c, pod={"spec": {}})
    assert c["resources"]["limits"]["nvidia.com/gpumem"] == "2048"


def test_mutate_zero_gpus_is_not_a_device_container():
    c = ctr(gpu=0, mem=1000)
    r = NV.mutate_container(c, pod={"spec": {}})
    assert r.uses_device is False
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}


def test_config_file_errors_are_one_line_naming_file_and_position(tmp_path):
    f = tmp_path / "device-config.yaml"
    f.write_text("nvidia:\n  deviceSplitCount: [1,\n")
    with pytest.raises(ConfigError) as e:
        load_config_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: invalid YAML at line ") and "\n" not in msg
    f.write_text("nvidia:\n  deviceSplitCount: 0\n")
    with pytest.raises(ConfigError, match=r"device-config.yaml: nvidia.deviceSplitCount: 0 is invalid"):
        load_config_file(f)
