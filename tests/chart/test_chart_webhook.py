"""The webhook's reach and its failure mode, as the API server evaluates the rendered configuration:
which namespaces and pods are sent to it, under which failurePolicy, on Kubernetes before and after
1.28 (matchConditions), and that the chart's defaults are the ones docs/webhook.md recommends."""

from __future__ import annotations

import re

import helm_python
import pytest
import yaml

from tests.chart.render import NAMESPACE, ROOT, render

DOC = (ROOT / "docs" / "webhook.md").read_text()


def entries(kube_version: str = "v1.30.0", values: dict | None = None) -> list[dict]:
    r = render(values or {}, kube_version=kube_version)
    return r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels AND matchExpressions) against `labels`."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def policies(
    webhooks: list[dict], namespace: str, ns_labels: dict | None = None, pod_labels=None
) -> list[str]:
    """failurePolicy of every entry a pod (labels `pod_labels`) in `namespace` (labels `ns_labels`) is
    sent to; the API server adds kubernetes.io/metadata.name to every namespace."""
    ns = {"kubernetes.io/metadata.name": namespace, **(ns_labels or {})}
    return [
        w["failurePolicy"]
        for w in webhooks
        if selects(w["namespaceSelector"], ns) and selects(w.get("objectSelector") or {}, pod_labels or {})
    ]


