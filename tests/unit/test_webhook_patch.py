"""The JSON Patch diff: exact operations for the pod shapes the webhook produces, and a property test
that applying the diff with a real RFC 6902 implementation (`jsonpatch`) gives the target."""

from __future__ import annotations

import copy

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.patch import diff, pointer


def test_pointer_escapes_slash_and_tilde() -> None:
    assert (
        pointer("metadata", "annotations", "hami.io/vgpu-node") == "/metadata/annotations/hami.io~1vgpu-node"
    )
    assert pointer("a~b", 0) == "/a~0b/0"


def test_add_annotations_map_when_missing() -> None:
    # k8s-protocols §4.5 item 5: adding under a missing parent fails, so the whole map is added.
    before = {"metadata": {"name": "p"}}
    after = {"metadata": {"name": "p", "annotations": {"a/b": "1"}}}
    assert diff(before, after) == [{"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}}]


def test_env_append_uses_dash_and_env_creation_adds_list() -> None:
    before = {"c": [{"env": [{"name": "A", "value": "1"}]}, {"name": "x"}]}
    after = copy.deepcopy(before)
    after["c"][0]["env"].append({"name": "B", "value": "2"})
    after["c"][1]["env"] = [{"name": "B", "value": "2"}]
    assert diff(before, after) == [
        {"op": "add", "path": "/c/0/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "add", "path": "/c/1/env", "value": [{"name": "B", "value": "2"}]},
    ]


def test_remove_replace_and_type_change() -> None:
    before = {"a": {"x": 1, "y": 2}, "b": "1", "c": [1, 2, 3]}
    after = {"a": {"y": 3}, "b": 1, "c": [3]}
    assert diff(before, after) == [
        {"op": "remove", "path": "/a/x"},
        {"op": "replace", "path": "/a/y", "value": 3},
        {"op": "replace", "path": "/b", "value": 1},
        {"op": "replace", "path": "/c", "value": [3]},
    ]
    assert diff(before, copy.deepcopy(before)) == []


def test_bool_and_int_are_different_json() -> None:
    assert diff({"a": True}, {"a": 1}) == [{"op": "replace", "path": "/a", "value": 1}]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab/~", max_size=3),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text("ab/~", max_size=3), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)  # enough to hit every shape; keeps the suite fast on 2 cores
@given(st.dictionaries(st.text("ab/~", max_size=3), json_values, max_size=4),
       st.dictionaries(st.text("ab/~", max_size=3), json_values, max_size=4))  # fmt: skip
def test_diff_applies_to_target(before: dict, after: dict) -> None:
    ops = diff(before, after)
    assert jsonpatch.apply_patch(before, ops) == after
    if before == after:
        assert ops == []
