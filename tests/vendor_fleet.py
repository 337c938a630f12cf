"""One node of every vendor HAMi schedules, built from the worked examples of HAMi's vendor backends,
and the config that enables them all. Shared by the vendor table tests, the extender integration test
and the property test (no tests here)."""

from __future__ import annotations

import json
from typing import Any

from hami.cluster import ClusterState, FilterOutcome
from hami.config import load_config

CONFIG = load_config({"scheduler": {"enableAscend": True, "enableIluvatar": True}})


def node(name: str, *, annotations: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A Node as the API server returns it: annotations, labels, capacity (= allocatable)."""
    obj: dict[str, Any] = {
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})}
    }
    if capacity:
        obj["status"] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    return obj


def container(name: str, limits: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A container with these resource limits (values stringified) and extra fields (env, ...)."""
    return {"name": name, "resources": {"limits": {k: str(v) for k, v in limits.items()}}, **extra}


def pod(name: str, *containers: dict[str, Any], annotations: dict[str, str] | None = None, uid: str | None = None,
        ns: str = "default", init: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    p: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)},
    }
    if init:
        p["spec"]["initContainers"] = init
    return p


ENFLAME_DRS = json.dumps({
    "devices": [{"index": "0", "minor": "0", "capacity": 6}, {"index": "1", "minor": "1", "capacity": 6}],
    "profiles": {"1g.8gb": "0", "2g.16gb": "1", "3g.24gb": "2", "6g.48gb": "3"},
})  # fmt: skip
METAX_SGPU = (
    '[{"uuid":"GPU-9a1b77c0","bdf":"0000:3b:00.0","model":"MXC500","totalDevCount":16,"totalCompute":100,'
    '"totalVRam":65536,"numa":0,"healthy":true,"qosPolicy":"best-effort","linkZone":1}]'
)
ASCEND_910B3 = (
    '[{"id":"ascend-7a2c-0","count":7,"devmem":65536,"devcore":20,"type":"Ascend910B3","health":true,'
    '"custominfo":{"NetworkID":0}},{"id":"ascend-7a2c-1","index":1,"count":7,"devmem":65536,"devcore":20,'
    '"type":"Ascend910B3","health":true,"custominfo":{"NetworkID":0}}]'
)
AMD_MI300X = (
    '[{"id":"8eff74b5-0000-1000-801b-b56457addd1b","index":0,"count":10,"devmem":196288,"devcore":304,'
    '"type":"AMD Instinct MI300X VF","numa":0,"health":true,"devicevendor":"amd","custominfo":{"pciBDF":"0000:83:00.0"}}]'
)
BIREN = '[{"id":"brgpu-0","count":1,"devmem":65024,"type":"Biren","health":true,"devicepairscore":{}}]'
VASTAI_DIES = json.dumps([
    {"id": f"va-{c}-die{d}", "index": 2 * c + d, "count": 1, "devmem": 16384, "type": "Vastai", "health": True,
     "custominfo": {"DeviceStrategy": "die", "AIC": f"va-{c}"}, "devicepairscore": {}}
    for c in (3, 4) for d in (0, 1)
])  # fmt: skip
XPU = json.dumps([
    {"id": f"0000:{0x1a + i:02x}:00.0", "index": i, "count": 4, "devmem": 98304, "devcore": 100, "type": "XPU",
     "health": True} for i in range(8)
])  # fmt: skip
ILUVATAR = (
    "GPU-7c1f02aa-0001,16,32768,100,BI-V150,0,true,0,hami-core:"
    "GPU-7c1f02aa-0002,16,32768,100,BI-V150,1,true,1,hami-core:"
)
DCU = (
    "5f1e0c7a-k100-0,4,65520,100,DCU-K100_AI,0,true,0,hami-core:"
    "5f1e0c7a-k100-1,4,65520,100,DCU-K100_AI,1,true,1,hami-core:"
)
NVIDIA = (
    '[{"id":"GPU-nv-0","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100","health":true},'
    '{"id":"GPU-nv-1","index":1,"count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100","health":true}]'
)


