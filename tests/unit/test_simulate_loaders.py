"""hami.simulate loaders: the openb CSV request mapping, the YAML loader and input errors (file, line, column)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hami import annotations as A
from hami.config import DeviceConfig, load_config
from hami.errors import InvalidRequest
from hami.registration import decode_node_devices_json
from hami.simulate import kubeyaml, openb
from hami.simulate.generate import generate_default
from hami.simulate.workload import DEFAULT_GPU_MODELS, TraceError, milli_to_percent, parse_gpu_models

CFG = DeviceConfig()
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------------------
# openb nodes


def test_openb_node_registers_cards_as_the_device_plugin_would(tmp_path):
    p = write(tmp_path, "n.csv", NODE_HEADER + "node-a,64000,262144,4,V100M32\nnode-b,8000,61440,0,\n")
    a, b = openb.load_nodes(p, config=CFG)
    assert (a.name, a.cpu_milli, a.memory_mib, a.max_pods) == ("node-a", 64000, 262144, 110)
    devices = decode_node_devices_json(a.obj["metadata"]["annotations"][A.NVIDIA_REGISTER])
    assert [(d.uuid, d.index, d.count, d.devmem, d.devcore, d.type, d.numa) for d in devices] == [
        ("GPU-node-a-0", 0, 10, 32768, 100, "NVIDIA-V100M32", 0),
        ("GPU-node-a-1", 1, 10, 32768, 100, "NVIDIA-V100M32", 0),
        ("GPU-node-a-2", 2, 10, 32768, 100, "NVIDIA-V100M32", 1),
        ("GPU-node-a-3", 3, 10, 32768, 100, "NVIDIA-V100M32", 1),
    ]
    assert a.obj["status"]["allocatable"] == {"cpu": "64000m", "memory": "262144Mi", "pods": "110"}
    # A CPU-only node carries no registration at all.
    assert b.cards == () and A.NVIDIA_REGISTER not in b.obj["metadata"]["annotations"]


def test_openb_node_uses_split_count_and_scaling_from_the_device_config(tmp_path):
    cfg = load_config(
        {
            "nvidia": {"deviceSplitCount": 4, "deviceMemoryScaling": 2},
            "nodeconfig": [{"name": "b", "devicesplitcount": 7}],
        }
    )
    p = write(tmp_path, "n.csv", NODE_HEADER + "a,1000,1000,1,T4\nb,1000,1000,1,T4\n")
    a, b = openb.load_nodes(p, config=cfg)
    assert (a.cards[0].count, a.cards[0].devmem) == (4, 30720)
    assert (b.cards[0].count, b.cards[0].devmem) == (7, 30720)


def test_openb_node_unknown_model_names_file_line_column_and_the_fix(tmp_path):
    p = write(tmp_path, "n.csv", NODE_HEADER + "a,1000,1000,1,T4\nb,1000,1000,2,H100\n")
    with pytest.raises(TraceError) as e:
        openb.load_nodes(p, config=CFG)
    assert str(e.value) == (
        f"{p}:3: column 5 (model): unknown GPU model 'H100'; known: A10, G2, G3, P100, T4, V100M16, V100M32 "
        "(add it with --gpu-models MODEL=MiB)"
    )
    nodes = openb.load_nodes(p, config=CFG, gpu_models=parse_gpu_models("H100=81559"))
    assert nodes[1].cards[0].devmem == 81559 and nodes[1].cards[0].type == "NVIDIA-H100"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,12x,1000,1,T4", "column 2 (cpu_milli): '12x' is not an integer"),
        ("a,1000,-5,1,T4", "column 3 (memory_mib): -5 is out of range; valid: an integer from 0 to 2^50"),
        ("a,1000,1000,,T4", "column 4 (gpu): empty; valid: 0..1024"),
        (",1000,1000,1,T4", "column 1 (sn): empty node name"),
        ("a,1000,1000", "column 4 (gpu) is missing: the row has 3 columns, the header 5"),
        ("a", "column 2 (cpu_milli) is missing: the row has 1 column, the header 5"),
        # Above 2^50 the engine's int64 arrays would overflow (was an internal error).
        (
            "a,99999999999999999999999,1000,1,T4",
            "column 2 (cpu_milli): 99999999999999999999999 is out of range; valid: an integer from 0 to 2^50",
        ),
        # int() takes these; a trace never holds them.
        ("a,1_000,1000,1,T4", "column 2 (cpu_milli): '1_000' is not an integer"),
        ("a,\u0661\u0660,1000,1,T4", "column 2 (cpu_milli): '\u0661\u0660' is not an integer"),
        ("a,+5,1000,1,T4", "column 2 (cpu_milli): '+5' is not an integer"),
        ("a\x00b,1,1,1,T4", "column 1 (sn): 'a\\x00b': a node name must not hold control characters"),
        ('"a,1,1,1,T4', 'a quote (") opened on this line is not closed on it'),
    ],
)
def test_openb_node_malformed_rows(tmp_path, row, message):
    p = write(tmp_path, "n.csv", NODE_HEADER + "ok,1,1,0,\n" + row + "\n")
    with pytest.raises(TraceError) as e:
        openb.load_nodes(p, config=CFG)
    assert str(e.value) == f"{p}:3: {message}"


def test_openb_node_file_errors(tmp_path):
    p = write(tmp_path, "n.csv", "sn,cpu,memory_mib,gpu,model\n")
    with pytest.raises(
        TraceError, match=r"n.csv:1: header lacks column cpu_milli; expected columns sn, cpu_milli"
    ):
        openb.load_nodes(p, config=CFG)
    dup = write(tmp_path, "d.csv", NODE_HEADER + "a,1,1,0,\na,1,1,0,\n")
    with pytest.raises(TraceError, match=r"d.csv:3: column 1 \(sn\): duplicate node 'a' \(first on line 2\)"):
        openb.load_nodes(dup, config=CFG)
    with pytest.raises(TraceError, match="cannot read"):
        openb.load_nodes(tmp_path / "missing.csv", config=CFG)


# ------------------------------------------------------------------------------------------------
# openb pods


def limits(pod) -> dict[str, str]:
    return pod.obj["spec"]["containers"][0]["resources"]["limits"]


def test_openb_pod_request_mapping(tmp_path):
    p = write(
        tmp_path,
        "p.csv",
        POD_HEADER
        + "frac,6000,12288,1,460,,LS,Running,10,20,10\n"
        + "whole,12000,24576,1,1000,,LS,Running,0,30,0\n"
        + "multi,32000,65536,8,1000,V100M16|V100M32|V100M32,LS,Running,5,,5\n"
        + "cpu,4000,8192,0,0,,BE,Running,1,2,1\n",
    )
    frac, whole, multi, cpu = openb.load_pods(p, config=CFG)
    assert limits(frac) == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "46",
        "nvidia.com/gpucores": "46",
    }
    assert frac.obj["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "6000m", "memory": "12288Mi"}
    assert (frac.gpu_demand, frac.creation_time, frac.deletion_time) == (0.46, 10.0, 20.0)
    assert limits(whole) == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}
    assert limits(multi) == {"nvidia.com/gpu": "8", "nvidia.com/gpucores": "100"}
    # Duplicates in gpu_spec are dropped; the list becomes HAMi's use-gputype annotation.
    assert multi.obj["metadata"]["annotations"] == {"nvidia.com/use-gputype": "V100M16,V100M32"}
    assert (multi.gpu_demand, multi.deletion_time) == (8.0, None)
    assert limits(cpu) == {} and cpu.gpu_demand == 0 and not cpu.is_gpu
    assert frac.obj["metadata"]["namespace"] == "default" and "uid" not in frac.obj["metadata"]


def test_openb_pod_requests_parse_through_the_nvidia_vendor(tmp_path):
    from hami.vendors.nvidia import NvidiaVendor

    p = write(tmp_path, "p.csv", POD_HEADER + "frac,6000,12288,1,810,,LS,Running,10,20,10\n")
    (pod,) = openb.load_pods(p, config=CFG)
    req = NvidiaVendor().container_request(pod.obj["spec"]["containers"][0])
    assert (req.nums, req.memreq, req.mem_percentage, req.coresreq) == (1, 0, 81, 81)


def test_milli_to_percent_rounds_up():
    assert [milli_to_percent(m) for m in (10, 460, 461, 5, 999)] == [1, 46, 47, 1, 100]


def test_openb_pod_with_unknown_model_is_unplaceable_not_an_error(tmp_path):
    p = write(tmp_path, "p.csv", POD_HEADER + "x,1000,1000,1,500,T4|H100,LS,Running,0,1,0\n")
    (pod,) = openb.load_pods(p, config=CFG)
    assert pod.unplaceable == (
        "unknown GPU model H100 in gpu_spec (known: A10, G2, G3, P100, T4, V100M16, V100M32; "
        "add it with --gpu-models MODEL=MiB)"
    )
    assert pod.is_gpu


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "x,1000,1000,1,1001,,LS,Running,0,1,0",
            "column 5 (gpu_milli): 1001 is out of range; valid: 0..1000",
        ),
        ("x,1000,1000,0,500,,LS,Running,0,1,0", "column 5 (gpu_milli): 500 on a row with num_gpu 0"),
        (
            "x,1000,1000,2,0,,LS,Running,0,1,0",
            "column 5 (gpu_milli): 0 on a row with num_gpu 2; valid: 1..1000",
        ),
        ("x,1000,1000,one,500,,LS,Running,0,1,0", "column 4 (num_gpu): 'one' is not an integer"),
        (
            "x,1000,1000,1,500,,LS,Running,abc,1,0",
            "column 9 (creation_time): 'abc' is not a number of seconds",
        ),
        ("x,1000,1000,1,500,,LS,Running,10,5,0", "column 10 (deletion_time): 5 is before creation_time 10"),
        (
            "x,1000,1000,1,500,,LS,Running,inf,,0",
            "column 9 (creation_time): 'inf' is not a number of seconds",
        ),
        (
            "x,1000,1000,1,500,,LS,Running,nan,,0",
            "column 9 (creation_time): 'nan' is not a number of seconds",
        ),
        (
            "x,1000,1000,1,500,,LS,Running,-1,,0",
            "column 9 (creation_time): '-1' must be a number of seconds >= 0",
        ),
        ("x,1000,1000,1,500", "column 6 (gpu_spec) is missing: the row has 5 columns, the header 11"),
    ],
)
def test_openb_pod_malformed_rows(tmp_path, row, message):
    p = write(tmp_path, "p.csv", POD_HEADER + "ok,1,1,0,0,,LS,Running,0,1,0\n" + row + "\n")
    with pytest.raises(TraceError) as e:
        openb.load_pods(p, config=CFG)
    assert message in str(e.value)
    assert str(e.value).startswith(f"{p}:3: ")


def test_openb_pod_times_may_be_decimal(tmp_path):
    p = write(tmp_path, "p.csv", POD_HEADER + "a,1,1,1,1000,,LS,Running,1.5,.5e,0\n")
    with pytest.raises(TraceError, match=r"p.csv:2: column 10 \(deletion_time\): '.5e' is not a number"):
        openb.load_pods(p, config=CFG)
    p = write(tmp_path, "p.csv", POD_HEADER + "a,1,1,1,1000,,LS,Running,1.5,2.,0\n")
    (pod,) = openb.load_pods(p, config=CFG)
    assert (pod.creation_time, pod.deletion_time) == (1.5, 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "",
            ":1: empty file; expected a header with columns name, cpu_milli, memory_mib, num_gpu, gpu_milli",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", ":2: no pod rows after the header"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,cpu_milli\n",
            ":1: column 6 (cpu_milli): duplicate column, first as column 2",
        ),
    ],
)
def test_openb_pod_file_errors(tmp_path, text, message):
    p = write(tmp_path, "p.csv", text)
    with pytest.raises(TraceError) as e:
        openb.load_pods(p, config=CFG)
    assert str(e.value) == f"{p}{message}"


def test_openb_csv_with_bom_crlf_and_blank_lines_counts_lines_right(tmp_path):
    p = tmp_path / "p.csv"
    p.write_bytes(
        b"\xef\xbb\xbfname,cpu_milli,memory_mib,num_gpu,gpu_milli\r\na,1,1,1,500\r\n\r\nb,1,1,1,500\r\n"
    )
    assert [x.name for x in openb.load_pods(p, config=CFG)] == ["a", "b"]
    p.write_bytes(p.read_bytes() + b"\r\nc,1,x,1,500\r\n")
    with pytest.raises(TraceError, match=r"p.csv:6: column 3 \(memory_mib\): 'x' is not an integer"):
        openb.load_pods(p, config=CFG)


def test_openb_pod_list_without_time_columns_loads(tmp_path):
    p = write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,2,1000\n")
    (pod,) = openb.load_pods(p, config=CFG)
    assert (pod.creation_time, pod.deletion_time, pod.gpu_demand) == (None, None, 2.0)


def test_parse_gpu_models():
    assert parse_gpu_models("") == DEFAULT_GPU_MODELS
    m = parse_gpu_models("G2=40960, H100=81559")
    assert (m["G2"], m["H100"], m["T4"]) == (40960, 81559, 15360)
    for bad in ("G2", "G2=", "G2=abc", "=5", "G2=0", "A|B=5"):
        with pytest.raises(InvalidRequest, match="--gpu-models"):
            parse_gpu_models(bad)


# ------------------------------------------------------------------------------------------------
# Kubernetes YAML

NODES_YAML = """\
apiVersion: v1
kind: Node
metadata:
  name: gpu-1
  annotations:
    hami.io/node-nvidia-register: '[{"id":"GPU-a","count":10,"devmem":24576,"devcore":100,"type":"NVIDIA-A10","health":true}]'
