"""hami.quota: the pod-alone demand follows the pod rule, so the webhook and the scheduler agree."""

from __future__ import annotations

import json

from hami.cluster import ClusterState
from hami.model import PERCENTAGE_UNSET, ContainerRequest
from hami.pods import ContainerKind, ContainerSpec
from hami.quota import QuotaState, containers_demand
from hami.vendors import build_vendors
from tests.builders import cards, ctr, node, pod

QUOTA = {
    "metadata": {"namespace": "ml", "name": "gpu"},
    "spec": {"hard": {"limits.nvidia.com/gpucores": "150"}},
}


def nv(mem: int, cores: int, nums: int = 1) -> tuple[ContainerRequest, ...]:
    return (ContainerRequest("NVIDIA", nums, mem, PERCENTAGE_UNSET, cores),)


def test_demand_counts_sidecars_beside_the_init_containers_after_them():
    demand = containers_demand(
        [
            ContainerSpec("proxy", ContainerKind.SIDECAR, nv(1000, 30)),
            ContainerSpec("setup", ContainerKind.INIT, nv(2000, 50)),
            ContainerSpec("main", ContainerKind.APP, nv(500, 10, nums=2)),
        ]
    )
    # max(sidecar + app = 1000 + 2x500, sidecar + setup = 1000 + 2000); cores max(30 + 20, 30 + 50).
    assert demand == {"NVIDIA": (3000, 80)}
    # An init container before the sidecar runs alone.
    demand = containers_demand(
        [
            ContainerSpec("setup", ContainerKind.INIT, nv(2000, 50)),
            ContainerSpec("proxy", ContainerKind.SIDECAR, nv(1000, 30)),
            ContainerSpec("main", ContainerKind.APP, ()),
        ]
    )
    assert demand == {"NVIDIA": (2000, 50)}


def _sidecar_then_init_pod() -> dict:
    side = ctr("proxy", gpu=1, mem=1000, cores=100) | {"restartPolicy": "Always"}
    return pod(ctr("main", gpu=1, mem=1000), init=[side, ctr("setup", gpu=1, mem=1000, cores=100)], ns="ml")


def test_webhook_denies_a_pod_the_scheduler_can_never_place_under_its_quota():
    from webhook.app import review_body
    from webhook.mutate import Mutator

    # The scheduler: `setup` runs beside `proxy`, so the pod holds 200 % of cores at least, over 150.
    cs = ClusterState()
    cs.upsert_quota(QUOTA)
    cs.upsert_node(node("n", cards("n", 2)))
    out = cs.filter(_sidecar_then_init_pod(), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "2/2 ResourceQuotaNotFit"}
    # The webhook refuses it at the door instead of leaving it Pending.
    vendors = build_vendors()
    quota = QuotaState(vendors)
    quota.upsert_quota(QUOTA)
    body = json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                    "namespace": "ml", "object": _sidecar_then_init_pod()},
    }).encode()  # fmt: skip
    _, reply, _ = review_body(Mutator(list(vendors.values()), quota=quota), body)
    assert reply["response"]["allowed"] is False
    assert reply["response"]["status"]["message"] == (
        "exceeding resource quota: namespace ml: the pod needs 200 % of nvidia.com/gpucores but the "
        "ResourceQuota limit limits.nvidia.com/gpucores is 150"
    )
