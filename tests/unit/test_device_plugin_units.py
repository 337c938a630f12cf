"""Unit tests of the device plugin's pure parts: proto contract, cards, backends, ListAndWatch messages."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from device_plugin.api import api_pb2 as pb
from device_plugin.api import generate
from device_plugin.backends import make_backend
from device_plugin.backends.fake import parse_cards
from device_plugin.backends.nvidia import DEFAULT_IGNORED_XIDS, NvidiaBackend, sysfs_bus_id, xid_policy
from device_plugin.devices import Card, DeviceState, nvidia_type
from device_plugin.kubelet import socket_name
from device_plugin.routes import list_response, options
from hami.errors import ConfigError

# ----- proto contract (k8s-protocols.md §2.1)

FIELDS = {
    "DevicePluginOptions": [("pre_start_required", 1), ("get_preferred_allocation_available", 2)],
    "RegisterRequest": [("version", 1), ("endpoint", 2), ("resource_name", 3), ("options", 4)],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1)],
    "TopologyInfo": [("nodes", 1)],
    "NUMANode": [("ID", 1)],
    "Device": [("ID", 1), ("health", 2), ("topology", 3)],
    "PreStartContainerRequest": [("devices_ids", 1)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [("container_requests", 1)],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1),
        ("must_include_deviceIDs", 2),
        ("allocation_size", 3),
    ],
    "PreferredAllocationResponse": [("container_responses", 1)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1)],
    "AllocateRequest": [("container_requests", 1)],
    "ContainerAllocateRequest": [("devices_ids", 1)],
    "CDIDevice": [("name", 1)],
    "AllocateResponse": [("container_responses", 1)],
    "ContainerAllocateResponse": [
        ("envs", 1),
        ("mounts", 2),
        ("devices", 3),
        ("annotations", 4),
        ("cdi_devices", 5),
    ],
    "Mount": [("container_path", 1), ("host_path", 2), ("read_only", 3)],
    "DeviceSpec": [("container_path", 1), ("host_path", 2), ("permissions", 3)],
}


def test_proto_package_messages_and_field_numbers_match_v1beta1():
    desc = pb.DESCRIPTOR
    assert desc.package == "v1beta1"
    assert set(desc.message_types_by_name) == set(FIELDS)
    for name, fields in FIELDS.items():
        got = [(f.name, f.number) for f in desc.message_types_by_name[name].fields]
        assert got == fields, name
    numa_id = desc.message_types_by_name["NUMANode"].fields_by_name["ID"]
    assert numa_id.type == numa_id.TYPE_INT64
    assert (
        desc.message_types_by_name["ContainerPreferredAllocationRequest"]
        .fields_by_name["allocation_size"]
        .type
        == numa_id.TYPE_INT32
    )


def test_proto_services_and_method_paths():
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    reg = services["Registration"].methods_by_name["Register"]
    assert (reg.input_type.name, reg.output_type.name) == ("RegisterRequest", "Empty")
    dp = services["DevicePlugin"]
    assert dp.full_name == "v1beta1.DevicePlugin"
    methods = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in dp.methods}
    assert methods == {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    }


def test_generated_stubs_are_up_to_date(capsys):
    assert generate.main(["--check"]) == 0, capsys.readouterr().out


# ----- cards and virtual devices


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("Tesla V100-PCIE-32GB", "NVIDIA-Tesla V100-PCIE-32GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
        ("NVIDIA H200", "NVIDIA H200"),
        ("GeForce RTX 3090", "NVIDIA-GeForce RTX 3090"),
    ],
)
def test_nvidia_type_rule(name, want):
    assert nvidia_type(name) == want


CARDS = [
    Card(uuid="GPU-b", index=1, model="NVIDIA-Tesla V100-PCIE-32GB", memory_mib=32768, numa=1),
    Card(uuid="GPU-a", index=0, model="NVIDIA-Tesla V100-PCIE-32GB", memory_mib=32768, numa=None),
]


def test_state_virtual_ids_and_mapping():
    state = DeviceState(CARDS, split_count=3, numa_topology=True)
    assert [d[0] for d in state.virtual_devices()] == [
        "GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1", "GPU-b-2",
    ]  # fmt: skip
    assert state.card_of("GPU-b-2") == "GPU-b"
    assert state.card_of("GPU-b-3") is None
    assert state.card_of("GPU-b") is None
    assert state.replicas("GPU-a") == ["GPU-a-0", "GPU-a-1", "GPU-a-2"]
    assert state.replicas("GPU-x") == []


def test_state_registration_applies_scaling_and_health():
    state = DeviceState(CARDS, split_count=10)
    state.set_health("GPU-b", False, "XID 79")
    devs = state.registration(memory_scaling=1.5, core_scaling=2)
    assert [(d.uuid, d.index, d.count, d.devmem, d.devcore, d.numa, d.health) for d in devs] == [
        ("GPU-a", 0, 10, 49152, 200, 0, True),
        ("GPU-b", 1, 10, 49152, 200, 1, False),
    ]


async def test_state_health_bumps_version_and_wakes_waiters():
    state = DeviceState(CARDS, split_count=2)
    v0 = state.version
    waiter = asyncio.create_task(state.wait_change(v0, timeout=5))
    await asyncio.sleep(0)
    assert state.set_health("GPU-a", False) is True
    assert await waiter == v0 + 1
    assert state.set_health("GPU-a", False) is False  # no change, no new version
    assert state.set_health("GPU-unknown", False) is False
    assert state.version == v0 + 1
    assert state.set_health(None, False) is True  # all cards
    assert [c.healthy for c in state.cards()] == [False, False]
    assert await state.wait_change(state.version, timeout=0.01) == v0 + 2


def test_state_rejects_duplicate_uuid_and_bad_split():
    with pytest.raises(ValueError, match="duplicate uuid"):
        DeviceState([CARDS[0], CARDS[0]], split_count=1)
    with pytest.raises(ValueError, match="split_count"):
        DeviceState(CARDS, split_count=0)


def test_list_response_full_list_health_and_topology():
    state = DeviceState(CARDS, split_count=2, numa_topology=True)
    state.set_health("GPU-b", False)
    msg = list_response(state)
    got = [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in msg.devices]
    assert got == [
        ("GPU-a-0", "Healthy", []),
        ("GPU-a-1", "Healthy", []),
        ("GPU-b-0", "Unhealthy", [1]),
        ("GPU-b-1", "Unhealthy", [1]),
    ]
    plain = list_response(DeviceState(CARDS, split_count=1, numa_topology=False))
    assert [d.HasField("topology") for d in plain.devices] == [False, False]


def test_options_and_socket_name():
    assert options() == pb.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )
    assert socket_name("nvidia.com/gpu") == "nvidia-gpu.sock"
    assert socket_name("example.com/vgpu") == "nvidia-vgpu.sock"


# ----- fake backend


def test_fake_cards_parse_and_type_rule():
    cards = parse_cards(
        {
            "cards": [
                {
                    "uuid": "GPU-2",
                    "index": 1,
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memory_mib": 81920,
                    "numa": 1,
                },
                {"uuid": "GPU-1", "index": 0, "model": "Tesla T4", "memory_mib": 15360, "healthy": False},
            ]
        }
    )
    assert cards == [
        Card("GPU-1", 0, "NVIDIA-Tesla T4", 15360, None, False),
        Card("GPU-2", 1, "NVIDIA A100-SXM4-80GB", 81920, 1, True),
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gpus": []}, "want a mapping with a 'cards:' list"),
        (
            {"cards": [{"index": 0, "model": "T4", "memory_mib": 1}]},
            r"cards\[0\]\.uuid: must be a non-empty string",
        ),
        (
            {"cards": [{"uuid": "G", "model": "T4", "memory_mib": 0}]},
            r"cards\[0\]\.memory_mib: 0 must be an integer >= 1",
        ),
        ({"cards": [{"uuid": "G", "model": "T4", "memory_mib": 1, "numa": -1}]}, r"cards\[0\]\.numa"),
        ({"cards": [{"uuid": "G", "model": "T4", "memory_mib": 1, "mem": 2}]}, r"unknown key\(s\) \['mem'\]"),
        ({"cards": [{"uuid": "G", "model": "T4", "memory_mib": 1}] * 2}, "duplicate uuid"),
    ],
    ids=["no-cards-list", "no-uuid", "zero-memory", "negative-numa", "unknown-key", "duplicate-uuid"],
)
def test_fake_cards_errors_name_the_field(doc, message):
    with pytest.raises(ConfigError, match=message):
        parse_cards(doc)


async def test_fake_backend_reports_health_changes_from_file(tmp_path):
    path = tmp_path / "cards.yaml"
    path.write_text("cards:\n- {uuid: GPU-1, index: 0, model: T4, memory_mib: 15360}\n")
    backend = make_backend("fake", fake_config=str(path))
    reports: list[tuple] = []
    task = asyncio.create_task(backend.watch_health(lambda *a: reports.append(a)))
    await asyncio.sleep(0.05)
    path.write_text("cards:\n- {uuid: GPU-1, index: 0, model: T4, memory_mib: 15360, healthy: false}\n")
    for _ in range(50):
        if reports:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    assert reports == [("GPU-1", False, f"{path}: healthy=false")]


def test_make_backend_errors():
    with pytest.raises(ConfigError, match="--fake-config: required"):
        make_backend("fake")
    with pytest.raises(ConfigError, match="valid: nvidia, fake"):
        make_backend("amd")


# ----- nvidia backend with a fake NVML module


def test_xid_policy():
    assert xid_policy({}) == (True, DEFAULT_IGNORED_XIDS)
    assert xid_policy({"DP_DISABLE_HEALTHCHECKS": "all"}) == (False, frozenset())
    assert xid_policy({"DP_DISABLE_HEALTHCHECKS": "xids"}) == (False, frozenset())
    assert xid_policy({"DP_DISABLE_HEALTHCHECKS": "79, 48"}) == (True, DEFAULT_IGNORED_XIDS | {79, 48})
    assert xid_policy({"DP_ENABLE_HEALTHCHECKS": "13,31"}) == (True, DEFAULT_IGNORED_XIDS - {13, 31})
    with pytest.raises(ConfigError, match="DP_DISABLE_HEALTHCHECKS: 'x' is not an XID number"):
        xid_policy({"DP_DISABLE_HEALTHCHECKS": "13,x"})


def test_sysfs_bus_id():
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("0000:af:00.0") == "0000:af:00.0"


class FakeNvml(SimpleNamespace):
    """Just enough of pynvml for discovery and event handling."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
        pass

    class NVMLError_Timeout(NVMLError):  # noqa: N801
        pass

    nvmlEventTypeXidCriticalError = 8  # noqa: N815

    def __init__(self, gpus):
        super().__init__(gpus=gpus, inited=0, shutdown=0)

    def nvmlInit(self):  # noqa: N802
        self.inited += 1

    def nvmlShutdown(self):  # noqa: N802
        self.shutdown += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return h["uuid"]

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        if h["mem"] is None:
            raise self.NVMLError_NotSupported()
        return SimpleNamespace(total=h["mem"])

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        if "mig" not in h:
            raise self.NVMLError_NotSupported()
        return [h["mig"], h["mig"]]

    def nvmlDeviceGetNumaNodeId(self, h):  # noqa: N802
        return h.get("numa", -1)

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return SimpleNamespace(busId=h["bus"].encode())


