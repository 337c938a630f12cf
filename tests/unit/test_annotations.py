from datetime import UTC, datetime, timedelta, timezone

import pytest

from hami import annotations as A
from hami.errors import AnnotationError
from hami.model import ContainerDevice, Device
from hami.registration import (
    decode_node_devices_colon,
    decode_node_devices_json,
    decode_pair_scores,
    encode_node_devices_colon,
    encode_node_devices_json,
    encode_pair_scores,
)

# Worked examples of hami-legacy-spec §1.6.
V100_JSON = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)
POD_LIST = (
    ";GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,30:;"
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,5000,0:GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,NVIDIA,5000,0:;"
)
DCU = (
    "DCU-6b1a-01,4,16368,100,DCU-Z100,0,true,0,hami-core:DCU-6b1a-02,4,16368,100,DCU-Z100,1,true,1,hami-core:"
)


def test_node_json_worked_example_round_trips_byte_for_byte():
    devices = decode_node_devices_json(V100_JSON)
    assert devices == [
        Device(
            "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec", 0, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 0
        ),
        Device(
            "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 1, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 1
        ),
    ]
    assert encode_node_devices_json(devices) == V100_JSON


def test_node_json_missing_health_means_false_and_unknown_keys_ignored():
    (d,) = decode_node_devices_json(
        '[{"id":"GPU-a","count":4,"devmem":100,"devcore":100,"devicevendor":"x"}]'
    )
    assert d.health is False and d.index == 0 and d.numa == 0 and d.mode == "hami-core"


def test_node_json_go_escaping():
    d = Device("GPU-<a>&", 0, 1, 1, 100, "NVIDIA-X")
    assert (
        encode_node_devices_json([d])
        == '[{"id":"GPU-\\u003ca\\u003e\\u0026","count":1,"devmem":1,"devcore":100,"type":"NVIDIA-X","mode":"hami-core","health":true}]'
    )


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        ("{", "not valid JSON"),
        ('{"id":"x"}', "must be a JSON array"),
        ('[{"count":1}]', "device 0: field 'id' must be a non-empty string"),
        ('[{"id":"GPU-a","devmem":"lots"}]', "device 0 (GPU-a): field 'devmem' must be an integer"),
        ('[{"id":"GPU-a","count":-2}]', "device 0 (GPU-a): field 'count' must be >= 0"),
        ('[{"id":"GPU-a","health":"yes"}]', "field 'health' must be true or false"),
    ],
)
def test_node_json_rejects(value, msg):
    with pytest.raises(AnnotationError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        decode_node_devices_json(value)


def test_colon_worked_example_round_trips():
    devices = decode_node_devices_colon(DCU, vendor="DCU")
    assert [(d.uuid, d.index, d.numa, d.count, d.devmem, d.type, d.vendor) for d in devices] == [
        ("DCU-6b1a-01", 0, 0, 4, 16368, "DCU-Z100", "DCU"),
        ("DCU-6b1a-02", 1, 1, 4, 16368, "DCU-Z100", "DCU"),
    ]
    assert encode_node_devices_colon(devices) == DCU


def test_colon_legacy_seven_fields():
    (d,) = decode_node_devices_colon(
        "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,NVIDIA-Tesla P4,0,true:", vendor="NVIDIA"
    )
    assert (d.uuid, d.count, d.devmem, d.type, d.health, d.index, d.mode) == (
        "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4",
        10,
        7680,
        "NVIDIA-Tesla P4",
        True,
        0,
        "hami-core",
    )


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        ("GPU-a,10,7680,100,P4,0,true", "needs ':'"),
        ("GPU-a,10,7680,100,P4,0:", "device 0: 6 fields"),
        ("GPU-a,10,lots,100,P4,0,true:", "device 0 devmem: 'lots' is not an integer"),
        ("GPU-a,10,7680,100,P4,0,maybe:", "health 'maybe' is not a boolean"),
    ],
)
def test_colon_rejects(value, msg):
    with pytest.raises(AnnotationError, match=msg):
        decode_node_devices_colon(value, vendor="DCU")


