"""Validate rendered objects against one Kubernetes version's OpenAPI schemas, strictly.

The schemas are kubernetes-validate's (the `-strict` variants: unknown fields are errors). That package
ships schemas from 1.25 on, so 1.23 and 1.24 are checked against 1.25's: the APIs the chart uses
(apps/v1, batch/v1, policy/v1, rbac/v1, admissionregistration/v1, node.k8s.io/v1, core/v1) have the
same fields there. The one newer field the chart uses, the webhook's `matchConditions`, is rendered only
for 1.28 and later (tested separately), so 1.25's schema is as strict as 1.23's would be.
`kubernetes_validate.validate` re-reads the schema files on every call; this module caches one
validator per (version, kind) so checking a few hundred objects stays well under a second.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

OLDEST_SCHEMA = "1.25"


def schema_version(kube_version: str) -> str:
    """'v1.23.0' -> '1.25' (the oldest shipped), 'v1.30.0' -> '1.30'."""
    mm = ".".join(kube_version.lstrip("v").split(".")[:2])
    major, minor = (int(x) for x in mm.split("."))
    return OLDEST_SCHEMA if (major, minor) < (1, 25) else mm


@functools.cache
def _validator(version: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    base = f"kubernetes-json-schema/v{version}.0-local-strict"
    try:
        schema = kv_utils.schema_contents(f"{base}/{kind.lower()}-{group}.json", version)
    except FileNotFoundError:
        return None
    defs = kv_utils.schema_contents(f"{base}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict[str, Any], kube_version: str) -> bool:
    """Validate `obj` for `kube_version`. True when checked, False when the version has no schema for
    its kind (custom resources: ServiceMonitor, cert-manager's). Raises AssertionError naming the
    object, the failing path and the schema's complaint."""
    version = schema_version(kube_version)
    v = _validator(version, obj["kind"], obj["apiVersion"])
    if v is None:
        return False
    try:
        v.validate(obj)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise AssertionError(
            f"{obj['kind']}/{obj['metadata'].get('name')} (schema {version}) at {where or '/'}: {e.message}"
        ) from None
    return True


# Custom resources have no schema in kubernetes-validate. The fields the chart may set, per the CRDs
# (prometheus-operator monitoring.coreos.com/v1 ServiceMonitor, cert-manager.io/v1 Issuer and
# Certificate): a typo in one of them is caught here instead of by the API server at install time.
CUSTOM_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "spec": {
            "selector": {"matchLabels": None, "matchExpressions": None},
            "namespaceSelector": {"any": None, "matchNames": None},
            "endpoints": [{"port": None, "path": None, "interval": None, "scheme": None, "scrapeTimeout": None,
                           "honorLabels": None, "relabelings": None, "metricRelabelings": None}],
            "jobLabel": None, "targetLabels": None, "podTargetLabels": None, "sampleLimit": None,
        }
    },
    ("cert-manager.io/v1", "Issuer"): {"spec": {"selfSigned": {"crlDistributionPoints": None}, "ca": None}},
    ("cert-manager.io/v1", "Certificate"): {
        "spec": {
            "secretName": None, "dnsNames": None, "ipAddresses": None, "duration": None, "renewBefore": None,
            "commonName": None, "isCA": None, "usages": None, "privateKey": None,
            "issuerRef": {"name": None, "kind": None, "group": None},
        }
    },
}  # fmt: skip


def _check_fields(value: Any, allowed: Any, where: str) -> None:
    if allowed is None:
        return
    if isinstance(allowed, list):
        assert isinstance(value, list), f"{where}: want a list"
        for i, item in enumerate(value):
            _check_fields(item, allowed[0], f"{where}/{i}")
        return
    assert isinstance(value, dict), f"{where}: want a mapping"
    unknown = set(value) - set(allowed)
    assert not unknown, f"{where}: unknown fields {sorted(unknown)}; known: {sorted(allowed)}"
    for key, sub in value.items():
        _check_fields(sub, allowed[key], f"{where}/{key}")


def validate_custom(obj: dict[str, Any]) -> None:
    """Check a custom resource's spec against CUSTOM_FIELDS. AssertionError names the path."""
    allowed = CUSTOM_FIELDS.get((obj["apiVersion"], obj["kind"]))
    assert allowed is not None, f"{obj['apiVersion']} {obj['kind']}: no schema and no field list"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}, sorted(obj)
    _check_fields({"spec": obj["spec"]}, allowed, f"{obj['kind']}/{obj['metadata']['name']}")
