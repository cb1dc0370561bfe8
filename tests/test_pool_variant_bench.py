"""``scripts/pool_variant_bench.py`` without a GPU: its shapes hold every max pool
of opgraph's GoogLeNet (batch 128) and VGG-A (batch 64), and the default tile of
each (``pool_vector.tile_shape``) fits the shared-memory budget, divides the
channel groups, keeps a block within ``TILE_THREADS`` and (the gather's) steps
by the stride; its tile alternatives (``--sweep``) are valid tiles too."""

from __future__ import annotations

import pytest

from opgraph import ops
from opgraph.backends.cuda import pool_vector, pool_vector_tile
from opgraph.benchmarks.models import build
from opgraph.op import abstract_of

from repo_scripts import load_script


def _script():
    return load_script("pool_variant_bench")


@pytest.mark.parametrize("model, batch", [("googlenet", 128), ("vgg_a", 64)])
def test_the_shapes_hold_every_max_pool_of_the_models(model, batch):
    graph = build(model, batch=batch)
    pools = set()
    for v in graph.output.graph.nodes_in_order([graph.output]):
        op = abstract_of(v.op)
        if isinstance(op, ops.MaxPool2d):
            (k, _), (s, _), ((p, _), _) = op.kernel_size, op.stride, op.padding
            pools.add((tuple(v.inputs[0].type.shape), k, s, p, op.ceil_mode))
    listed = {tuple(row[2:]) for row in _script().SHAPES if row[0] == model}
    assert pools and pools == listed


def test_the_default_tiles_of_the_shapes_fit_and_divide():
    bench = _script()
    for _, _, shape, k, s, p, ceil in bench.SHAPES:
        g = bench._geometry(shape, k, s, p, ceil)
        groups = shape[1] // pool_vector.lanes("bfloat16")
        window = (k, k, s, s)
        # the extents the launch covers: the output's, and the gather's from the stride's last
        # multiple in the (symmetric) padding on
        assert pool_vector.tile_extent("arg", g) == pool_vector.tile_extent("take", g) == tuple(g.out)
        assert pool_vector.tile_extent("bwd", g) == (shape[2] + p % s, shape[3] + p % s)
        for kind in ("arg", "take", "bwd"):
            t = pool_vector.tile_shape(kind, window, pool_vector.tile_extent(kind, g), groups)
            for tile in (t, *bench._alternatives(pool_vector, kind, t, window, groups)):
                assert pool_vector_tile.tile_smem(kind, window, tile) <= 48 * 1024
                assert groups % tile.groups == 0
                if kind == "bwd":
                    assert tile.rows % s == 0 and tile.cols % s == 0
            assert pool_vector_tile.tile_smem(kind, window, t) <= pool_vector_tile.TILE_SMEM
            assert t.cols * t.groups <= pool_vector_tile.TILE_THREADS
            assert t.rows <= pool_vector_tile.TILE_ROWS and t.cols <= pool_vector_tile.TILE_COLS


@pytest.mark.parametrize("groups, extent", [(0, (4, 4)), (2, (0, 5))])
def test_tile_shape_refuses_no_groups_or_an_empty_extent(groups, extent):
    with pytest.raises(ValueError, match="must be at least 1"):
        pool_vector.tile_shape("arg", (3, 3, 1, 1), extent, groups)
