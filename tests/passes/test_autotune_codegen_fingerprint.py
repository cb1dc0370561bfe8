"""Cached ``codegen`` decisions keyed on the kernels the generator emits for their node
(``backends/cuda/codegen_sources.py``, ``autotune_contenders.KeyNode``): the same node gives the
same key; an edit of the generator that changes one op kind's text changes the keys of that kind's
nodes and no other's, and re-tunes those nodes (with the note) while the others are reused; a
cache written before the per-node fingerprint (``codegen:_one_variant``) is found superseded,
never silently orphaned; and the text hashed is the plan the launch makes on autotune's inputs.

The pipeline runs for device ``cuda`` without a GPU, every cuda rule on the oracle's kernel
(``test_autotune_cuda_candidates.oracle_kernels_on_cuda``: keeps each rule's variants function,
so its fingerprints), timed by ``StubTimer``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.cuda import codegen_sources
from opgraph.backends.cuda.codegen import launch, plan
from opgraph.backends.cuda.codegen.expressions import EXPRESSIONS
from opgraph.backends.cuda.codegen.ir import PlanError
from opgraph.backends.registry import rules_for
from opgraph.buffer_views import Region
from opgraph.graph import graph_of
from opgraph.passes.autotune import candidate_set
from opgraph.passes.autotune_cache import FINGERPRINT, AutotuneCache, unfingerprinted
from opgraph.passes.autotune_contenders import KeyNode
from opgraph.passes.autotune_inputs import random_inputs
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import build
from opgraph.passes.zero_copy import Home
from opgraph.types import TensorType, numpy_dtype, storage_order, to_layout

from passes_stubs import StubTimer
from test_autotune_cuda_candidates import oracle_kernels_on_cuda

NOTE = "tuned on other kernel code"
NHWC = TensorType((4, 8, 5, 5), "bfloat16", "NHWC")


@pytest.fixture(autouse=True)
def fresh_fingerprints():
    """Each test computes the fingerprints of the generator as it is in that test."""
    codegen_sources.emitted_fingerprint.cache_clear()
    yield
    codegen_sources.emitted_fingerprint.cache_clear()


def relu_step():
    """ReLU (codegen against cuda: tuned), an Add (codegen alone: never tuned) and their
    gradients, the ReLU gradient tuned as the ReLU is."""
    g = og.Graph("relu step")
    x, b = g.input("x", (4, 8, 5, 5)), g.input("b", (4, 8, 5, 5))
    s = og.add(og.relu(x, name="relu"), b, name="add")
    return [s, *og.grad(s, [x, b], grad_outputs=[s])]


def tuned(cache):
    """``(records, said)``: :func:`relu_step` tuned on cuda in bfloat16 with the cache file
    ``cache``, its report's records by op name, and its notes saying a decision was tuned on
    other kernel code."""
    policy = og.LoweringPolicy(layout="NHWC", autotune=True, cache=str(cache))
    ctx = PassContext(device="cuda", policy=policy, dtype="bfloat16", xp=np, timer=StubTimer({}))
    outs = relu_step()
    graph, louts = build("default", policy).run(graph_of(*outs), list(outs), ctx)
    recs = {v.op.op.name: ctx.report.node(v.name) for v in graph.nodes_in_order(louts)
            if v.name in ctx.report.nodes}
    said = [n for n in ctx.report.notes if NOTE in n]
    return recs, said


def _codegen_part(key: str) -> str:
    return next(c for c in key.split("candidates=")[1].split(" |")[0].split(",") if c.startswith("codegen:"))


def edited_relu(monkeypatch):
    """The generator edited for ReLU alone: its formula written another way (NaN no longer
    kept), as an edit fixing or breaking one op's kernel would."""
    def relu(b, op, types, x):
        return b.expr("({0} > (CT)0 ? {0} : (CT)0)", b.value(x))
    monkeypatch.setitem(EXPRESSIONS, ops.Relu, attrs.evolve(EXPRESSIONS[ops.Relu], build=relu))
    codegen_sources.emitted_fingerprint.cache_clear()


# ---- the key

