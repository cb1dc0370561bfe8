"""The channels-last bias gradient's column-sum kernel, checked without a GPU.

The kernel itself runs in tests/gpu (against a float64 NumPy sum, both
methods); here a stand-in replaces ``cupy.RawModule``: it records the source
compiled and each launch, checks the arguments against the signature the
source declares (element types, ``long long`` scalars, buffer sizes), and
runs the launch as the CUDA source says, in NumPy and in the kernel's order
of additions. So the launch plumbing is checked on NumPy arrays: the chunk
chooser, the geometry of both passes, the dtypes of the partial-sum buffer,
one module per dtype, and the ``cuda`` rule offering both methods to the
autotuner.
"""

import re

import numpy as np
import pytest

from opgraph import ops
from opgraph.backends.cuda import colsum as cuda_colsum, colsum_vector
from opgraph.backends.cuda import rules as cuda_rules
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.errors import ParameterError, ShapeError
from opgraph.types import TensorType
from cupy_standin import cupy_replaced

#: element type in the CUDA source -> the NumPy dtype of the array passed
#: (float16 travels as its bit pattern).
C_TYPES = {"unsigned short": np.float16, "float": np.float32, "double": np.float64}


def _signatures(code):
    """kernel name -> (source element type, destination element type)."""
    return {name: (C_TYPES[src], C_TYPES[dst]) for name, src, dst in re.findall(
        r"void (opgraph_colsum_\w+)\(const ([\w ]+?)\* __restrict__ src, ([\w ]+?)\* __restrict__ dst",
        code)}


def _run(src, dst, m, c, rows_per_block, grid, acc):
    """What the kernel computes, block row by block row, in its order of additions:
    thread row ty sums rows ty, ty+8, ... of the chunk in turn, then 0 + 1 + ... + 7."""
    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
    cols = min(c, grid[0] * 32)
    for y in range(grid[1]):
        r0 = y * rows_per_block
        r1 = min(r0 + rows_per_block, m)
        chunk = flat_src[r0 * c:max(r0, r1) * c].reshape(-1, c)[:, :cols].astype(acc)
        parts = [np.add.accumulate(chunk[ty::8], axis=0, dtype=acc)[-1] if len(chunk[ty::8])
                 else np.zeros(cols, acc) for ty in range(8)]
        s = parts[0]
        for p in parts[1:]:
            s = (s + p).astype(acc)
        flat_dst[y * c:y * c + cols] = s.astype(dst.dtype)


class ColumnSumStandIn:
    """Stands in for ``cupy``: ``RawModule(code=...)`` records the source; each
    launch of ``get_function(name)`` is recorded, checked and run in NumPy."""

    def __init__(self):
        self.sources, self.launches = [], []

    def RawModule(self, code, options=()):
        self.sources.append(code)
        sigs, acc = _signatures(code), C_TYPES[re.search(r"typedef (\w[\w ]*) ACC;", code).group(1)]
        rec = self

        class Module:
            def get_function(self, name):
                src_t, dst_t = sigs[name]

                def launch(grid, block, args, shared_mem=0):
                    src, dst, m, c, rows_per_block = args
                    rec.launches.append(dict(name=name, grid=grid, block=block, args=args))
                    assert block == (32, 8) and shared_mem == 0
                    assert all(type(v) is np.int64 for v in (m, c, rows_per_block))  # long long
                    assert src.dtype == src_t and dst.dtype == dst_t, (name, src.dtype, dst.dtype)
                    assert src.flags.c_contiguous and dst.flags.c_contiguous
                    assert src.size >= m * c and dst.size >= grid[1] * c
                    assert (grid[0] - 1) * 32 < c <= grid[0] * 32  # every column, no idle block
                    _run(src, dst, int(m), int(c), int(rows_per_block), grid, acc)
                return launch
        return Module()


@pytest.fixture
def standin(monkeypatch):
    with cupy_replaced(monkeypatch, ColumnSumStandIn(), cuda_colsum._colsum_kernels) as rec:
        yield rec