def test_nvidia_discover(tmp_path):
    (tmp_path / "0000:3b:00.0").mkdir()
    (tmp_path / "0000:3b:00.0" / "numa_node").write_text("1\n")
    (tmp_path / "0000:5e:00.0").mkdir()
    (tmp_path / "0000:5e:00.0" / "numa_node").write_text("-1\n")
    gib = 1024 * 1024 * 1024
    nvml = FakeNvml(
        [
            {"uuid": "GPU-0", "name": "NVIDIA H200", "mem": 141 * gib, "numa": 0, "bus": "00000000:1A:00.0"},
            {"uuid": "GPU-1", "name": "Tesla V100-PCIE-32GB", "mem": 32 * gib, "bus": "00000000:3B:00.0"},
            {"uuid": "GPU-2", "name": "NVIDIA A100", "mem": 80 * gib, "mig": 1, "bus": "00000000:4C:00.0"},
            {"uuid": "GPU-3", "name": "NVIDIA GB10", "mem": None, "bus": "00000000:5E:00.0"},
        ]
    )
    backend = NvidiaBackend(nvml=nvml, preconfigured_memory_mib=100000, env={}, sysfs=tmp_path)
    assert backend.discover() == [
        Card("GPU-0", 0, "NVIDIA H200", 141 * 1024, 0, True),
        Card("GPU-1", 1, "NVIDIA-Tesla V100-PCIE-32GB", 32 * 1024, 1, True),
        Card("GPU-3", 3, "NVIDIA GB10", 100000, None, True),
    ]
    backend.close()
    assert (nvml.inited, nvml.shutdown) == (1, 1)
    # Without preConfiguredDeviceMemory a card whose memory NVML cannot report is skipped.
    assert [
        c.uuid for c in NvidiaBackend(nvml=FakeNvml(nvml.gpus[3:]), env={}, sysfs=tmp_path).discover()
    ] == []


