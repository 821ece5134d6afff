"""Regenerate the committed Python stubs (api_pb2.py, api_pb2_grpc.py) from api.proto with grpcio-tools.

    python -m inferwatch.exporters.gpu.podresources.generate [--check]

grpcio-tools is a test dependency (`pip install -e '.[test]'`); the service itself needs only grpcio and
protobuf. `--check` writes nothing and exits 1 when the committed stubs differ from what the proto gives
(tests/test_gpu_pods.py runs it). The stubs import each other by their package path, so the proto is compiled
under the virtual path inferwatch/exporters/gpu/podresources/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_PATH = "inferwatch/exporters/gpu/podresources"
STUBS = ("api_pb2.py", "api_pb2_grpc.py")
HEADER = ("# Generated from api.proto (the kubelet's PodResources v1 API) by grpcio-tools; do not edit.\n"
          "# Regenerate: python -m inferwatch.exporters.gpu.podresources.generate\n")


def render() -> dict[str, str]:
    """{stub file name: text} compiled from api.proto now. Raises RuntimeError when protoc fails."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        code = protoc.main(["grpc_tools.protoc", f"-I{PACKAGE_PATH}={HERE}", f"--python_out={out}",
                            f"--grpc_python_out={out}", f"{PACKAGE_PATH}/api.proto"])
        if code != 0:
            raise RuntimeError(f"protoc failed (exit {code}) on {HERE / 'api.proto'}")
        return {name: HEADER + (Path(out) / PACKAGE_PATH / name).read_text() for name in STUBS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    args = parser.parse_args(argv)
    stale = [name for name, text in render().items()
             if not (HERE / name).exists() or (HERE / name).read_text() != text]
    if args.check:
        for name in stale:
            print(f"stale: {HERE / name} (regenerate: python -m inferwatch.exporters.gpu.podresources.generate)")
        return 1 if stale else 0
    for name, text in render().items():
        (HERE / name).write_text(text)
    print(f"wrote {', '.join(STUBS)} in {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
