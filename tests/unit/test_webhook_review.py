"""AdmissionReview codec: version echo, uid echo, patch/patchType pairing, and rejection of bodies we
cannot answer (k8s-protocols §4.1, §4.2, §4.5)."""

from __future__ import annotations

import base64
import json

import pytest

from webhook.review import ReviewError, allow, decode_review, deny, encode_patch, encode_response


def _review(version: str = "admission.k8s.io/v1", **request) -> str:
    body = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE"}
    body.update(request)
    return json.dumps({"apiVersion": version, "kind": "AdmissionReview", "request": body})


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_decode_both_versions(version: str) -> None:
    req = decode_review(_review(version, namespace="ml", object={"spec": {}}, dryRun=True))
    assert (req.api_version, req.uid, req.operation, req.namespace) == (version, "u-1", "CREATE", "ml")
    assert req.object == {"spec": {}}
    assert req.dry_run is True
    assert req.name == ""  # generateName pods arrive without a name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body is not JSON"),
        (b"[1, 2]", "body must be a JSON object (an AdmissionReview), got list"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}),
            "kind must be AdmissionReview, got 'Pod'",
        ),
        (
            _review("admission.k8s.io/v2"),
            "apiVersion 'admission.k8s.io/v2' is not supported; valid: admission.k8s.io/v1, admission.k8s.io/v1beta1",
        ),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request is missing"),
        (_review(uid=""), "request.uid is missing or empty"),
        (_review(object=[1]), "request.object must be an object, got list"),
        (_review(operation=5), "request.operation must be a string, got int"),
        (b"\xff\xfe", "body is not JSON"),
    ],
)
def test_decode_rejects(body: bytes | str, message: str) -> None:
    with pytest.raises(ReviewError) as err:
        decode_review(body)
    assert str(err.value).startswith(message)


def test_encode_allow_without_change_has_no_patch_keys() -> None:
    reply = encode_response("admission.k8s.io/v1beta1", "u-9", allow())
    assert reply == {
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "response": {"uid": "u-9", "allowed": True},
    }


def test_encode_patch_is_base64_of_compact_json() -> None:
    ops = [{"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}]
    reply = encode_response("admission.k8s.io/v1", "u", allow(patch=ops, warnings=["w"]))
    resp = reply["response"]
    assert resp["patchType"] == "JSONPatch"
    assert (
        base64.b64decode(resp["patch"])
        == b'[{"op":"add","path":"/spec/schedulerName","value":"hami-scheduler"}]'
    )
    assert resp["warnings"] == ["w"]
    # The worked example of k8s-protocols §4.3 encodes to the documented bytes.
    example = [{"op": "add", "path": "/metadata/annotations/example.com~1vgpu-assigned", "value": "pending"}]
    assert (
        encode_patch(example)
        == base64.b64encode(json.dumps(example, separators=(",", ":")).encode()).decode()
    )


def test_encode_denial_status_and_code_floor() -> None:
    reply = encode_response("admission.k8s.io/v1", "u", deny("no", code=200, reason="BadRequest"))
    assert reply["response"] == {
        "uid": "u",
        "allowed": False,
        "status": {"status": "Failure", "code": 400, "reason": "BadRequest", "message": "no"},
    }
    assert "patch" not in reply["response"]