def test_nvidia_xid_events():
    nvml = FakeNvml([{"uuid": "GPU-0"}])
    backend = NvidiaBackend(nvml=nvml, env={})
    reports: list[tuple] = []
    dev = {"uuid": "GPU-0"}
    backend._handle_event(
        SimpleNamespace(eventType=8, eventData=13, device=dev), lambda *a: reports.append(a)
    )
    backend._handle_event(SimpleNamespace(eventType=2, eventData=0, device=dev), lambda *a: reports.append(a))
    assert reports == []  # application XID 13 and non-XID events are ignored
    backend._handle_event(
        SimpleNamespace(eventType=8, eventData=79, device=dev), lambda *a: reports.append(a)
    )
    assert reports == [("GPU-0", False, "critical XID 79")]


def test_nvidia_init_failure_is_a_config_error():
    class Broken(FakeNvml):
        def nvmlInit(self):  # noqa: N802
            raise self.NVMLError("Driver Not Loaded")

    with pytest.raises(ConfigError, match=r"NVML init failed \(Driver Not Loaded\).*--backend fake"):
        NvidiaBackend(nvml=Broken([]), env={}).discover()


def test_cli_requires_node_name(monkeypatch, capsys):
    from device_plugin.cli import main

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["--backend", "fake", "--fake-config", "x.yaml"]) == 2
    assert "--node-name (or env NODE_NAME) is required" in capsys.readouterr().err


