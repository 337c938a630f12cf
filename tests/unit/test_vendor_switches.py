"""HAMi's `--enable-ascend` / `--enable-iluvatar` on the extender and the webhook: flag > environment >
``scheduler.enableAscend`` / ``enableIluvatar`` of the device config > false, and the vendors built
from the result."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.vendors import build_vendors
from scheduler_extender import cli as extender
from webhook import cli as webhook

SERVERS = [
    pytest.param(extender, "HAMI_EXTENDER_", id="extender"),
    pytest.param(webhook, "HAMI_WEBHOOK_", id="webhook"),
]
CERTS = ["--tls-cert-file", "c.pem", "--tls-private-key-file", "k.pem"]


def switches(cli, argv: list[str], env: dict[str, str]) -> tuple[bool, bool]:  # type: ignore[no-untyped-def]
    s = cli.parse_args([*CERTS, *argv], env=env).device_config.scheduler
    return s.enableAscend, s.enableIluvatar


@pytest.mark.parametrize(("cli", "prefix"), SERVERS)
def test_flag_beats_environment_beats_config_beats_default(tmp_path: Path, cli, prefix) -> None:  # type: ignore[no-untyped-def]
    on = tmp_path / "on.yaml"
    on.write_text("scheduler:\n  enableAscend: true\n  enableIluvatar: true\n")
    assert switches(cli, [], {}) == (False, False)
    assert switches(cli, ["--enable-ascend"], {}) == (True, False)
    assert switches(cli, ["--enable-iluvatar=true"], {}) == (False, True)
    assert switches(cli, ["--config", str(on)], {}) == (True, True)
    assert switches(cli, ["--config", str(on), "--enable-ascend=false"], {}) == (False, True)
    env = {prefix + "ENABLE_ASCEND": "false", prefix + "ENABLE_ILUVATAR": "yes"}
    assert switches(cli, ["--config", str(on)], env) == (False, True)
    assert switches(cli, [], env) == (False, True)
    assert switches(cli, ["--enable-ascend", "true"], env) == (True, True)


@pytest.mark.parametrize(("cli", "prefix"), SERVERS)
def test_the_switch_builds_the_vendors(cli, prefix) -> None:  # type: ignore[no-untyped-def]
    off = set(build_vendors(cli.parse_args(CERTS, env={}).device_config))
    on = set(build_vendors(cli.parse_args([*CERTS, "--enable-ascend"], env={}).device_config))
    assert {"Ascend910B3", "Ascend310P"} <= on - off and not {n for n in off if n.startswith("Ascend")}
    assert "MR-V100" not in on
    iluvatar = build_vendors(cli.parse_args(CERTS, env={prefix + "ENABLE_ILUVATAR": "1"}).device_config)
    assert {"MR-V100", "BI-V150"} <= set(iluvatar) and "Ascend310P" not in iluvatar


@pytest.mark.parametrize(("cli", "prefix"), SERVERS)
def test_a_bad_switch_value_is_a_usage_error(capsys, cli, prefix) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args([*CERTS, "--enable-ascend=maybe"], env={})
    assert exit_.value.code == 2
    assert "argument --enable-ascend: 'maybe' is not a boolean; valid: 1, t, true" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(CERTS, env={prefix + "ENABLE_ILUVATAR": "maybe"})
    err = capsys.readouterr().err
    assert "argument --enable-iluvatar: 'maybe' is not a boolean; valid: 1, t, true" in err
    assert f"(from environment variable {prefix}ENABLE_ILUVATAR)" in err
