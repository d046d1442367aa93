"""The package as `pip install .` installs it (no GPU).

* The version is one number: lfce.__version__ (which pyproject.toml reads) is CMake's project
  version.
* `pip install .` into a fresh virtual environment (no torch, no LFCE_LIBRARY, no PYTHONPATH)
  builds the library, and the installed package imports, reports its version and metadata, finds
  liblfce.so inside itself, generates a kernel, and its `lfce` console entry point runs the C++
  command line shipped in the package. The build takes minutes on two cores, so this test runs
  only with LFCE_TEST_PIP_INSTALL=1 (it uses ccache when installed); it needs PyPI for the build
  backend (scikit-build-core).
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

import lfce
from lfce import _cli

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


@pytest.mark.skipif(os.environ.get("LFCE_TEST_PIP_INSTALL") != "1",
                    reason="pip install . builds liblfce.so (minutes on 2 cores): set LFCE_TEST_PIP_INSTALL=1")
def test_pip_install_into_a_fresh_venv_gives_a_working_package(tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip"]
    env = {key: value for key, value in os.environ.items()
           if key not in ("LFCE_LIBRARY", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    options = [f"--config-settings=build-dir={tmp_path / 'build'}"]
    if shutil.which("ccache"):
        options.append("--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache")
    run(*pip, "install", "-q", *options, REPO, env=env, timeout=3600)

    # Run outside the checkout: the installed package must be the one imported.
    out = run(python, "-c", INSTALLED_REPORT, env=env, cwd=tmp_path).split("\n")
    version, metadata_version = out[0].split()
    assert version == metadata_version == lfce.__version__
    package_dir = out[1]
    assert package_dir.startswith(str(venv)), f"imported {package_dir}, not the installed package"
    assert out[2] == os.path.join(package_dir, "liblfce.so"), f"loaded {out[2]}"
    assert int(out[3]) > 0
    assert "compile" in run(str(venv / "bin" / "lfce"), "--help", env=env)
