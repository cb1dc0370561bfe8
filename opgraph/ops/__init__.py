"""Abstract ops, one module per family. Every op class of every module here
is re-exported (found, not listed: a new op needs no line in this file);
``__all__`` lists the op classes (the policy's op names)."""

import importlib as _importlib
import pkgutil as _pkgutil

import attrs as _attrs

from ..op import Op as _Op

__all__: list[str] = []
for _info in _pkgutil.iter_modules(__path__):
    if _info.name.startswith("_"):  # _fields: field factories, no ops
        continue
    _module = _importlib.import_module(f"{__name__}.{_info.name}")
    for _name, _obj in vars(_module).items():
        if (isinstance(_obj, type) and issubclass(_obj, _Op) and _obj.__module__ == _module.__name__
                and not _name.startswith("_") and _attrs.has(_obj)):  # op classes are attrs classes; plain bases are not ops
            globals()[_name] = _obj
            __all__.append(_name)
__all__.sort()


def of_family(family: str, direction: str | None = None) -> tuple[type, ...]:
    """The op classes of ``family`` (and ``direction`` when given), by name:
    the declarations ``Op.family`` / ``Op.direction`` read back, e.g.
    ``of_family('conv', 'wgrad') == (Conv2dBackwardFilter,)``."""
    classes = (globals()[name] for name in __all__)
    return tuple(c for c in classes if c.family == family and direction in (None, c.direction))
