"""Builds the `tessera` Python package's extension with the project's CMake.

tessera._tessera links the project's static libraries, so it is CMake's
target tessera_python (python/CMakeLists.txt), configured as scripts/common.sh
configures release builds; the pure-Python modules come from python/tessera.
The metadata is pyproject.toml's.

The CMake build goes to a temporary directory, removed afterwards, unless
TESSERA_CMAKE_BUILD_DIR names one: a configured build there (scripts/test's,
scripts/install-python's) is built as it is configured, anything else is
configured first. Either way only tessera_python and what it links are built,
with ccache where it is installed.
"""

import atexit
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import ExecError, SetupError

ROOT = os.path.dirname(os.path.abspath(__file__))

# The repository's build/ is CMake's (scripts/common.sh), so setuptools'
# own build folders and egg-info go to a temporary directory instead.
_BUILD_BASE = tempfile.mkdtemp(prefix="tessera-setup-")
atexit.register(shutil.rmtree, _BUILD_BASE, ignore_errors=True)

# As scripts/common.sh's TESSERA_RELEASE_FLAGS.
RELEASE_FLAGS = ["-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"]


def _cmake_project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*tessera\s+VERSION\s+([0-9.]+)", f.read())
    if not m:
        raise SetupError("CMakeLists.txt: no project(tessera VERSION ...)")
    return m.group(1)


def _temporary_build_dir():
    """A CMake build folder removed at exit: build-pip-XXXXXX in the
    repository (ignored by git) where it is writable, so that ccache, with
    its base_dir over the repository, shares objects between pip builds and
    with the checkout's other builds under the same base_dir (build/ when
    CCACHE_BASEDIR covers it); else one in $TMPDIR."""
    try:
        path = tempfile.mkdtemp(prefix="build-pip-", dir=ROOT)
    except OSError:
        path = tempfile.mkdtemp(prefix="tessera-build-pip-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _ccache_env():
    # A build folder of another name compiles the same sources: ccache hits
    # only when it rewrites paths below base_dir to relative ones and leaves
    # the working directory out of the hash (the debug info's compilation
    # directory may then name another build's folder). The caller's settings
    # win.
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", ROOT)
    if "CCACHE_HASHDIR" not in env:
        env.setdefault("CCACHE_NOHASHDIR", "1")
    return env


def _run(cmd):
    print(" ".join(cmd), flush=True)
    try:
        subprocess.run(cmd, check=True, env=_ccache_env())
    except FileNotFoundError:
        raise ExecError(f"{cmd[0]} not found: building tessera needs CMake and the "
                        "project's Debian packages (scripts/common.sh, TESSERA_PACKAGES)")
    except subprocess.CalledProcessError as e:
        raise ExecError(f"{' '.join(cmd)} failed (exit status {e.returncode})")


class CMakeBuild(build_ext):
    """Builds tessera_python with CMake and copies the extension into the wheel."""

    def build_extension(self, ext):
        version = self.distribution.get_version()
        if version != _cmake_project_version():
            raise SetupError(f"pyproject.toml's version {version} differs from "
                             f"CMakeLists.txt's {_cmake_project_version()}")
        named = os.environ.get("TESSERA_CMAKE_BUILD_DIR")
        build_dir = os.path.abspath(named) if named else _temporary_build_dir()
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure = ["cmake", "-S", ROOT, "-B", build_dir, *RELEASE_FLAGS]
            if shutil.which("ccache"):
                configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
            if not named:
                # A named folder is configured as scripts/common.sh would, so
                # that it serves scripts/test too; this one serves this
                # interpreter and pybind11 (an isolated build's, or Debian's)
                # only.
                configure += ["-DBUILD_TESTING=OFF", f"-DPython3_EXECUTABLE={sys.executable}"]
                if importlib.util.find_spec("pybind11"):
                    import pybind11
                    if os.path.isdir(pybind11.get_cmake_dir()):
                        configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
            _run(configure)
        build = ["cmake", "--build", build_dir, "--target", "tessera_python"]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            build += ["-j", str(os.cpu_count() or 1)]
        _run(build)

        # The extension for this interpreter's ABI; a reused build configured
        # for another Python has none.
        built_dir = os.path.join(build_dir, "python", "tessera")
        name = ext.name.rsplit(".", 1)[-1]
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            built = os.path.join(built_dir, name + suffix)
            if os.path.exists(built):
                break
        else:
            found = sorted(f for f in os.listdir(built_dir) if f.startswith(name)) if \
                os.path.isdir(built_dir) else []
            raise SetupError(
                f"{built_dir} has no {name} extension for {sys.executable} "
                f"(suffixes {importlib.machinery.EXTENSION_SUFFIXES}; found {found}): "
                "that build is configured for another Python")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


class MissingWheel(Command):
    """Stands in for bdist_wheel where the `wheel` package is missing.

    That happens only under `pip install --no-build-isolation` (pip's isolated
    builds install it), where the build runs in the target Python: this says
    what that Python lacks, numpy included, instead of setuptools'
    "invalid command 'bdist_wheel'"."""

    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        missing = ["wheel"] + [m for m in ("pybind11", "numpy") if not _has_distribution(m)]
        raise SetupError(
            f"{sys.executable} lacks {', '.join(missing)}: pip install --no-build-isolation "
            "builds tessera with what this Python has, and tessera needs numpy to run. "
            "Offline on Debian, use a virtualenv of Debian's python3 made with "
            "--system-site-packages (/usr/bin/python3 -m venv --system-site-packages VENV, "
            "as scripts/install-python VENV does where VENV is absent), which sees "
            "python3-wheel, python3-pybind11 and python3-numpy; with a package index, "
            "install them first or leave out --no-build-isolation.")

    def run(self):
        pass


def _has_distribution(name):
    # Its metadata, not only its module: setuptools finds bdist_wheel through
    # the wheel distribution's entry points.
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


cmdclass = {"build_ext": CMakeBuild}
if not _has_distribution("wheel"):
    cmdclass["bdist_wheel"] = MissingWheel

setup(
    # In setup.py rather than pyproject.toml's [tool.setuptools], which
    # setuptools 66 (Debian 12's) calls beta and warns about.
    packages=["tessera"],
    package_dir={"tessera": "python/tessera"},
    ext_modules=[Extension("tessera._tessera", sources=[])],
    cmdclass=cmdclass,
    options={"build": {"build_base": _BUILD_BASE}, "egg_info": {"egg_base": _BUILD_BASE}},
)
