"""The package as `pip install .` installs it (no GPU).

* The version is one number: lfce.__version__ (which pyproject.toml reads) is CMake's project
  version.
* `pip install .` into a fresh virtual environment (no torch, no LFCE_LIBRARY, no PYTHONPATH)
  builds the library, and the installed package imports, reports its version and metadata, finds
  liblfce.so inside itself, generates a kernel, and its `lfce` console entry point runs the C++
  command line shipped in the package (help, and `lfce compile` of a small problem). It needs PyPI
  for the build backend (scikit-build-core) and runs with LFCE_TEST_PIP_INSTALL=1, which
  scripts/test.sh sets in CI. Where the build under test (the folder of the liblfce.so the tests
  load) compiled through ccache, the pip build does too, with the same compiler, in a fresh folder
  beside it and CCACHE_BASEDIR at the repository root: the same relative paths, so it reuses those
  objects and only configures and links (seconds instead of minutes on two cores).
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

import lfce
from lfce import _cli, _lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_package_version_is_the_cmake_project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(lfce VERSION ([0-9.]+)", f.read()).group(1)
    assert lfce.__version__ == cmake_version


def test_console_entry_point_names_a_missing_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(_cli, "executable", lambda: str(tmp_path / "bin" / "lfce"))
    with pytest.raises(SystemExit, match=re.escape(str(tmp_path / "bin" / "lfce")) + " is missing"):
        _cli.main()


# What the installed package reports: versions, its folder, the library it loaded, a kernel count.
INSTALLED_REPORT = """
import importlib.metadata, os, lfce
from lfce import _lib
print(lfce.__version__, importlib.metadata.version("lfce"))
print(os.path.dirname(lfce.__file__))
print(_lib.load()._name)
print(len(lfce.generate(1000, 256, arch="sm_80")))
"""


def run(*command, env=None, timeout=60, cwd=None):
    result = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def cmake_cache(build_dir):
    """The CMakeCache.txt entries of a build folder ({} where it is none)."""
    entries = {}
    if os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                match = re.match(r"([A-Za-z_0-9]+):[A-Z]+=(.*)", line.rstrip("\n"))
                if match:
                    entries[match.group(1)] = match.group(2)
    return entries


def pip_build_options(tmp_path, env):
    """--config-settings for the pip build: the compile cache of the build under test where it has one."""
    build_dir = os.path.dirname(os.path.realpath(_lib.load()._name))
    cache = cmake_cache(build_dir)
    launcher = cache.get("CMAKE_CXX_COMPILER_LAUNCHER", "")
    if os.path.basename(launcher) != "ccache" or not shutil.which(launcher):
        return [f"--config-settings=build-dir={tmp_path / 'build'}"]
    pip_build_dir = build_dir + "-pip-test"  # beside it: the same paths relative to the build folder
    shutil.rmtree(pip_build_dir, ignore_errors=True)
    env.setdefault("CCACHE_BASEDIR", REPO)
    return [f"--config-settings=build-dir={pip_build_dir}",
            f"--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER={launcher}",
            f"--config-settings=cmake.define.CMAKE_CXX_COMPILER={cache['CMAKE_CXX_COMPILER']}"]


PIP_INSTALL = os.environ.get("LFCE_TEST_PIP_INSTALL")


@pytest.mark.skipif(PIP_INSTALL != "1", reason="pip install . builds liblfce.so: set LFCE_TEST_PIP_INSTALL=1 (CI does)"
                    if PIP_INSTALL != "0" else "LFCE_TEST_PIP_INSTALL=0 (ctest runs it in python.cpu alone)")
def test_pip_install_into_a_fresh_venv_gives_a_working_package(tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip"]
    env = {key: value for key, value in os.environ.items()
           if key not in ("LFCE_LIBRARY", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run(*pip, "install", "-q", *pip_build_options(tmp_path, env), REPO, env=env, timeout=3600)

    # Run outside the checkout: the installed package must be the one imported.
    out = run(python, "-c", INSTALLED_REPORT, env=env, cwd=tmp_path).split("\n")
    version, metadata_version = out[0].split()
    assert version == metadata_version == lfce.__version__
    package_dir = out[1]
    assert package_dir.startswith(str(venv)), f"imported {package_dir}, not the installed package"
    assert out[2] == os.path.join(package_dir, "liblfce.so"), f"loaded {out[2]}"
    assert int(out[3]) > 0
    # PEP 561's marker: type checkers read the package's annotations.
    assert os.path.isfile(os.path.join(package_dir, "py.typed")), os.listdir(package_dir)
    # The library and the package only: the benchmark harness (bench/) stays in the checkout.
    assert not os.path.exists(os.path.join(package_dir, "bench")), os.listdir(package_dir)
    assert not list((venv / "lib").glob("python*/site-packages/bench"))

    # The console entry point runs the command line in the package, which loads the library beside it.
    lfce_command = str(venv / "bin" / "lfce")
    assert "compile" in run(lfce_command, "--help", env=env)
    run(lfce_command, "compile", "--vocab", "1000", "--hidden", "256", "--arch", "sm_80", "-o", "kernels",
        env=env, cwd=tmp_path)
    ptx = sorted(p.name for p in (tmp_path / "kernels").glob("*.ptx"))
    assert "lse_forward.ptx" in ptx, ptx
    assert ".target sm_80" in (tmp_path / "kernels" / "lse_forward.ptx").read_text()
