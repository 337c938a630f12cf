"""Pod-level rules and orchestration details that the golden files do not show directly."""

from __future__ import annotations

import base64
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
    # NVIDIA and Hygon: the other vendors' keys are checked in tests/unit/test_vendor_webhook.py.
    vendors = build_vendors()
    keys = Mutator([vendors["NVIDIA"], vendors["DCU"]]).protected_annotation_keys
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
    ids=["metadata-list", "spec-str", "containers-mapping", "container-str"],
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


def test_ignore_annotation_on_pod_does_not_bypass_the_stripping() -> None:
    # QA finding: the annotation form was honoured like the label, so any user could keep forged
    # allocation annotations (and skip the takeover) by adding it; selectors (and HAMi) only know the label.
    pod = _gpu_pod(**{"hami.io/webhook": "ignore", "hami.io/vgpu-node": "n1"})
    _, reply, decision = review_body(Mutator(list(build_vendors().values())), _review(pod))
    assert reply["response"]["allowed"] is True
    assert decision is not None
    assert decision.patch == [
        {"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-node"},
        {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"},
        {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores", "value": "100"},
    ]
    assert reply["response"]["warnings"] == [
        "annotation hami.io/webhook: ignore has no effect; to opt a pod out, set it as a label",
        "removed annotation hami.io/vgpu-node: allocation annotations are written by HAMi only",
    ]


def test_empty_scheduler_name_disables_takeover() -> None:
    from webhook.mutate import WebhookSettings

    mutator = Mutator(list(build_vendors().values()), WebhookSettings(scheduler_name=""))
    _, reply, decision = review_body(mutator, _review(_gpu_pod()))
    assert decision is not None
    assert [op["path"] for op in decision.patch] == [
        "/spec/containers/0/resources/limits/nvidia.com~1gpucores"
    ]


def _answer(pod: dict) -> dict:
    status, reply, _ = review_body(Mutator(list(build_vendors().values())), _review(pod))
    assert status == 200
    return reply["response"]


@pytest.mark.parametrize(
    ("container", "message"),
    [
        ({"name": "main", "resources": "1"}, "spec.containers[0].resources must be an object, got str"),
        ({"name": "main", "resources": {"limits": ["nvidia.com/gpu"]}},
         "spec.containers[0].resources.limits must be an object (resource name -> quantity), got list"),
        ({"name": "main", "resources": {"requests": "x"}},
         "spec.containers[0].resources.requests must be an object (resource name -> quantity), got str"),
        ({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}},
          "env": [1]}, "spec.containers[0].env[0] must be an object with name and value"),
        ({"name": "main", "env": "A=1"}, "spec.containers[0].env must be a list of {name, value} objects"),
        ({"name": "main", "securityContext": True}, "spec.containers[0].securityContext must be an object, got bool"),
    ],
    ids=["resources-str", "limits-list", "requests-str", "env-item-int", "env-str", "security-context-bool"],
)  # fmt: skip
def test_malformed_container_members_are_a_400_denial_naming_the_field(container: dict, message: str) -> None:
    # QA regression: these reached the vendor hook and came back as "internal error" (code 500).
    response = _answer({"metadata": {"name": "p"}, "spec": {"containers": [container]}})
    assert response["allowed"] is False
    assert response["status"] == {
        "status": "Failure",
        "code": 400,
        "reason": "BadRequest",
        "message": message,
    }


def test_pod_without_metadata_gets_no_empty_metadata_patch() -> None:
    # QA regression: the stripping step added {"op": "add", "path": "/metadata", "value": {}} to every
    # pod sent without metadata, so a pod that needed no change was answered with a patch.
    response = _answer({"spec": {"containers": [{"name": "web", "image": "nginx"}]}})
    assert response == {"uid": "u-1", "allowed": True}


def test_gpumem_in_the_api_servers_canonical_form_is_admitted_as_mib() -> None:
    # The API server re-serialises every quantity in canonical form before calling webhooks
    # (apimachinery Quantity: "the exponent (or suffix) is as large as possible"), so a user's
    # `nvidia.com/gpumem: 3000` arrives as "3k". HAMi reads 3000 MiB (AsInt64). QA finding: it was
    # denied as "0.003 MiB" (fixed in hami/quantity.py); this keeps the webhook path honest.
    pod = _gpu_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "3k"
    response = _answer(pod)
    assert response["allowed"] is True, response.get("status")
    ops = {op["path"]: op.get("value") for op in json.loads(base64.b64decode(response["patch"]))}
    assert ops["/spec/schedulerName"] == "hami-scheduler"
    assert ops.get("/spec/containers/0/resources/limits/nvidia.com~1gpumem", "3000") == "3000"
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpucores" not in ops  # memory given: shared


def test_annotation_warnings_are_capped() -> None:
    # QA regression: 20000 made-up hami.io/ keys (about 600 KB, under the API server's request limit)
    # cost 3.8 s of fuzzy matching on the event loop and a 1.5 MB reply with 20000 warnings.
    pod = _gpu_pod(**{f"hami.io/vgpu-nod{i}": "x" for i in range(5000)})
    warnings = _answer(pod)["warnings"]
    assert len(warnings) == rules.MAX_ANNOTATION_WARNINGS + 1 == 11
    assert warnings[0] == "unknown annotation hami.io/vgpu-nod0 (did you mean hami.io/vgpu-node?)"
    assert warnings[-1] == "4990 more annotation warning(s) not shown"