def test_cli_busy_metrics_port_is_one_line_exit_1(monkeypatch, capsys, tmp_path):
    # QA regression: an OSError at start (busy port, unusable socket dir) ended in a traceback.
    import socket

    from device_plugin.cli import main

    cards = tmp_path / "cards.yaml"
    cards.write_text("cards:\n  - {uuid: GPU-a, index: 0, model: T4, memory_mib: 1024}\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["--backend", "fake", "--fake-config", str(cards), "--node-name", "n", "--no-kube",
                   "--socket-dir", str(tmp_path / "dp"), "--metrics-host", "127.0.0.1",
                   "--metrics-port", str(port)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("hami-device-plugin: cannot start: ") and "address already in use" in err.lower()
    assert "Traceback" not in err and err.count("\n") == 1


def test_cli_bad_metrics_port_env_is_a_usage_error(monkeypatch, capsys):
    # QA regression: METRICS_PORT=abc raised ValueError with a traceback while building the parser.
    from device_plugin.cli import main

    monkeypatch.setenv("METRICS_PORT", "abc")
    with pytest.raises(SystemExit) as exit_:
        main(["--node-name", "n"])
    assert exit_.value.code == 2
    assert "argument --metrics-port: invalid int value: 'abc'" in capsys.readouterr().err


def test_module_path():
    # the stubs live inside the package and import it absolutely (see generate.py)
    assert Path(pb.__file__).parent.name == "api"
    assert "device_plugin.api.api_pb2" in sys.modules


# ----- allocator helpers


def _allocator(fallbacks: list[str]):
    from device_plugin.allocator import Allocator, AllocatorSettings

    state = DeviceState(CARDS, split_count=3)
    return Allocator(
        kube=None,
        state=state,
        settings=AllocatorSettings(node_name="n1"),
        release_lock=lambda *a, **k: False,
        on_preferred_fallback=fallbacks.append,
    )


def _entry(*uuids: str):
    from hami.model import ContainerDevice

    return [ContainerDevice(uuid=u, type="NVIDIA", usedmem=1000, usedcores=10) for u in uuids]


def test_prefer_picks_one_replica_per_recorded_card_honouring_must_include():
    fallbacks: list[str] = []
    alloc = _allocator(fallbacks)
    req = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-2"],
        must_include_deviceIDs=["GPU-a-1"],
        allocation_size=2,
    )
    assert alloc._prefer(req, _entry("GPU-a", "GPU-b")) == ["GPU-a-1", "GPU-b-0"]
    req = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["GPU-b-1", "GPU-b-2"], allocation_size=1
    )
    assert alloc._prefer(req, _entry("GPU-b")) == ["GPU-b-1"]
    assert fallbacks == []


