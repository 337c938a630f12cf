"""`webhook.cli`: flags > ``HAMI_WEBHOOK_*`` environment > device config > defaults, and the checks on
what the command line and the environment say together."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.cli import ENV_PREFIX, build_parser, parse_args

CERTS = ["--tls-cert-file", "c.pem", "--tls-private-key-file", "k.pem"]


def test_every_flag_reads_its_environment_variable() -> None:
    env = {
        "HAMI_WEBHOOK_TLS_CERT_FILE": "/tls/tls.crt",
        "HAMI_WEBHOOK_TLS_PRIVATE_KEY_FILE": "/tls/tls.key",
        "HAMI_WEBHOOK_ADDRESS": "127.0.0.1",
        "HAMI_WEBHOOK_PORT": "9443",
        "HAMI_WEBHOOK_SCHEDULER_NAME": "other",
        "HAMI_WEBHOOK_TAKEOVER_SCHEDULERS": "a,b",
        "HAMI_WEBHOOK_KUBECONFIG": "/k",
        "HAMI_WEBHOOK_IN_CLUSTER": "true",
        "HAMI_WEBHOOK_LOG_LEVEL": "DEBUG",
        "HAMI_WEBHOOK_ENABLE_ASCEND": "true",
        "HAMI_WEBHOOK_ENABLE_ILUVATAR": "on",
        "HAMI_WEBHOOK_ALLOCATION_WRITERS": "system:serviceaccount:a:s, system:serviceaccount:a:d",
    }
    o = parse_args([], env=env)
    assert o.writers == frozenset({"system:serviceaccount:a:s", "system:serviceaccount:a:d"})
    assert (o.device_config.scheduler.enableAscend, o.device_config.scheduler.enableIluvatar) == (True, True)
    assert (o.tls_cert_file, o.tls_private_key_file, o.address, o.port) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        "127.0.0.1",
        9443,
    )
    assert (o.scheduler_name, o.takeover, o.kubeconfig, o.in_cluster, o.log_level) == (
        "other",
        frozenset({"", "a", "b"}),
        "/k",
        True,
        "DEBUG",
    )
    dests = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert {ENV_PREFIX + d.upper() for d in dests} - {"HAMI_WEBHOOK_CONFIG"} == set(env)


def test_flag_beats_environment_beats_config_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("scheduler:\n  schedulerName: from-config\n")
    assert parse_args(CERTS, env={}).scheduler_name == "hami-scheduler"
    assert parse_args([*CERTS, "--config", str(cfg)], env={}).scheduler_name == "from-config"
    env = {"HAMI_WEBHOOK_CONFIG": str(cfg), "HAMI_WEBHOOK_SCHEDULER_NAME": "from-env"}
    assert parse_args(CERTS, env=env).scheduler_name == "from-env"
    assert parse_args([*CERTS, "--scheduler-name", "from-flag"], env=env).scheduler_name == "from-flag"
    # An ambient KUBECONFIG does not switch the quota caches on.
    assert parse_args(CERTS, env={"KUBECONFIG": "/k"}).kubeconfig is None


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "the following arguments are required: --tls-cert-file, --tls-private-key-file"),
        (CERTS, {"HAMI_WEBHOOK_PORT": "x"}, "argument --port: invalid int value: 'x' (from environment variable HAMI_WEBHOOK_PORT)"),
        (CERTS, {"HAMI_WEBHOOK_IN_CLUSTER": "sure"}, "argument --in-cluster: 'sure' is not a boolean; valid: 1, t, true"),
        (CERTS, {"HAMI_WEBHOOK_LOG_LEVEL": "LOUD"}, "argument --log-level: invalid choice: 'LOUD'"),
    ],
    ids=["certs-missing", "bad-port", "bad-boolean", "bad-choice"],
)  # fmt: skip
def test_bad_or_missing_values_are_usage_errors(capsys, argv, env, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv, env=env)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
