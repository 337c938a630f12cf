"""The mixed-vendor fleet of `hami simulate --vendors` and YAML nodes of any vendor."""

import pytest

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate import kubeyaml
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.mixed import config_for, generate_mixed, parse_vendor_shares
from hami.simulate.workload import TraceError

SHARES = "nvidia=40,ascend=10,cambricon=10,amd=10,hygon=5,mthreads=5,metax=5,enflame=5,kunlun=5,iluvatar=5"


def test_vendor_shares_parse_and_errors():
    assert parse_vendor_shares("nvidia=3, ascend=1") == {"nvidia": 0.75, "ascend": 0.25}
    with pytest.raises(
        InvalidRequest, match=r"--vendors: unknown vendor 'nvidea' in 'nvidea=1'; valid: nvidia, ascend"
    ):
        parse_vendor_shares("nvidea=1")
    with pytest.raises(InvalidRequest, match=r"--vendors: 'amd=0' needs a share > 0"):
        parse_vendor_shares("amd=0")


def test_mixed_fleet_packs_every_vendor():
    shares = parse_vendor_shares(SHARES)
    cfg = config_for(DeviceConfig(), shares)
    w = generate_mixed(config=cfg, shares=shares, nodes=40, pods=600, seed=3)
    assert len(w.nodes) == 40
    vendors = {c.vendor for n in w.nodes for c in n.cards}
    assert vendors == {
        "NVIDIA",
        "Ascend910B3",
        "MLU",
        "AMD",
        "DCU",
        "Mthreads",
        "Metax-GPU",
        "GCU",
        "kunlun",
        "BI-V150",
    }
    r = run(w, config=cfg, policy=parse_policy("binpack"), mode=Mode.FILL, arrival=100, seed=3)
    assert r.scheduled > 0
    used = {m: u.usedcores for m, u in r.per_model.items()}
    for model in (
        "Ascend910B3",
        "MLU",
        "AMD Instinct MI300X",
        "DCU-K100_AI",
        "Mthreads",
        "Metax-GPU",
        "GCU",
        "kunlun",
        "BI-V150",
    ):
        assert used[model] > 0, model
    again = generate_mixed(config=cfg, shares=shares, nodes=40, pods=600, seed=3)
    assert [p.obj for p in again.pods] == [p.obj for p in w.pods]


def test_yaml_nodes_of_any_vendor(tmp_path):
    f = tmp_path / "nodes.yaml"
    f.write_text(
        "kind: Node\nmetadata: {name: mlu-a}\nstatus:\n  capacity: {cambricon.com/mlu.smlu.vcore: '400', "
        "cambricon.com/mlu.smlu.vmemory: '384', cpu: '64', memory: 256Gi}\n---\n"
        "kind: Node\nmetadata:\n  name: amd-a\n  annotations:\n    hami.io/node-amd-register: "
        '\'[{"id":"a0","count":10,"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X","health":true}]\'\n'
    )
    nodes = kubeyaml.load_nodes(f, config=DeviceConfig())
    assert [(n.name, [c.vendor for c in n.cards]) for n in nodes] == [
        ("mlu-a", ["MLU"] * 4),
        ("amd-a", ["AMD"]),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: Node\nmetadata: {name: m}\nstatus:\n  capacity: {cambricon.com/mlu.smlu.vcore: '1.5'}\n"
    )
    with pytest.raises(
        TraceError,
        match=r"bad.yaml:1: Node m: MLU inventory: status.capacity\[cambricon.com/mlu.smlu.vcore\]",
    ):
        kubeyaml.load_nodes(bad, config=DeviceConfig())


def test_cli_vendors_flag_runs_a_mixed_fleet_and_rejects_file_input(capsys):
    from hami.cli import main

    rc = main(
        [
            "simulate",
            "--generate",
            "30,300",
            "--vendors",
            "nvidia=50,ascend=25,amd=25",
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0
    import json

    j = json.loads(capsys.readouterr().out)
    assert j["nodes"] == 30 and j["scheduled"] > 0
    rc = main(["simulate", "--vendors", "nvidia=1", "--nodes", "x.yaml", "--no-progress"])
    assert rc == 2
    assert (
        "--vendors: only for the built-in generated fleet; drop --nodes and --pods" in capsys.readouterr().err
    )
