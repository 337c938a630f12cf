"""Golden AdmissionReviews: every admission rule, in admission.k8s.io/v1 and v1beta1.

Each tests/golden/webhook/<case>.json holds a v1 request as the API server sends it, the settings the
webhook runs with (device config, flags, cached quota and namespace labels), and the exact reply. The
same request in v1beta1 must get the same reply in v1beta1. The decoded `patch` and the `pod_after` it
produces are stored next to the reply so a reviewer reads the mutation, and the patch is applied with
`jsonpatch` (a real RFC 6902 implementation) to check it yields exactly `pod_after`.

Regenerate after a deliberate change with `UPDATE_GOLDEN=1 python -m pytest tests/unit/test_webhook_golden.py`
and review the diff of the JSON files.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from hami.config import load_config
from hami.quota import QuotaState
from hami.vendors import build_vendors
from webhook.app import review_body
from webhook.mutate import Mutator, WebhookSettings

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "webhook"
CASES = sorted(p.stem for p in GOLDEN.glob("*.json"))
VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


class DictNamespaces:
    """NamespaceView over {namespace: labels}."""

    def __init__(self, data: Mapping[str, Mapping[str, str]]) -> None:
        self.data = data

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.data.get(namespace)


def mutator_for(settings: Mapping[str, Any]) -> Mutator:
    """The Mutator a golden case runs with (defaults: HAMi chart config, scheduler hami-scheduler)."""
    config = load_config(settings.get("config"))
    vendors = build_vendors(config)
    quota = None
    if "resource_quotas" in settings:
        quota = QuotaState(vendors)
        for obj in settings["resource_quotas"]:
            quota.upsert_quota(obj)
    takeover = settings.get("takeover_schedulers", ["default-scheduler"])
    return Mutator(
        list(vendors.values()),
        WebhookSettings(
            scheduler_name=settings.get("scheduler_name", "hami-scheduler"),
            takeover_schedulers=frozenset(["", *takeover]) if takeover else frozenset(),
            allocation_writers=frozenset(settings.get("allocation_writers", ())),
        ),
        quota=quota,
        namespaces=DictNamespaces(settings["namespace_labels"]) if "namespace_labels" in settings else None,
    )


def load(case: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{case}.json").read_text())


def with_version(doc: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["apiVersion"] = version
    return out


def test_every_rule_has_golden_cases() -> None:
    rules = {load(c)["rule"] for c in CASES}
    assert rules >= {
        "defaults", "quantities", "priority", "runtimeClassName", "schedulerName", "security", "ignore",
        "operations", "kinds", "denials", "policies", "quota", "warnings", "no-op", "vendors",
    }  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, version: str) -> None:
    golden = load(case)
    mutator = mutator_for(golden["settings"])
    request = with_version(golden["request"], version)
    status, reply, _ = review_body(mutator, json.dumps(request).encode())
    assert status == 200
    if UPDATE and version == VERSIONS[0]:
        golden["response"] = reply
        resp = reply["response"]
        golden.pop("patch", None)
        golden.pop("pod_after", None)
        if "patch" in resp:
            golden["patch"] = json.loads(base64.b64decode(resp["patch"]))
            golden["pod_after"] = jsonpatch.apply_patch(
                golden["request"]["request"]["object"], golden["patch"]
            )
        (GOLDEN / f"{case}.json").write_text(json.dumps(golden, indent=2) + "\n")
        return
    assert reply == with_version(golden["response"], version)
    resp = reply["response"]
    assert resp["uid"] == request["request"]["uid"]
    if "patch" in resp:
        ops = json.loads(base64.b64decode(resp["patch"]))
        assert ops == golden["patch"]
        assert resp["patchType"] == "JSONPatch"
        pod = request["request"]["object"]
        assert jsonpatch.apply_patch(pod, ops) == golden["pod_after"]
        # Reinvocation (reinvocationPolicy: IfNeeded) of the mutated pod must not change it again.
        again = copy.deepcopy(request)
        again["request"]["object"] = golden["pod_after"]
        _, reply2, _ = review_body(mutator, json.dumps(again).encode())
        assert "patch" not in reply2["response"], reply2
    else:
        assert "pod_after" not in golden and "patchType" not in resp
