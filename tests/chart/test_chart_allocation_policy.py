"""The chart's guard of allocation annotations after creation: a ValidatingAdmissionPolicy where the
cluster serves the API (Kubernetes 1.30 v1, 1.28+ v1beta1 when enabled), else the webhook on UPDATE;
both know the scheduler's and the device plugin's service accounts. The policy's CEL is evaluated with
cel-python against every allocation key the webhook protects (all vendors on)."""

from __future__ import annotations

import pytest

from hami.vendors import build_vendors
from tests.chart.render import NAMESPACE, render
from tests.vendor_fleet import CONFIG
from webhook.mutate import Mutator

V1 = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
V1BETA1 = "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy"
WRITERS = [
    f"system:serviceaccount:{NAMESPACE}:hami-scheduler",
    f"system:serviceaccount:{NAMESPACE}:hami-device-plugin",
]


@pytest.mark.parametrize(
    ("kube", "apis", "policy", "operations"),
    [
        ("v1.27.0", [], None, ["CREATE", "UPDATE"]),
        ("v1.29.0", [], None, ["CREATE", "UPDATE"]),
        ("v1.29.0", [V1BETA1], "admissionregistration.k8s.io/v1beta1", ["CREATE"]),
        ("v1.30.0", [V1], "admissionregistration.k8s.io/v1", ["CREATE"]),
        ("v1.33.0", [V1, V1BETA1], "admissionregistration.k8s.io/v1", ["CREATE"]),
        ("v1.27.0", [V1BETA1], None, ["CREATE", "UPDATE"]),  # not before 1.28, whatever is served
    ],
)
def test_policy_where_the_api_server_has_it_else_the_webhook(kube, apis, policy, operations) -> None:
    r = render({}, kube_version=kube, api_versions=apis)
    hooks = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    # Before 1.28 a second, best-effort entry reviews the namespaces not opted in: both guard UPDATE.
    assert [h["name"] for h in hooks] == (
        ["vgpu.hami.io"] if kube >= "v1.28" else ["vgpu.hami.io", "vgpu-best-effort.hami.io"]
    )
    assert [h["rules"][0]["operations"] for h in hooks] == [operations] * len(hooks)
    found = r.find("ValidatingAdmissionPolicy")
    # The allocation guard, and the device plugin's token held to its own node.
    assert [(p["metadata"]["name"], p["apiVersion"]) for p in found] == (
        [("hami-allocations", policy), ("hami-node-agents", policy)] if policy else []
    )
    for name in ("hami-allocations", "hami-node-agents") if policy else ():
        binding = r.one("ValidatingAdmissionPolicyBinding", name)
        assert binding["apiVersion"] == policy
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    args = r.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--allocation-writers={','.join(WRITERS)}" in args


def test_extra_writers_reach_both_guards() -> None:
    vendor_sa = "system:serviceaccount:kube-system:ascend-device-plugin"
    r = render(
        {"scheduler": {"admissionWebhook": {"allocationWriters": [vendor_sa]}}},
        kube_version="v1.30.0",
        api_versions=[V1],
    )
    [cond] = r.one("ValidatingAdmissionPolicy", "hami-allocations")["spec"]["matchConditions"]
    for user in (*WRITERS, vendor_sa):
        assert f'"{user}"' in cond["expression"]
    args = r.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--allocation-writers={','.join([*WRITERS, vendor_sa])}" in args


def _evaluate(expression: str, new: dict, old: dict, user: str = "alice") -> bool:
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(expression))
    activation = {"object": new, "oldObject": old, "request": {"userInfo": {"username": user}}}
    return bool(program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()}))


def test_the_policy_guards_every_key_the_webhook_protects() -> None:
    spec = render({}, kube_version="v1.30.0", api_versions=[V1]).one(
        "ValidatingAdmissionPolicy", "hami-allocations"
    )["spec"]
    assert spec["failurePolicy"] == "Fail"
    # pods/status too: it writes labels and annotations (kube-apiserver keeps only the spec there).
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods", "pods/status"],
        }
    ]
    [cond] = spec["matchConditions"]
    assert not _evaluate(cond["expression"], {}, {}, WRITERS[0])
    assert not _evaluate(cond["expression"], {}, {}, WRITERS[1])
    assert _evaluate(cond["expression"], {}, {}, "alice")
    changed, removed = (v["expression"] for v in spec["validations"])

    def allowed(new: dict, old: dict) -> bool:
        pod = lambda annos: {"metadata": {"annotations": annos} if annos is not None else {}}  # noqa: E731
        return _evaluate(changed, pod(new), pod(old)) and _evaluate(removed, pod(new), pod(old))

    keys = Mutator(list(build_vendors(CONFIG).values())).protected_annotation_keys
    assert len(keys) > 40
    for key in keys:
        assert not allowed({key: "forged"}, {}), f"{key}: adding it passes the policy"
        assert not allowed({key: "1"}, {key: "2"}), f"{key}: changing it passes the policy"
        assert not allowed({}, {key: "2"}), f"{key}: removing it passes the policy"
        assert not allowed(None, {key: "2"}), f"{key}: removing every annotation passes the policy"
        assert allowed({key: "2", "team": "b"}, {key: "2", "team": "a"}), key
    # The owner's own annotations (and HAMi's user-set policy annotations) stay the owner's.
    assert allowed({"hami.io/node-scheduler-policy": "spread"}, {"hami.io/node-scheduler-policy": "binpack"})
    assert allowed({"hami.io/gpu-scheduler-policy": "binpack"}, None)


