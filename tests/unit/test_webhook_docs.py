"""docs/webhook.md is executable: its example pod goes through the webhook and comes out exactly as
documented (patch, resulting pod, warnings), and its recommended MutatingWebhookConfiguration has
the settings the page explains."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import jsonpatch
import pytest
import yaml

from hami.vendors import build_vendors
from tests.ci import require_module
from webhook.app import make_app, review_body
from webhook.mutate import Mutator

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhook.md"


def block(marker: str) -> str:
    """The fenced code block right after ``<!-- marker -->`` in docs/webhook.md."""
    m = re.search(rf"<!-- {re.escape(marker)} -->\n```[a-z]*\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"marker {marker!r} not found in {DOC}"
    return m.group(1)


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_documented_example_round_trip(version: str) -> None:
    pod = yaml.safe_load(block("webhook-example: input"))
    review = {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "ml", "name": "resnet-train", "object": pod},
    }  # fmt: skip
    status, reply, _ = review_body(Mutator(list(build_vendors().values())), json.dumps(review).encode())
    assert status == 200
    assert reply["apiVersion"] == version
    response = reply["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops == json.loads(block("webhook-example: patch"))
    assert jsonpatch.apply_patch(pod, ops) == yaml.safe_load(block("webhook-example: output"))
    assert response["warnings"] == block("webhook-example: warnings").strip().splitlines()


def test_recommended_configuration() -> None:
    config = yaml.safe_load(block("webhook-config"))
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert 1 <= hook["timeoutSeconds"] <= 30
    assert hook["rules"] == [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]  # fmt: skip
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    assert ignore in hook["namespaceSelector"]["matchExpressions"]
    assert ignore in hook["objectSelector"]["matchExpressions"]
    # The path the configuration points at is one the app serves.
    paths = {r.resource.canonical for r in make_app(Mutator([])).router.routes() if r.method == "POST"}
    assert hook["clientConfig"]["service"]["path"] in paths
    expression = hook["matchConditions"][0]["expression"]
    for prefix in ("'nvidia.com/'", "'hygon.com/'", "'hami.io/'", "initContainers"):
        assert prefix in expression


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "webhook"


def test_match_conditions_select_every_pod_the_webhook_acts_on() -> None:
    """Evaluate the documented CEL `matchConditions` on every golden pod: each pod the webhook would
    patch, deny or warn about is sent to it; pods it leaves alone are not (the point of scoping Fail)."""
    celpy = require_module("celpy", "cel-python (test extras) evaluates the matchConditions")
    hook = yaml.safe_load(block("webhook-config"))["webhooks"][0]
    env = celpy.Environment()
    program = env.program(env.compile(hook["matchConditions"][0]["expression"]))
    selected, skipped = set(), set()
    for path in sorted(GOLDEN.glob("*.json")):
        golden = json.loads(path.read_text())
        request = golden["request"]["request"]
        pod = request["object"]
        if (
            request["operation"] != "CREATE"
            or request["kind"]["kind"] != "Pod"
            or not pod["spec"]["containers"]
        ):
            continue  # never sent (rules: CREATE pods) or refused by API validation (no containers)
        labels = pod["metadata"].get("labels", {})
        if labels.get("hami.io/webhook") == "ignore":
            continue  # the objectSelector already skips it
        response = golden["response"]["response"]
        acts = "patch" in response or not response["allowed"] or "warnings" in response
        matched = bool(program.evaluate({"object": celpy.json_to_cel(pod)}))
        assert matched or not acts, f"{path.stem}: the webhook acts on this pod but matchConditions skip it"
        (selected if matched else skipped).add(path.stem)
    assert {"no-device-pod", "privileged-without-devices"} <= skipped
    assert {"init-container-gpu", "native-sidecar-gpu", "strip-on-no-device-pod", "dcu-pod"} <= selected