def test_pod_list_worked_example():
    containers = A.decode_pod_devices(POD_LIST)
    assert containers == [
        [],
        [ContainerDevice("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "NVIDIA", 3000, 30)],
        [
            ContainerDevice("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "NVIDIA", 5000, 0),
            ContainerDevice("GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec", "NVIDIA", 5000, 0),
        ],
    ]
    assert A.encode_pod_devices(containers) == POD_LIST
    # After the device plugin consumed every entry.
    assert A.decode_pod_devices(";;;") == [[], [], []]
    assert A.encode_pod_devices([[], [], []]) == ";;;"


def test_pod_list_variants_hami_wrote():
    # No trailing ';' on the last entry; no trailing ':' on the last device; fragments without a comma.
    assert A.decode_pod_devices("GPU-a,NVIDIA,1,2") == [[ContainerDevice("GPU-a", "NVIDIA", 1, 2)]]
    assert A.decode_pod_devices("GPU-a,NVIDIA,1,2:junk:;") == [[ContainerDevice("GPU-a", "NVIDIA", 1, 2)]]
    assert A.decode_pod_devices("") == []
    assert A.decode_pod_devices(";") == [[]]


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        (";GPU-a,NVIDIA,1:;", "container entry 1, device 0: 'GPU-a,NVIDIA,1' has 3 fields"),
        ("GPU-a,NVIDIA,x,1:;", "container entry 0, device 0 usedmem: 'x' is not an integer"),
        ("GPU-a,NVIDIA,1,2:GPU-b,NVIDIA,1,y:;", "container entry 0, device 1 usedcores"),
        (",NVIDIA,1,2:;", "empty uuid"),
        ("GPU-a,NVIDIA,-5,2:;", "must be >= 0"),
    ],
)
def test_pod_list_rejects_naming_entry_and_field(value, msg):
    with pytest.raises(AnnotationError, match=msg):
        A.decode_pod_devices(value)


def test_node_lock_worked_example():
    lock = A.decode_node_lock("2024-05-10T16:15:30+08:00,default,gpu-pod")
    assert lock.namespace == "default" and lock.name == "gpu-pod"
    assert lock.time == datetime(2024, 5, 10, 8, 15, 30, tzinfo=UTC)
    assert A.encode_node_lock(lock) == "2024-05-10T16:15:30+08:00,default,gpu-pod"
    utc = A.NodeLock(datetime(2024, 5, 10, 8, 15, 30, 999, tzinfo=UTC), "ns", "p")
    assert A.encode_node_lock(utc) == "2024-05-10T08:15:30Z,ns,p"


def test_node_lock_legacy_and_errors():
    legacy = A.decode_node_lock("2024-05-10T08:15:30Z")
    assert legacy.namespace is None and legacy.time.tzinfo is not None
    assert A.encode_node_lock(legacy) == "2024-05-10T08:15:30Z"
    for bad in ("2024-05-10T08:15:30Z,ns", "yesterday,ns,p", "2024-05-10T08:15:30Z,,p"):
        with pytest.raises(AnnotationError, match="lock value"):
            A.decode_node_lock(bad)


def test_handshake():
    t = datetime(2024, 5, 10, 16, 15, 30)
    assert A.encode_handshake(A.HANDSHAKE_REQUESTING, t) == "Requesting_2024-05-10 16:15:30"
    assert A.decode_handshake("Requesting_2024-05-10 16:15:30") == A.Handshake("Requesting", t)
    assert A.decode_handshake("Reported_whenever").time is None
    assert A.decode_handshake("Deleted_2024-05-10 16:15:30").state == "Deleted"


def test_pair_scores_round_trip_and_errors():
    value = '[{"uuid":"GPU-a","score":{"GPU-b":220,"GPU-c":10}}]'
    assert decode_pair_scores(value) == {"GPU-a": {"GPU-b": 220, "GPU-c": 10}}
    assert encode_pair_scores(decode_pair_scores(value)) == value
    with pytest.raises(AnnotationError, match="entry 0 \\(GPU-a\\): 'score'"):
        decode_pair_scores('[{"uuid":"GPU-a","score":{"GPU-b":"x"}}]')


def test_rfc3339_of_offset_zone():
    t = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5)))
    assert A.format_rfc3339(t) == "2024-01-02T03:04:05-05:00"


def test_registration_json_depth_is_bounded_and_brackets_in_strings_do_not_count() -> None:
    from hami.annotations import MAX_JSON_DEPTH, load_json

    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(AnnotationError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        load_json(deep)
    at_bound = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(at_bound) is not None
    # Many brackets, but inside strings (escaped quotes included): not nesting.
    strings = '[{"id": "GPU-[[[[[[[[[[[[[[[[[[[[", "t": "a\\"{{{{{{{{{{{{{{{{{{{{"}]'
    assert load_json(strings) == [{"id": "GPU-" + "[" * 20, "t": 'a"' + "{" * 20}]
    # An unterminated string: everything after its quote is inside it; the decoder names the problem.
    with pytest.raises(AnnotationError, match="not valid JSON"):
        load_json('["' + '\\"[' * 5000)
    with pytest.raises(AnnotationError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        load_json('["a", ' * 40 + "1" + "]" * 40)
