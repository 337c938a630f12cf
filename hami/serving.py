"""Running one server process, the same way for every server (the scheduler extender, the webhook, the
device plugin and the node monitor): options from the command line, logging, the checks that need the
options, the service started and kept until SIGTERM or SIGINT, then stopped.

Every failure before serving is one line and an exit status, never a traceback (the usage errors of
`argparse` exit 2 by themselves, inside the server's own parser). What differs between the servers is
said once, in its `ServerMain`: how it parses, how it serves, which file flags it checks, how a line is
told (logged, or printed with the program's name) and which statuses its documentation gives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from hami import settings
from hami.config import DeviceConfig, load_config_file
from hami.errors import HamiError

__all__ = [
    "LOG_FORMAT", "ServerMain", "Stoppable", "logged", "resolve_with_device_config", "scheduler_settings",
    "serve_until_signalled",
]  # fmt: skip

#: The log line of every server: time, level, logger name, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

Options = TypeVar("Options")


def scheduler_settings(config: DeviceConfig, values: Mapping[str, Any]) -> dict[str, Any]:
    """What the device config supplies to the scheduler's servers (extender, webhook): ``--scheduler-name``
    from ``scheduler.schedulerName`` and HAMi's vendor switches (`hami.settings.switches_of`)."""
    return {"scheduler_name": config.scheduler.schedulerName, **settings.switches_of(config)}


def resolve_with_device_config(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    *,
    env: Mapping[str, str] | None,
    prefix: str,
    aliases: Mapping[str, Sequence[str]] | None = None,
    flag: str = "--config",
    supplies: Callable[[DeviceConfig, Mapping[str, Any]], Mapping[str, Any]] = scheduler_settings,
) -> tuple[dict[str, Any], DeviceConfig]:
    """`hami.settings.resolve` (flag > environment > config file > default) with the device config file
    named by `flag` as the config layer: the flags it supplies are ``supplies(config, values)``.

    `env` None is ``os.environ``. A path that is empty or not given means the built-in defaults. Returns
    the values by flag dest and the loaded config. Exits 2 with the usage message for a bad flag or
    environment value or a `flag` naming a missing file or a directory; raises ConfigError for a file that
    does not parse.
    """
    dest = flag.lstrip("-").replace("-", "_")
    loaded: dict[str, DeviceConfig] = {}

    def config_layer(values: Mapping[str, Any]) -> Mapping[str, Any]:
        for problem in settings.file_problems({flag: values[dest]}):
            parser.error(problem)
        config = loaded["config"] = load_config_file(values[dest] or None)
        return supplies(config, values)

    values = settings.resolve(
        parser,
        argv,
        env=os.environ if env is None else env,
        prefix=prefix,
        aliases=aliases,
        config=config_layer,
    )
    return values, loaded["config"]


class Stoppable(Protocol):
    """A started service: `stop` ends it (listeners closed, watches and threads ended)."""

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


async def serve_until_signalled(start: Callable[[], Awaitable[S]], *, stop: asyncio.Event | None = None) -> S:
    """Start a service with `start`, keep it until SIGTERM or SIGINT (or until `stop` is set), then stop it.

    The handlers are installed before `start`, so a signal during start-up stops the service as soon as
    it is up. Where the loop cannot take signal handlers (not the main thread) only `stop` ends it.
    Returns the stopped service; what `start` raises propagates (nothing was started to stop).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    service = await start()
    try:
        await stop.wait()
    finally:
        await service.stop()
    return service


def logged(log: logging.Logger) -> Callable[[str], None]:
    """Tell a start-up problem as an ERROR line ``cannot start: <problem>`` of `log`."""
    return lambda problem: log.error("cannot start: %s", problem)


def _no_files(options: object) -> Mapping[str, str | None]:
    return {}


def _no_problems(options: object) -> Iterable[str]:
    return ()


@dataclass(frozen=True)
class ServerMain(Generic[Options]):
    """One server's console script (`__call__` is its ``main``).

    Exit statuses: 0 after SIGTERM or SIGINT; 2 for a usage error (from the parser), a start-up check
    (`check`) or a file flag naming a missing file or a directory (`files`); `config_status` when the
    device config file cannot be used (a `HamiError` from `parse`); `start_status` when starting fails
    (`HamiError`, `OSError`, `ssl.SSLError` for a certificate and key that are no PEM pair).
    """

    #: argv (None: ``sys.argv[1:]``) -> the server's typed options; raises HamiError for a bad config file.
    parse: Callable[[Sequence[str] | None], Options]
    #: The coroutine that serves until SIGTERM/SIGINT (usually through `serve_until_signalled`).
    serve: Callable[[Options], Awaitable[object]]
    #: The logging level the options ask for (a level name or number).
    log_level: Callable[[Options], str | int]
    #: How one problem line reaches the operator (`logged`, or a print with the program's name).
    say: Callable[[str], None]
    #: Flag -> path for the files the server reads at start (`hami.settings.file_problems`).
    files: Callable[[Options], Mapping[str, str | None]] = _no_files
    #: Problems only the resolved options show (a required value the environment may give), checked first.
    check: Callable[[Options], Iterable[str]] = _no_problems
    #: ``(--tls-cert-file, --tls-private-key-file)`` of the options, named when they are no PEM pair.
    tls_files: Callable[[Options], tuple[str | None, str | None]] | None = None
    #: The text of an error that stopped the start (default: the error's own).
    describe: Callable[[BaseException], str] = str
    config_status: int = 2
    start_status: int = 2
    log_format: str = LOG_FORMAT

    def __call__(self, argv: Sequence[str] | None = None) -> int:
        try:
            options = self.parse(argv)
        except HamiError as e:  # a bad device config file: one line, no traceback
            logging.basicConfig(level="INFO", format=self.log_format, stream=sys.stderr)
            self.say(str(e))
            return self.config_status
        logging.basicConfig(level=self.log_level(options), format=self.log_format, stream=sys.stderr)
        for problem in [*self.check(options), *settings.file_problems(self.files(options))]:
            self.say(problem)
            return 2
        try:
            asyncio.run(self.serve(options))
        except ssl.SSLError as e:  # both files open, but they are no PEM certificate and key pair
            if self.tls_files is None:
                self.say(self.describe(e))
            else:
                cert, key = self.tls_files(options)
                self.say(f"--tls-cert-file {cert!r} / --tls-private-key-file {key!r}: {e}")
            return self.start_status
        except (HamiError, OSError) as e:
            self.say(self.describe(e))
            return self.start_status
        except KeyboardInterrupt:  # SIGINT before the handlers were installed: a stop, not a traceback
            pass
        return 0