def test_prefer_leaves_unavailable_cards_to_kubelet():
    fallbacks: list[str] = []
    alloc = _allocator(fallbacks)
    req = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["GPU-a-0", "GPU-a-1"], allocation_size=2
    )
    assert alloc._prefer(req, _entry("GPU-a", "GPU-b")) == ["GPU-a-0"]
    assert fallbacks == ["card_unavailable"]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ([], False),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}], True),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "1"}], True),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "false"}], False),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": ""}], False),
        (
            [{"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}],
            False,
        ),
        # QA regression: duplicates were decided by the first entry, but kubelet lets the last one win.
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "false"}, {"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
         True),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}, {"name": "CUDA_DISABLE_CONTROL", "value": "false"}],
         False),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": " true"}], False),  # Go ParseBool does not trim
    ],
    ids=["unset", "true", "one", "false", "empty", "value-from", "last-wins-true", "last-wins-false", "untrimmed"],
)  # fmt: skip
def test_disable_control_is_read_by_value(env, want):
    from hami.vendors.nvidia import control_disabled

    assert control_disabled({"name": "c", "env": env}) is want


class EventNvml(FakeNvml):
    """FakeNvml with an event set that yields queued events, then times out."""

    def __init__(self, gpus, events):
        super().__init__(gpus)
        self.events = list(events)
        self.registered: list[tuple] = []

    def nvmlEventSetCreate(self):  # noqa: N802
        return "set"

    def nvmlEventSetFree(self, s):  # noqa: N802
        pass

    def nvmlDeviceGetSupportedEventTypes(self, h):  # noqa: N802
        return 0xFF

    def nvmlDeviceRegisterEvents(self, h, types, s):  # noqa: N802
        self.registered.append((h["uuid"], types))

    def nvmlEventSetWait(self, s, ms):  # noqa: N802
        if self.events:
            return self.events.pop(0)
        import time

        time.sleep(0.01)
        raise self.NVMLError_Timeout()


async def test_nvidia_watch_health_reports_critical_xids_from_its_thread():
    gpu = {"uuid": "GPU-0", "name": "NVIDIA H200", "mem": 1, "bus": "0000:00:00.0"}
    events = [
        SimpleNamespace(eventType=8, eventData=43, device=gpu),
        SimpleNamespace(eventType=8, eventData=79, device=gpu),
    ]
    nvml = EventNvml([gpu], events)
    backend = NvidiaBackend(nvml=nvml, env={})
    reports: list[tuple] = []
    task = asyncio.create_task(backend.watch_health(lambda *a: reports.append(a)))
    for _ in range(100):
        if reports:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert nvml.registered == [("GPU-0", 8)]
    assert reports == [("GPU-0", False, "critical XID 79")]


