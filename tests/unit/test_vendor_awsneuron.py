"""AWS Neuron: capacity inventory with core bitmasks, contiguous devices, core indexes in AWS_NEURON_IDS."""

import pytest

from hami.errors import InvalidRequest
from hami.vendors.awsneuron import AWSNeuronVendor
from tests.vendor_fleet import container, fleet, node, place, pod, state

AWS = AWSNeuronVendor()
NODE = fleet()["AWSNeuron"]


def test_inventory():
    devs = AWS.node_devices(NODE)
    assert len(devs) == 16 and devs[15].uuid == "trn-a-AWSNeuron-15"
    assert {(d.count, d.devmem, d.devcore, d.instance_type) for d in devs} == {(2, 0, 3, "trn1.32xlarge")}


@pytest.mark.parametrize(("limits", "expected"), [
    ({"aws.amazon.com/neuron": 4}, (4, 2)),
    ({"aws.amazon.com/neuroncore": 1}, (1, 1)),
    ({"aws.amazon.com/neuroncore": 4}, (2, 2)),
], ids=["devices", "one-core", "cores-as-devices"])  # fmt: skip
def test_requests(limits, expected):
    r = AWS.container_request(container("c", limits))
    assert (r.nums, r.coresreq) == expected


@pytest.mark.parametrize(("limits", "message"), [
    ({"aws.amazon.com/neuroncore": 3}, "aws.amazon.com/neuroncore must be 1 or a multiple of 2, got 3"),
    ({"aws.amazon.com/neuron": 0}, "aws.amazon.com/neuron must be greater than 0"),
    ({"aws.amazon.com/neuron": "1500m"}, "aws.amazon.com/neuron must be an integer"),
], ids=["odd-cores", "zero", "fraction"])  # fmt: skip
def test_rejections(limits, message):
    with pytest.raises(InvalidRequest, match=message):
        AWS.mutate_container(container("c", limits), pod={})


def test_one_core_worked_example_then_the_complement_core():
    st = state(NODE)
    annos = {"aws.amazon.com/use-neuron-uuid": "trn-a-AWSNeuron-15"}
    a = st.filter(
        pod("p", container("c", {"aws.amazon.com/neuroncore": 1}), annotations=annos),
        ["trn-a"],
        now=1_700_000_000,
    ).annotations
    assert a["hami.io/aws-neuron-devices-allocated"] == "trn-a-AWSNeuron-15,AWSNeuron,0,1:;"
    assert (a["AWS_NEURON_IDS"], a["NEURON_RESOURCE_TYPE"], a["NEURON_ALLOCATED"]) == (
        "30",
        "aws.amazon.com/neuroncore",
        "false",
    )
    assert (a["NEURON_ALLOC_TIME"], a["aws.amazon.com/predicate-node"]) == ("1700000000000000000", "trn-a")
    b = st.filter(
        pod("q", container("c", {"aws.amazon.com/neuroncore": 1}), annotations=annos), ["trn-a"]
    ).annotations
    assert b["hami.io/aws-neuron-devices-allocated"] == "trn-a-AWSNeuron-15,AWSNeuron,0,2:;"
    assert b["AWS_NEURON_IDS"] == "31"
    full = st.filter(pod("r", container("c", {"aws.amazon.com/neuroncore": 1}), annotations=annos), ["trn-a"])
    assert full.failed_nodes["trn-a"] == "1/16 CardTimeSlicingExhausted, 15/16 CardUuidMismatch"


def test_four_devices_are_an_aligned_run():
    a = place(pod("p", container("c", {"aws.amazon.com/neuron": 4})), NODE).annotations
    assert a["AWS_NEURON_IDS"] == "0,1,2,3"
    assert a["hami.io/aws-neuron-devices-allocated"] == (
        "trn-a-AWSNeuron-0,AWSNeuron,0,3:trn-a-AWSNeuron-1,AWSNeuron,0,3:trn-a-AWSNeuron-2,AWSNeuron,0,3:"
        "trn-a-AWSNeuron-3,AWSNeuron,0,3:;"
    )
    assert "NEURON_RESOURCE_TYPE" not in a


def test_runs_aligned_on_trn_anywhere_on_inf():
    st = state(NODE)
    st.filter(pod("one", container("c", {"aws.amazon.com/neuron": 1})), ["trn-a"])  # takes device 0
    a = st.filter(pod("two", container("c", {"aws.amazon.com/neuron": 2})), ["trn-a"]).annotations
    assert a["AWS_NEURON_IDS"] == "2,3"  # aligned to 2 on trn
    inf = node(
        "inf-a",
        capacity={"aws.amazon.com/neuron": "4", "aws.amazon.com/neuroncore": "8"},
        labels={"node.kubernetes.io/instance-type": "inf2.24xlarge"},
    )
    st2 = state(inf)
    st2.filter(pod("one", container("c", {"aws.amazon.com/neuron": 1})), ["inf-a"])
    assert (
        st2.filter(pod("three", container("c", {"aws.amazon.com/neuron": 3})), ["inf-a"]).annotations[
            "AWS_NEURON_IDS"
        ]
        == "1,2,3"
    )
    assert (
        st2.filter(pod("more", container("c", {"aws.amazon.com/neuron": 2})), ["inf-a"]).failed_nodes["inf-a"]
        == "1/4 NumaNotFit"
    )
