"""A stand-in for the ``cupy`` module in the CPU launch tests of our GPU kernels."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def cupy_replaced(monkeypatch, standin, *caches):
    """``standin`` as ``sys.modules['cupy']`` inside the block; the ``lru_cache``
    functions ``caches`` (compiled-kernel caches) are cleared on entry and on
    exit, so that no stand-in kernel is left for a later (GPU) test."""
    monkeypatch.setitem(sys.modules, "cupy", standin)
    for cache in caches:
        cache.cache_clear()
    try:
        yield standin
    finally:
        for cache in caches:
            cache.cache_clear()
