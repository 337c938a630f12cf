"""Regenerate the Python stubs for the kubelet device plugin API from ``api.proto``.

The stubs are committed so that the plugin runs without ``grpcio-tools``; this script is the one way to
rebuild them after the proto changes (``python -m device_plugin.api.generate``, or ``--check`` in CI to
fail when the committed stubs are stale). The proto is compiled with the repository root as include
path, so its descriptor file name is ``device_plugin/api/api.proto``: unique in the process-wide
descriptor pool even if another ``api.proto`` (e.g. podresources/v1) is loaded next to it
(k8s-protocols.md §2.5 item 16), and the generated ``_grpc`` module imports ``device_plugin.api.api_pb2``.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
REPO_ROOT = API_DIR.parent.parent
PROTO = "device_plugin/api/api.proto"
OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py")


def generate(out_root: Path) -> None:
    """Run protoc (from grpcio-tools) on ``api.proto``, writing under ``out_root``/device_plugin/api/.

    Raises RuntimeError when protoc fails; ImportError when grpcio-tools is not installed.
    """
    from grpc_tools import protoc  # only needed here: the runtime uses the committed stubs

    (out_root / "device_plugin" / "api").mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).resolve().parent / "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{REPO_ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(REPO_ROOT / PROTO),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc} on {PROTO}")


def main(argv: list[str] | None = None) -> int:
    """Regenerate the stubs in place, or with ``--check`` report (exit 1) when they differ from the proto."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the stubs are stale")
    args = parser.parse_args(argv)
    if not args.check:
        generate(REPO_ROOT)
        print(f"regenerated {', '.join(OUTPUTS)} in {API_DIR}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in OUTPUTS
            if not filecmp.cmp(Path(tmp) / "device_plugin" / "api" / name, API_DIR / name, shallow=False)
        ]
    if stale:
        print(f"stale generated stubs: {', '.join(stale)}; run python -m device_plugin.api.generate")
        return 1
    print("generated stubs are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
