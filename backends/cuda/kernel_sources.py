"""Fingerprints of the Python that writes our generated CUDA kernels: part of the autotune cache key.

The autotune pass reuses a cached decision without running anything (``passes/autotune.py``), so
the decision is only as good as the kernels its rows were measured on. Keyed by a hand-bumped
``REVISION`` alone, a kernel edited after a device run kept its old rows: a candidate fixed since
was still marked wrong, and one changed since was reused unchecked (a filled input, ``Op.fills``,
is checked only when a node is tuned). So a kernel family's variants function carries a
``fingerprint`` (a zero-argument callable, made by :func:`fingerprinted`), which
``passes/autotune_contenders`` writes into the key beside the function's name as ``#`` and 12
hex digits: an edit that changes what the family generates changes the key, and the nodes it
runs are tuned again on the next compile (the report's notes say which; the old entries stay in
the file, unread). No ``REVISION`` bump is needed for that any more.

Which decisions carry one: every rule of algorithm ``cuda`` (``backends/cuda/rules.py``) and the
``unfold`` rules. A family with variants of its own hangs the fingerprint on its variants function
(pooling ``rules.pool_variants`` / ``vector_pool_variants``, the bias gradient's
``rules.bias_variants``, ``depthwise.variants``, ``depthwise_filter.variants``,
``unfold.variants``); every other ``cuda`` rule (ReLU, threshold and their gradients, LRN, the
losses, the ReLU gradient that fills its bias sums, the argmax slot, ``Zeros``, ``Constant``)
lists one variant through :func:`one_variant` over the module its kernel comes from
(``rules.KERNEL_MODULES``). That matters wherever a ``cuda`` rule competes with another: on CUDA
the reference is dropped, so a ReLU node times the ``cuda`` kernel against the ``codegen`` one
and caches the winner; an edit of ``relu.py`` now tunes those nodes again. A rule alone on its
node (the losses, LRN, ``Zeros``, ``Constant`` today) is never timed nor cached, so its fingerprint
costs nothing (``Zeros`` and ``Constant`` run ``codegen.movement``, whose imports reach the
generator: their keys change with it, unread).

Not fingerprinted here, on purpose:

* the generator of the element-wise and fused kernels (``codegen.plan``, ``emit``,
  ``expressions``, ...), behind the ``codegen`` rules (``codegen_rules``): it is edited more often
  than any other code here, and a fingerprint of its modules would tune every element-wise node
  of every cached model again after each such edit, its candidates compiled and timed anew. Those
  rules carry a finer fingerprint instead (``codegen_sources``): of the kernels the generator
  emits for the node the key is made for (their text, launch geometry and arguments), so an edit
  re-tunes the nodes whose kernels it changed, with the same note, and no other; their key reads
  ``codegen:_one_variant#<12 hex>``, a key of before it (``codegen:_one_variant``) is found
  superseded. The data-movement ``codegen`` rules carry none (never timed: ``codegen_sources``).
  The same reason stops the imports of the :data:`LEAVES` at the generator;
* the library rules (``cudnn`` of the convolutions, ``cudnn_rules``, and of training batch norm,
  ``cudnn_norm_rules``; ``cublas``, ``cublas_rules``): they write no
  kernel text; what autotune times there is cuDNN's engines and cuBLAS's products, whose versions
  are in the key already. The only kernels of ours they launch are ``storage``'s dtype conversions
  of operands (``storage.like``: bfloat16 bits to float32 and back, the same in every engine),
  and a fingerprint over ``cudnn``, ``cudnn_graph`` and their helpers would re-time every
  convolution's engines (the most expensive decisions of a cache) on edits of plan-building code
  that moves no kernel's speed.

Why a key and not a check on a cache hit: running the chosen candidate's (untimed) fill check on
every hit would catch a chosen kernel that broke, but never give a candidate fixed since its
``wrong`` row a second chance, nor time a kernel made faster; it would also cost a run per node
on every compile. The key costs nothing on a hit (the files are read once per process, on the
first key that needs them) and sends every candidate through the whole check and timing again.

What is hashed (:func:`source_fingerprint`): the code of the family's modules and of every module
of :data:`PACKAGE` they import, transitively, found by reading their import statements with
``ast`` (a template string imported from a helper module counts as the helper's code; an import
inside a function counts too), each as its syntax tree without docstrings. Every statement,
template string and constant counts; comments, docstrings and line numbers do not, so the
repository's documentation edits re-tune nothing. An edit of a module the family imports but does
not generate from (a launch helper) re-tunes it too: a few seconds of tuning, not a stale reuse.

Not followed: modules outside :data:`PACKAGE` (a core constant such as
``ops.pool_indices.MASKED``, the reference kernels: a change there changes what an op means, and
its tests), package ``__init__`` modules (registration only), libraries (their versions are in
the key already), this module, and the imports of the :data:`LEAVES` (hashed themselves, not
what they import). A module whose source cannot be read (an install without ``.py`` files)
counts by its name alone: its edits are then not seen.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util

#: the package whose modules a fingerprint follows
PACKAGE = "opgraph.backends.cuda"
#: hex digits of a fingerprint (the cache key's ``#...``)
DIGITS = 12
#: modules hashed but whose imports are not followed, and why
LEAVES = {
    f"{PACKAGE}.codegen.launch": "our kernels take its NVRTC compile (its options count) and allocation "
                                 "helpers; what it imports is the fused chains' generator (codegen.plan), "
                                 "which writes none of their text and changes often",
}


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent that is not a package, a bad name
        return None


def _is_package(spec) -> bool:
    return spec is not None and spec.submodule_search_locations is not None


def _source(spec) -> str | None:
    try:
        return spec.loader.get_source(spec.name)
    except Exception:  # no loader, no .py file
        return None


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function body removed."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _imported(name: str, tree: ast.AST, package: str) -> set[str]:
    """The modules of ``package`` (not package ``__init__`` modules) that module ``name``'s
    import statements name, in its code at any depth."""
    spec = _spec(name)
    here = name if _is_package(spec) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bases, names = [a.name for a in node.names], []
        elif isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            try:
                base = importlib.util.resolve_name(relative, here) if node.level else node.module
            except ImportError:
                continue
            bases, names = [base], [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for base in bases:
            if not (base == package or base.startswith(package + ".")):
                continue
            base_spec = _spec(base)
            if base_spec is None:
                continue
            if not _is_package(base_spec):
                found.add(base)
            else:  # ``from . import colsum``: the submodules named, not the package
                found.update(n for n in names if (s := _spec(n)) is not None and not _is_package(s))
    return found - {__name__}  # how a fingerprint is taken writes no kernel


def hashed_code(names, package: str = PACKAGE, leaves=LEAVES) -> dict[str, str]:
    """Module name -> the code a fingerprint hashes (``ast.dump`` of its tree without
    docstrings; "" for a module whose source cannot be read), for the modules ``names`` and every
    module of ``package`` they import, transitively (module docstring), read from their files now;
    the imports of ``leaves`` are not followed.

    Raises:
        ModuleNotFoundError: a name of ``names`` is no module.
    """
    todo, seen = list(names), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        spec = _spec(name)
        if spec is None:
            raise ModuleNotFoundError(f"kernel_sources: no module {name!r}")
        text = _source(spec)
        if text is None:
            seen[name] = ""  # unreadable: by name only
            continue
        tree = ast.parse(text)
        if name not in leaves:
            todo.extend(_imported(name, tree, package))
        seen[name] = ast.dump(_without_docstrings(tree))
    return seen


def source_fingerprint(names, package: str = PACKAGE, leaves=LEAVES) -> str:
    """:data:`DIGITS` hex digits of SHA-256 over :func:`hashed_code` of ``names``.

    Raises:
        ModuleNotFoundError: a name of ``names`` is no module.
    """
    digest = hashlib.sha256()
    for name, code in sorted(hashed_code(names, package, leaves).items()):
        digest.update(f"{name}\n{code}\n".encode())
    return digest.hexdigest()[:DIGITS]


@functools.lru_cache(maxsize=None)
def _cached(names: tuple) -> str:
    return source_fingerprint(names)


def fingerprinted(*modules):
    """A variants function's ``fingerprint``: a zero-argument callable returning
    :func:`source_fingerprint` of ``modules`` (the modules that write the family's kernels:
    module objects or names, e.g. a module's own ``__name__``), computed once per process, on
    first use (a compile that tunes nothing reads no file)."""
    names = _names(modules)

    def fingerprint() -> str:
        return _cached(names)

    fingerprint.modules = names
    return fingerprint


def _names(modules) -> tuple:
    return tuple(sorted(m if isinstance(m, str) else m.__name__ for m in modules))


def one_variant(*modules):
    """The variants function of a ``cuda`` rule with no variants of its own: one option set, as the
    registry's default (``registry._one_variant``, whatever listing keywords its tags ask for),
    with the ``fingerprint`` (:func:`fingerprinted`) of ``modules``, those its kernel comes from.

    Named ``_one_variant`` as the default is: the cache key reads ``cuda:_one_variant#<12 hex>``,
    which is the key written before the fingerprint but for it, so a decision of the old key is
    found superseded (tuned again, with the note) rather than silently orphaned. The same
    ``modules`` give the same function (one per family, however often the rules register)."""
    return _one_variant_of(_names(modules))


@functools.lru_cache(maxsize=None)
def _one_variant_of(names: tuple):
    def _one_variant(op, in_types, device, **listing):
        return [{}]

    _one_variant.__qualname__ = "_one_variant"  # the key's name (one_variant's docstring)
    _one_variant.fingerprint = fingerprinted(*names)
    return _one_variant


__all__ = ["PACKAGE", "DIGITS", "LEAVES", "hashed_code", "source_fingerprint", "fingerprinted", "one_variant"]
