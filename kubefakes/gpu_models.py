"""The card models the fake NVML (`kubefakes.nvml`) serves: NVML name, memory and the MIG GPU-instance
profiles, as NVIDIA's MIG user guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/) and
``nvidia-smi mig -lgip`` / ``-lgipp`` give them.

Each profile has its slice count, the number of instances a card takes of it, its SMs, its memory and
the placements it may start at (1g at 0..6 size 1, 1g with double memory at 0/2/4/6 size 2, 2g at 0/2/4
size 2, 3g at 0/4 size 4, 4g at 0 size 4, 7g at 0 size 8). Memory sizes for the A100 and H100 are what
``nvidia-smi mig -lgip`` prints (GiB x 1024); the H200's are the H100's scaled to its 141 GB, since
only the profile names, counts and placements of the H200 were at hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pynvml

__all__ = [
    "A100_40GB",
    "A100_80GB",
    "CI_PROFILE_OF_SLICES",
    "H100_80GB",
    "H200_141GB",
    "V100",
    "GiProfile",
    "Model",
]

P = pynvml  # the constants' source


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile of a model: NVML profile id, name, slices, max instances, SMs, MiB,
    placement starts and size (memory slices)."""

    id: int
    name: str
    slices: int
    instances: int
    sms: int
    memory_mb: int
    starts: tuple[int, ...]
    size: int


def _table(mem: Mapping[str, int], sms: Mapping[str, int], names: Mapping[str, str]) -> tuple[GiProfile, ...]:
    rows = [
        (P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, "1g", 1, 7, (0, 1, 2, 3, 4, 5, 6), 1),
        (P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, "1g+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        (P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, "1g2", 1, 4, (0, 2, 4, 6), 2),
        (P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, "2g", 2, 3, (0, 2, 4), 2),
        (P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, "3g", 3, 2, (0, 4), 4),
        (P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, "4g", 4, 1, (0,), 4),
        (P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, "7g", 7, 1, (0,), 8),
    ]
    return tuple(
        GiProfile(pid, names[k], s, n, sms[k], mem[k], starts, size) for pid, k, s, n, starts, size in rows
    )


_A100_SMS = {"1g": 14, "1g+me": 14, "1g2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_H100_SMS = {"1g": 16, "1g+me": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}


@dataclass(frozen=True)
class Model:
    """A card model: NVML name, total memory (MiB), MIG profiles (empty: not MIG-capable)."""

    name: str
    memory_mib: int
    profiles: tuple[GiProfile, ...] = ()


A100_40GB = Model(
    "NVIDIA A100-SXM4-40GB",
    40960,
    _table(
        {"1g": 4864, "1g+me": 4864, "1g2": 9984, "2g": 9984, "3g": 20096, "4g": 20096, "7g": 40192},
        _A100_SMS,
        {
            "1g": "1g.5gb",
            "1g+me": "1g.5gb+me",
            "1g2": "1g.10gb",
            "2g": "2g.10gb",
            "3g": "3g.20gb",
            "4g": "4g.20gb",
            "7g": "7g.40gb",
        },
    ),  # fmt: skip
)
A100_80GB = Model(
    "NVIDIA A100-SXM4-80GB",
    81920,
    _table(
        {"1g": 9728, "1g+me": 9728, "1g2": 19968, "2g": 19968, "3g": 40192, "4g": 40192, "7g": 81152},
        _A100_SMS,
        {
            "1g": "1g.10gb",
            "1g+me": "1g.10gb+me",
            "1g2": "1g.20gb",
            "2g": "2g.20gb",
            "3g": "3g.40gb",
            "4g": "4g.40gb",
            "7g": "7g.80gb",
        },
    ),  # fmt: skip
)
H100_80GB = Model(
    "NVIDIA H100 80GB HBM3",
    81559,
    _table(
        {"1g": 9984, "1g+me": 9984, "1g2": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
        _H100_SMS,
        {
            "1g": "1g.10gb",
            "1g+me": "1g.10gb+me",
            "1g2": "1g.20gb",
            "2g": "2g.20gb",
            "3g": "3g.40gb",
            "4g": "4g.40gb",
            "7g": "7g.80gb",
        },
    ),  # fmt: skip
)
H200_141GB = Model(
    "NVIDIA H200",
    143771,
    _table(
        {"1g": 17664, "1g+me": 17664, "1g2": 35584, "2g": 35584, "3g": 71296, "4g": 71296, "7g": 143104},
        _H100_SMS,
        {
            "1g": "1g.18gb",
            "1g+me": "1g.18gb+me",
            "1g2": "1g.35gb",
            "2g": "2g.35gb",
            "3g": "3g.71gb",
            "4g": "4g.71gb",
            "7g": "7g.141gb",
        },
    ),  # fmt: skip
)
V100 = Model("Tesla V100-PCIE-32GB", 32768)

#: NVML's compute-instance profile id of the compute instance that fills a GPU instance of N slices.
CI_PROFILE_OF_SLICES = {
    1: P.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: P.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: P.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: P.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: P.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: P.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: P.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
