"""The extender's `hami_node_gpu_mig_instance_info`: one series per MIG instance the device plugin has
realized (its runtime identity recorded in ``hami.io/vgpu-mig-allocations``) on a card in MIG mode, with
HAMi's labels (cmd/scheduler/metrics.go) and our constant ``zone="vGPU"``. The expected line is HAMi's
own (TestClusterManagerCollectorExposesDynamicMigRuntimeIdentity)."""

from __future__ import annotations

from prometheus_client import generate_latest

from hami import annotations as A
from hami.cluster import ClusterState
from hami.model import Device, MigPlacement, MigProfile
from scheduler_extender.metrics import ExtenderMetrics
from tests.builders import ctr, node, pod

FAMILY = "hami_node_gpu_mig_instance_info"
PROFILES = (MigProfile("2g.10gb", 9984, 29, 2, (MigPlacement(0, 2), MigPlacement(2, 2))),)


def _state(mode: str = "mig") -> ClusterState:
    profiles = PROFILES if mode == "mig" else ()
    card = Device("GPU-parent", 0, 7, 40960, 100, "NVIDIA", mode=mode, mig_profiles=profiles)
    st = ClusterState()
    st.upsert_node(node("node-1", [card]))
    return st


def _placed(mig: str) -> dict:
    devices = "GPU-parent,NVIDIA,9984,29:;"
    annos = {A.ASSIGNED_NODE: "node-1", A.NVIDIA_ALLOCATED: devices, A.NVIDIA_TO_ALLOCATE: devices}
    annos[A.MIG_ALLOCATIONS] = mig
    return pod(ctr(gpu=1, mem=9000), annotations=annos)


RESERVED = '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-parent","profile":"2g.10gb","placement":{"start":0,"size":2}}]'
REALIZED = RESERVED[:-2] + ',"migUUID":"MIG-runtime","gpuInstanceID":4,"computeInstanceID":0}]'


def _series(st: ClusterState) -> list[str]:
    text = generate_latest(ExtenderMetrics(st).registry).decode()
    return [line for line in text.splitlines() if line.startswith(FAMILY)]


def test_a_realized_instance_is_exported_with_hamis_labels() -> None:
    st = _state()
    p = _placed(REALIZED)
    st.upsert_pod(p)
    assert _series(st) == [
        'hami_node_gpu_mig_instance_info{compute_instance_id="0",device_index="0",device_uuid="GPU-parent",'
        'gpu_instance_id="4",mig_uuid="MIG-runtime",node="node-1",placement_size="2",placement_start="0",'
        'profile="2g.10gb",zone="vGPU"} 1.0'
    ]
    st.remove_pod(p["metadata"]["uid"])
    assert _series(st) == []


def test_only_realized_instances_on_mig_cards_count() -> None:
    # A reservation the device plugin has not made yet (no runtime identity) is no instance.
    reserved = _state()
    p = _placed(RESERVED)
    reserved.upsert_pod(p)
    assert _series(reserved) == []
    # The device plugin's Allocate patch adds the identity to the same pod: now it is.
    p["metadata"]["annotations"][A.MIG_ALLOCATIONS] = REALIZED
    reserved.upsert_pod(p)
    assert len(_series(reserved)) == 1
    # HAMi exports the family for cards in MIG mode only.
    hami_core = _state("hami-core")
    hami_core.upsert_pod(_placed(REALIZED))
    assert _series(hami_core) == []


def test_the_family_is_described_even_without_instances() -> None:
    text = generate_latest(ExtenderMetrics(_state()).registry).decode()
    assert f"# TYPE {FAMILY} gauge" in text
