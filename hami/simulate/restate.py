"""The openb traces restated as HAMi users write their requests (`hami simulate --restate VARIANT`).

Why: the Alibaba trace states every share of a card as `gpu_milli`, which the openb mapping
(`hami.simulate.workload.openb_pod`) turns into `nvidia.com/gpumem-percentage` and `nvidia.com/gpucores`
of the same percent. HAMi users mostly write `nvidia.com/gpumem` in MiB and no `nvidia.com/gpucores`
(the card's compute is then not reserved), and whole cards as `nvidia.com/gpu: N` alone. A policy
that packs the openb shapes well may pack those badly, so the simulator replays both.

The transformation, per pod of an openb-shaped workload (an openb CSV or the built-in generator):

- CPU-only pods, and pods that can never be placed, are kept as they are;
- a whole card (`gpu_milli` 1000, any number of cards) becomes ``nvidia.com/gpu: N`` alone: HAMi gives
  it all of each card's memory and no cores;
- a share of a card (`gpu_milli` < 1000) becomes ``nvidia.com/gpumem: MiB``, the same share of the
  smallest card the pod may run on (its `gpu_spec` models that the cluster has, else every card of
  the cluster), rounded up to a multiple of 512 MiB and at most that card's memory; and, by variant:

  ============================  ===============================================================
  variant                       what a share also states
  ============================  ===============================================================
  ``hami``                      ``nvidia.com/gpucores`` (the share, in percent) for a seeded
                                quarter of the pods (`CORES_SHARE`), nothing for the rest
  ``gpumem``                    nothing: memory only
  ``gpumem-cores``              ``nvidia.com/gpucores`` always
  ``gpumem-percentage``         no MiB: ``nvidia.com/gpumem-percentage`` (the share) only
  ============================  ===============================================================

The draw of ``hami`` is made per pod of the input, in input order, with `random.Random(seed)`: the same
seed gives the same workload, and every policy of a run replays the same one. Model constraints
(`nvidia.com/use-gputype`), CPU, memory, times and the pod's GPU demand in cards (the unit of the fill
target) are unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate.workload import SimNode, SimPod, model_of
from hami.vendors.nvidia import USE_GPUTYPE

VARIANTS = ("hami", "gpumem", "gpumem-cores", "gpumem-percentage")

#: In the ``hami`` variant, the share of the pods asking for a share of a card that also state
#: `nvidia.com/gpucores`; the others state memory only, as most HAMi users write them.
CORES_SHARE = 0.25

#: Memory requests are rounded up to a multiple of this many MiB (HAMi users write round figures).
MIB_STEP = 512


def parse_variant(value: str) -> str:
    """The `--restate` value, lower-cased; raises InvalidRequest naming the flag and the valid values."""
    v = value.strip().lower()
    if v not in VARIANTS:
        raise InvalidRequest(f"--restate: {value!r} is not a variant; valid: {', '.join(VARIANTS)}")
    return v


def share_mib(pct: int, card_mib: int) -> int:
    """MiB of a `pct` percent share of a `card_mib` card: rounded up to `MIB_STEP`, at most the card."""
    return min(card_mib, max(MIB_STEP, math.ceil(card_mib * pct / 100 / MIB_STEP) * MIB_STEP))


def _smallest_card(nodes: Sequence[SimNode], models: Sequence[str]) -> int | None:
    mibs = [c.devmem for n in nodes for c in n.cards if not models or model_of(c.type) in models]
    return min(mibs) if mibs else None


def restate(
    pods: Sequence[SimPod], nodes: Sequence[SimNode], variant: str, *, config: DeviceConfig, seed: int
) -> list[SimPod]:
    """The pods of an openb-shaped workload restated as `variant` (the module docstring). Raises
    InvalidRequest for a pod that is not openb-shaped (a Kubernetes YAML pod list): name the pod."""
    variant = parse_variant(variant)
    nv = config.nvidia
    rng = random.Random(seed)
    out = []
    for p in pods:
        containers = p.obj["spec"]["containers"]
        limits = containers[0]["resources"]["limits"] if len(containers) == 1 else None
        if (
            limits is None
            or p.obj["spec"].get("initContainers")
            or (limits and nv.resourceCountName not in limits)
        ):
            raise InvalidRequest(
                f"--restate: pod {p.name} is not an openb pod (one container asking for {nv.resourceCountName}); "
                "--restate takes openb CSV pods or the built-in generator's"
            )
        if not limits or p.unplaceable is not None:
            out.append(p)
            continue
        pct_text = limits.get(nv.resourceMemoryPercentageName)
        with_cores = rng.random() < CORES_SHARE  # drawn for every GPU pod, so a pod's draw is its own
        new = {nv.resourceCountName: limits[nv.resourceCountName]}
        if pct_text is not None:
            pct = int(pct_text)
            models = [m for m in p.obj["metadata"]["annotations"].get(USE_GPUTYPE, "").split(",") if m]
            if variant == "gpumem-percentage":
                new[nv.resourceMemoryPercentageName] = pct_text
            else:
                card = _smallest_card(nodes, models)
                if card is None:
                    out.append(p)  # no card it may use: it fails as before
                    continue
                new[nv.resourceMemoryName] = str(share_mib(pct, card))
                if variant == "gpumem-cores" or (variant == "hami" and with_cores):
                    new[nv.resourceCoreName] = pct_text
        container = {**containers[0], "resources": {**containers[0]["resources"], "limits": new}}
        out.append(replace(p, obj={**p.obj, "spec": {**p.obj["spec"], "containers": [container]}}))
    return out