def fleet() -> dict[str, dict[str, Any]]:
    """CommonWord -> a node with that vendor's cards (names as in the worked examples)."""
    return {
        "NVIDIA": node("nv-a", annotations={"hami.io/node-nvidia-register": NVIDIA}),
        "DCU": node("dcu-a", annotations={"hami.io/node-dcu-register": DCU}),
        "MLU": node("mlu-a", capacity={"cambricon.com/mlu.smlu.vcore": "400", "cambricon.com/mlu.smlu.vmemory": "384"}),
        "BI-V150": node("ilu-a", annotations={"hami.io/node-BI-V150-register": ILUVATAR}),
        "Metax-GPU": node("mx-a", capacity={"metax-tech.com/gpu": "8"}),
        "Metax-SGPU": node("mxs-a", annotations={"metax-tech.com/node-gpu-devices": METAX_SGPU}),
        "Mthreads": node("mt-1", capacity={"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}),
        "Ascend910B3": node("npu-a", annotations={"hami.io/node-register-Ascend910B3": ASCEND_910B3}),
        "GCU": node("g1", capacity={"enflame.com/gcu": "2"}),
        "Enflame": node("e1", annotations={"enflame.com/gcu-drs-capacity": ENFLAME_DRS}),
        "kunlun": node("k1", capacity={"kunlunxin.com/xpu": "8"}),
        "XPU": node("x1", annotations={"hami.io/node-register-xpu": XPU}),
        "AWSNeuron": node("trn-a", capacity={"aws.amazon.com/neuron": "16", "aws.amazon.com/neuroncore": "32"},
                          labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"}),
        "AMD": node("amd-a", annotations={"hami.io/node-amd-register": AMD_MI300X}, capacity={"amd.com/gpu": "1"}),
        "Vastai": node("va-a", annotations={"hami.io/node-va-register": VASTAI_DIES}),
        "Biren": node("br-a", annotations={"hami.io/node-biren-register": BIREN}),
    }  # fmt: skip


#: CommonWord -> (limits of one container asking for one share, the annotation key holding its list).
ONE_SHARE: dict[str, tuple[dict[str, Any], str]] = {
    "NVIDIA": ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10}, "hami.io/vgpu-devices-allocated"),
    "DCU": ({"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000, "hygon.com/dcucores": 10}, "hami.io/dcu-devices-allocated"),
    "MLU": ({"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 20, "cambricon.com/mlu.smlu.vcore": 30},
            "hami.io/cambricon-mlu-devices-allocated"),
    "BI-V150": ({"iluvatar.ai/BI-V150-vgpu": 1, "iluvatar.ai/BI-V150.vMem": 64, "iluvatar.ai/BI-V150.vCore": 50},
                "hami.io/BI-V150-devices-allocated"),
    "Metax-GPU": ({"metax-tech.com/gpu": 1}, "hami.io/metax-gpu-devices-allocated"),
    "Metax-SGPU": ({"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 30, "metax-tech.com/vmemory": 8},
                   "hami.io/metax-sgpu-devices-allocated"),
    "Mthreads": ({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4},
                 "hami.io/mthreads-vgpu-devices-allocated"),
    "Ascend910B3": ({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 16384},
                    "hami.io/Ascend910B3-devices-allocated"),
    "GCU": ({"enflame.com/gcu": 1}, "hami.io/enflame-gcu-devices-allocated"),
    "Enflame": ({"enflame.com/drs-gcu": 2}, "hami.io/enflame-vgpu-devices-allocated"),
    "kunlun": ({"kunlunxin.com/xpu": 1}, "hami.io/kunlun-allocated"),
    "XPU": ({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576}, "hami.io/xpu-devices-allocated"),
    "AWSNeuron": ({"aws.amazon.com/neuroncore": 1}, "hami.io/aws-neuron-devices-allocated"),
    "AMD": ({"amd.com/gpu": 1, "amd.com/gpumem": 49152, "amd.com/gpucores": 25}, "hami.io/amd-devices-allocated"),
    "Vastai": ({"vastaitech.com/va": 1}, "hami.io/Vastai-devices-allocated"),
    "Biren": ({"birentech.com/gpu": 1}, "hami.io/Biren-devices-allocated"),
}  # fmt: skip


def state(*nodes: dict[str, Any]) -> ClusterState:
    """A ClusterState with every vendor enabled and these nodes."""
    st = ClusterState(CONFIG)
    for n in nodes:
        st.upsert_node(n)
    return st


def place(
    p: dict[str, Any], *nodes: dict[str, Any], st: ClusterState | None = None, now: float = 1_700_000_000.5
) -> FilterOutcome:
    """Filter `p` onto `nodes` (a fresh state unless `st`), clock fixed at `now`."""
    st = st or state(*nodes)
    return st.filter(p, [objects_name(n) for n in nodes], now=now)


def objects_name(n: dict[str, Any]) -> str:
    return n["metadata"]["name"]


#: CommonWord -> (pod annotations pinning the card of the worked example, exact annotations the filter
#: writes for the `ONE_SHARE` container named "c"). Timestamps are checked separately.
EXPECTED: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "NVIDIA": ({"nvidia.com/use-gpuuuid": "GPU-nv-1"}, {"hami.io/vgpu-devices-to-allocate": "GPU-nv-1,NVIDIA,1000,10:;"}),
    "DCU": ({"hygon.com/use-gpuuuid": "5f1e0c7a-k100-1"}, {"hami.io/dcu-devices-to-allocate": "5f1e0c7a-k100-1,DCU,1000,10:;"}),
    "MLU": ({"cambricon.com/use-gpuuuid": "mlu-a-cambricon-mlu-2"}, {
        "hami.io/cambricon-mlu-devices-to-allocate": "mlu-a-cambricon-mlu-2,MLU,5120,30:;",
        "CAMBRICON_DSMLU_PROFILE": "2_30_20", "CAMBRICON_DSMLU_ASSIGNED": "false", "CAMBRICON_DSMLU_ASSIGHED": "false"}),
    "BI-V150": ({"hami.io/use-BI-V150-uuid": "GPU-7c1f02aa-0002"},
                {"hami.io/BI-V150-devices-to-allocate": "GPU-7c1f02aa-0002,BI-V150,16384,50:;"}),
    "Metax-GPU": ({}, {"hami.io/metax-gpu-devices-to-allocate": "mx-a-metax-0,Metax-GPU,65536,100:;"}),
    "Metax-SGPU": ({}, {"hami.io/metax-sgpu-devices-to-allocate": "GPU-9a1b77c0,Metax-SGPU,8192,30:;",
                        "metax-tech.com/gpu-devices-allocated": '[[{"uuid":"GPU-9a1b77c0","compute":30,"vRam":8192}]]'}),
    "Mthreads": ({"mthreads.ai/use-gpuuuid": "mt-1-mthreads-1"}, {
        "hami.io/mthreads-vgpu-devices-allocated": "mt-1-mthreads-1,Mthreads,4096,4:;",
        "mthreads.com/gpu-index": "1", "mthreads.com/predicate-node": "mt-1"}),
    "Ascend910B3": ({"hami.io/use-Ascend910B3-uuid": "ascend-7a2c-1"}, {
        "hami.io/Ascend910B3-devices-to-allocate": "ascend-7a2c-1,Ascend910B3,16384,0:;",
        "huawei.com/Ascend910B3": '[{"UUID":"ascend-7a2c-1","temp":"vir05_1c_16g","memory":16384}]'}),
    "GCU": ({}, {"hami.io/enflame-gcu-devices-to-allocate": "g1-GCU-0,GCU,100,100:;"}),
    "Enflame": ({"enflame.com/use-gpuuuid": "e1-enflame-drs-1"}, {
        "hami.io/enflame-vgpu-devices-allocated": "e1-enflame-drs-1,Enflame,16384,34:;", "enflame.com/gcu-assigned": "false",
        "enflame.com/gcu-assigned-index": "1", "enflame.com/gcu-assigned-id": "1", "enflame.com/gcu-assigned-minor": "1",
        "enflame.com/gcu-request-size": "2",
        "assigned-containers": '{"c":{"allocated":false,"request":2,"profileID":"1","profileName":"2g.16gb"}}'}),
    "kunlun": ({}, {"hami.io/kunlun-allocated": "k1-kunlun-0,kunlun,98304,100:;", "BAIDU_COM_DEVICE_IDX": "0"}),
    "XPU": ({}, {"hami.io/xpu-devices-to-allocate": "0000:1a:00.0,XPU,24576,25:;"}),
    "AWSNeuron": ({"aws.amazon.com/use-neuron-uuid": "trn-a-AWSNeuron-15"}, {
        "hami.io/aws-neuron-devices-allocated": "trn-a-AWSNeuron-15,AWSNeuron,0,1:;", "AWS_NEURON_IDS": "30",
        "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuroncore", "NEURON_ALLOCATED": "false",
        "aws.amazon.com/predicate-node": "trn-a"}),
    "AMD": ({}, {"hami.io/amd-devices-to-allocate": "8eff74b5-0000-1000-801b-b56457addd1b,AMD Instinct MI300X VF,49152,76:;"}),
    "Vastai": ({}, {"hami.io/Vastai-devices-to-allocate": "va-3-die0,Vastai,0,0:;"}),
    "Biren": ({}, {"hami.io/Biren-devices-to-allocate": "brgpu-0,Biren,0,0:;"}),
}  # fmt: skip