def test_the_same_node_compiled_twice_gives_the_same_key_and_a_cache_hit(monkeypatch, tmp_path):
    oracle_kernels_on_cuda(monkeypatch)
    first, said = tuned(tmp_path / "c.json")
    assert first["Relu"].how == "autotune" and first["ReluBackward"].how == "autotune" and not said
    for op in ("Relu", "ReluBackward"):
        assert FINGERPRINT.fullmatch(_codegen_part(first[op].cache_key).removeprefix("codegen:_one_variant"))
    codegen_sources.emitted_fingerprint.cache_clear()  # computed anew, as in another process
    again, said = tuned(tmp_path / "c.json")
    for op in ("Relu", "ReluBackward"):
        assert again[op].cache_key == first[op].cache_key and again[op].how == "cache", op
    assert not said
    assert first["Relu"].cache_key != first["ReluBackward"].cache_key


def test_an_edit_of_one_op_kinds_emitted_source_changes_that_kinds_keys_only():
    relu, add, grad = (KeyNode(ops.Relu(), (NHWC,), NHWC), KeyNode(ops.Add(), (NHWC, NHWC), NHWC),
                       KeyNode(ops.ReluBackward(), (NHWC, NHWC), NHWC))

    def keys():
        return {kind: candidate_set([(r, {}) for a, r in rules_for(type(node.op)).items() if a != "reference"],
                                    node=node)
                for kind, node in (("relu", relu), ("add", add), ("grad", grad))}

    before = keys()
    assert all("codegen:_one_variant#" in k for k in before.values())
    with pytest.MonkeyPatch.context() as mp:
        edited_relu(mp)
        after = keys()
    assert after["relu"] != before["relu"] and unfingerprinted(after["relu"]) == unfingerprinted(before["relu"])
    assert after["add"] == before["add"] and after["grad"] == before["grad"]
    codegen_sources.emitted_fingerprint.cache_clear()
    assert keys() == before  # the edit undone: the keys of before


def test_an_edit_of_the_generator_re_tunes_the_nodes_whose_kernels_it_changed_and_no_other(monkeypatch, tmp_path):
    oracle_kernels_on_cuda(monkeypatch)
    cache = tmp_path / "c.json"
    first, _ = tuned(cache)
    edited_relu(monkeypatch)
    edited, said = tuned(cache)
    assert edited["Relu"].how == "autotune" and edited["Relu"].cache_key != first["Relu"].cache_key
    assert edited["ReluBackward"].how == "cache" and edited["ReluBackward"].cache_key == first["ReluBackward"].cache_key
    assert len(said) == 1 and "relu" in said[0] and "relu_backward" not in said[0]
    keys = set(json.loads(cache.read_text())["entries"])
    assert edited["Relu"].cache_key in keys and first["Relu"].cache_key not in keys  # the old entry pruned
    assert first["ReluBackward"].cache_key in keys


