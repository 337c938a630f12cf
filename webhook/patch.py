"""RFC 6902 JSON Patch computed as the difference between the pod as sent and the pod as mutated.

Rules mutate a deep copy of the pod like ordinary Python data; the patch is derived afterwards, as HAMi
does, so no rule ever has to know JSON Pointer syntax or the "add into a missing parent" trap
(k8s-protocols §4.5 item 5): a new member is always added at the deepest existing parent, with its whole
value. The patch is minimal enough to read in a golden file and exact: applying it to the original with
any conforming implementation yields the mutated pod (tests apply it with `jsonpatch`).
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def escape(token: str) -> str:
    """JSON Pointer escaping of one reference token: ``~`` -> ``~0``, ``/`` -> ``~1`` (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """A JSON Pointer from unescaped tokens, e.g. ``pointer("metadata", "annotations", "hami.io/x")``."""
    return "".join("/" + escape(str(t)) for t in tokens)


def diff(original: Any, mutated: Any, path: str = "") -> list[Op]:
    """Operations that turn `original` into `mutated` (JSON values as `json.loads` returns them).

    Objects are compared member by member: members gone from `mutated` are `remove`d (in the original's
    order), changed members are diffed recursively, new members are `add`ed (in the mutated order).
    Lists of equal length are diffed element by element; a list that only grew at the end gets
    ``add .../-`` per new element (the env-append case); any other list change replaces the list.
    A type change at `path` replaces the value. Returns [] when the values are equal.
    """
    if isinstance(original, dict) and isinstance(mutated, dict):
        ops: list[Op] = []
        for key in original:
            if key not in mutated:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in original.items():
            if key in mutated:
                other = mutated[key]
                # Most of a pod is unchanged: the C-level == rules those members out cheaply; _same
                # then only guards against Python's True == 1.
                if value == other and _same(value, other):
                    continue
                ops.extend(diff(value, other, f"{path}/{escape(key)}"))
        for key, value in mutated.items():
            if key not in original:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
        return ops
    if _is_list(original) and _is_list(mutated):
        if len(original) == len(mutated):
            ops = []
            for i, (a, b) in enumerate(zip(original, mutated, strict=True)):
                ops.extend(diff(a, b, f"{path}/{i}"))
            return ops
        if len(mutated) > len(original) and _same(list(mutated[: len(original)]), list(original)):
            return [{"op": "add", "path": f"{path}/-", "value": v} for v in mutated[len(original) :]]
    if _same(original, mutated):
        return []
    if path == "":
        # The document root itself: RFC 6902 allows replacing "" but not every library does; never
        # reached for pods (both sides are objects), kept total for callers diffing scalars.
        return [{"op": "replace", "path": "", "value": mutated}]
    return [{"op": "replace", "path": path, "value": mutated}]


def _same(a: Any, b: Any) -> bool:
    """JSON equality: like ``==`` but ``true`` is not ``1`` (Python says True == 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _is_list(value: Any) -> bool:
    # Concrete types only: the values come from json.loads, and abc isinstance checks are slow.
    return isinstance(value, list | tuple)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars), several times faster than copy.deepcopy."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value
