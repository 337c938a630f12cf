"""The three Kubernetes patch formats, applied to plain JSON values, for the in-memory API server.

Why here and not a library: the fake API server (`kubefakes.apiserver`) must answer patches the way
kube-apiserver does, including its error classes (a failed JSON-patch ``test`` is 422 Invalid, an
undecodable body is 400 BadRequest), and the installed package should not need test-only
dependencies. Supported:

* ``application/merge-patch+json`` — RFC 7386: maps merge recursively, ``null`` deletes, anything else
  (lists included) replaces.
* ``application/strategic-merge-patch+json`` — merge patch plus Kubernetes' list merge keys for the
  fields of Pod/Node/Event/Lease objects (containers by ``name``, conditions by ``type``, ...),
  ``$patch: delete|replace`` directives and ``$deleteFromPrimitiveList/<field>``.
  Lists of fields not in the table are replaced, as the real server does for ``atomic`` lists.
* ``application/json-patch+json`` — RFC 6902 (add, remove, replace, move, copy, test) with RFC 6901
  pointers (``~1`` is ``/``, ``~0`` is ``~``).

Every function returns a new value and never changes its arguments; errors raise `PatchError`.
"""

from __future__ import annotations

from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied; `invalid` selects 422 Invalid (True) or 400 BadRequest (False)."""

    def __init__(self, message: str, *, invalid: bool = True) -> None:
        super().__init__(message)
        self.invalid = invalid


def deep_copy(value: Any) -> Any:
    """A copy of a JSON value (dicts, lists, scalars); much faster than `copy.deepcopy` for API objects."""
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------
# RFC 7386 merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch: returns the patched copy of `target`."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = deep_copy(value)
    return result


# ---------------------------------------------------------------------------------------------------
# Strategic merge patch

# Field name -> merge key for lists of objects with patchStrategy "merge" in the core/v1, coordination
# and events types (k8s.io/api). A field not listed here is atomic: the patch's list replaces it.
_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "addresses": "type",
    "taints": "key",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "podIPs": "ip",
    "resourceClaims": "name",
    "readinessGates": "conditionType",
}
# Lists of scalars with patchStrategy "merge" (set union).
_MERGE_SCALAR_LISTS = frozenset({"finalizers"})


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch (see module docstring for the supported subset)."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    if patch.get("$patch") == "replace":
        return {k: deep_copy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch" or key == "$retainKeys" or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            sub = strategic_merge_patch(result.get(key), value)
            if sub is None:
                result.pop(key, None)
            else:
                result[key] = sub
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(result[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _MERGE_SCALAR_LISTS and isinstance(result.get(key), list):
            merged = list(result[key])
            merged.extend(v for v in value if v not in merged)
            result[key] = merged
        else:
            result[key] = _strip_directives(value)
    return result


def _merge_keyed_list(current: list, patch: list, merge_key: str) -> list:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = list(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item!r} does not contain declared merge key: {merge_key}")
        index = next(
            (
                i
                for i, cur in enumerate(out)
                if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del out[index]
        elif index is None:
            out.append(_strip_directives(item))
        else:
            out[index] = strategic_merge_patch(out[index], item)
    return out


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------
# RFC 6902 JSON patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict):
            if part not in node:
                raise PatchError(f"doc is missing path: {path}: missing value")
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(part, len(node), path)]
        else:
            raise PatchError(f"doc is missing path: {path}: missing value")
    return node


def _index(part: str, length: int, path: str, *, allow_end: bool = False) -> int:
    if part == "-" and allow_end:
        return length
    if not part.isdigit() or (len(part) > 1 and part[0] == "0"):
        raise PatchError(f"invalid index {part!r} in path {path}")
    i = int(part)
    if i > length or (i == length and not allow_end):
        raise PatchError(f"index out of range in path {path}")
    return i


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"doc is missing path: {path}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), path)]
    raise PatchError(f"doc is missing path: {path}: missing value")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), path, allow_end=True), value)
    else:
        raise PatchError(f"doc is missing path: {path}: missing value")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(last, len(parent), path))
    raise PatchError(f"doc is missing path: {path}: missing value")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch (a list of operations); returns the patched copy of `target`."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a JSON array of operations", invalid=False)
    doc = deep_copy(target)
    for i, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {i}: needs 'op' and 'path'", invalid=False)
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {i} ({kind}): missing 'value'")
        if kind == "add":
            doc = _add(doc, path, deep_copy(op["value"]))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # replace of a missing member fails (RFC 6902 §4.3)
            if _pointer(path):
                doc, _ = _remove(doc, path)
            else:
                doc = None
            doc = _add(doc, path, deep_copy(op["value"]))
        elif kind in ("move", "copy"):
            if "from" not in op:
                raise PatchError(f"operation {i} ({kind}): missing 'from'")
            if kind == "move":
                doc, value = _remove(doc, op["from"])
            else:
                value = deep_copy(_get(doc, op["from"]))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    return doc
