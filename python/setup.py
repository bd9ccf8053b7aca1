"""Build step of the mooncake-go Python package.

The package is pure Python over one shared library, libmooncake.so, which
is the Go C ABI (../capi) built with -buildmode=c-shared. This file adds
that build to setuptools:

  * build_py compiles the library with the local Go toolchain
    (scripts/build-capi.sh of the repository, or go build -buildmode=c-shared
    ./capi) or copies a prebuilt one named by MOONCAKE_GO_LIBRARY, into the
    package directory;
  * the distribution says it has native code, so bdist_wheel writes a
    platform wheel; the tag is py3-none-<platform> because the library is
    loaded with ctypes and does not depend on the Python version.

Environment:
  MOONCAKE_GO_LIBRARY  path of a prebuilt libmooncake.so to bundle (no Go needed)
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


def build_library(dest):
    """Writes libmooncake.so to dest: a prebuilt copy or a fresh Go build."""
    prebuilt = os.environ.get("MOONCAKE_GO_LIBRARY")
    if prebuilt:
        shutil.copyfile(prebuilt, dest)
        return
    root = module_root()
    if root is None or not os.path.isdir(os.path.join(root, "capi")):
        sys.exit(
            "mooncake-go: cannot find the Go sources (../capi) to build "
            f"{LIBRARY}; build from a checkout of the repository, set "
            "MOONCAKE_GO_ROOT to one, or set MOONCAKE_GO_LIBRARY to a prebuilt library"
        )
    go = os.environ.get("GO", "go")
    if shutil.which(go) is None:
        sys.exit(f"mooncake-go: building {LIBRARY} needs the Go toolchain ('{go}' not found)")
    env = dict(os.environ, CGO_ENABLED="1")
    # cgo writes a generated header beside the library; build in a scratch
    # directory so that only the library is bundled (include/mooncake.h is
    # the hand-written contract).
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(root, "scripts", "build-capi.sh")
        if os.path.isfile(script):
            # The repository's own build (flags, version script) when present.
            cmd = ["bash", script, tmp]
        else:
            cmd = [go, "build", "-buildmode=c-shared", "-trimpath", "-o", os.path.join(tmp, LIBRARY), "./capi"]
        print("mooncake-go: " + " ".join(cmd), flush=True)
        subprocess.check_call(cmd, cwd=root, env=env)
        shutil.copyfile(os.path.join(tmp, LIBRARY), dest)


class BuildPy(build_py):
    """build_py that also puts libmooncake.so into the mooncake_go package."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "mooncake_go")
        os.makedirs(pkg, exist_ok=True)
        build_library(os.path.join(pkg, LIBRARY))


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
