"""Installs the build tree into a scratch prefix and builds one of
examples/ against it with find_package(tessel), as a project outside
tessel's tree would: the first steps of the install tests."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, finish, run  # noqa: E402


def install_and_build(build, source, work, example):
    """Returns (the install prefix, the example's build directory); ends the
    test (with what failed) if a step fails."""
    prefix = os.path.join(work, "prefix")
    code, out, _ = run(["cmake", "--install", build, "--prefix", prefix], timeout=300)
    check("tessel installs into a scratch prefix", code == 0, out[-2000:])
    generator = ["-G", "Ninja"] if subprocess.run(["which", "ninja"], capture_output=True).returncode == 0 else []
    example_build = os.path.join(work, example)
    code, out, _ = run(["cmake", "-S", os.path.join(source, "examples", example), "-B", example_build,
                        f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"] + generator, timeout=300)
    check("the example configures with find_package(tessel)", code == 0, out[-3000:])
    code, out, secs = run(["cmake", "--build", example_build], timeout=600)
    check(f"the example builds against the install ({secs:.0f} s)", code == 0, out[-3000:])
    if code != 0:
        finish()
    return prefix, example_build
