"""``fft._progressions``: the cells no window reads, as slices covering exactly them."""

import numpy as np
import pytest

from opgraph.backends.algorithms.fft import _progressions


@pytest.mark.parametrize("seed", range(40))
def test_slices_cover_exactly_the_indices(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 40))
    idx = np.flatnonzero(rng.random(size) < rng.random())
    covered = np.zeros(size, bool)
    for sl in _progressions(idx):
        assert not covered[sl].any(), "slices overlap"
        covered[sl] = True
    np.testing.assert_array_equal(np.flatnonzero(covered), idx)


def test_a_stride_skipping_rows_takes_few_slices():
    # k=1, s=3 on 8 rows: rows 1, 2, 4, 5, 7 are read by no window
    assert len(_progressions(np.array([1, 2, 4, 5, 7]))) <= 3
    assert _progressions(np.array([6, 7])) == [slice(6, 8, 1)]
    assert _progressions(np.array([], int)) == []