def _channels_last(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _brief_r(m, c):
    """R as first chosen: max(1, min(ceil(m/64), max(1, 1024 // ceil(c/32))))."""
    return max(1, min(-(-m // 64), max(1, 1024 // -(-c // 32))))


# ------------------------------------------------------------------ the chooser

@pytest.mark.parametrize("m,c,want", [
    (1, 1, (1, 1)),
    (64, 1, (1, 64)),            # one chunk up to 64 rows
    (65, 1, (2, 33)),
    (10 ** 6, 1, (1024, 977)),   # ~1024 blocks
    (10 ** 6, 33, (512, 1954)),  # 2 column tiles: 512 block rows
    (5000, 1000, (32, 157)),     # 32 column tiles: 32 block rows
    (10 ** 6, 16384, (2, 500000)),
    (10 ** 6, 16385, (1, 10 ** 6)),  # more than 512 column tiles: a single pass
    (6529, 300, (101, 65)),      # 102 chunks of 65 would leave the last one empty
])
def test_colsum_grid_values(m, c, want):
    assert cuda_colsum.colsum_grid(m, c) == want


def test_colsum_grid_covers_every_row_with_no_empty_chunk():
    for m in [*range(1, 300), 1000, 6529, 65473, 10 ** 5 + 7, 2 ** 20 + 1, 5 * 10 ** 6]:
        for c in (1, 3, 31, 32, 33, 100, 384, 1000, 5000, 20000, 40000):
            r, rpb = cuda_colsum.colsum_grid(m, c)
            first = _brief_r(m, c)
            assert 1 <= r <= first and rpb == -(-m // first)
            assert r * rpb >= m > (r - 1) * rpb, (m, c, r, rpb)  # rows covered, last chunk not empty
            assert r * -(-c // 32) <= max(1024, -(-c // 32))   # ~1024 blocks at most


# ------------------------------------------------------------------ launches

def test_two_passes_geometry_and_partial_buffer(standin):
    a = np.random.default_rng(0).standard_normal((1000, 40)).astype(np.float32)
    got = cuda_colsum.column_sums(np, a)
    r, rpb = cuda_colsum.colsum_grid(1000, 40)
    assert (r, rpb) == (16, 63)
    first, second = standin.launches
    assert first["name"] == "opgraph_colsum_part" and first["grid"] == (2, r) and first["block"] == (32, 8)
    src, part, m, c, chunk = first["args"]
    assert src is a and part.shape == (r, 40) and part.dtype == np.float32
    assert (m, c, chunk) == (1000, 40, rpb)
    assert second["name"] == "opgraph_colsum_final" and second["grid"] == (2, 1)
    src2, out, m2, c2, chunk2 = second["args"]
    assert src2 is part and out is got and (m2, c2, chunk2) == (r, 40, r)
    np.testing.assert_allclose(got, a.astype(np.float64).sum(0), rtol=1e-5)


def test_one_block_row_writes_the_result_directly(standin):
    a = np.arange(64 * 5, dtype=np.float64).reshape(64, 5)
    got = cuda_colsum.column_sums(np, a)
    (call,) = standin.launches
    assert call["name"] == "opgraph_colsum_direct" and call["grid"] == (1, 1)
    assert call["args"][1] is got and call["args"][2:] == (64, 5, 64)
    np.testing.assert_array_equal(got, a.sum(0))


def test_float16_accumulates_in_float32_and_one_module_per_dtype(standin):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3000, 70)).astype(np.float16)
    got = cuda_colsum.column_sums(np, a)
    cuda_colsum.column_sums(np, a[:50])
    cuda_colsum.column_sums(np, a.astype(np.float32))
    part, final, direct, f32_part, f32_final = standin.launches
    assert part["args"][1].dtype == np.float32 and final["args"][0] is part["args"][1]
    assert got.dtype == np.float16 and direct["name"] == "opgraph_colsum_direct"
    assert len(standin.sources) == 2  # float16 once (cached), float32 once
    assert "typedef float ACC;" in standin.sources[0] and "cuda_fp16" not in standin.sources[0]
    np.testing.assert_allclose(got.astype(np.float64), a.astype(np.float64).sum(0), rtol=2e-3, atol=2e-3)
    assert f32_part["args"][1].dtype == np.float32 and f32_final["args"][0] is f32_part["args"][1]


def test_sources_declare_their_types():
    for dtype, (store, acc) in {"float16": ("unsigned short", "float"), "float32": ("float", "float"),
                                "float64": ("double", "double")}.items():
        code = cuda_colsum.colsum_source(dtype)
        assert code.startswith(f"typedef {acc} ACC;")
        assert _signatures(code) == {"opgraph_colsum_part": (C_TYPES[store], C_TYPES[acc]),
                                     "opgraph_colsum_final": (C_TYPES[acc], C_TYPES[store]),
                                     "opgraph_colsum_direct": (C_TYPES[store], C_TYPES[store])}
        assert "long long r = r0 + ty" in code and "__shared__ ACC part[8][33]" in code
        assert "atomic" not in code


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("c", [1, 3, 31, 32, 33, 384, 1000])
@pytest.mark.parametrize("nhw", [(2, 3, 5), (3, 20, 21)])  # one pass, two passes
def test_channels_last_bias_grad_through_the_stand_in(standin, dtype, c, nhw):
    n, h, w = nhw
    g = np.random.default_rng(c).standard_normal((n, c, h, w)).astype(dtype)
    want = g.astype(np.float64).sum(axis=(0, 2, 3))
    tol = 2e-3 if dtype == np.float16 else 1e-6
    passes = ["opgraph_colsum_direct"] if n * h * w <= 64 else ["opgraph_colsum_part", "opgraph_colsum_final"]

    def check(got):
        assert got.dtype == dtype and got.shape == (c,)
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < tol

    got = cuda_colsum.bias_add_backward(np, _channels_last(g))
    check(got)
    # C == 1 is NCHW-contiguous too: bias_add_backward takes the NCHW code
    assert [x["name"] for x in standin.launches] == ([] if c == 1 else passes)
    standin.launches.clear()
    cols = cuda_colsum.column_sums(np, np.ascontiguousarray(g.transpose(0, 2, 3, 1)).reshape(-1, c))  # any C
    check(cols)
    assert [x["name"] for x in standin.launches] == passes
    if c > 1:
        np.testing.assert_array_equal(cols, got)


def test_empty_and_bad_input_launch_nothing(standin):
    assert not cuda_colsum.column_sums(np, np.zeros((0, 7), np.float32)).any()
    assert cuda_colsum.bias_add_backward(np, _channels_last(np.zeros((0, 4, 2, 2)))).shape == (4,)
    with pytest.raises(ShapeError, match="2-D"):
        cuda_colsum.column_sums(np, np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ShapeError, match="int32"):
        cuda_colsum.column_sums(np, np.zeros((2, 3), np.int32))
    assert standin.launches == [] and standin.sources == []


def test_a_strided_matrix_is_copied_to_c_order(standin):
    a = np.random.default_rng(2).standard_normal((40, 200)).astype(np.float32)
    got = cuda_colsum.column_sums(np, a.T)  # (200, 40), F order
    assert standin.launches[0]["args"][0].flags.c_contiguous
    np.testing.assert_allclose(got, a.T.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ method option

@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "empty"])
def test_unknown_method_is_a_parameter_error(standin, layout):
    g = {"NCHW": np.ones((2, 3, 4, 4)), "NHWC": _channels_last(np.ones((2, 3, 4, 4))),
         "empty": np.ones((0, 3, 4, 4))}[layout]
    with pytest.raises(ParameterError, match=r"method='cublas'") as e:
        cuda_colsum.bias_add_backward(np, g, method="cublas")
    assert e.value.param == "method" and e.value.value == "cublas"
    assert "'columns', 'vector', 'gemv'" in str(e.value)
    assert standin.launches == []


def test_gemv_method_launches_no_kernel(standin):
    g = np.random.default_rng(3).standard_normal((2, 5, 3, 4))
    got = cuda_colsum.bias_add_backward(np, _channels_last(g), method="gemv")
    np.testing.assert_allclose(got, g.sum(axis=(0, 2, 3)), rtol=1e-12)
    assert standin.launches == []


def test_cuda_rule_offers_both_methods_for_channels_last_and_passes_the_option(standin):
    cuda_rules.register_rules()
    rule = rules_for(ops.BiasAddBackward)["cuda"]
    op = ops.BiasAddBackward()
    nhwc, nchw = TensorType((8, 5, 6, 6), layout="NHWC"), TensorType((8, 5, 6, 6), layout="NCHW")
    assert rule.variants(op, [nhwc], "cuda") == [{}, {"method": "gemv"}]
    # the methods differ only for channels-last input: one candidate otherwise
    assert rule.variants(op, [nchw], "cuda") == [{}]
    assert rule.variants(op, [TensorType((8, 5))], "cuda") == [{}]
    g = _channels_last(np.random.default_rng(4).standard_normal((8, 5, 6, 6)))
    gemv = rule.kernel(KernelContext(np, "cuda", {"method": "gemv"}), op, g)
    assert standin.launches == []
    cols = rule.kernel(KernelContext(np, "cuda", {}), op, g)
    assert [c["name"] for c in standin.launches] == ["opgraph_colsum_part", "opgraph_colsum_final"]
    np.testing.assert_allclose(cols, gemv, rtol=1e-12)
    with pytest.raises(ParameterError):
        rule.kernel(KernelContext(np, "cuda", {"method": "nope"}), op, g)


def test_cuda_rule_declares_the_gemv_variant_not_capturable():
    """The rule captures (``capturable=True``) but for its cuBLAS variant, which
    autotune must leave out of a step replayed as CUDA graphs."""
    cuda_rules.register_rules()
    rule = rules_for(ops.BiasAddBackward)["cuda"]
    assert rule.capturable is True
    nhwc = TensorType((8, 5, 6, 6), layout="NHWC")
    blockers = {v.get("method", "columns"): rule.declared_capture_blocker(v)
                for v in rule.variants(ops.BiasAddBackward(), [nhwc], "cuda")}
    assert blockers["columns"] is None
    assert "cuBLAS" in blockers["gemv"] and "stream capture" in blockers["gemv"]
    assert rule.capture_blocker({"method": "gemv"}, installed=False) == blockers["gemv"]
    assert rule.capture_blocker({}, installed=False) is None
    # the other cuda rules declare no variant that does not capture
    assert rules_for(ops.Relu)["cuda"].declared_capture_blocker({"method": "gemv"}) is None


@pytest.mark.parametrize("dtype, channels, vector", [("float32", 5, False), ("bfloat16", 64, True)])
def test_autotune_enumerates_the_methods_as_candidates(dtype, channels, vector):
    """columns and gemv always; vector where its lanes divide the channels (5 float32 channels:
    not a multiple of 4); the variants' revision is in the cache key."""
    from opgraph.passes.autotune import candidate_set
    from opgraph.passes.candidates import rule_variants
    from opgraph.passes.candidates import survey
    from opgraph.passes.policy import LoweringPolicy
    cuda_rules.register_rules()
    op, policy = ops.BiasAddBackward(), LoweringPolicy()
    types = (TensorType((8, channels, 6, 6), dtype, layout="NHWC"),)
    applicable = [(e.rule, e.options) for e in survey("conv.grad/bias_add_backward", op, types, "cuda",
                                                        policy).applicable()]
    cands = [(r.algorithm, {**o, **v}) for r, o in applicable for v in rule_variants(r, op, types, "cuda", o)]
    assert ("cuda", {}) in cands and ("cuda", {"method": "gemv"}) in cands
    assert (("cuda", {"method": "vector"}) in cands) == vector
    # part of the autotune cache key, with the vector kernels' revision and their code's fingerprint
    fingerprint = cuda_rules.bias_variants.fingerprint()
    assert f"cuda:bias_variants@{colsum_vector.REVISION}#{fingerprint}" in candidate_set(applicable).split(",")
