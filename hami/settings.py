"""One precedence rule for every server's options: flag > environment > config file > default.

The three servers (scheduler extender, webhook, device plugin) each declare their flags once, in an
`argparse.ArgumentParser`; this module turns a command line plus an environment into one value per
flag, so that "which source wins" is answered in one place instead of three:

1. a flag given on the command line;
2. else the first set environment variable of the flag: ``<PREFIX><FLAG_NAME>`` (``--node-lock-timeout``
   -> ``HAMI_EXTENDER_NODE_LOCK_TIMEOUT``), then the flag's aliases (HAMi's names such as
   ``NODE_NAME``, ``CONFIG_FILE``), in the order given;
3. else the value the device config file supplies for it (only a few flags have one, e.g. the
   scheduler name from ``scheduler.schedulerName``);
4. else the flag's built-in default.

An environment value is read with the flag's own type, so a bad ``HAMI_EXTENDER_PORT=x`` is refused
exactly like ``--port x``, with the variable named. Durations accept plain seconds (``300``) or Go-style
units (``30s``, ``5m``, ``1m30s``, ``500ms``); booleans follow the one truth table of `hami.booleans`.

Pure: the environment comes in as a mapping and the config file through a function the caller passes,
so the rule is testable without touching the process.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.booleans import parse_bool
from hami.config import SCHEDULER_SWITCHES, DeviceConfig
from hami.errors import InvalidRequest

__all__ = [
    "SettingError", "add_switches", "argtype", "boolean", "duration", "env_names", "file_problems", "resolve",
    "switches_of",
]  # fmt: skip

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")  # ASCII digits, as Go's durations
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class SettingError(InvalidRequest):
    """An environment value that its flag's type refuses; the message names the flag, the variable
    and the valid values."""


def duration(value: str) -> float:
    """``300`` / ``300s`` / ``5m`` / ``1m30s`` / ``500ms`` -> seconds (float).

    Raises InvalidRequest naming the valid forms for anything else (``5 minutes``, empty text).
    """
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise InvalidRequest(f"{value!r} is not a duration; valid: 300, 300s, 5m, 1m30s, 500ms")
    return total


def boolean(value: str) -> bool:
    """A boolean flag or variable value by the shared truth table (`hami.booleans`).

    Raises InvalidRequest naming the valid values.
    """
    try:
        return parse_bool(str(value), field="value")
    except InvalidRequest as e:
        # parse_bool's message starts with the field; the caller names the flag and the variable.
        raise InvalidRequest(str(e).split(": ", 1)[1]) from None


def add_switches(parser: argparse.ArgumentParser) -> None:
    """Add HAMi's vendor switches (`hami.config.SCHEDULER_SWITCHES`: ``--enable-ascend``,
    ``--enable-iluvatar``) to a server's parser, in HAMi's forms ``--enable-ascend`` and
    ``--enable-ascend=true|false``.

    The built-in default is false; a server's config layer supplies the device config's value
    (`switches_of`) and applies the result with `hami.config.with_switches`, so the order is the usual
    flag > environment (``<PREFIX>ENABLE_ASCEND``) > ``scheduler.enableAscend`` > false.
    """
    for dest, key in SCHEDULER_SWITCHES.items():
        parser.add_argument(
            "--" + dest.replace("_", "-"), dest=dest, type=argtype(boolean), nargs="?", const=True,
            default=False, metavar="BOOL",
            help=f"HAMi's switch for scheduler.{key} of the device config, which it overrides (default: "
            "that key, false)",
        )  # fmt: skip


def switches_of(config: DeviceConfig) -> dict[str, bool]:
    """The device config's values of the `add_switches` flags: flag dest -> bool (for a config layer)."""
    return {dest: getattr(config.scheduler, key) for dest, key in SCHEDULER_SWITCHES.items()}


def file_problems(files: Mapping[str, str | None]) -> list[str]:
    """Flag -> path of the files a server reads at start -> one line per unusable one, in order.

    A None or empty path (flag not given) is skipped. Each line names the flag and the path:
    ``--tls-cert-file 'tls.crt': no such file`` / ``is a directory, want a file`` / ``not readable
    (permission denied)``. Empty when every file can be opened for reading. Touches the filesystem, so
    `resolve` never calls it: the servers do, just before they read the files (the device config in
    their config layer, certificates in ``main``).
    """
    problems = []
    for flag, path in files.items():
        if not path:
            continue
        if os.path.isdir(path):
            why = "is a directory, want a file"
        elif not os.path.exists(path):
            why = "no such file"
        elif not os.access(path, os.R_OK):
            why = "not readable (permission denied)"
        else:
            continue
        problems.append(f"{flag} {path!r}: {why}")
    return problems


def argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse ``type=``: its InvalidRequest becomes an ArgumentTypeError, so argparse
    shows our message (the valid forms) instead of its generic "invalid value"."""

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except InvalidRequest as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def env_names(
    dest: str, *, prefix: str, aliases: Mapping[str, Sequence[str]] | None = None
) -> tuple[str, ...]:
    """The environment variables of flag `dest`, in precedence order: ``<prefix><DEST>``, then aliases."""
    return (prefix + dest.upper(), *((aliases or {}).get(dest, ())))


class _Unset:
    """Marks a flag absent from the command line (argparse keeps a namespace's existing attributes)."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions  # noqa: SLF001 - the parser's declared flags are the option list
        if a.option_strings and a.dest != "help" and not isinstance(a, argparse._VersionAction)  # noqa: SLF001
    ]


def _from_text(action: argparse.Action, raw: str, source: str) -> Any:
    """`raw` (an environment value) read with `action`'s type. Raises SettingError worded like
    argparse's own message for the flag, plus the variable it came from."""
    flag = "argument " + "/".join(action.option_strings)
    try:
        if action.nargs == 0:  # store_true / store_const: a switch; the variable names the dest
            on = boolean(raw)
            if isinstance(action.const, bool):
                return on
            return action.const if on else _default(action)
        value = action.type(raw) if action.type else raw
    except (argparse.ArgumentTypeError, InvalidRequest) as e:
        raise SettingError(f"{flag}: {e} (from environment variable {source})") from None
    except (ValueError, TypeError):
        kind = getattr(action.type, "__name__", "value")
        raise SettingError(
            f"{flag}: invalid {kind} value: {raw!r} (from environment variable {source})"
        ) from None
    if action.choices is not None and value not in action.choices:
        valid = ", ".join(map(repr, action.choices))
        raise SettingError(
            f"{flag}: invalid choice: {raw!r} (choose from {valid}) (from environment variable {source})"
        )
    return value


def _default(action: argparse.Action) -> Any:
    # argparse applies `type` to a string default; keep that reading.
    if isinstance(action.default, str) and action.type is not None:
        return action.type(action.default)
    return action.default


def resolve(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    *,
    env: Mapping[str, str],
    prefix: str,
    aliases: Mapping[str, Sequence[str]] | None = None,
    config: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every flag of `parser` -> its value by flag > environment > config file > default.

    `argv`: the command line (None = ``sys.argv[1:]``, as argparse). `env`: the environment
    (``os.environ`` in production). `prefix`: the servers' variable prefix (``HAMI_EXTENDER_``).
    `aliases`: flag dest -> further variable names read after ``<prefix><DEST>`` (HAMi's names).
    `config`: called once with the values resolved from flags and environment (so it can find the
    config file's path and the node name), it returns dest -> value for the flags the config file
    supplies; its errors (a bad file) propagate unchanged.

    Returns a dict keyed by argparse dest. Exits with status 2 and argparse's usage message for a bad
    command line or a bad environment value (the message names the flag and the variable).
    """
    given = argparse.Namespace(**{a.dest: _UNSET for a in _options(parser)})
    parser.parse_args(argv, namespace=given)
    values: dict[str, Any] = {}
    unset: list[argparse.Action] = []
    for action in _options(parser):
        value = getattr(given, action.dest)
        if value is not _UNSET:
            values[action.dest] = value
            continue
        for name in env_names(action.dest, prefix=prefix, aliases=aliases):
            if name in env:
                try:
                    values[action.dest] = _from_text(action, env[name], name)
                except SettingError as e:
                    parser.error(str(e))
                break
        else:
            unset.append(action)
    # The config file fills only flags neither the command line nor the environment set.
    supplied = dict(config({**{a.dest: _default(a) for a in unset}, **values})) if config else {}
    for action in unset:
        if action.dest in supplied and supplied[action.dest] is not None:
            values[action.dest] = supplied[action.dest]
        else:
            values[action.dest] = _default(action)
    return values
