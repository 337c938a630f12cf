"""hami.serving: the one way every server runs (start, serve until SIGTERM/SIGINT, stop; one line and the
server's exit status for each start-up failure) and the device config as the options' config layer."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from collections.abc import Sequence
from pathlib import Path

import pytest

from hami import serving
from hami.errors import ConfigError, HamiError


class Service:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def start(self) -> Service:
        self.events.append("start")
        return self

    async def stop(self) -> None:
        self.events.append("stop")


async def test_serves_until_the_stop_event_then_stops() -> None:
    service, stop = Service(), asyncio.Event()
    task = asyncio.create_task(serving.serve_until_signalled(service.start, stop=stop))
    await asyncio.sleep(0.01)
    assert service.events == ["start"]
    stop.set()
    assert await task is service
    assert service.events == ["start", "stop"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_sigterm_and_sigint_stop_the_service(sig: signal.Signals) -> None:
    service = Service()

    async def start() -> Service:
        await service.start()
        os.kill(os.getpid(), sig)  # handled by the loop: a stop, not the process's end
        return service

    await asyncio.wait_for(serving.serve_until_signalled(start), 5)
    assert service.events == ["start", "stop"]


async def test_a_failed_start_stops_nothing() -> None:
    async def start() -> Service:
        raise OSError("address already in use")

    with pytest.raises(OSError, match="address already in use"):
        await serving.serve_until_signalled(start, stop=asyncio.Event())


def command(said: list[str], *, parse=None, serve=None, **kw) -> serving.ServerMain:  # type: ignore[no-untyped-def]
    def default_parse(argv: Sequence[str] | None) -> dict:
        return {"level": "INFO"}

    async def default_serve(options: dict) -> None:
        return None

    return serving.ServerMain(
        parse=parse or default_parse,
        serve=serve or default_serve,
        log_level=lambda o: o["level"],
        say=said.append,
        **kw,
    )


def raising(error: BaseException):  # type: ignore[no-untyped-def]
    async def serve(options: dict) -> None:
        raise error

    return serve


def test_a_clean_stop_is_status_0() -> None:
    said: list[str] = []
    assert command(said)([]) == 0 and said == []


def test_a_bad_device_config_is_one_line_and_the_config_status() -> None:
    def parse(argv: Sequence[str] | None) -> dict:
        raise ConfigError("cfg.yaml: invalid YAML at line 2")

    said: list[str] = []
    assert command(said, parse=parse)([]) == 2
    assert command(said, parse=parse, config_status=1)([]) == 1
    assert said == ["cfg.yaml: invalid YAML at line 2"] * 2


def test_start_up_checks_and_file_flags_are_status_2_before_serving(tmp_path: Path) -> None:
    served: list[dict] = []

    async def serve(options: dict) -> None:
        served.append(options)

    said: list[str] = []
    missing = str(tmp_path / "tls.crt")
    files = command(said, serve=serve, files=lambda o: {"--tls-cert-file": missing}, start_status=1)
    assert files([]) == 2
    checked = command(said, serve=serve, check=lambda o: ["--node-name is required"], start_status=1)
    assert checked([]) == 2
    assert said == [f"--tls-cert-file {missing!r}: no such file", "--node-name is required"]
    assert served == []


@pytest.mark.parametrize("error", [OSError("address already in use"), HamiError("NVML init failed")])
def test_a_failed_start_is_one_line_and_the_start_status(error: BaseException) -> None:
    said: list[str] = []
    assert command(said, serve=raising(error))([]) == 2
    assert command(said, serve=raising(error), start_status=1, describe=lambda e: f"cannot start: {e}")([]) == 1
    assert said == [str(error), f"cannot start: {error}"]


def test_certificates_that_are_no_pem_pair_name_both_flags() -> None:
    said: list[str] = []
    error = ssl.SSLError(9, "[SSL] PEM lib")
    main = command(said, serve=raising(error), tls_files=lambda o: ("c.crt", "k.key"))
    assert main([]) == 2
    assert said == [f"--tls-cert-file 'c.crt' / --tls-private-key-file 'k.key': {error}"]


def test_sigint_before_the_handlers_is_a_stop_not_a_traceback() -> None:
    # The webhook and the device plugin let a Ctrl-C during start-up end in a traceback.
    said: list[str] = []
    assert command(said, serve=raising(KeyboardInterrupt()))([]) == 0 and said == []


def test_logged_says_cannot_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        serving.logged(logging.getLogger("probe"))("--port: busy")
    assert caplog.messages == ["cannot start: --port: busy"]


def test_an_empty_config_path_means_the_built_in_defaults() -> None:
    # `--config ''` (or HAMI_EXTENDER_CONFIG= / HAMI_WEBHOOK_CONFIG=) was read as the file '' and
    # refused with ": cannot read device config: Is a directory".
    from scheduler_extender.cli import parse_args as extender_args
    from webhook.cli import parse_args as webhook_args

    assert extender_args(["--config", ""], env={}).device_config.scheduler.schedulerName == "hami-scheduler"
    options = webhook_args([], env={"HAMI_WEBHOOK_CONFIG": "", "HAMI_WEBHOOK_TLS_CERT_FILE": "c",
                                    "HAMI_WEBHOOK_TLS_PRIVATE_KEY_FILE": "k"})  # fmt: skip
    assert options.scheduler_name == "hami-scheduler"


def test_the_device_config_supplies_what_flags_and_environment_leave(tmp_path: Path) -> None:
    import argparse

    config = tmp_path / "device-config.yaml"
    config.write_text("scheduler:\n  schedulerName: from-file\n")
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--scheduler-name", default="hami-scheduler")
    serving.settings.add_switches(parser)
    values, loaded = serving.resolve_with_device_config(parser, ["--config", str(config)], env={}, prefix="P_")
    assert values["scheduler_name"] == "from-file" and loaded.scheduler.schedulerName == "from-file"
    values, _ = serving.resolve_with_device_config(
        parser, ["--config", str(config)], env={"P_SCHEDULER_NAME": "from-env"}, prefix="P_"
    )
    assert values["scheduler_name"] == "from-env"
    with pytest.raises(SystemExit) as exit_:
        serving.resolve_with_device_config(parser, ["--config", str(tmp_path)], env={}, prefix="P_")
    assert exit_.value.code == 2
