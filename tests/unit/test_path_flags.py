"""Path flags of every server: a relative or unusable path is made absolute or refused in one line that
names the flag (exit 2), never a traceback from deep inside gRPC, ssl or the YAML loader."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from hami import settings

CARDS = "cards:\n  - {uuid: GPU-a, index: 0, model: T4, memory_mib: 1024}\n"


def test_file_problems_name_the_flag_and_the_path(tmp_path: Path) -> None:
    present = tmp_path / "ok.yaml"
    present.write_text("x: 1\n")
    problems = settings.file_problems(
        {"--a": str(present), "--b": str(tmp_path / "nope"), "--c": str(tmp_path), "--d": None, "--e": ""}
    )
    assert problems == [
        f"--b {str(tmp_path / 'nope')!r}: no such file",
        f"--c {str(tmp_path)!r}: is a directory, want a file",
    ]


# ----- device plugin


def _dp_parse(argv: list[str]):  # type: ignore[no-untyped-def]
    from device_plugin.cli import parse_options

    return parse_options(["--node-name", "n", *argv], env={})


def _usage_error(capsys: pytest.CaptureFixture[str], call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


async def test_relative_socket_dir_is_served_from_the_working_directory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # gRPC read unix://device-plugins/nvidia-gpu.sock as host "device-plugins": RuntimeError at start.
    from device_plugin.cli import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cards.yaml").write_text(CARDS)
    options = _dp_parse(["--backend", "fake", "--fake-config", "cards.yaml", "--no-kube",
                         "--socket-dir", "device-plugins", "--metrics-port", "-1"])  # fmt: skip
    assert options.socket_dir == str(tmp_path / "device-plugins")
    stop = asyncio.Event()
    sock = tmp_path / "device-plugins" / "nvidia-gpu.sock"
    task = asyncio.create_task(run(options, stop=stop))
    deadline = asyncio.get_running_loop().time() + 20
    while not sock.is_socket():
        assert not task.done(), task.exception()
        assert asyncio.get_running_loop().time() < deadline, "the plugin never served its socket"
        await asyncio.sleep(0.02)
    stop.set()
    assert await task == 0
    assert not sock.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hook-path", "usr/local"], "--hook-path 'usr/local': must be an absolute host path (kubelet mounts it)"),
        (["--device-config", "/nonexistent/device-config.yaml"],
         "--device-config '/nonexistent/device-config.yaml': no such file"),
    ],
)  # fmt: skip
def test_device_plugin_refuses_unusable_paths(capsys, argv, message) -> None:  # type: ignore[no-untyped-def]
    assert _usage_error(capsys, lambda: _dp_parse(argv)) == f"hami-device-plugin: error: {message}"


def test_device_plugin_socket_dir_that_is_a_file_or_too_long(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    a_file = tmp_path / "f"
    a_file.write_text("")
    last = _usage_error(capsys, lambda: _dp_parse(["--socket-dir", str(a_file)]))
    assert last == f"hami-device-plugin: error: --socket-dir {str(a_file)!r}: not a directory"
    deep = str(tmp_path / ("d" * 120))
    last = _usage_error(capsys, lambda: _dp_parse(["--socket-dir", deep]))
    assert last.startswith(
        f"hami-device-plugin: error: --socket-dir {deep!r}: too long for a unix socket path ("
    )
    assert last.endswith(" bytes with the socket name, at most 107)")


def test_device_plugin_missing_fake_config_is_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from device_plugin.cli import main

    missing = str(tmp_path / "cards.yaml")
    rc = main(["--node-name", "n", "--backend", "fake", "--fake-config", missing, "--no-kube",
               "--socket-dir", str(tmp_path / "dp"), "--metrics-port", "-1"])  # fmt: skip
    assert rc == 2
    assert capsys.readouterr().err == f"hami-device-plugin: --fake-config {missing!r}: no such file\n"


async def test_kubelet_socket_bind_failure_is_an_oserror(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # gRPC signals a failed bind with RuntimeError: at start a traceback, and after a kubelet restart
    # a dead registration task (it retries OSError only).
    from device_plugin.api import api_pb2_grpc as rpc
    from device_plugin.kubelet import KubeletRegistration

    deep = tmp_path / ("d" * 120)
    reg = KubeletRegistration(rpc.DevicePluginServicer, socket_dir=deep, resource_name="nvidia.com/gpu")
    with pytest.raises(
        OSError, match=r"cannot serve the device plugin socket .*nvidia-gpu\.sock: Failed to bind"
    ):
        await reg.start()
    await reg.stop()


# ----- webhook and extender: certificate and config files


def _pem_pair(tmp_path: Path) -> tuple[str, str]:
    from webhook.devcerts import make_ca, make_server_cert, write_pair

    cert, key = write_pair(tmp_path, *make_server_cert(make_ca()))
    return str(cert), str(key)


def _kubeconfig(tmp_path: Path) -> str:
    # Never dialled: the servers stop at the certificate files first.
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    return str(path)


def _servers():  # type: ignore[no-untyped-def]
    from scheduler_extender import cli as extender
    from webhook import cli as webhook

    return [pytest.param(webhook, [], id="webhook"), pytest.param(extender, ["--kubeconfig"], id="extender")]


@pytest.mark.parametrize(("cli", "kube"), _servers())
def test_certificate_files_are_named_by_their_flag(tmp_path, caplog, cli, kube) -> None:  # type: ignore[no-untyped-def]
    cert, key = _pem_pair(tmp_path)
    base = [*(kube and [kube[0], _kubeconfig(tmp_path)]), "--address", "127.0.0.1", "--port", "0"]
    caplog.set_level(logging.ERROR)
    missing = str(tmp_path / "nope.crt")
    assert cli.main([*base, "--tls-cert-file", missing, "--tls-private-key-file", key]) == 2
    assert f"cannot start: --tls-cert-file {missing!r}: no such file" in caplog.messages
    caplog.clear()
    assert cli.main([*base, "--tls-cert-file", cert, "--tls-private-key-file", str(tmp_path)]) == 2
    assert (
        f"cannot start: --tls-private-key-file {str(tmp_path)!r}: is a directory, want a file"
        in caplog.messages
    )
    caplog.clear()
    # Readable files that are no PEM pair: the ssl error, with both flags named.
    assert cli.main([*base, "--tls-cert-file", key, "--tls-private-key-file", cert]) == 2
    [line] = caplog.messages
    assert line.startswith(f"cannot start: --tls-cert-file {key!r} / --tls-private-key-file {cert!r}: [")


@pytest.mark.parametrize(("cli", "kube"), _servers())
def test_missing_config_file_is_a_usage_error(tmp_path, capsys, cli, kube) -> None:  # type: ignore[no-untyped-def]
    missing = str(tmp_path / "device-config.yaml")
    last = _usage_error(capsys, lambda: cli.parse_args(["--tls-cert-file", "c", "--tls-private-key-file", "k",
                                                        "--config", missing], env={}))  # fmt: skip
    assert last.endswith(f": error: --config {missing!r}: no such file")
