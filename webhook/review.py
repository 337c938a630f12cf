"""The AdmissionReview codec: bytes from the API server in, a decision out, the reply in the same version.

The API server is strict about the reply (k8s-protocols §4.1, §4.5): the same `apiVersion` as the
request, `kind: AdmissionReview`, `response.uid` equal to `request.uid`, `allowed` always present, and
`patch` with `patchType` together or not at all. All of that is decided here, in one place, so the
rules code never builds wire JSON. A body we cannot answer in kind (not JSON, not an AdmissionReview,
an unknown version, no `uid`) is a `ReviewError`, which the HTTP layer turns into a 400: the API server
then applies the webhook's `failurePolicy`, which is the only sensible outcome for a request we cannot
even attribute.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.errors import InvalidRequest

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
SUPPORTED_VERSIONS = (ADMISSION_V1, ADMISSION_V1BETA1)
PATCH_TYPE_JSONPATCH = "JSONPatch"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class ReviewError(InvalidRequest):
    """The body is not an AdmissionReview request we can answer; the message says which field is wrong."""


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of `AdmissionReview.request` the webhook uses (k8s-protocols §4.2).

    `object` is the pod as sent (a dict in the API's JSON form), None for DELETE; `old_object` the pod
    before an UPDATE; `kind` is the request's group/version/kind dict; `name` is empty on CREATE with
    `generateName`; `username`/`groups` are ``userInfo``'s (who asks, as the API server authenticated it).
    """

    api_version: str
    uid: str
    operation: str
    kind: Mapping[str, str]
    resource: Mapping[str, str]
    sub_resource: str
    namespace: str
    name: str
    object: dict[str, Any] | None
    dry_run: bool
    old_object: dict[str, Any] | None = None
    username: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """What the webhook decided for one review.

    `patch` is a list of RFC 6902 operations (empty = no change); `message`/`code`/`reason` only matter
    when `allowed` is False; `warnings` go back on allow and deny alike (HTTP `Warning` headers).
    """

    allowed: bool
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()
    message: str = ""
    code: int = 403
    reason: str = "Forbidden"
    audit_annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def result(self) -> str:
        """Metric label: `denied`, `patched` or `allowed` (allowed without change)."""
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"


def allow(*, patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()) -> Decision:
    """An allowing decision, with the patch (possibly empty) and warnings."""
    return Decision(allowed=True, patch=list(patch), warnings=list(warnings))


def deny(
    message: str, *, code: int = 403, reason: str = "Forbidden", warnings: Sequence[str] = ()
) -> Decision:
    """A denial; `message` is what the user sees after `admission webhook "..." denied the request: `."""
    return Decision(allowed=False, message=message, code=code, reason=reason, warnings=list(warnings))


_JSON_TYPES = {dict: "an object", str: "a string", bool: "a boolean"}


def _field(obj: Mapping[str, Any], key: str, typ: type, where: str, *, default: Any = None) -> Any:
    """`obj[key]` when it has JSON type `typ`, `default` when absent or null; else ReviewError."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, typ):
        raise ReviewError(f"{where}.{key} must be {_JSON_TYPES[typ]}, got {type(value).__name__}")
    return value


def decode_review(body: bytes | str) -> AdmissionRequest:
    """Parse an AdmissionReview request body (admission.k8s.io/v1 or v1beta1).

    Returns the request; raises `ReviewError` naming the field when the body is not JSON, not an object,
    not `kind: AdmissionReview`, of an unsupported `apiVersion` (valid: admission.k8s.io/v1,
    admission.k8s.io/v1beta1), nested too deeply to parse, or lacks `request` / `request.uid`.
    The pod itself is not validated here.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(f"body is not JSON: {exc}") from None
    except RecursionError:
        # Nesting deeper than Python's recursion limit: no pod is shaped like that.
        raise ReviewError("body is not a usable AdmissionReview: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise ReviewError(f"body must be a JSON object (an AdmissionReview), got {type(doc).__name__}")
    kind = doc.get("kind")
    if kind != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, got {kind!r}")
    version = doc.get("apiVersion")
    if version not in SUPPORTED_VERSIONS:
        raise ReviewError(f"apiVersion {version!r} is not supported; valid: {', '.join(SUPPORTED_VERSIONS)}")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing or empty")
    operation = _field(request, "operation", str, "request", default="")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise ReviewError(f"request.object must be an object, got {type(obj).__name__}")
    old = request.get("oldObject")
    if old is not None and not isinstance(old, dict):
        raise ReviewError(f"request.oldObject must be an object, got {type(old).__name__}")
    user = _field(request, "userInfo", dict, "request", default={})
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups must be a list of strings")
    return AdmissionRequest(
        api_version=version,
        uid=uid,
        operation=operation,
        kind=_field(request, "kind", dict, "request", default={}),
        resource=_field(request, "resource", dict, "request", default={}),
        sub_resource=_field(request, "subResource", str, "request", default=""),
        namespace=_field(request, "namespace", str, "request", default=""),
        name=_field(request, "name", str, "request", default=""),
        object=obj,
        dry_run=bool(_field(request, "dryRun", bool, "request", default=False)),
        old_object=old,
        username=_field(user, "username", str, "request.userInfo", default=""),
        groups=tuple(groups),
    )


def encode_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    """Base64 (standard, padded) of the compact JSON array of operations, as the API server expects."""
    return base64.b64encode(json.dumps(list(patch), separators=(",", ":")).encode()).decode()


def encode_response(api_version: str, uid: str, decision: Decision) -> dict[str, Any]:
    """The reply AdmissionReview as a dict, in the request's version, echoing `uid`.

    `patch`/`patchType` appear only when the patch is non-empty; `status` only on denial, with a code
    of at least 400 (the API server raises lower codes anyway); `warnings` only when there are some.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.allowed:
        if decision.patch:
            response["patchType"] = PATCH_TYPE_JSONPATCH
            response["patch"] = encode_patch(decision.patch)
    else:
        response["status"] = {
            "status": "Failure",
            "code": max(decision.code, 400),
            "reason": decision.reason,
            "message": decision.message,
        }
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.audit_annotations:
        response["auditAnnotations"] = dict(decision.audit_annotations)
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
