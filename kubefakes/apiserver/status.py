"""Errors as the real API server writes them: a ``Status`` body with message, reason, details, code."""

from __future__ import annotations

from typing import Any

from kubefakes.apiserver.resources import (
    ResourceInfo,
)

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``meta/v1 Status`` with the real server's key order (``status: Failure``)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason if reason is not None else _REASONS.get(code, ""),
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


class ApiStatusError(Exception):
    """An error answer: HTTP `code` with a Status body (raised by the store, rendered by the server)."""

    def __init__(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body
        self.headers = headers or {}


def status_details(info: ResourceInfo, name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if info.group:
        d["group"] = info.group
    d["kind"] = info.plural
    d.update(extra)
    return d


def not_found(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        404, status_body(404, f'{info.qualified} "{name}" not found', details=status_details(info, name))
    )


def already_exists(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        status_body(
            409,
            f'{info.qualified} "{name}" already exists',
            reason="AlreadyExists",
            details=status_details(info, name),
        ),
    )


def conflict(info: ResourceInfo, name: str, why: str, *, qualified: str | None = None) -> ApiStatusError:
    q = qualified or info.qualified
    details = {"name": name, **({"group": info.group} if info.group else {}), "kind": q.split(".")[0]}
    return ApiStatusError(
        409, status_body(409, f'Operation cannot be fulfilled on {q} "{name}": {why}', details=details)
    )


def check_uid_precondition(info: ResourceInfo, name: str, uid: str | None, cur_meta: dict[str, Any]) -> None:
    """Raise the real server's 409 when a UID precondition (binding target, delete options) is stale."""
    if uid and uid != cur_meta.get("uid"):
        raise conflict(
            info,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}",
        )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(info: ResourceInfo, name: str, causes: list[tuple[str, str, str]]) -> ApiStatusError:
    """422: `causes` are (field, reason e.g. FieldValueRequired, text like 'Required value: ...')."""
    text = ", ".join(f"{f}: {m}" for f, _, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    details: dict[str, Any] = {"name": name}
    if info.group:
        details["group"] = info.group
    details["kind"] = info.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return ApiStatusError(
        422, status_body(422, f'{info.qualified_kind} "{name}" is invalid: {text}', details=details)
    )


def method_not_allowed() -> ApiStatusError:
    return ApiStatusError(
        405, status_body(405, "the server does not allow this method on the requested resource")
    )


def bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, status_body(400, message))
