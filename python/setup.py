"""Build step of the mooncake-go Python package.

The package is pure Python over one shared library, the Go C ABI
(../capi), which is two files that go together: libmooncake.so, the public
library (a small C library), and libmooncake_go.so beside it, the Go
library (-buildmode=c-shared) that libmooncake.so loads at its first call,
so that a process may load the package and fork before using it. Beside
them goes the mooncake command (../cmd/mooncake) that the official console
scripts (mooncake_master, mooncake_client, transfer_engine_bench, ...) run.
This file adds that build to setuptools:

  * build_py compiles the two with the local Go toolchain and C compiler
    (scripts/build-capi.sh of the repository) or copies a prebuilt pair,
    named by MOONCAKE_GO_LIBRARY, into the package directory; and builds
    the command into mooncake_go/bin/mooncake (or copies MOONCAKE_BIN);
  * the distribution says it has native code, so bdist_wheel writes a
    platform wheel; the tag is py3-none-<platform> because the library is
    loaded with ctypes and does not depend on the Python version.

Environment:
  MOONCAKE_GO_LIBRARY  path of a prebuilt libmooncake.so to bundle, with the
                       libmooncake_go.so beside it (no Go needed)
  MOONCAKE_BIN         path of a prebuilt mooncake command to bundle (with
                       MOONCAKE_GO_LIBRARY: no Go needed at all)
  MOONCAKE_GO_ROOT     root of the mooncake-go module (default: found by
                       walking up from this file to a go.mod of the module)
  GO                   the go command (default: go)
"""

import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

MODULE = "module github.com/mooncake-go/mooncake"
LIBRARY = "libmooncake.so"
GO_LIBRARY = "libmooncake_go.so"
BINARY = os.path.join("bin", "mooncake")
HERE = os.path.dirname(os.path.abspath(__file__))


def module_root():
    """The directory of the mooncake-go go.mod, or None."""
    env = os.environ.get("MOONCAKE_GO_ROOT")
    if env:
        return os.path.abspath(env)
    d = HERE
    while True:
        gomod = os.path.join(d, "go.mod")
        if os.path.isfile(gomod):
            with open(gomod, encoding="utf-8") as f:
                if f.readline().strip() == MODULE:
                    return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def prebuilt_pair(path):
    """The prebuilt libmooncake.so at path and its Go library: beside it, or
    beside the file it links to (where libmooncake.so looks)."""
    for d in (os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))):
        go_library = os.path.join(d, GO_LIBRARY)
        if os.path.isfile(go_library):
            return path, go_library
    sys.exit(f"mooncake-go: MOONCAKE_GO_LIBRARY={path} has no {GO_LIBRARY} beside it (build-capi.sh builds both)")


def go_toolchain(what):
    """The module root and the go command, or an exit naming what needed them."""
    root = module_root()
    if not root or not os.path.isdir(os.path.join(root, "cmd", "mooncake")):
        sys.exit(
            f"mooncake-go: cannot find the sources to build {what}; build from a checkout of "
            "the repository, set MOONCAKE_GO_ROOT to one, or set MOONCAKE_GO_LIBRARY and "
            "MOONCAKE_BIN to prebuilt files"
        )
    go = os.environ.get("GO", "go")
    if shutil.which(go) is None:
        sys.exit(f"mooncake-go: building {what} needs the Go toolchain ('{go}' not found)")
    return root, go


def build_binary(pkg):
    """Writes the mooncake command to pkg/bin/mooncake: a prebuilt one
    (MOONCAKE_BIN) or a fresh build, stripped (it is most of the wheel)."""
    dst = os.path.abspath(os.path.join(pkg, BINARY))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    prebuilt = os.environ.get("MOONCAKE_BIN")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            sys.exit(f"mooncake-go: MOONCAKE_BIN={prebuilt} is not a file")
        shutil.copyfile(prebuilt, dst)
    else:
        root, go = go_toolchain("the mooncake command")
        cmd = [go, "build", "-ldflags=-s -w", "-o", dst, "./cmd/mooncake"]
        print("mooncake-go: " + " ".join(cmd), flush=True)
        subprocess.check_call(cmd, cwd=root, env=dict(os.environ, CGO_ENABLED="1"))
    os.chmod(dst, 0o755)


def build_library(pkg):
    """Writes libmooncake.so and libmooncake_go.so to the directory pkg: a
    prebuilt pair or a fresh build."""
    prebuilt = os.environ.get("MOONCAKE_GO_LIBRARY")
    if prebuilt:
        shared, go_library = prebuilt_pair(prebuilt)
        shutil.copyfile(shared, os.path.join(pkg, LIBRARY))
        shutil.copyfile(go_library, os.path.join(pkg, GO_LIBRARY))
        return
    root = module_root()
    script = root and os.path.join(root, "scripts", "build-capi.sh")
    if not script or not os.path.isfile(script):
        sys.exit(
            "mooncake-go: cannot find the sources (../capi, scripts/build-capi.sh) to build "
            f"{LIBRARY}; build from a checkout of the repository, set "
            "MOONCAKE_GO_ROOT to one, or set MOONCAKE_GO_LIBRARY to a prebuilt library"
        )
    go = os.environ.get("GO", "go")
    if shutil.which(go) is None:
        sys.exit(f"mooncake-go: building {LIBRARY} needs the Go toolchain ('{go}' not found)")
    env = dict(os.environ, CGO_ENABLED="1")
    # Built in a scratch directory, from which only the two libraries are
    # bundled (not the libtransfer_engine.so link; include/ is the contract).
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["bash", script, tmp]
        print("mooncake-go: " + " ".join(cmd), flush=True)
        subprocess.check_call(cmd, cwd=root, env=env)
        for name in (LIBRARY, GO_LIBRARY):
            shutil.copyfile(os.path.join(tmp, name), os.path.join(pkg, name))


class BuildPy(build_py):
    """build_py that also puts libmooncake.so, libmooncake_go.so and the
    mooncake command (bin/mooncake) into the mooncake_go package."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "mooncake_go")
        os.makedirs(pkg, exist_ok=True)
        build_library(pkg)
        build_binary(pkg)


class BinaryDistribution(Distribution):
    """Marks the distribution as carrying native code (platform wheel)."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    """Tags the wheel py3-none-<platform>: ctypes, no Python ABI."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
)
