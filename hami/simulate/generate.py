"""The built-in workload: a seeded, heterogeneous cluster and pod list shaped like the openb trace.

Why: `hami simulate` must work on a fresh machine without the trace files. The node mix (models, cards
per node, CPU, memory) and the pod mix (whole-card, fractional and multi-card GPU pods, CPU-only pods,
~10 % with a model constraint) follow the proportions of the Alibaba v2023 openb lists; sizes are
smaller so a run takes seconds. Arrival and deletion times make `--mode trace` work too: arrivals are a
Poisson process and lifetimes exponential, sized so that about 85 % of the GPU capacity is asked for
at steady state. Same seed, same workload.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from hami.config import DeviceConfig
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimNode, SimPod, Workload, gpu_node, openb_pod

#: (model, cards, cpu_milli, memory_mib, share of nodes) - the openb node list's main shapes.
NODE_SHAPES: tuple[tuple[str, int, int, int, float], ...] = (
    ("G2", 8, 96000, 393216, 0.44),
    ("T4", 2, 104000, 524288, 0.30),
    ("P100", 2, 64000, 262144, 0.10),
    ("V100M16", 4, 32000, 131072, 0.04),
    ("G3", 8, 128000, 786432, 0.04),
    ("V100M32", 8, 96000, 786432, 0.03),
    ("T4", 4, 96000, 393216, 0.03),
    ("A10", 1, 128000, 1048576, 0.02),
)

#: ((num_gpu, gpu_milli), weight) - the openb default pod list's request mix.
POD_SHAPES: tuple[tuple[tuple[int, int], int], ...] = (
    ((1, 1000), 3911),
    ((0, 0), 1088),
    ((1, 810), 1078),
    ((1, 470), 750),
    ((1, 320), 328),
    ((1, 650), 253),
    ((1, 230), 140),
    ((1, 460), 128),
    ((1, 590), 75),
    ((1, 160), 74),
    ((1, 550), 72),
    ((1, 220), 62),
    ((1, 370), 47),
    ((8, 1000), 44),
    ((1, 110), 24),
    ((1, 480), 19),
    ((2, 1000), 16),
    ((4, 1000), 15),
)

#: gpu_spec values of constrained pods (openb gpuspec lists), with weights.
GPU_SPECS: tuple[tuple[str, int], ...] = (
    ("T4", 40),
    ("G2", 12),
    ("P100", 12),
    ("V100M16|V100M32", 8),
    ("P100|V100M16|V100M32", 5),
    ("G3", 4),
    ("A10|T4", 3),
)

DEFAULT_NODES = 200
DEFAULT_PODS = 3000
SPEC_SHARE = 0.10
MEAN_INTERARRIVAL_S = 60.0


def generate_nodes(count: int, *, config: DeviceConfig, seed: int = 0) -> list[SimNode]:
    """`count` nodes in the `NODE_SHAPES` proportions (every shape at least once when count allows)."""
    rng = random.Random(seed)
    shapes = [s for s in NODE_SHAPES]
    per = [max(1, round(s[4] * count)) for s in shapes]
    while sum(per) > count and max(per) > 1:
        per[per.index(max(per))] -= 1
    while sum(per) < count:
        per[0] += 1
    kinds = [s for s, k in zip(shapes, per, strict=True) for _ in range(k)][:count]
    rng.shuffle(kinds)
    return [
        gpu_node(
            f"sim-node-{i:04d}",
            cpu_milli=cpu,
            memory_mib=mem,
            gpus=cards,
            model=model,
            card_mib=DEFAULT_GPU_MODELS[model],
            config=config,
        )
        for i, (model, cards, cpu, mem, _) in enumerate(kinds)
    ]


def generate_pods(
    count: int,
    *,
    config: DeviceConfig,
    gpu_capacity: float,
    seed: int = 0,
    gpu_models: Mapping[str, int] = DEFAULT_GPU_MODELS,
) -> list[SimPod]:
    """`count` pods in the `POD_SHAPES` mix with trace times; `gpu_capacity` (cards) sizes lifetimes."""
    rng = random.Random(seed + 1)
    shapes = [s for s, _ in POD_SHAPES]
    weights = [w for _, w in POD_SHAPES]
    specs = [s for s, _ in GPU_SPECS]
    spec_w = [w for _, w in GPU_SPECS]
    mean_demand = sum(n * m / 1000 * w for (n, m), w in POD_SHAPES) / sum(weights)
    # Little's law: concurrent demand = arrival rate x lifetime x demand per pod; aim at 85 % of capacity.
    lifetime = 0.85 * gpu_capacity * MEAN_INTERARRIVAL_S / max(mean_demand, 1e-9)
    pods = []
    t = 0.0
    for i in range(count):
        num_gpu, milli = rng.choices(shapes, weights)[0]
        if num_gpu == 0:
            cpu = rng.choice((2000, 4000, 8000, 16000))
            mem = cpu // 1000 * rng.choice((2048, 4096))
        else:
            cpu = num_gpu * rng.choice((4000, 6000, 8000, 12000))
            mem = cpu // 1000 * rng.choice((2048, 4096))
        spec = rng.choices(specs, spec_w)[0].split("|") if num_gpu and rng.random() < SPEC_SHARE else []
        t += rng.expovariate(1 / MEAN_INTERARRIVAL_S)
        created = float(int(t))
        deleted = float(int(t + rng.expovariate(1 / lifetime))) + 1
        pods.append(
            openb_pod(
                f"sim-pod-{i:05d}",
                cpu_milli=cpu,
                memory_mib=mem,
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_spec=spec,
                config=config,
                gpu_models=gpu_models,
                creation_time=created,
                deletion_time=deleted,
            )
        )
    return pods


def generate_default(
    *, config: DeviceConfig, seed: int = 0, nodes: int = DEFAULT_NODES, pods: int = DEFAULT_PODS
) -> Workload:
    """The built-in cluster and workload (`nodes` nodes, `pods` pods), deterministic for `seed`."""
    node_list = generate_nodes(nodes, config=config, seed=seed)
    capacity = sum(c.devcore for n in node_list for c in n.cards) / 100
    pod_list = generate_pods(pods, config=config, gpu_capacity=capacity, seed=seed)
    return Workload(
        nodes=node_list,
        pods=pod_list,
        nodes_source=f"built-in generator (seed {seed}, {nodes} nodes)",
        pods_source=f"built-in generator (seed {seed}, {pods} pods)",
    )
