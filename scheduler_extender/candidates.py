"""``--filter-mode all``: kube-scheduler's own scoring counts, our policy becomes one of its scores.

HAMi's filter returns one node (it makes the final choice itself), so kube-scheduler's scoring (pod
affinity, topology spread, image locality) never counts. In this mode:

* /filter returns every candidate node the pod fits on, with the reason for every other one, and
  writes nothing (no reservation kept, no API call);
* /prioritize returns our node policy's preference for each node as kube-scheduler's extender score
  (`prioritize_scores`);
* /bind decides the exact cards on the node kube-scheduler picked, reserves them under the state's
  lock (two binds can never take the same capacity), records the placement on the pod (one patch)
  and then binds as in the single-node mode. A node that no longer fits fails the bind with the
  reason, and kube-scheduler schedules the pod again.

Score scale (k8s.io/kube-scheduler/extender/v1): ``MinExtenderPriority`` 0 .. ``MaxExtenderPriority``
10, integers; kube-scheduler multiplies each by the extender's ``weight`` and by
``MaxNodeScore / MaxExtenderPriority`` = 10, so a score of 10 at weight 1 weighs like one in-tree
plugin's full 100 points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.cluster import ClusterState, FilterOutcome
from hami.scoring import NodePolicy, choose_policies

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's ``MaxExtenderPriority`` (extender v1 API)."""

_UTILISATION_MAX = 30.0  # hami.scoring.node_score: 10 x (slots + cores + memory fractions)


def fitting_nodes(state: ClusterState, pod: Mapping[str, Any], names: Sequence[str]) -> tuple[FilterOutcome, list[str]]:
    """The nodes among `names` that `pod` fits on now, in the order sent, and the outcome.

    The outcome carries `error` / `no_devices` for a pod that cannot be placed at all or asks for no
    device, and in `failed_nodes` the reason of every node that does not fit. Nothing is reserved
    (`ClusterState.fitting_nodes`: one parse, one prefilter pass, one fit per candidate).
    """
    return state.fitting_nodes(pod, names)


def prioritize_scores(
    state: ClusterState, pod: Mapping[str, Any], names: Sequence[str]
) -> list[dict[str, Any]]:
    """kube-scheduler's HostPriorityList for `names`: ``[{"Host": name, "Score": 0..10}, ...]``.

    The pod's node policy (``hami.io/node-scheduler-policy``, else the configured default) on the
    node's utilisation before the pod (`ClusterState.node_scores`, 0..30): ``binpack`` gives the
    fullest node 10, ``spread`` the emptiest; ``fragmentation`` is scored as binpack here (its
    exact term needs the whole candidate set, which kube-scheduler's combined score does not
    keep). Integers only (kube-scheduler refuses a non-integer score), nodes we do not know get 0.
    """
    annos = (pod.get("metadata") or {}).get("annotations") or {}
    sched = state.config.scheduler
    policy = choose_policies(annos, node_default=sched.nodeSchedulerPolicy, card_default=sched.gpuSchedulerPolicy)
    util = state.node_scores(names)
    out = []
    for name in names:
        u = util.get(name)
        if u is None:
            score = 0
        else:
            fullness = min(1.0, max(0.0, u / _UTILISATION_MAX))
            pref = 1.0 - fullness if policy.node is NodePolicy.SPREAD else fullness
            score = int(round(MAX_EXTENDER_PRIORITY * pref))
        out.append({"Host": name, "Score": score})
    return out


__all__ = ["MAX_EXTENDER_PRIORITY", "fitting_nodes", "prioritize_scores"]
