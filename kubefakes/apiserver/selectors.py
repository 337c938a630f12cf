"""Kubernetes label and field selectors, parsed once and matched against plain-dict objects.

Used by the in-memory API server for list and watch. Grammar as in k8s.io/apimachinery
``labels.Parse`` and ``fields.ParseSelector``:

* labels: comma-separated requirements ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
  ``k`` (exists), ``!k`` (does not exist). ``!=`` and ``notin`` also match objects without the label.
* fields: ``path=v``, ``path==v``, ``path!=v``; a missing field reads as the empty string, so
  ``spec.nodeName=`` selects unscheduled pods.

Parse errors raise `SelectorError` with the real server's wording.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector string that does not parse (the API server answers 400 BadRequest)."""


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        present = self.key in labels
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # "!=" / "notin"


_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_.\-/]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_.\-/]+)\s*(==|=|!=)\s*([A-Za-z0-9_.\-]*)\s*$")


def _split_top_level(selector: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_label_selector(selector: str | None) -> tuple[LabelRequirement, ...]:
    """Parse a label selector; an empty or None selector matches everything (empty tuple)."""
    if not selector or not selector.strip():
        return ()
    reqs = []
    for part in _split_top_level(selector):
        m = _EQ_RE.match(part)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(LabelRequirement(m.group(1), op, frozenset({m.group(3)})))
            continue
        m = _SET_RE.match(part)
        if m and not (m.group(1) and m.group(3)):
            if m.group(3):
                values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
                reqs.append(LabelRequirement(m.group(2), m.group(3), values))
            else:
                reqs.append(LabelRequirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
            continue
        raise SelectorError(f"unable to parse requirement: {part.strip()!r}: invalid label selector")
    return tuple(reqs)


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: str
    negate: bool
    value: str


def parse_field_selector(selector: str | None, supported: frozenset[str]) -> tuple[FieldRequirement, ...]:
    """Parse a field selector against the resource's supported field labels (else SelectorError)."""
    if not selector or not selector.strip():
        return ()
    reqs = []
    for part in selector.split(","):
        if not part.strip():
            continue
        if "!=" in part:
            path, value = part.split("!=", 1)
            negate = True
        elif "==" in part:
            path, value = part.split("==", 1)
            negate = False
        elif "=" in part:
            path, value = part.split("=", 1)
            negate = False
        else:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{part}'")
        path = path.strip()
        if path not in supported:
            raise SelectorError(f"field label not supported: {path}")
        reqs.append(FieldRequirement(path, negate, value.strip()))
    return tuple(reqs)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path; missing -> ""; booleans as "true"/"false"."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
        if node is None:
            return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def compile_matcher(
    labels: tuple[LabelRequirement, ...], fields: tuple[FieldRequirement, ...]
) -> Callable[[Mapping[str, Any]], bool] | None:
    """A predicate over objects, or None when the selectors select everything."""
    if not labels and not fields:
        return None

    def match(obj: Mapping[str, Any]) -> bool:
        if labels:
            obj_labels = (obj.get("metadata") or {}).get("labels") or {}
            if not all(r.matches(obj_labels) for r in labels):
                return False
        for f in fields:
            if (field_value(obj, f.path) == f.value) == f.negate:
                return False
        return True

    return match
