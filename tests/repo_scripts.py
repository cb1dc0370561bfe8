"""The repository's ``scripts/*.py`` loaded as modules, for the tests of their
pure parts (the device scripts' shapes, cases and tables need no GPU)."""

from __future__ import annotations

import functools
import importlib.util
import pathlib

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


@functools.cache
def load_script(name: str):
    """``scripts/<name>.py`` as a module, executed once per test session."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