status:
  allocatable: {cpu: "16", memory: 64Gi, pods: "30"}
---
apiVersion: v1
kind: List
items:
- kind: Node
  metadata: {name: cpu-1}
  status: {capacity: {cpu: 4000m, memory: "1073741824"}}
"""

PODS_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
  uid: will-be-replaced
  creationTimestamp: "2024-01-01T00:00:10Z"
  deletionTimestamp: "2024-01-01T00:01:10Z"
  annotations: {nvidia.com/use-gputype: A10}
spec:
  initContainers:
  - name: fetch
    resources: {requests: {cpu: "3", memory: 1Gi}}
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 8Gi, nvidia.com/gpucores: 30, cpu: "1", memory: 2Gi}
  - name: side
    resources: {requests: {cpu: 500m, memory: 512Mi}}
---
kind: Pod
metadata: {name: whole, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  containers:
  - name: c
    resources: {limits: {nvidia.com/gpu: 2}}
"""


def test_yaml_nodes(tmp_path):
    gpu, cpu = kubeyaml.load_nodes(write(tmp_path, "n.yaml", NODES_YAML), config=CFG)
    assert (gpu.name, gpu.cpu_milli, gpu.memory_mib, gpu.max_pods) == ("gpu-1", 16000, 65536, 30)
    assert [(c.uuid, c.devmem, c.type) for c in gpu.cards] == [("GPU-a", 24576, "NVIDIA-A10")]
    assert (cpu.name, cpu.cpu_milli, cpu.memory_mib, cpu.max_pods, cpu.cards) == (
        "cpu-1",
        4000,
        1024,
        110,
        (),
    )


