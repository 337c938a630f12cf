"""`hami.settings`: the one precedence rule of the servers (flag > environment > config file > default),
durations and booleans, and how a bad environment value is refused."""

from __future__ import annotations

import argparse

import pytest

from hami import settings
from hami.errors import InvalidRequest


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="demo")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--timeout", type=settings.argtype(settings.duration), default=30.0)
    p.add_argument("--name", default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--elect", type=settings.argtype(settings.boolean), nargs="?", const=True, default=False)
    p.add_argument("--level", default="INFO", choices=["INFO", "DEBUG"])
    p.add_argument("--metrics-port", type=int, default="9396")
    return p


def resolve(argv, env, config=None):  # type: ignore[no-untyped-def]
    return settings.resolve(parser(), argv, env=env, prefix="DEMO_", aliases={"name": ("NAME", "OLD_NAME")},
                            config=config)  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env", "config", "want"),
    [
        ([], {}, None, None),
        ([], {}, {"name": "from-config"}, "from-config"),
        ([], {"OLD_NAME": "alias-2"}, {"name": "from-config"}, "alias-2"),
        ([], {"NAME": "alias-1", "OLD_NAME": "alias-2"}, None, "alias-1"),
        ([], {"DEMO_NAME": "own", "NAME": "alias-1"}, {"name": "from-config"}, "own"),
        (["--name", "flag"], {"DEMO_NAME": "own"}, {"name": "from-config"}, "flag"),
        (["--name", ""], {"DEMO_NAME": "own"}, None, ""),
    ],
    ids=["default", "config", "second-alias", "first-alias", "own-variable", "flag", "empty-flag-still-wins"],
)
def test_precedence(argv, env, config, want) -> None:  # type: ignore[no-untyped-def]
    assert resolve(argv, env, (lambda _v: config) if config else None)["name"] == want


def test_environment_values_are_read_with_the_flags_types() -> None:
    env = {"DEMO_PORT": "7000", "DEMO_TIMEOUT": "1m30s", "DEMO_DRY_RUN": "yes", "DEMO_ELECT": "off",
           "DEMO_LEVEL": "DEBUG"}  # fmt: skip
    got = resolve([], env)
    assert (got["port"], got["timeout"], got["dry_run"], got["elect"], got["level"]) == (
        7000,
        90.0,
        True,
        False,
        "DEBUG",
    )
    defaults = resolve([], {})
    assert (defaults["port"], defaults["timeout"], defaults["dry_run"], defaults["elect"]) == (
        8080,
        30.0,
        False,
        False,
    )
    assert defaults["metrics_port"] == 9396  # a string default goes through the type, as in argparse
    assert resolve(["--elect"], {"DEMO_ELECT": "false"})["elect"] is True


def test_config_layer_sees_flags_and_environment_and_fills_only_unset() -> None:
    seen = {}

    def config(values):  # type: ignore[no-untyped-def]
        seen.update(values)
        return {"port": 1, "name": "cfg", "level": None}

    got = resolve(["--config", "c.yaml"], {"DEMO_PORT": "2"}, config)
    assert (seen["config"], seen["port"], seen["name"]) == ("c.yaml", 2, None)
    assert (got["port"], got["name"], got["level"]) == (2, "cfg", "INFO")  # None from the config = not given


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEMO_PORT": "x"}, "argument --port: invalid int value: 'x' (from environment variable DEMO_PORT)"),
        ({"DEMO_TIMEOUT": "5 minutes"}, "argument --timeout: '5 minutes' is not a duration; valid: 300, 300s, 5m, 1m30s, 500ms (from environment variable DEMO_TIMEOUT)"),
        ({"DEMO_DRY_RUN": " true"}, "argument --dry-run: ' true' is not a boolean; valid: 1, t, true"),
        ({"DEMO_LEVEL": "LOUD"}, "argument --level: invalid choice: 'LOUD' (choose from 'INFO', 'DEBUG')"),
    ],
    ids=["int", "duration", "boolean-with-space", "choice"],
)  # fmt: skip
def test_bad_environment_value_is_a_usage_error_naming_flag_and_variable(capsys, env, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        resolve([], env)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300.0),
        ("0.5", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert settings.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "5d", "m5", "1m 30s"])
def test_bad_durations_name_the_valid_forms(text: str) -> None:
    with pytest.raises(InvalidRequest, match=r"is not a duration; valid: 300, 300s, 5m, 1m30s, 500ms"):
        settings.duration(text)


def test_booleans_follow_the_shared_table() -> None:
    assert [settings.boolean(v) for v in ("1", "True", "yes", "ON", "t", "y")] == [True] * 6
    assert [settings.boolean(v) for v in ("0", "False", "no", "OFF", "f", "n", "")] == [False] * 7
    with pytest.raises(InvalidRequest, match="'maybe' is not a boolean"):
        settings.boolean("maybe")


def test_env_names_order() -> None:
    assert settings.env_names("node_name", prefix="P_", aliases={"node_name": ("NODE_NAME",)}) == (
        "P_NODE_NAME",
        "NODE_NAME",
    )
