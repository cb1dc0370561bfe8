"""Cached autotune decisions keyed on the code that generates our kernels
(``backends/cuda/kernel_sources.py``, ``autotune_contenders._stable_name``): the fingerprint
follows the code that writes a kernel's text, not its comments or docstrings; every ``cuda``
rule (variants of its own or one) and every ``unfold`` rule carries one into its key, the
``codegen`` rules one of the kernels emitted for the node instead (``codegen_sources``;
``test_autotune_codegen_fingerprint.py``); a decision tuned on other kernel code (or written before
fingerprints were kept) is tuned again, with a note, never a crash; and the case that asked for
it: a candidate whose filled input (``Op.fills``) was wrong when tuned, fixed since, is checked
again and chosen, with no revision bump."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.cuda import codegen_sources, kernel_sources, pool, pool_indices, relu, rules as cuda_rules
from opgraph.backends.reference.kernel import params_kernel
from opgraph.backends.registry import Rule, rules_for
from opgraph.op import Lowered
from opgraph.passes.autotune import candidate_set
from opgraph.passes.autotune_cache import FINGERPRINT, AutotuneCache, unfingerprinted
from opgraph.passes.autotune_contenders import KeyNode
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import SCALE_RULES, Scale, StubTimer, install_rule
from test_autotune import scale_graph, table, tune

CUDA = "opgraph.backends.cuda"
FILES = {
    "__init__.py": "from . import kern  # registration: never hashed\n",
    "kern.py": '''
        """A kernel family: its text is TEXT from helpers and TAIL from lazy."""
        from .helpers import TEXT
        from . import launch


        def source():
            """The kernel's text."""
            from .lazy import TAIL  # an import inside a function counts
            return launch.compiled(TEXT + TAIL)
        ''',
    "helpers.py": 'TEXT = "__global__ void k(float* y) { y[0] = 1; }"  # the template\n',
    "lazy.py": 'TAIL = "// end"\n',
    "launch.py": "from . import compiler\n\n\ndef compiled(text):\n    return text\n",
    "compiler.py": "RULES = 1  # behind the leaf: not followed\n",
    "unrelated.py": "X = 1\n",
}


@pytest.fixture
def family(tmp_path, monkeypatch):
    """A package ``fpkg`` of :data:`FILES` on ``sys.path``: ``(edit, fingerprint)``, ``edit(file,
    old, new)`` changing a file and ``fingerprint()`` the kernel module's, ``fpkg.launch`` a leaf."""
    root = tmp_path / "fpkg"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield (lambda file, old, new: (root / file).write_text((root / file).read_text().replace(old, new, 1)),
           lambda: kernel_sources.source_fingerprint(["fpkg.kern"], "fpkg", {"fpkg.launch": "a leaf"}))
    for name in [n for n in sys.modules if n == "fpkg" or n.startswith("fpkg.")]:
        del sys.modules[name]


def test_the_hashed_modules_are_the_kernels_code_and_its_helpers(family):
    _, fingerprint = family
    hashed = kernel_sources.hashed_code(["fpkg.kern"], "fpkg", {"fpkg.launch": "a leaf"})
    assert set(hashed) == {"fpkg.kern", "fpkg.helpers", "fpkg.lazy", "fpkg.launch"}
    assert "A kernel family" not in hashed["fpkg.kern"] and "__global__" in hashed["fpkg.helpers"]
    assert FINGERPRINT.fullmatch("#" + fingerprint())


@pytest.mark.parametrize("file, old, new, changes", [
    ("helpers.py", "y[0] = 1", "y[0] = 2", True),  # the template's text
    ("lazy.py", '"// end"', '"// the end"', True),  # imported inside a function
    ("launch.py", "return text", "return text + ''", True),  # the leaf itself
    ("kern.py", "TEXT + TAIL", "TAIL + TEXT", True),
    ("helpers.py", "# the template", "# the template, reworded", False),  # a comment
    ("kern.py", "The kernel's text.", "The text of the kernel, reworded.", False),  # a docstring
    ("kern.py", "\n\ndef source", "\n\n\n\n\ndef source", False),  # line numbers
    ("compiler.py", "RULES = 1", "RULES = 2", False),  # behind the leaf
    ("unrelated.py", "X = 1", "X = 2", False),
    ("__init__.py", "# registration", "\nY = 2  # registration", False),
])
def test_the_fingerprint_follows_the_code_that_writes_a_kernel_not_its_comments(family, file, old, new, changes):
    edit, fingerprint = family
    before = fingerprint()
    edit(file, old, new)
    assert (fingerprint() != before) == changes


def test_an_unknown_module_is_an_error_not_a_fingerprint():
    with pytest.raises(ModuleNotFoundError, match="no module"):
        kernel_sources.source_fingerprint([f"{CUDA}.no_such_module"])


def _generated_rules():
    """Every registered rule whose kernels this project writes: every ``cuda`` rule, whether it
    lists variants of its own or the one (a ReLU node's ``cuda`` kernel is timed against
    ``codegen``'s on CUDA, the reference dropped, and the winner cached), and the ``unfold``
    rules."""
    registry.rules_for(Scale)  # load the backends
    for op_type, table_ in registry._RULES.items():
        for rule in table_.values():
            if rule.algorithm in ("cuda", "unfold"):
                yield op_type, rule


def _kernel_module(op_type, rule) -> str:
    """The module that defines ``rule``'s kernel function (through ``params_kernel``'s wrapper
    for the ``fn(xp, *arrays, **fields)`` kernels); ``Zeros``' (``rules.zeros_node``) runs
    ``codegen.movement.zeros``."""
    fn = cuda_rules.CUDA_KERNELS[op_type] if rule.kernel.__module__ == params_kernel.__module__ else rule.kernel
    return f"{CUDA}.codegen.movement" if fn.__module__ == cuda_rules.__name__ else fn.__module__


def test_each_generated_kernel_family_keys_its_decisions_on_its_code():
    rules_ = list(_generated_rules())
    assert {op for op, _ in rules_} >= {ops.MaxPool2dScan, ops.MaxPool2d, ops.BiasAddBackward,
                                       ops.Conv2dBackwardData, ops.Conv2dBackwardFilter, ops.Conv2d,
                                       ops.Relu, ops.ReluBackward, ops.Threshold, ops.ThresholdBackward,
                                       ops.LocalResponseNorm, ops.CrossEntropy, ops.ReluBackwardSums, ops.Zeros}
    for op_type, rule in rules_:
        fp = rule.variants.fingerprint()
        assert FINGERPRINT.fullmatch("#" + fp), (op_type, rule.algorithm)
        assert f"#{fp}" in candidate_set([(rule, {})]), (op_type, rule.algorithm)
        assert _kernel_module(op_type, rule) in kernel_sources.hashed_code(rule.variants.fingerprint.modules), \
            (op_type, rule.algorithm)
    # the pooling family: its text generators and helpers, not the fused chains' compiler
    hashed = kernel_sources.hashed_code(cuda_rules.vector_pool_variants.fingerprint.modules)
    assert {f"{CUDA}.{m}" for m in ("pool", "pool_indices", "pool_vector", "pool_vector_lanes",
                                    "pool_vector_tile_kernels", "codegen.storage", "codegen.launch")} <= set(hashed)
    assert f"{CUDA}.codegen.plan" not in hashed and f"{CUDA}.rules" not in hashed
    assert cuda_rules.vector_pool_variants.fingerprint.modules == (pool.__name__, pool_indices.__name__)
    # library engines and the CPU's NumPy algorithms: their versions are in the key instead
    assert "cudnn:variants," in candidate_set([(r, {}) for r in rules_for(ops.Conv2d).values()])
    assert "cublas:_one_variant," in candidate_set([(r, {}) for r in rules_for(ops.Linear).values()])


def _key(candidates: str) -> str:
    """A cache key of a ReLU gradient (its shape as ``cache_key`` writes it) among ``candidates``."""
    return f"ReluBackward() | in=(bfloat16[8x64x28x28], bfloat16[8x64x28x28]) | candidates={candidates} | cupy=14.2.0"


def test_a_relu_decision_between_cuda_and_codegen_is_keyed_on_the_kernels_of_both():
    """The nodes where a one-variant ``cuda`` rule competes (ReLU, threshold and their gradients,
    against ``codegen``): the ``cuda`` side carries ``relu.py``'s fingerprint, ``codegen`` the
    fingerprint of what the generator emits for the node (``codegen_sources``: the generator's
    modules are not hashed); a decision cached under the key of before either is found
    superseded, so the node is tuned again, with the note."""
    t = og.TensorType((8, 64, 28, 28), "bfloat16", "NHWC")
    for op, arity in ((ops.Relu(), 1), (ops.ReluBackward(), 2), (ops.Threshold(threshold=0.5, value=0.0), 1),
                      (ops.ThresholdBackward(threshold=0.5), 2)):
        rules_ = rules_for(type(op))
        node = KeyNode(op, (t,) * arity, t)
        names = candidate_set([(rules_[a], {}) for a in ("codegen", "cuda")], node=node)
        emitted = codegen_sources.emitted_fingerprint(*node)
        cuda = kernel_sources.source_fingerprint([relu.__name__])
        assert names == f"codegen:_one_variant#{emitted},cuda:_one_variant#{cuda}"
        for before in ("codegen:_one_variant,cuda:_one_variant", f"codegen:_one_variant,cuda:_one_variant#{cuda}"):
            cache = AutotuneCache(None)
            cache.put(_key(before), {"algorithm": "codegen", "options": {}})
            assert cache.get(_key(names)) is None
            assert cache.superseded(_key(names)) == _key(before)


def test_an_op_that_fills_an_input_is_never_cached_without_a_fingerprint():
    """A decision autotune caches for an op with ``Op.fills`` (more than one variant) is keyed on
    its kernels' code: the filled input is checked only when the node is tuned."""
    nhwc = og.TensorType((8, 64, 28, 28), "bfloat16", "NHWC")
    k3 = dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=True)
    cases = {ops.MaxPool2dScan: (ops.MaxPool2dScan(**k3), [nhwc, og.TensorType((8, 64, 14, 14), "uint8", "NHWC")]),
             ops.ReluBackwardSums: (ops.ReluBackwardSums(), [nhwc, nhwc, og.TensorType((64,), "bfloat16")]),
             ops.LayerNormBackwardDataSums: (ops.LayerNormBackwardDataSums(normalized_shape=(28,)),
                                             [nhwc, nhwc, *[og.TensorType((28,), "bfloat16")] * 2])}
    assert {t for t in registry._RULES if t.fills} == set(cases)
    for op_type, (op, types) in cases.items():
        for rule in rules_for(op_type).values():
            several = len(rule.variants(op, types, "cuda")) > 1
            assert not several or getattr(rule.variants, "fingerprint", None) is not None, rule.algorithm


# ---- the autotune pass: a decision tuned on other kernel code is tuned again

def _install_generated(monkeypatch, code: dict):
    """Scale rules: the reference and ``gen`` with two variants, whose fingerprint is ``code['fp']``."""
    def variants(op, types, device):
        return [{"t": 1}, {"t": 2}]
    variants.fingerprint = lambda: code["fp"]
    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"],
                                                 "gen": Rule(Scale, "gen", SCALE_RULES["fast"].kernel,
                                                             variants=variants)})


def _said(report) -> bool:
    return any("tuned on other kernel code" in n for n in report.notes)


def test_a_decision_tuned_on_other_kernel_code_is_tuned_again_and_said(monkeypatch, tmp_path):
    code = {"fp": "0123456789ab"}
    _install_generated(monkeypatch, code)
    cache = tmp_path / "c.json"
    timer = StubTimer({"reference": 3.0, "gen[t=1]": 1.0, "gen[t=2]": 2.0})
    outs = scale_graph()[1]
    _, first = tune(outs, cache, timer)
    rec = first.node("s0")
    assert rec.how == "autotune" and rec.options == {"t": 1} and "variants#0123456789ab," in rec.cache_key
    _, again = tune(outs, cache, timer)
    assert again.node("s0").how == "cache" and not _said(again)
    code["fp"] = "fedcba987654"  # the kernels' code edited
    timer.times_ms["gen[t=2]"] = 0.5  # and its second variant now the faster
    calls = len(timer.calls)
    _, edited = tune(outs, cache, timer)
    rec = edited.node("s0")
    assert rec.how == "autotune" and rec.options == {"t": 2} and len(timer.calls) > calls
    assert _said(edited) and "#fedcba987654" in rec.cache_key
    keys = set(json.loads(cache.read_text())["entries"])
    assert keys == {rec.cache_key}  # the entry tuned on the old code pruned: never read again
    _, last = tune(outs, cache, timer)
    assert last.node("s0").how == "cache" and last.node("s0").options == {"t": 2} and not _said(last)


def test_a_cache_written_before_fingerprints_is_read_and_its_decisions_tuned_again(monkeypatch, tmp_path):
    """An entry under the key without the fingerprint (a file from before it was kept): read
    without complaint, the node tuned again and said; a corrupt entry under the new key is
    still reported and tuned again, never a crash."""
    code = {"fp": "00000000abcd"}
    _install_generated(monkeypatch, code)
    timer = StubTimer({"reference": 3.0, "gen[t=1]": 1.0, "gen[t=2]": 2.0})
    outs = scale_graph()[1]
    _, fresh = tune(outs, tmp_path / "fresh.json", timer)
    key = fresh.node("s0").cache_key
    entry = json.loads((tmp_path / "fresh.json").read_text())["entries"][key]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "opgraph-autotune/1",
                               "entries": {unfingerprinted(key): {**entry, "options": {"t": 2}}}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the file is sound
        _, report = tune(outs, old, timer)
    assert report.node("s0").how == "autotune" and report.node("s0").options == {"t": 1} and _said(report)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(json.dumps({"format": "opgraph-autotune/1", "entries": {key: {"algorithm": 7}}}))
    with pytest.warns(RuntimeWarning, match="corrupt entr"):
        _, report = tune(outs, corrupt, timer)
    assert report.node("s0").how == "autotune" and table(report)["gen[t=1]"].status == "chosen"


def _relu_sums_outputs():
    """A ReLU gradient and its bias gradient, fused by ``relu-bias-sums`` into a node that fills
    the bias gradient's slot."""
    g = og.Graph("relu sums")
    y, gy = g.input("y", (2, 8, 5, 5)), g.input("gy", (2, 8, 5, 5))
    relu_grad = g.apply(ops.ReluBackward, {}, [y, gy])
    return [relu_grad, g.apply(ops.BiasAddBackward, {}, [relu_grad])]


def test_a_candidate_whose_filled_input_was_wrong_is_checked_again_once_its_code_is_fixed(monkeypatch, tmp_path):
    """The leftover this key closes: a fast variant of ``ReluBackwardSums`` that did not write the
    sums (the filled input) is ``wrong`` when tuned, and the slow one chosen; fixed, its code's
    fingerprint changes, so the next compile checks it again (sums included) and chooses it.
    Keyed on a revision alone the cached rows kept it wrong until someone bumped it."""
    rule = rules_for(ops.ReluBackwardSums)["reference"]
    fixed = {"fast": False}

    def kernel(ctx, op, y, gy, sums, out=None):
        if ctx.options.get("fast") and not fixed["fast"]:  # the bug: the sums never written
            return rules_for(ops.ReluBackward)["reference"].kernel(ctx, ops.ReluBackward(), y, gy)
        return rule.kernel(ctx, op, y, gy, sums)

    def variants(op, types, device):
        return [{}, {"fast": True}]
    variants.fingerprint = lambda: "0000000000bb" if fixed["fast"] else "0000000000aa"  # the code's hash
    install_rule(monkeypatch, ops.ReluBackwardSums, attrs.evolve(rule, kernel=kernel, variants=variants))
    outs = _relu_sums_outputs()
    policy = LoweringPolicy(autotune=True, include=["fused-reference"], cache=str(tmp_path / "c.json"))
    timer = StubTimer({"reference[fast=True]": 0.1})

    def compiled():
        exe = og.compile(outs, policy=policy, timer=timer)
        (rec,) = [r for r in exe.report.nodes.values() if r.op_type == "ReluBackwardSums"]
        return exe, rec, {c.label: c.status for c in rec.candidates if c.algorithm == "reference"}

    _, rec, status = compiled()
    assert rec.how == "autotune" and status == {"reference[fast=True]": "wrong", "reference": "chosen"}
    assert compiled()[1].how == "cache"
    fixed["fast"] = True
    exe, rec, status = compiled()
    assert rec.how == "autotune" and status == {"reference[fast=True]": "chosen", "reference": "ok"}
    assert any("tuned on other kernel code" in n for n in exe.report.notes)
    kinds = [v.op.op.name for v in exe.graph.nodes_in_order(exe.outputs) if isinstance(v.op, Lowered)]
    assert "ReluBackwardSums" in kinds
    rng = np.random.default_rng(4)
    yv, gyv = rng.standard_normal((2, 8, 5, 5)), rng.standard_normal((2, 8, 5, 5))
    g, sums = exe(y=yv, gy=gyv)
    want = np.where(yv > 0, gyv, 0.0)
    np.testing.assert_allclose(g, want, rtol=1e-6)
    np.testing.assert_allclose(sums, want.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