def test_yaml_pods_are_mutated_like_the_webhook_does(tmp_path):
    train, whole = kubeyaml.load_pods(write(tmp_path, "p.yaml", PODS_YAML), config=CFG)
    # max(sum of app containers, largest init container)
    assert (train.cpu_milli, train.memory_mib) == (3000, 2560)
    assert train.gpu_demand == 0.3
    assert (train.creation_time, train.deletion_time) == (10.0, 70.0)
    assert train.obj["metadata"]["namespace"] == "ml" and "uid" not in train.obj["metadata"]
    # gpumem with a unit is normalised to MiB by the webhook's mutation.
    assert train.obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "8192"
    # A bare count is exclusive, whole cards.
    assert whole.obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    assert (whole.gpu_demand, whole.creation_time, whole.deletion_time) == (2.0, 0.0, None)


def test_yaml_errors_name_file_line_and_field(tmp_path):
    bad_reg = NODES_YAML.replace('"devmem":24576', '"devmem":"lots"')
    with pytest.raises(TraceError) as e:
        kubeyaml.load_nodes(write(tmp_path, "n.yaml", bad_reg), config=CFG)
    assert str(e.value).startswith(
        f"{tmp_path / 'n.yaml'}:1: Node gpu-1: annotation hami.io/node-nvidia-register:"
    )
    assert "'devmem' must be an integer" in str(e.value)
    bad_q = PODS_YAML.replace("nvidia.com/gpumem: 8Gi", "nvidia.com/gpumem: 8Gx")
    with pytest.raises(TraceError, match=r"p.yaml:1: Pod train: container main: .*nvidia.com/gpumem.*'8Gx'"):
        kubeyaml.load_pods(write(tmp_path, "p.yaml", bad_q), config=CFG)
    second = PODS_YAML.replace('creationTimestamp: "2024-01-01T00:00:00Z"', "creationTimestamp: yesterday")
    with pytest.raises(
        TraceError, match=r"p.yaml:21: Pod whole: creationTimestamp: 'yesterday' is not an RFC 3339"
    ):
        kubeyaml.load_pods(write(tmp_path, "p.yaml", second), config=CFG)
    with pytest.raises(TraceError, match=r"x.yaml:2: invalid YAML"):
        kubeyaml.load_pods(write(tmp_path, "x.yaml", "kind: Pod\n  bad: [\n"), config=CFG)
    with pytest.raises(TraceError, match="no object of kind Node"):
        kubeyaml.load_nodes(write(tmp_path, "p2.yaml", PODS_YAML), config=CFG)