def test_a_cache_written_before_the_per_node_fingerprint_is_superseded_and_re_tuned(monkeypatch, tmp_path):
    """An entry under the key of before (``codegen:_one_variant``, the ``cuda`` side's
    fingerprint already there): read without complaint, the node tuned again and said, not
    silently orphaned; the entry of before leaves the file (superseded: never read again)."""
    oracle_kernels_on_cuda(monkeypatch)
    fresh, _ = tuned(tmp_path / "fresh.json")
    entries = json.loads((tmp_path / "fresh.json").read_text())["entries"]
    old_keys = {}
    for op in ("Relu", "ReluBackward"):
        key = fresh[op].cache_key
        part = _codegen_part(key)
        old_keys[op] = key.replace(part, "codegen:_one_variant")
        assert old_keys[op] != key and unfingerprinted(old_keys[op]) == unfingerprinted(key)
        assert FINGERPRINT.search(old_keys[op])  # the cuda rule's own fingerprint is kept
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "opgraph-autotune/1",
                               "entries": {old_keys[op]: entries[fresh[op].cache_key] for op in old_keys}}))
    assert all(AutotuneCache(old).superseded(fresh[op].cache_key) == old_keys[op] for op in old_keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the file is sound
        report, said = tuned(old)
    for op in old_keys:
        assert report[op].how == "autotune" and report[op].cache_key == fresh[op].cache_key, op
    assert len(said) == 2
    assert set(json.loads(old.read_text())["entries"]) == {r.cache_key for r in fresh.values() if r.cache_key}


# ---- what is hashed

@pytest.mark.parametrize("op, kinds, shape, layout", [
    (ops.Relu(), 1, (4, 8, 5, 5), "NHWC"),
    (ops.Relu(), 1, (4, 8, 5, 5), "NCHW"),
    (ops.Relu(), 1, (4, 1, 5, 5), "NHWC"),  # one channel: stored as NCHW is
    (ops.Add(), 2, (3, 70), None),
    (ops.BatchNormStats(), 1, (4, 16, 6, 6), "NHWC"),
    (ops.ReluBackward(), 2, (2, 8, 3, 3), "NHWC"),
])
def test_the_hashed_text_is_the_plan_the_launch_makes_on_autotunes_inputs(op, kinds, shape, layout):
    types = tuple(TensorType(shape, "bfloat16", layout) for _ in range(kinds))
    out = op.infer(*types)
    arrays = random_inputs(types, np, seed=0)
    (text,) = codegen_sources.emitted_texts(op, types, out)
    assert text == codegen_sources._text(launch.plan_for(op, arrays, out))
    assert "__global__" in text


def test_a_homed_output_adds_the_form_writing_its_slice_as_the_launch_plans_it():
    """Batch statistics homed in a concat of statistics (``share_bn_stats``): the strided form
    writes its column slice through the row pitch; the dense form is the plain plan."""
    x = TensorType((4, 16, 6, 6), "bfloat16", "NHWC")
    op = ops.BatchNormStats()
    out_type = op.infer(x)  # (2, 16) float32 rows
    home = Home(root=7, shape=(2, 48), layout=None, chain=((1, 16, 32),))
    root = np.empty((2, 48), dtype=numpy_dtype(out_type.dtype))
    view = root[:, 16:32]
    assert home.placement() == ((48, 1), 16)
    dense, strided = codegen_sources.emitted_texts(op, (x,), out_type, home.placement())
    arrays = random_inputs((x,), np, seed=0)
    assert dense == codegen_sources._text(launch.plan_for(op, arrays, out_type))
    assert strided == codegen_sources._text(launch.plan_for(op, arrays, out_type, out=view)) != dense
    rule = rules_for(ops.BatchNormStats)["codegen"]
    keyed = KeyNode(op, (x,), out_type, home.placement())
    assert candidate_set([(rule, {})], node=keyed) != candidate_set([(rule, {})], node=keyed._replace(out=None))
    # a rule that cannot write the slice runs dense and is copied in: its out form is not hashed
    relu = KeyNode(ops.Relu(), (NHWC,), NHWC, ((1000, 1, 200, 40), 8))
    codegen = rules_for(ops.Relu)["codegen"]
    assert not codegen.writes_strided("NHWC")
    assert candidate_set([(codegen, {})], node=relu) == candidate_set([(codegen, {})], node=relu._replace(out=None))


@pytest.mark.parametrize("shape, layout, chain", [
    ((2, 48), None, ((1, 16, 32),)),
    ((2, 24, 5, 7), "NHWC", ((1, 8, 20),)),
    ((2, 24, 5, 7), None, ((1, 8, 20), (0, 1, 2))),
])
def test_a_homes_placement_is_its_views_strides_and_offset(shape, layout, chain):
    home = Home(root=1, shape=shape, layout=layout, chain=chain)
    view = Region(1, shape, np.dtype("float32"), layout == "NHWC", chain).array({}, np)
    base = view.base if view.base is not None else view
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // view.itemsize
    assert home.placement() == (tuple(s // view.itemsize for s in view.strides), offset)


@pytest.mark.parametrize("shape", [(4, 8, 5, 5), (4, 1, 5, 5), (4, 8, 1, 1), (1, 8, 5, 5), (0, 8, 5, 5), (3, 70), (9,)])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW", None])
def test_an_inputs_layout_is_the_one_the_launch_reads_off_its_array(shape, layout):
    t = TensorType(shape, "float32", layout)
    a = to_layout(np, np.zeros(shape, dtype="float32"), layout)
    assert codegen_sources._stored(t).layout == storage_order(a)


def test_a_node_the_generator_cannot_plan_hashes_its_error_and_never_raises():
    """Its candidate fails when run (a ``failed`` row); a fix of the generator changes the text."""
    x = TensorType((3, 5), "bfloat16")
    op = ops.Concat(axis=1)  # no expression: the generator declines it
    with pytest.raises(PlanError) as e:
        plan.lower(op, (x, x), op.infer(x, x))
    assert codegen_sources.emitted_texts(op, (x, x), op.infer(x, x)) == (f"PlanError: {e.value}",)
    assert FINGERPRINT.fullmatch("#" + codegen_sources.emitted_fingerprint(op, (x, x), op.infer(x, x)))


def test_every_variants_function_with_a_node_fingerprint_lists_one_variant():
    """The premise of autotune's gate (``passes/autotune.py``): a node fingerprint is taken only
    where the key can be written (two contenders or more, or a homed node), which misses no key a
    decision is cached under only while such a function lists one option set."""
    registry.rules_for(ops.Relu)  # the backends loaded
    found = [(t, r) for t, table in registry._RULES.items() for r in table.values()
             if getattr(r.variants, "node_fingerprint", None) is not None]
    assert {t for t, _ in found} >= {ops.Relu, ops.Add, ops.FusedElementwise, ops.BatchNormStats}
    for op_type, rule in found:
        assert rule.algorithm == "codegen" and rule.variants is codegen_sources.one_variant(), op_type
    assert codegen_sources.one_variant()(ops.Relu(), (NHWC,), "cuda") == [{}]
    # the data-movement rules plan their copies from the arrays: no node fingerprint
    assert getattr(rules_for(ops.Concat)["codegen"].variants, "node_fingerprint", None) is None


def test_a_lone_codegen_node_takes_no_fingerprint(monkeypatch, tmp_path):
    """The Add of :func:`relu_step` (codegen alone, its own buffer: never timed nor cached) costs
    no plan at key time; the tuned ReLU nodes each one."""
    oracle_kernels_on_cuda(monkeypatch)
    seen = []
    inner = codegen_sources._one_variant.node_fingerprint
    monkeypatch.setattr(codegen_sources._one_variant, "node_fingerprint",
                        lambda *node: seen.append(node[0].name) or inner(*node))
    recs, _ = tuned(tmp_path / "c.json")
    assert recs["Add"].how == "policy" and sorted(seen) == ["Relu", "ReluBackward"]


_EVERY_CODEGEN_NODE = """
import json, sys
sys.path[:0] = {paths!r}
import opgraph as og
from opgraph.backends.cuda import codegen_sources
from opgraph.op import Lowered
from opgraph.run_types import run_types
from passes_stubs import compile_for_cuda
from test_autotune_cuda_candidates import bn_relu_step

outs = bn_relu_step()
graph, louts, _ = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC"), "bfloat16")
run = run_types(graph, graph.ancestors(louts), "bfloat16")
print(json.dumps({{v.name: codegen_sources.emitted_fingerprint(v.op.op, tuple(run[i] for i in graph.input_ids(v.id)),
                                                              run[v.id])
                  for v in graph.nodes_in_order(louts) if isinstance(v.op, Lowered) and v.op.algorithm == "codegen"}}))
"""


def test_a_nodes_fingerprint_is_the_same_in_every_process():
    """The key is read by later processes: what the generator emits may not depend on the
    process (string hashing, ``PYTHONHASHSEED``: iterating a set), for every codegen node of a
    batch-norm and ReLU training step (statistics, a fused program, the gradients' sums)."""
    here = pathlib.Path(__file__).parent
    script = _EVERY_CODEGEN_NODE.format(paths=[str(here), str(here.parent)])
    found = []
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        found.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert found[0] == found[1]
    assert {"bn/stats", "relu", "bn.grad/batch_norm_training_backward_data"} <= set(found[0])  # relu: fused


def test_a_planning_error_hashes_without_object_addresses_and_a_text_bug_raises(monkeypatch):
    """The key of a node the generator refuses hashes the error's message, which must not carry
    an object's address (another key in every process); a bug after planning (in the text the key
    hashes) must raise, not hash one constant error for every node (review)."""
    messages = iter(["no rule for <Op at 0x7f00aa> here", "no rule for <Op at 0x7f11bb> here"])

    def refuse(*args, **kwargs):
        raise PlanError(next(messages))

    monkeypatch.setattr(codegen_sources, "lower", refuse)
    first = codegen_sources.emitted_texts(ops.Relu(), (NHWC,), NHWC)
    second = codegen_sources.emitted_texts(ops.Relu(), (NHWC,), NHWC)
    assert first == second == ("PlanError: no rule for <Op at 0x?> here",)
    monkeypatch.undo()
    monkeypatch.setattr(codegen_sources, "_text", lambda plan: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        codegen_sources.emitted_texts(ops.Relu(), (NHWC,), NHWC)
