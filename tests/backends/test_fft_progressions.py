"""``fft._progressions``: the cells no window reads, as slices covering exactly them."""

import numpy as np
import pytest

from opgraph.backends.algorithms.fft import _progressions, _untouched


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


@pytest.mark.parametrize("size, k, s, d, begin", [(224, 1, 3, 1, 0), (225, 1, 4, 1, 0), (97, 2, 5, 1, 1),
                                                 (64, 2, 3, 2, 0)])
def test_a_stride_past_the_windows_takes_a_few_slices_per_phase_not_one_per_period(size, k, s, d, begin):
    """k=1, s=3 on 224 rows: rows 1 and 2 of every period are read by no window. Greedy runs of
    consecutive cells gave a slice per period (75 slice assignments, each a launch on the GPU);
    one progression of step s per skipped phase covers them in a few."""
    out = (size + begin - d * (k - 1) - 1) // s + 1
    idx = _untouched(size, out, k, s, d, begin)
    slices = _progressions(idx, s)
    covered = np.zeros(size, bool)
    for sl in slices:
        assert not covered[sl].any(), "slices overlap"
        covered[sl] = True
    np.testing.assert_array_equal(np.flatnonzero(covered), idx)
    assert len(slices) <= s + 2, slices


@pytest.mark.parametrize("seed", range(40))
def test_slices_with_a_period_cover_exactly_the_indices_and_never_outnumber_plain_runs(seed):
    rng = np.random.default_rng(seed)
    size, period = int(rng.integers(1, 60)), int(rng.integers(1, 6))
    idx = np.flatnonzero(rng.random(size) < rng.random())
    slices = _progressions(idx, period)
    covered = np.zeros(size, bool)
    for sl in slices:
        assert not covered[sl].any(), "slices overlap"
        covered[sl] = True
    np.testing.assert_array_equal(np.flatnonzero(covered), idx)
    assert len(slices) <= len(_progressions(idx))