def test_generated_default_is_seeded_and_heterogeneous():
    a = generate_default(config=CFG, seed=3, nodes=40, pods=300)
    b = generate_default(config=CFG, seed=3, nodes=40, pods=300)
    assert json.dumps([p.obj for p in a.pods]) == json.dumps([p.obj for p in b.pods])
    assert [n.obj for n in a.nodes] == [n.obj for n in b.nodes]
    models = {c.type for n in a.nodes for c in n.cards}
    assert models == {f"NVIDIA-{m}" for m in ("G2", "T4", "P100", "V100M16", "G3", "V100M32", "A10")}
    assert len(a.pods) == 300 and any(not p.is_gpu for p in a.pods)
    assert any(p.obj["metadata"]["annotations"] for p in a.pods)
    assert all(p.creation_time is not None and p.deletion_time > p.creation_time for p in a.pods)
    c = generate_default(config=CFG, seed=4, nodes=40, pods=300)
    assert [p.obj for p in c.pods] != [p.obj for p in a.pods]


# Each of these was an internal error (a traceback behind "hami: internal error") or a silent
# misreading before; now one line naming file, line and field.
POD_TMPL = "kind: Pod\nmetadata: {name: p%s}\nspec: {containers: [{name: c, resources: %s}]}\n"


@pytest.mark.parametrize(
    ("meta", "resources", "message"),
    [
        ("", "[1]", "Pod p: container c: resources must be a mapping (limits, requests)"),
        ("", "{limits: [1]}", "Pod p: container c: resources.limits must be a mapping of quantities"),
        (
            "",
            "{limits: {nvidia.com/gpu: true}}",
            "Pod p: container c: resources.limits[nvidia.com/gpu]: True must be a quantity such as 2 or 8Gi",
        ),
        (
            "",
            "{requests: {cpu: '1e30'}}",
            "Pod p: container c: requests.cpu: '1e30' is larger than 2^50 millicores",
        ),
        (
            ", annotations: {nvidia.com/use-gputype: 5}",
            "{limits: {nvidia.com/gpu: 1}}",
            'Pod p: metadata.annotations[nvidia.com/use-gputype]: 5 must be a string (quote it in YAML, e.g. "5")',
        ),
        (", namespace: 7", "{}", "Pod p: metadata.namespace must be a non-empty string"),
        (", labels: [a]", "{}", "Pod p: metadata.labels must be a mapping of strings to strings"),
    ],
)
def test_yaml_pod_shape_errors(tmp_path, meta, resources, message):
    p = write(tmp_path, "p.yaml", POD_TMPL % (meta, resources))
    with pytest.raises(TraceError) as e:
        kubeyaml.load_pods(p, config=CFG)
    assert str(e.value) == f"{p}:1: {message}"