def test_the_defaults_are_the_documented_recommendation() -> None:
    r = render()
    [w] = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    block = DOC.split("<!-- webhook-config -->")[1].split("```yaml")[1].split("```")[0]
    [doc] = yaml.safe_load(block)["webhooks"]
    for key in ("failurePolicy", "reinvocationPolicy", "timeoutSeconds", "sideEffects", "matchPolicy"):
        assert w[key] == doc[key], key
    assert (w["failurePolicy"], w["reinvocationPolicy"], w["timeoutSeconds"]) == ("Fail", "IfNeeded", 5)
    deploy = r.one("Deployment", "hami-webhook")
    assert deploy["spec"]["replicas"] >= 2
    pdb = r.one("PodDisruptionBudget", "hami-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("kube_version", ["v1.28.0", "v1.33.0"])
def test_with_match_conditions_device_pods_are_guarded_everywhere_but_the_excluded(kube_version: str) -> None:
    webhooks = entries(kube_version)
    assert [w["name"] for w in webhooks] == ["vgpu.hami.io"] and "matchConditions" in webhooks[0]
    assert policies(webhooks, "team-a") == ["Fail"]
    for namespace, labels in (
        ("kube-system", {}),
        (NAMESPACE, {}),
        ("team-b", {"hami.io/webhook": "ignore"}),
    ):
        assert policies(webhooks, namespace, labels) == [], namespace
    # A pod's own opt-out label is no selector term (its owner sets it): the matchConditions send such
    # a pod only while it carries an allocation annotation, which the webhook removes or guards.
    assert policies(webhooks, "team-a", pod_labels={"hami.io/webhook": "ignore"}) == ["Fail"]
    by_name = {c["name"]: c["expression"] for c in webhooks[0]["matchConditions"]}
    expr = by_name["opted-out-pods-only-with-allocation-annotations"]

    def sent(labels: dict, annotations: dict, old: dict | None = None) -> bool:
        import celpy

        pod = lambda a: {"metadata": {"labels": labels, "annotations": a}}  # noqa: E731
        env = celpy.Environment()
        activation = {
            "object": pod(annotations),
            "oldObject": None if old is None else pod(old),
            "request": {"operation": "CREATE" if old is None else "UPDATE"},
        }
        return bool(
            env.program(env.compile(expr)).evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})
        )

    ignore = {"hami.io/webhook": "ignore"}
    assert not sent(ignore, {}) and not sent(ignore, {"nvidia.com/use-gputype": "A100"})
    assert sent(ignore, {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1,0:;"})
    assert sent(ignore, {"hami.io/vgpu-node": "n1"}) and sent(ignore, {"hami.io/vgpu-mig-allocations": "[]"})
    assert sent(ignore, {}, old={"hami.io/vgpu-devices-allocated": "x"}), "a removal on UPDATE"
    assert sent({}, {}) and sent({"hami.io/webhook": "enabled"}, {}), (
        "other pods: the other conditions decide"
    )


@pytest.mark.parametrize(
    ("kube_version", "values"),
    [("v1.23.0", {}), ("v1.27.9", {}), ("v1.30.0", {"scheduler": {"admissionWebhook": {"matchConditions": False}}})],
    ids=["1.23", "1.27", "1.30-without-matchConditions"],
)  # fmt: skip
def test_without_match_conditions_fail_holds_only_in_opted_in_namespaces(
    kube_version: str, values: dict
) -> None:
    # Every pod of every other namespace reaches the webhook here: a cluster-wide Fail would block them
    # all (the webhook's own recovery included) while it is down.
    webhooks = entries(kube_version, values)
    assert all("matchConditions" not in w for w in webhooks)
    assert policies(webhooks, "gpu-team", {"hami.io/webhook": "enabled"}) == ["Fail"]
    assert policies(webhooks, "web") == ["Ignore"]
    for namespace, labels in (("kube-system", {}), (NAMESPACE, {}), ("kube-system", {"hami.io/webhook": "enabled"}),
                              ("web", {"hami.io/webhook": "ignore"})):  # fmt: skip
        assert policies(webhooks, namespace, labels) == [], (namespace, labels)
    names = [w["name"] for w in webhooks]
    assert len(names) == len(set(names)) and all(
        re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+){2,}", n) for n in names
    )


def test_ignore_before_1_28_is_one_entry_for_every_namespace() -> None:
    webhooks = entries(
        "v1.27.0", {"scheduler": {"admissionWebhook": {"failurePolicy": "Ignore", "replicas": 1}}}
    )
    assert [w["failurePolicy"] for w in webhooks] == ["Ignore"]
    assert policies(webhooks, "web") == ["Ignore"] and policies(webhooks, "kube-system") == []


@pytest.mark.parametrize("kube_version", ["v1.27.0", "v1.30.0"])
def test_hami_selectors_narrow_the_webhook_and_never_widen_it(kube_version: str) -> None:
    # HAMi's values keys scheduler.admissionWebhook.namespaceSelector / objectSelector.
    values = {"scheduler": {"admissionWebhook": {
        "namespaceSelector": {"matchLabels": {"team": "ml"},
                              "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                    "values": ["kube-system", "ml", NAMESPACE]}]},
        "objectSelector": {"matchExpressions": [{"key": "hami.io/enable", "operator": "In", "values": ["true"]}]},
    }}}  # fmt: skip
    webhooks = entries(kube_version, values)
    enabled = {"team": "ml", "hami.io/webhook": "enabled"} if kube_version < "v1.28" else {"team": "ml"}
    pod = {"hami.io/enable": "true"}
    assert policies(webhooks, "ml", enabled, pod) == ["Fail"]
    assert policies(webhooks, "ml", enabled, {}) == [], "objectSelector narrows"
    assert policies(webhooks, "ml", {k: v for k, v in enabled.items() if k != "team"}, pod) == [], (
        "matchLabels"
    )
    for namespace in ("kube-system", NAMESPACE):
        assert policies(webhooks, namespace, enabled, pod) == [], namespace


def test_hamis_empty_selectors_and_whitelist_render() -> None:
    # HAMi's values.yaml leaves these keys with every child commented out, i.e. null.
    values = {"scheduler": {"admissionWebhook": {
        "whitelistNamespaces": None, "namespaceSelector": {"matchLabels": None, "matchExpressions": []},
        "objectSelector": {"matchExpressions": []},
    }}}  # fmt: skip
    [w] = entries("v1.30.0", values)
    assert "matchLabels" not in w["namespaceSelector"]


def test_fail_with_a_single_replica_is_refused() -> None:
    with pytest.raises(
        helm_python.HelmRenderError, match=r"scheduler\.admissionWebhook\.replicas: 1 is too few"
    ):
        render({"scheduler": {"admissionWebhook": {"replicas": 1}}})
    r = render({"scheduler": {"admissionWebhook": {"replicas": 1, "failurePolicy": "Ignore"}}})
    assert r.one("Deployment", "hami-webhook")["spec"]["replicas"] == 1
    assert r.find("PodDisruptionBudget", "hami-webhook") == []


def test_the_docs_say_which_pods_bypass_the_webhook_and_what_happens_to_them() -> None:
    section = DOC.split("## Which pods can bypass the webhook")[1].split("\n## ")[0]
    for words in ("kube-system", "hami.io/webhook: ignore", "hami.io/webhook: enabled", "whitelistNamespaces",
                  "matchConditions", "default-scheduler", "failurePolicy: Fail"):  # fmt: skip
        assert words in section, words


@pytest.mark.parametrize(
    ("kube_version", "values", "told"),
    [
        ("v1.27.0", {}, True),
        ("v1.23.0", {}, True),
        ("v1.30.0", {"scheduler": {"admissionWebhook": {"matchConditions": False}}}, True),
        ("v1.28.0", {}, False),
        ("v1.27.0", {"scheduler": {"admissionWebhook": {"failurePolicy": "Ignore"}}}, False),
    ],
    ids=["1.27", "1.23", "no-match-conditions", "1.28", "ignore"],
)
def test_notes_say_where_fail_holds_without_match_conditions(kube_version, values, told) -> None:
    # Before 1.28 an install that follows only NOTES would get Ignore everywhere without being told.
    notes = render(values, kube_version=kube_version).notes
    label = "kubectl label namespace <namespace running GPU pods> hami.io/webhook=enabled"
    assert (label in notes) is told, notes
    if told:
        assert "failurePolicy Fail" in notes and "Ignore" in notes


def test_notes_name_the_ascend_node_label_when_ascend_is_on() -> None:
    assert "ascend=on" not in render().notes
    notes = render({"devices": {"ascend": {"enabled": True}}}, kube_version="v1.27.0").notes
    assert "kubectl label node <npu-node> ascend=on" in notes
    assert "hami-ascend" in notes and "ascend-device-plugin" in notes
