"""A non-editable install works: build a wheel from a copy of the repository,
install it into a fresh virtual environment, and import every subpackage and
run the console script from outside the repository.

Offline and fast: the wheel is built without build isolation (setuptools and
wheel of the running environment) and installed with ``--no-deps --no-index``;
the new environment then sees the running one's site-packages (numpy, attrs,
networkx, scipy) through a path file written *after* the install, which adds
those directories to ``sys.path`` without running their own ``.pth`` files,
so the editable install of the checkout stays invisible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["opgraph", "opgraph.ops", "opgraph.onnx", "opgraph.backends", "opgraph.backends.reference",
               "opgraph.backends.algorithms", "opgraph.backends.cuda",
               "opgraph.passes", "opgraph.benchmarks", "opgraph.benchmarks.models"]
# What a fresh clone would not have, or what the build does not need.
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".whl", ".gl", "*.pyc")


def _build_tools_missing() -> str | None:
    try:
        st = tuple(int(p) for p in version("setuptools").split(".")[:2])
    except PackageNotFoundError:
        return "setuptools is not installed"
    if st < (64, 0):
        return f"setuptools {version('setuptools')} < 64 cannot build this layout"
    try:
        version("wheel")
    except PackageNotFoundError:
        if st < (70, 1):  # older setuptools needs the wheel package for bdist_wheel
            return "the 'wheel' package is missing (setuptools < 70.1 needs it)"
    return None


def _run(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    missing = _build_tools_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build offline: {missing} (.ci/run installs them)")
        pytest.skip(f"cannot build offline: {missing}")
    tmp = tmp_path_factory.mktemp("pkg")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    shutil.copytree(REPO, src, ignore=IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", dist, src], cwd=tmp)
    (wheel,) = dist.glob("opgraph-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q",
          wheel], cwd=tmp)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_opgraph_test_deps.pth").write_text("\n".join(sorted(here)) + "\n")
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "py": py, "site": site}


def test_wheel_holds_only_the_opgraph_namespace(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    tops = {n.split("/")[0] for n in names}
    # nothing generic (backends, passes, benchmarks) at the top of site-packages
    assert {t for t in tops if not t.endswith(".dist-info")} == {"opgraph"}
    for pkg in SUBPACKAGES:
        assert pkg.replace(".", "/") + "/__init__.py" in names, pkg
    assert "opgraph/benchmarks/specs/imagenet_winners.json" in names
    assert "opgraph/benchmarks/specs/layer_suite.json" in names
    assert "opgraph/benchmarks/specs/modern_convnets.json" in names


def test_every_subpackage_imports_from_the_installed_copy(installed):
    code = ("import importlib, json; "
            f"print(json.dumps({{m: importlib.import_module(m).__file__ for m in {SUBPACKAGES!r}}}))")
    out = _run([installed["py"], "-c", code], cwd=installed["tmp"]).stdout
    files = json.loads(out)
    for mod, path in files.items():
        assert Path(path).resolve().is_relative_to(installed["site"].resolve()), (mod, path)
        assert not Path(path).resolve().is_relative_to(REPO), (mod, path)


def test_console_script_of_the_installed_copy_runs(installed):
    exe = installed["venv"] / "bin" / "opgraph-bench"
    assert exe.exists()
    out = _run([exe, "--model", "L5", "--summary", "--format", "json"], cwd=installed["tmp"]).stdout
    (m,) = json.loads(out)["models"]
    assert m["model"] == "L5" and m["totals"]["params"] == 1327488