def test_yaml_node_shape_errors(tmp_path):
    p = write(
        tmp_path,
        "n.yaml",
        "kind: Node\nmetadata: {name: a, annotations: {hami.io/node-nvidia-register: 5}}\n",
    )
    with pytest.raises(TraceError) as e:
        kubeyaml.load_nodes(p, config=CFG)
    assert str(e.value) == (
        f"{p}:1: Node a: metadata.annotations[hami.io/node-nvidia-register]: 5 must be a string "
        '(quote it in YAML, e.g. "5")'
    )
    # Found by a structural fuzz: a scalar or a list where a mapping belongs was an AttributeError.
    for status, message in (
        ("x", "status must be a mapping (allocatable, capacity)"),
        ("{capacity: [1]}", "status.capacity must be a mapping of quantities"),
        ("{allocatable: 5}", "status.allocatable must be a mapping of quantities"),
    ):
        p = write(tmp_path, "s.yaml", f"kind: Node\nmetadata: {{name: a}}\nstatus: {status}\n")
        with pytest.raises(TraceError) as e:
            kubeyaml.load_nodes(p, config=CFG)
        assert str(e.value) == f"{p}:1: Node a: {message}"
    # A tag the safe loader refuses: one line with the line number, not PyYAML's five-line text.
    p = write(tmp_path, "u.yaml", "kind: Node\nmetadata: !!python/object:os.system {name: a}\n")
    with pytest.raises(TraceError) as e:
        kubeyaml.load_nodes(p, config=CFG)
    assert str(e.value) == (
        f"{p}:2: invalid YAML: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object:os.system'"
    )


