"""Typed views of raw API objects: members of the wrong JSON type read as absent, never as a value
that breaks a dict key or a message further in."""

import pytest

from hami import objects

POD = {
    "metadata": {
        "name": "p",
        "namespace": "ml",
        "uid": "u-1",
        "annotations": {"a": "1"},
        "labels": {"l": "2"},
    },
    "spec": {"schedulerName": "hami-scheduler", "nodeName": "n1"},
    "status": {"phase": "Running"},
}


def test_well_formed_pod():
    assert (objects.name(POD), objects.namespace(POD), objects.uid(POD), objects.ref(POD)) == (
        "p",
        "ml",
        "u-1",
        "ml/p",
    )
    assert (objects.phase(POD), objects.scheduler_name(POD), objects.node_name(POD)) == (
        "Running",
        "hami-scheduler",
        "n1",
    )
    assert objects.annotations(POD) == {"a": "1"} and objects.labels(POD) == {"l": "2"}


@pytest.mark.parametrize(
    "junk", [None, 5, [1], {"a": None}, True], ids=["null", "int", "list", "object", "bool"]
)
def test_members_of_the_wrong_type_read_as_absent(junk):
    pod = {"metadata": {"name": junk, "namespace": junk, "uid": junk, "annotations": junk, "labels": junk},
           "spec": {"schedulerName": junk, "nodeName": junk}, "status": {"phase": junk}}  # fmt: skip
    assert (objects.name(pod), objects.namespace(pod), objects.uid(pod), objects.ref(pod)) == (
        "",
        "default",
        "",
        "default/",
    )
    assert (objects.phase(pod), objects.scheduler_name(pod), objects.node_name(pod)) == (None, None, None)
    assert objects.annotations(pod) == (junk if isinstance(junk, dict) else {})
    hash(objects.uid(pod))  # usable as a dict key


@pytest.mark.parametrize("junk", [None, 5, "x", [1]], ids=["null", "int", "str", "list"])
def test_sections_of_the_wrong_type_read_as_empty(junk):
    obj = {"metadata": junk, "spec": junk, "status": junk}
    assert (objects.meta(obj), objects.spec(obj), objects.status(obj)) == ({}, {}, {})
    assert (objects.name(obj), objects.uid(obj), objects.phase(obj)) == ("", "", None)
