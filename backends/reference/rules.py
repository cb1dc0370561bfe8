"""Registers the NumPy reference kernels as the ``reference`` lowering of every op.

Each kernel registers itself where it is defined (``kernel.reference`` /
``kernel.reference_node`` decorators); importing every module of this
package here runs them, so a new module needs no line anywhere else. The
convolution reference (the ``direct`` algorithm) is registered with the
other convolution algorithms in ``opgraph.backends.algorithms.rules``.
"""

from __future__ import annotations

import importlib
import pkgutil

_PACKAGE = __name__.rpartition(".")[0]
for _module in pkgutil.iter_modules(importlib.import_module(_PACKAGE).__path__):
    importlib.import_module(f"{_PACKAGE}.{_module.name}")
