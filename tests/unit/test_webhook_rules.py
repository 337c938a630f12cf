"""Pod-level rules and orchestration details that the golden files do not show directly."""

from __future__ import annotations

import json

import pytest

from hami.errors import InvalidRequest
from hami.vendors import build_vendors
from hami.vendors.base import MutationResult
from hami.vendors.nvidia import NvidiaVendor
from webhook import rules
from webhook.app import review_body
from webhook.mutate import Mutator


def _review(pod: dict, **request) -> bytes:
    req = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
           "namespace": "ml", "object": pod}  # fmt: skip
    req.update(request)
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
    ).encode()


def _gpu_pod(**annotations: str) -> dict:
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"schedulerName": "default-scheduler",
                 "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


def test_protected_keys_come_from_every_vendor() -> None:
    keys = Mutator(list(build_vendors().values())).protected_annotation_keys
    assert keys == (
        "hami.io/vgpu-node",
        "hami.io/vgpu-time",
        "hami.io/bind-phase",
        "hami.io/bind-time",
        "hami.io/vgpu-mig-allocations",
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-devices-allocated",
        "hami.io/dcu-devices-to-allocate",
        "hami.io/dcu-devices-allocated",
    )


@pytest.mark.parametrize("value", ["binpack", "spread", " spread ", ""])
def test_node_policy_valid(value: str) -> None:
    rules.check_node_policy(value)


@pytest.mark.parametrize("value", ["binpack", "numa", "binpack,numa", "spread, topology-aware", "mutex"])
def test_gpu_policy_valid(value: str) -> None:
    rules.check_gpu_policy(value)


def test_gpu_policy_duplicate() -> None:
    with pytest.raises(InvalidRequest, match="names a policy twice"):
        rules.check_gpu_policy("binpack,binpack")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("slot=1,core=1,memory=3", True),
        ("memory=3, slot=0 ,core=0", True),
        ("slot=1,core=1", False),
        ("slot=1,core=1,memory=3,slot=2", False),
        ("slot=1,core=-1,memory=3", False),
        ("slot=1,core=1.5,memory=3", False),
        ("slot=1,cores=1,memory=3", False),
        ("", False),
    ],
)
def test_scoring_weights(value: str, ok: bool) -> None:
    if ok:
        rules.check_scoring_weights(value)
    else:
        with pytest.raises(InvalidRequest, match=r"valid: exactly slot=N,core=N,memory=N"):
            rules.check_scoring_weights(value)


def test_warnings_stay_under_the_header_limit() -> None:
    mutator = Mutator(list(build_vendors().values()))
    pod = _gpu_pod(**{"nvidia.com/use-gpu-type": "A100", "nvidia.com/gpumem": "1", "hami.io/bind-time": "1"})
    _, reply, decision = review_body(mutator, _review(pod))
    assert decision is not None and len(decision.warnings) == 3
    assert all(len(w) < 120 for w in reply["response"]["warnings"])


class BrokenVendor(NvidiaVendor):
    def mutate_container(self, container: dict, *, pod: dict) -> MutationResult:
        raise RuntimeError("boom: secret internals")


def test_bug_in_a_vendor_is_a_500_denial_without_internals(caplog: pytest.LogCaptureFixture) -> None:
    status, reply, decision = review_body(Mutator([BrokenVendor()]), _review(_gpu_pod()))
    assert status == 200
    assert reply["response"] == {
        "uid": "u-1",
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": 500,
            "reason": "InternalError",
            "message": "internal error in the HAMi webhook while reviewing this pod; see the webhook logs",
        },
    }
    assert "boom" in caplog.text  # the operator sees the trace in the log, the user does not


def test_dry_run_gets_the_same_answer() -> None:
    mutator = Mutator(list(build_vendors().values()))
    _, wet, _ = review_body(mutator, _review(_gpu_pod()))
    _, dry, _ = review_body(mutator, _review(_gpu_pod(), dryRun=True))
    assert wet == dry and "patch" in wet["response"]


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"metadata": [], "spec": {}}, "metadata must be an object"),
        ({"metadata": {}, "spec": "x"}, "spec is missing or not an object"),
        ({"spec": {"containers": {"a": 1}}}, "spec.containers must be a list of containers"),
        ({"spec": {"containers": ["x"]}}, "spec.containers[0] must be an object (a container)"),
    ],
)
def test_malformed_pods_are_400_denials(pod: dict, message: str) -> None:
    _, reply, _ = review_body(Mutator(list(build_vendors().values())), _review(pod))
    assert reply["response"]["allowed"] is False
    assert reply["response"]["status"]["code"] == 400
    assert reply["response"]["status"]["message"] == message


def test_sub_resource_is_not_mutated() -> None:
    _, reply, _ = review_body(
        Mutator(list(build_vendors().values())), _review(_gpu_pod(), subResource="status")
    )
    assert reply["response"] == {"uid": "u-1", "allowed": True}


def test_ignore_annotation_on_pod_is_honoured() -> None:
    pod = _gpu_pod(**{"hami.io/webhook": "ignore", "hami.io/vgpu-node": "n1"})
    _, reply, _ = review_body(Mutator(list(build_vendors().values())), _review(pod))
    assert reply["response"] == {"uid": "u-1", "allowed": True}


def test_empty_scheduler_name_disables_takeover() -> None:
    from webhook.mutate import WebhookSettings

    mutator = Mutator(list(build_vendors().values()), WebhookSettings(scheduler_name=""))
    _, reply, decision = review_body(mutator, _review(_gpu_pod()))
    assert decision is not None
    assert [op["path"] for op in decision.patch] == [
        "/spec/containers/0/resources/limits/nvidia.com~1gpucores"
    ]