def test_documented_cards_yaml_gives_the_documented_registration():
    # QA finding: docs/device-plugin.md showed a registration for GPU-bbbb (V100, 32768 MiB) that its
    # own CARDS.yaml example (A100, 81920 MiB) cannot produce. Keep the page executable.
    import re

    import yaml

    from hami.registration import encode_node_devices_json

    text = (Path(__file__).resolve().parents[2] / "docs" / "device-plugin.md").read_text()
    cards_yaml = re.search(r"```yaml\n(cards:\n.*?)```", text, re.S)
    assert cards_yaml is not None
    state = DeviceState(parse_cards(yaml.safe_load(cards_yaml.group(1))), split_count=10)
    value = encode_node_devices_json(state.registration(memory_scaling=1.0, core_scaling=1.0))
    assert f"\nhami.io/node-nvidia-register: {value}\n" in text


# ----- gRPC status codes: chosen by the server from the allocator's typed errors


class _AbortContext:
    def __init__(self) -> None:
        self.aborted: tuple[object, str] | None = None

    async def abort(self, code, details):  # noqa: ANN001
        self.aborted = (code, details)
        raise RuntimeError("aborted")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("refused", "FAILED_PRECONDITION"),
        ("api_unavailable", "UNAVAILABLE"),
        ("bug", "INTERNAL"),
    ],
    ids=["refused", "api-unavailable", "bug"],
)
def test_allocate_status_code_is_chosen_by_the_server(error, code):
    import grpc

    from device_plugin.errors import AllocationRefused, ApiUnavailable
    from device_plugin.routes import DevicePluginService

    raised = {
        "refused": AllocationRefused("lock_missing", "no lock"),
        "api_unavailable": ApiUnavailable("api_error", "API server: down"),
        "bug": KeyError("x"),
    }[error]

    class Policy:
        async def allocate(self, requests):
            raise raised

    reasons: list[str] = []
    service = DevicePluginService(
        DeviceState(CARDS, split_count=3), Policy(), on_allocate_error=reasons.append
    )
    ctx = _AbortContext()
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-a-0"])])
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(service.Allocate(request, ctx))
    assert ctx.aborted is not None and ctx.aborted[0] == getattr(grpc.StatusCode, code)
    assert reasons == [{"refused": "lock_missing", "api_unavailable": "api_error", "bug": "internal"}[error]]


def test_allocator_raises_typed_errors_without_grpc():
    import device_plugin.allocator as allocator_module
    from device_plugin.errors import ApiUnavailable
    from hami.errors import ApiError

    assert "grpc" not in vars(allocator_module)
    allocator = _allocator([])

    def down():
        raise ApiError("connection refused", status=None, reason="Transport")

    with pytest.raises(ApiUnavailable, match="API server: connection refused") as e:
        asyncio.run(allocator._call(down))
    assert e.value.reason == "api_error"


# ----- flags and environment: flag > HAMI_DEVICE_PLUGIN_* > HAMi's names > config > default


def test_every_flag_has_an_environment_variable_and_hami_names_stay_aliases():
    from dataclasses import fields

    from device_plugin.cli import ENV_PREFIX, CommandOptions, build_parser, parse_options

    env = {
        "HAMI_DEVICE_PLUGIN_NODE_NAME": "n-new",
        "NODE_NAME": "n-old",
        "CONFIG_FILE": "",
        "HAMI_DEVICE_PLUGIN_REGISTER_INTERVAL": "1m",
        "HAMI_DEVICE_PLUGIN_NO_KUBE": "true",
        "VGPU_LOCK_DIR": "/locks",
        "HAMI_DEVICE_PLUGIN_VERBOSE": "yes",
    }
    o = parse_options(["--lock-dir", "/flag"], env=env)
    assert (o.node_name, o.register_interval_s, o.no_kube, o.lock_dir, o.verbose) == (
        "n-new",
        60.0,
        True,
        "/flag",
        True,
    )
    assert parse_options([], env={"NODE_NAME": "n-old", "VGPU_LOCK_DIR": "/locks"}).lock_dir == "/locks"
    dests = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    # Every flag is an option field (and so has its HAMI_DEVICE_PLUGIN_<DEST> variable).
    assert ENV_PREFIX == "HAMI_DEVICE_PLUGIN_"
    assert dests == ({f.name for f in fields(CommandOptions)} - {"config", "register_interval_s"}) | {
        "register_interval"
    }


