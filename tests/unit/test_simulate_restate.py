"""hami.simulate.restate: the openb traces restated as HAMi users write requests (`--restate`)."""

from __future__ import annotations

import pytest

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate.restate import CORES_SHARE, VARIANTS, parse_variant, restate, share_mib
from hami.simulate.workload import DEFAULT_GPU_MODELS, gpu_node, openb_pod

CFG = DeviceConfig()
COMMON = {"cpu_milli": 4000, "memory_mib": 8192, "config": CFG, "gpu_models": DEFAULT_GPU_MODELS}
NODES = [
    gpu_node("t4", cpu_milli=64000, memory_mib=262144, gpus=2, model="T4", card_mib=15360, config=CFG),
    gpu_node("g3", cpu_milli=64000, memory_mib=262144, gpus=8, model="G3", card_mib=81920, config=CFG),
]


def limits(p) -> dict[str, str]:
    return p.obj["spec"]["containers"][0]["resources"]["limits"]


def test_share_mib_rounds_up_to_512_and_stays_on_the_card():
    assert share_mib(47, 15360) == 7680  # 7219.2 MiB -> 15 x 512
    assert share_mib(1, 15360) == 512
    assert share_mib(99, 15360) == 15360  # 15206.4 -> 15360, the card itself
    assert share_mib(50, 16000) == 8192


def test_each_kind_of_request_is_restated_as_hami_users_write_it():
    pods = [
        openb_pod("whole", num_gpu=1, gpu_milli=1000, gpu_spec=[], **COMMON),
        openb_pod("eight", num_gpu=8, gpu_milli=1000, gpu_spec=[], **COMMON),
        openb_pod("share", num_gpu=1, gpu_milli=470, gpu_spec=[], **COMMON),
        openb_pod("g3only", num_gpu=1, gpu_milli=500, gpu_spec=["G3"], **COMMON),
        openb_pod("cpu", num_gpu=0, gpu_milli=0, gpu_spec=[], **COMMON),
        openb_pod("unknown", num_gpu=1, gpu_milli=500, gpu_spec=["H100"], **COMMON),
    ]
    out = {p.name: p for p in restate(pods, NODES, "gpumem", config=CFG, seed=0)}
    assert limits(out["whole"]) == {"nvidia.com/gpu": "1"}  # all of the card's memory, no cores
    assert limits(out["eight"]) == {"nvidia.com/gpu": "8"}
    # the smallest card it may use is a T4: 47 % of 15360 MiB, rounded up to 512 MiB
    assert limits(out["share"]) == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "7680"}
    # allowed on G3 only: half of 81920 MiB; the model rule stays
    assert limits(out["g3only"]) == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"}
    assert out["g3only"].obj["metadata"]["annotations"] == {"nvidia.com/use-gputype": "G3"}
    assert out["cpu"] is pods[4] and out["unknown"] is pods[5]
    # CPU, memory and the demand in cards (the unit of the fill target) are unchanged
    assert (out["share"].cpu_milli, out["share"].memory_mib, out["share"].gpu_demand) == (4000, 8192, 0.47)
    cores = {p.name: limits(p) for p in restate(pods, NODES, "gpumem-cores", config=CFG, seed=0)}
    assert cores["share"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "7680", "nvidia.com/gpucores": "47"}
    pct = {p.name: limits(p) for p in restate(pods, NODES, "gpumem-percentage", config=CFG, seed=0)}
    assert pct["share"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "47"}
    assert pct["whole"] == {"nvidia.com/gpu": "1"}


def test_the_hami_mix_states_cores_for_a_seeded_quarter_of_the_shares():
    pods = [openb_pod(f"s{i}", num_gpu=1, gpu_milli=320, gpu_spec=[], **COMMON) for i in range(2000)]
    one = restate(pods, NODES, "hami", config=CFG, seed=1)
    with_cores = [p.name for p in one if "nvidia.com/gpucores" in limits(p)]
    assert abs(len(with_cores) / len(pods) - CORES_SHARE) < 0.03
    assert all(limits(p)["nvidia.com/gpumem"] == "5120" for p in one)
    # the same seed, the same workload; another seed, another draw
    again = restate(pods, NODES, "hami", config=CFG, seed=1)
    assert [limits(p) for p in again] == [limits(p) for p in one]
    other = restate(pods, NODES, "hami", config=CFG, seed=2)
    assert [p.name for p in other if "nvidia.com/gpucores" in limits(p)] != with_cores


def test_bad_variants_and_pods_that_are_not_openb_are_named():
    assert parse_variant(" HAMI ") == "hami" and "gpumem" in VARIANTS
    with pytest.raises(InvalidRequest, match=r"--restate: 'cores' is not a variant; valid: hami, gpumem"):
        parse_variant("cores")
    yaml_pod = openb_pod("y", num_gpu=1, gpu_milli=500, gpu_spec=[], **COMMON)
    yaml_pod.obj["spec"]["containers"].append({"name": "side", "resources": {}})
    with pytest.raises(InvalidRequest, match=r"pod y is not an openb pod"):
        restate([yaml_pod], NODES, "gpumem", config=CFG, seed=0)