def test_the_webhook_is_not_called_for_hamis_own_updates() -> None:
    # Kubernetes 1.28/1.29 without the policy API: the webhook guards UPDATE, but the scheduler's and the
    # device plugin's updates (the filter's and Allocate's patches) need no call.
    [hook] = render({}, kube_version="v1.29.0").one("MutatingWebhookConfiguration", "hami-webhook")[
        "webhooks"
    ]
    by_name = {c["name"]: c["expression"] for c in hook["matchConditions"]}
    expr = by_name["not-an-update-by-hami"]

    def sent(operation: str, user: str) -> bool:
        import celpy

        env = celpy.Environment()
        activation = {"request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": user}})}
        return bool(env.program(env.compile(expr)).evaluate(activation))

    assert not sent("UPDATE", WRITERS[0]) and not sent("UPDATE", WRITERS[1])
    assert sent("UPDATE", "alice") and sent("CREATE", WRITERS[0])
    # pods/status is guarded too, and an UPDATE is sent only when it changes an allocation annotation:
    # the kubelet's status updates never wait for the webhook.
    assert hook["rules"][1] == {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                "resources": ["pods/status"], "scope": "Namespaced"}  # fmt: skip
    changes = by_name["updates-that-change-allocation-annotations"]

    def changed(new: dict | None, old: dict | None, operation: str = "UPDATE") -> bool:
        import celpy

        pod = lambda a: {"metadata": {} if a is None else {"annotations": a}}  # noqa: E731
        activation = {"object": pod(new), "oldObject": pod(old), "request": {"operation": operation}}
        env = celpy.Environment()
        return bool(
            env.program(env.compile(changes)).evaluate(
                {k: celpy.json_to_cel(v) for k, v in activation.items()}
            )
        )

    alloc, team = "hami.io/vgpu-devices-allocated", {"team": "a"}
    assert (
        not changed({alloc: "x", **team}, {alloc: "x"}) and not changed(team, {}) and not changed(None, None)
    )
    assert changed({alloc: "y"}, {alloc: "x"}) and changed({alloc: "x"}, None) and changed(team, {alloc: "x"})
    assert changed(None, {alloc: "x"}) and changed({"hami.io/bind-phase": "allocating"}, {})
    assert changed(team, team, operation="CREATE")


ASCEND_PLUGIN = f"system:serviceaccount:{NAMESPACE}:hami-ascend"


@pytest.mark.parametrize(("kube", "apis"), [("v1.27.0", []), ("v1.29.0", []), ("v1.30.0", [V1])])
def test_ascend_device_plugin_is_a_writer_when_ascend_is_on(kube, apis) -> None:
    # HAMi's ascend-device-plugin (service account hami-ascend, its manifests' name) patches bind-phase and
    # hami.io/<chip>-devices-to-allocate at Allocate: refused, the NPU container would never start.
    for enabled in (True, False):
        r = render({"devices": {"ascend": {"enabled": enabled}}}, kube_version=kube, api_versions=apis)
        args = r.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
        writers = [*WRITERS, ASCEND_PLUGIN] if enabled else WRITERS
        assert f"--allocation-writers={','.join(writers)}" in args, (enabled, args)
        [hook] = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"][:1]
        conditions = {c["name"]: c["expression"] for c in hook.get("matchConditions", [])}
        exempt = conditions.get("not-an-update-by-hami")
        if exempt:
            assert (f'"{ASCEND_PLUGIN}"' in exempt) is enabled
        # the allocation policy exempts the writers (hami-node-agents holds the device plugin to its node)
        for policy in r.find("ValidatingAdmissionPolicy"):
            if policy["metadata"]["name"] != "hami-allocations":
                continue
            [cond] = policy["spec"]["matchConditions"]
            assert _evaluate(cond["expression"], {}, {}, ASCEND_PLUGIN) is not enabled


def test_ascend_writer_follows_the_release_namespace() -> None:
    r = render({"devices": {"ascend": {"enabled": True}}}, namespace="npu", kube_version="v1.27.0")
    args = r.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.startswith("--allocation-writers=") and a.endswith(",system:serviceaccount:npu:hami-ascend")
               for a in args), args  # fmt: skip