def test_config_file_supplies_resource_and_scheduler_name_below_flags_and_env(tmp_path):
    from device_plugin.cli import parse_options

    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("nvidia:\n  resourceCountName: example.com/vgpu\nscheduler:\n  schedulerName: my-sched\n")
    o = parse_options(["--node-name", "n", "--device-config", str(cfg)], env={})
    assert (o.resource_name, o.scheduler_name) == ("example.com/vgpu", "my-sched")
    o = parse_options(["--node-name", "n"], env={"CONFIG_FILE": str(cfg), "RESOURCE_NAME": "x.io/gpu"})
    assert (o.resource_name, o.scheduler_name) == ("x.io/gpu", "my-sched")


# ----- docs/device-plugin.md stays true to the code and the committed logs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "device-plugin.md"


def test_docs_list_every_flag_with_its_environment_variables():
    from device_plugin.cli import ENV_ALIASES, ENV_PREFIX, build_parser
    from hami.settings import env_names

    text = DOCS.read_text()
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            row = next(
                line for line in text.splitlines() if line.startswith(f"| `{action.option_strings[0]}`")
            )
            assert (
                ", ".join(f"`{n}`" for n in env_names(action.dest, prefix=ENV_PREFIX, aliases=ENV_ALIASES))
                in row
            )


def test_gpu_transcript_in_docs_is_an_excerpt_of_the_committed_log_it_names():
    import re

    section = DOCS.read_text().split("## On a real GPU", 1)[1].split("\n## ", 1)[0]
    (log_name,) = set(re.findall(r"`(benchmarks/results/[\w.-]+\.log)`", section))
    log_lines = set((DOCS.parents[1] / log_name).read_text().splitlines())
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert blocks, "no transcript"
    lines = [line for block in blocks for line in block.splitlines() if line != "..."]
    assert [line for line in lines if line not in log_lines] == []
    # Lines the probe always prints for an Allocate are in the excerpt.
    assert any(line.startswith("  env CUDA_DEVICE_MEMORY_SHARED_CACHE=") for line in lines)
    assert any(line.startswith("  mount ") for line in lines)


def test_backend_table_drives_choices_building_and_the_valid_message(monkeypatch):
    # Adding a backend is one module with `build` plus one table line: the flag's choices, BACKENDS
    # and the "valid: ..." message follow.
    import types

    import device_plugin.backends as backends
    from device_plugin.cli import build_parser

    module = types.ModuleType("device_plugin.backends.example")
    built = []
    module.build = lambda options: built.append(options) or "example-backend"
    monkeypatch.setitem(sys.modules, "device_plugin.backends.example", module)
    monkeypatch.setattr(backends, "_TABLE", {**backends._TABLE, "example": "device_plugin.backends.example"})
    monkeypatch.setattr(backends, "BACKENDS", tuple(backends._TABLE))
    assert backends.make_backend("example", fake_config="x.yaml") == "example-backend"
    assert built == [backends.BackendOptions(fake_config="x.yaml", preconfigured_memory_mib=0)]
    with pytest.raises(ConfigError, match="valid: nvidia, fake, example$"):
        backends.make_backend("amd")
    (backend_flag,) = [a for a in build_parser()._actions if a.dest == "backend"]
    assert tuple(backend_flag.choices) == ("nvidia", "fake", "example")
