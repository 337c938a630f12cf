"""Fuzzing every decoder at the edges: whatever arrives, only our error types come out.

Each test feeds hypothesis-generated input to one decoder that reads something we do not control -
kube-scheduler's ExtenderArgs / ExtenderBindingArgs, the API server's AdmissionReview, every annotation
codec (pod device lists, node registrations in JSON and colon form, pair scores, the node lock, the
handshake, every vendor's inventory), Kubernetes quantities - and accepts a clean result or a
`hami.errors.HamiError` (which the servers turn into a 400, an `Error` reply, an unusable node or a
logged skip), nothing else. The inputs are mostly near-valid: built from the format's own tokens, so
the fuzzer spends its examples at the edges of the grammar rather than on random bytes (those get a
test too). Example counts are bounded (100 per decoder) so the module takes ~10 s of CPU.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import annotations as A
from hami import quantity
from hami.cluster import ClusterState
from hami.errors import HamiError
from hami.registration import (
    decode_node_devices_colon,
    decode_node_devices_json,
    decode_pair_scores,
    encode_node_devices_json,
)
from hami.vendors import build_vendors
from scheduler_extender.wire import parse_bind_args, parse_filter_args, parse_preempt_args
from tests.vendor_fleet import CONFIG
from webhook.app import review_body
from webhook.mutate import Mutator

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VENDORS = build_vendors(CONFIG)  # every vendor family enabled

# -- near-valid input -----------------------------------------------------------------------------

NUMBERS = ["0", "1", "-1", "100", "3000", " 7", "1e3", "0x10", "99999999999999999999999", "1.5", "", "NaN"]
WORDS = ["GPU-a", "GPU-b", "NVIDIA", "DCU", "MLU", "hami-core", "mig", "true", "false", "T", "x", "é", "\x00"]
#: Pieces of HAMi's colon/semicolon wire formats: joined at random they hit every branch of the codecs.
TOKENS = st.sampled_from([*NUMBERS, *WORDS, ",", ":", ";", " ", "_", "-"])
wire = st.lists(TOKENS, max_size=30).map("".join) | st.text(max_size=40)

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([*NUMBERS, *WORDS])
    | st.text(max_size=8)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
REGISTRATION_KEYS = ["id", "ID", "index", "count", "devmem", "Devmem", "devcore", "type", "numa", "mode", "health",
                     "custominfo", "devicepairscore"]  # fmt: skip
registration_obj = st.dictionaries(st.sampled_from(REGISTRATION_KEYS), json_value, max_size=9)
registration_json = st.lists(registration_obj, max_size=5).map(json.dumps) | json_value.map(json.dumps) | wire


def only_our_errors(fn, *args: Any, **kwargs: Any) -> Any:
    """Call `fn`; a HamiError is a clean refusal (returns None); anything else fails the test."""
    try:
        return fn(*args, **kwargs)
    except HamiError as e:
        assert str(e), f"{fn.__name__} raised {type(e).__name__} without a message"
        return None


# -- annotation codecs ----------------------------------------------------------------------------


@FUZZ
@given(value=wire, n=st.integers(0, 6))
def test_pod_device_lists(value, n):
    entries = only_our_errors(A.decode_pod_devices, value)
    if entries is not None:
        # What decodes re-encodes to a value that decodes the same (HAMi's writers' form).
        assert A.decode_pod_devices(A.encode_pod_devices(entries)) == entries
        only_our_errors(A.align_pod_devices, entries, n)
    only_our_errors(A.decode_container_devices, value)


@FUZZ
@given(value=registration_json)
def test_node_registration_json(value):
    for vendor in ("NVIDIA", "DCU"):
        devices = only_our_errors(decode_node_devices_json, value, vendor=vendor)
        if devices is not None:
            assert len({d.uuid for d in devices}) == len(devices)  # a card is never listed twice
            assert all(d.devmem > 0 for d in devices)
            assert decode_node_devices_json(encode_node_devices_json(devices), vendor=vendor) == devices


@FUZZ
@given(value=wire)
def test_node_registration_colon_form(value):
    devices = only_our_errors(decode_node_devices_colon, value, vendor="DCU")
    if devices is not None:
        assert len({d.uuid for d in devices}) == len(devices)
        assert all(d.devmem > 0 and d.count >= 0 for d in devices)


@FUZZ
@given(value=st.one_of(wire, json_value.map(json.dumps)))
def test_pair_scores_node_lock_and_handshake(value):
    only_our_errors(decode_pair_scores, value)
    lock = only_our_errors(A.decode_node_lock, value)
    if lock is not None and lock.namespace is not None:
        assert A.decode_node_lock(A.encode_node_lock(lock)) == lock
    only_our_errors(A.decode_handshake, value)


@FUZZ
@given(value=st.one_of(json_value, wire), resource=st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpumem"]))
def test_quantities(value, resource):
    only_our_errors(quantity.parse_quantity, value, resource=resource)
    only_our_errors(quantity.to_count, value, resource=resource)
    only_our_errors(quantity.to_mib, value, resource=resource)
    only_our_errors(quantity.to_percent, value, resource=resource)


# -- every vendor's inventory and pod records, through ClusterState (which must never raise) -------

NODE_KEYS = sorted({k for v in VENDORS.values() for k in (*v.node_annotation_keys, v.register_key) if k})
CAPACITY_KEYS = sorted({k for v in VENDORS.values() for k in v.node_capacity_keys})
LABEL_KEYS = sorted({k for v in VENDORS.values() for k in v.node_label_keys})
POD_KEYS = sorted(
    {
        k
        for v in VENDORS.values()
        for k in (v.allocated_key, v.to_allocate_key, *v.user_annotation_keys())
        if k
    }
    | {A.ASSIGNED_NODE, A.NODE_SCHEDULER_POLICY, A.GPU_SCHEDULER_POLICY, A.BIND_PHASE}
)
RESOURCES = sorted({r for v in VENDORS.values() for r in v.resource_names().all()})
text_value = registration_json | wire


@FUZZ
@given(
    annos=st.dictionaries(st.sampled_from(NODE_KEYS), text_value, max_size=4),
    capacity=st.dictionaries(st.sampled_from(CAPACITY_KEYS), wire, max_size=3),
    labels=st.dictionaries(st.sampled_from(LABEL_KEYS or ["x"]), wire, max_size=3),
)
def test_every_vendors_node_inventory_never_raises(annos, capacity, labels):
    state = ClusterState(CONFIG, VENDORS)
    node = {
        "metadata": {"name": "n", "annotations": annos, "labels": labels},
        "status": {"capacity": capacity, "allocatable": capacity},
    }
    reason = state.upsert_node(node)  # a malformed inventory is a reason, never an exception
    assert reason is None or (isinstance(reason, str) and reason)
    assert (state.node_unusable_reason("n") is None) == (reason is None)


container_st = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", ""])},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={"limits": st.dictionaries(st.sampled_from(RESOURCES), json_value | wire, max_size=4)},
        )
        | json_value,
        "env": st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["CUDA_DISABLE_CONTROL", "X"]), "value": wire})
        ),
    },
)


@FUZZ
@given(
    annos=st.dictionaries(st.sampled_from(POD_KEYS), text_value, max_size=5),
    containers=st.lists(container_st, max_size=3),
    init=st.lists(container_st, max_size=2),
    phase=st.sampled_from(["Pending", "Running", "Succeeded", "", None]),
)
def test_every_vendors_pod_records_and_requests_never_raise(annos, containers, init, phase):
    state = ClusterState(CONFIG, VENDORS)
    for n in ("n", "m"):
        state.upsert_node(
            {"metadata": {"name": n, "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json([])}}}
        )
    pod = {
        "metadata": {"uid": "u", "name": "p", "namespace": "default", "annotations": annos},
        "spec": {"schedulerName": "hami-scheduler", "containers": containers, "initContainers": init},
        "status": {"phase": phase},
    }
    state.upsert_pod(pod)  # a malformed record is logged and not counted
    out = state.filter(pod, ["n", "m"])  # a bad request is `error`, never an exception
    assert out.error is None or out.error.startswith("pod default/p")
    state.remove_pod("u")
    assert not any(state.usage_snapshot().values())  # whatever was counted is freed again


# -- kube-scheduler's and the API server's request bodies ----------------------------------------

pod_like = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={"uid": json_leaf, "name": json_leaf, "namespace": json_leaf, "annotations": json_value},
        )
        | json_value,
        "spec": st.fixed_dictionaries(
            {}, optional={"containers": st.lists(container_st, max_size=2) | json_value}
        )
        | json_value,
    },
)
extender_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": pod_like | json_value,
        "NodeNames": st.lists(st.sampled_from(["n", "m", ""]) | json_leaf, max_size=4) | json_value,
        "Nodes": st.fixed_dictionaries({}, optional={"items": st.lists(json_value, max_size=3)}) | json_value,
        "nodenames": json_value,
    },
)
binding_args = st.fixed_dictionaries(
    {},
    optional={k: json_leaf | json_value for k in ("PodName", "PodNamespace", "PodUID", "Node", "podname")},
)
victims_st = st.fixed_dictionaries(
    {},
    optional={
        "Pods": st.lists(
            st.fixed_dictionaries({}, optional={"UID": json_leaf}) | pod_like | json_value, max_size=3
        )
        | json_value,
        "NumPDBViolations": json_leaf,
    },
)
preempt_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": pod_like | json_value,
        "NodeNameToMetaVictims": st.dictionaries(
            st.sampled_from(["n", "m", ""]), victims_st | json_value, max_size=3
        )
        | json_value,
        "NodeNameToVictims": st.dictionaries(st.sampled_from(["n", "m"]), victims_st | json_value, max_size=3)
        | json_value,
    },
)
raw_body = st.binary(max_size=64) | st.text(max_size=64).map(str.encode)


@FUZZ
@given(
    body=st.one_of(
        extender_args.map(json.dumps).map(str.encode), json_value.map(json.dumps).map(str.encode), raw_body
    )
)
def test_extender_args(body):
    args = only_our_errors(parse_filter_args, body)
    if args is not None:
        assert args.names and all(isinstance(n, str) and n for n in args.names)
        assert isinstance(args.pod, dict)


@FUZZ
@given(
    body=st.one_of(
        binding_args.map(json.dumps).map(str.encode), json_value.map(json.dumps).map(str.encode), raw_body
    )
)
def test_extender_binding_args(body):
    args = only_our_errors(parse_bind_args, body)
    if args is not None:
        assert args.pod_name and args.node


review_st = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]) | json_leaf,
        "kind": st.just("AdmissionReview") | json_leaf,
    },
    optional={
        "request": st.fixed_dictionaries(
            {"uid": st.just("r1") | json_leaf},
            optional={
                "operation": st.sampled_from(["CREATE", "UPDATE"]) | json_leaf,
                "namespace": json_leaf,
                "object": pod_like | json_value,
                "kind": json_value,
                "dryRun": json_leaf,
            },
        )
        | json_value
    },
)
MUTATOR = Mutator(list(VENDORS.values()))


@FUZZ
@given(body=st.one_of(review_st.map(json.dumps).map(str.encode), raw_body))
def test_admission_review(body):
    status, reply, decision = review_body(MUTATOR, body)
    assert status in (200, 400)
    if status == 400:
        assert reply["error"] and decision is None
    else:
        # A bug of ours would be the generic InternalError denial: bad pods are 400 denials naming a field.
        assert decision is not None
        assert (decision.reason, decision.code) != ("InternalError", 500), decision.message
        assert reply["response"]["uid"] == json.loads(body)["request"]["uid"]


@pytest.mark.parametrize("depth", [1000, 200_000])
def test_deeply_nested_bodies_are_refused_cleanly(depth):
    body = b"[" * depth + b"]" * depth
    only_our_errors(parse_filter_args, body)
    only_our_errors(parse_bind_args, body)
    assert review_body(MUTATOR, body)[0] == 400


@FUZZ
@given(
    body=st.one_of(
        preempt_args.map(json.dumps).map(str.encode), json_value.map(json.dumps).map(str.encode), raw_body
    )
)
def test_extender_preemption_args(body):
    args = only_our_errors(parse_preempt_args, body)
    if args is not None:
        assert isinstance(args.pod, dict) and args.pod["metadata"]["uid"]
        assert all(isinstance(u, str) and u for uids in args.victims.values() for u in uids)
        assert all(isinstance(n, int) and n >= 0 for n in args.pdb_violations.values())
