"""The subset of ObjectMeta validation the project's objects can trip (names, labels, annotations).

Messages and causes are the real server's (apimachinery validation), so clients see the same 422.
"""

from __future__ import annotations

import re
from typing import Any

from kubefakes.apiserver.resources import (
    ResourceInfo,
)
from kubefakes.apiserver.status import (
    bad_request,
    invalid,
)

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_MAX_ANNOTATIONS_BYTES = 256 * 1024


def _key_errors(path: str, key: str) -> list[tuple[str, str, str]]:
    name = key
    if "/" in key:
        prefix, name = key.split("/", 1)
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            return [(path, "FieldValueInvalid", f'Invalid value: "{key}": prefix part {_SUBDOMAIN_MSG}')]
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return [
            (
                path,
                "FieldValueInvalid",
                f"Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' "
                "or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
                "'my.name',  or '123-abc', regex used for validation is "
                "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') and must be no more than 63 characters",
            )
        ]
    return []


def _validate(info: ResourceInfo, obj: dict[str, Any]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request(
            f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '
            "metadata must be an object"
        )
    name = meta.get("name") or ""
    causes: list[tuple[str, str, str]] = []
    if not name:
        causes.append(
            ("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")
        )
    else:
        pattern = _DNS1123_LABEL if info.plural == "namespaces" else _DNS1123_SUBDOMAIN
        limit = 63 if info.plural == "namespaces" else 253
        if len(name) > limit or not pattern.match(name):
            msg = _LABEL_MSG if info.plural == "namespaces" else _SUBDOMAIN_MSG
            causes.append(("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {msg}'))
    for section in ("labels", "annotations"):
        values = meta.get(section)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise bad_request(
                f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: json: '
                f"cannot unmarshal into Go struct field ObjectMeta.metadata.{section} of type string"
            )
        for k, v in values.items():
            causes.extend(_key_errors(f"metadata.{section}", k))
            if section == "labels" and (len(v) > 63 or not _LABEL_VALUE.match(v)):
                causes.append(
                    (
                        "metadata.labels",
                        "FieldValueInvalid",
                        f'Invalid value: "{v}": a valid label must be an empty string or consist of '
                        "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                        "alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
                        "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                    )
                )
        if section == "annotations":
            size = sum(len(k) + len(v) for k, v in values.items())
            if size > _MAX_ANNOTATIONS_BYTES:
                causes.append(
                    (
                        "metadata.annotations",
                        "FieldValueTooLong",
                        f"Too long: must have at most {_MAX_ANNOTATIONS_BYTES} bytes",
                    )
                )
    if causes:
        raise invalid(info, name, causes)
