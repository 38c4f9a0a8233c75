"""Generates the scoring.v1 stubs from the repository's proto/ at build time.

The stubs are never committed: every build regenerates them from the single source of truth,
so a contract change cannot ship with stale Python code.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_ROOT = Path(os.environ.get("SCORING_PROTO_ROOT", HERE.parent.parent / "proto"))


def generate_stubs(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    import google.rpc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("scoring/**/*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    common = Path(google.rpc.__path__[0]).parent.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{common}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    for package in {Path(p).parent for p in protos} | {Path("scoring")}:
        (out_dir / package / "__init__.py").touch()


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        generate_stubs(HERE / "src")
        # Package discovery ran before the stubs existed: add their packages now.
        self.packages = sorted(set(self.packages or []) | {"scoring", "scoring.v1"})
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