def test_yaml_node_with_huge_allocatable_fits_anything_without_overflow(tmp_path):
    p = write(
        tmp_path,
        "n.yaml",
        "kind: Node\nmetadata: {name: a}\nstatus: {allocatable: {cpu: '1e20', memory: 1e25}}\n",
    )
    (node,) = kubeyaml.load_nodes(p, config=CFG)
    assert (node.cpu_milli, node.memory_mib) == (kubeyaml.UNLIMITED, kubeyaml.UNLIMITED)


@pytest.fixture
def tokyo_local_time(monkeypatch):
    """This machine's local time is not UTC (a naive time read as local time would be 9 h off)."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_yaml_times_without_an_offset_are_utc(tmp_path, tokyo_local_time):
    text = (
        "kind: Pod\nmetadata: {name: a, creationTimestamp: '2024-01-01T00:00:00Z'}\nspec: {containers: [{name: c}]}\n"
        "---\nkind: Pod\nmetadata: {name: b, creationTimestamp: '2024-01-01T01:00:00'}\n"
        "spec: {containers: [{name: c}]}\n"
        "---\nkind: Pod\nmetadata: {name: c, creationTimestamp: 2024-01-02}\nspec: {containers: [{name: c}]}\n"
        "---\nkind: Pod\nmetadata: {name: d, creationTimestamp: 2024-01-01T02:00:00+01:00}\n"
        "spec: {containers: [{name: c}]}\n"
    )
    pods = kubeyaml.load_pods(write(tmp_path, "p.yaml", text), config=CFG)
    assert [x.creation_time for x in pods] == [0.0, 3600.0, 86400.0, 3600.0]


SIDECAR_PODS_YAML = """\
kind: Pod
metadata: {name: init-gpu}
spec:
  initContainers:
  - name: warmup
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000, nvidia.com/gpucores: 50, cpu: "2"}}
  containers:
  - name: main
    resources: {requests: {cpu: "1"}}
---
kind: Pod
metadata: {name: sidecar-gpu}
spec:
  initContainers:
  - name: proxy
    restartPolicy: Always
    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 2000, nvidia.com/gpucores: 30, cpu: "1"}}
  - name: setup
    resources: {requests: {cpu: "2"}}
  containers:
  - name: main
    resources: {requests: {cpu: "1"}}
"""


def test_yaml_pods_with_gpus_in_init_containers_or_native_sidecars_are_gpu_pods(tmp_path):
    from hami.simulate.engine import Mode, Policy, run
    from hami.simulate.workload import Workload, gpu_node

    init_gpu, sidecar = kubeyaml.load_pods(write(tmp_path, "p.yaml", SIDECAR_PODS_YAML), config=CFG)
    # Demand by the pod rule: max(app + sidecars, each init container + the sidecars before it).
    assert (init_gpu.gpu_demand, sidecar.gpu_demand) == (0.5, 0.3)
    assert init_gpu.cpu_milli == 2000
    # The sidecar keeps running beside `main`, and `setup` runs beside it: 1 + max(1, 2) cores.
    assert sidecar.cpu_milli == 3000
    n = gpu_node("n1", cpu_milli=64000, memory_mib=262144, gpus=1, model="T4", card_mib=15360, config=CFG)
    r = run(
        Workload([n], [init_gpu, sidecar]),
        config=CFG,
        policy=Policy("binpack", "binpack"),
        mode=Mode.TRACE,
        placements=True,
    )
    assert [(p.pod, p.container, p.card_uuid, p.mem_mib, p.cores) for p in r.placements] == [
        ("init-gpu", "warmup", "GPU-n1-0", 4000, 50),
        ("sidecar-gpu", "proxy", "GPU-n1-0", 2000, 30),
    ]
