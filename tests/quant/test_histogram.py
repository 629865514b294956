"""The |x| histogram: power-of-two ranges, exact merging across batches, zeros, bad data."""

import numpy as np
import pytest
import torch

from tensorforge.quant.histogram import Histogram


def test_counts_every_value_in_its_bin():
    x = torch.tensor([0.0, 0.5, -0.75, 1.0, 2.5, -3.0])
    hist = Histogram(8)
    hist.add(x)
    assert hist.limit == 4.0  # smallest power of two above max |x| = 3
    assert hist.amax == 3.0
    assert hist.zeros == 1
    # bins of width 0.5 over [0, 4): 0 → 0, 0.5 → 1, 0.75 → 1, 1.0 → 2, 2.5 → 5, 3.0 → 6
    assert hist.counts.tolist() == [1, 2, 1, 0, 0, 1, 1, 0]


def test_power_of_two_max_gets_a_larger_limit():
    hist = Histogram(4)
    hist.add(torch.tensor([2.0]))
    assert hist.limit == 4.0 and hist.counts.tolist() == [0, 0, 1, 0]


def test_merge_across_batches_equals_one_shot():
    rng = np.random.default_rng(0)
    # Each batch widens the range (a later batch exceeds the limit by several powers of two).
    batches = [torch.from_numpy(rng.normal(0, s, 5000).astype(np.float32)) for s in (0.01, 0.3, 7.0, 2.0)]
    incremental = Histogram()
    for batch in batches:
        incremental.add(batch)
    one_shot = Histogram()
    one_shot.add(torch.cat(batches))
    assert incremental.limit == one_shot.limit
    assert incremental.amax == one_shot.amax
    assert incremental.zeros == one_shot.zeros
    np.testing.assert_array_equal(incremental.counts, one_shot.counts)
    # Merging separately built histograms (in either order) gives the same counts.
    parts = []
    for batch in batches:
        part = Histogram()
        part.add(batch)
        parts.append(part)
    for order in (parts, parts[::-1]):
        merged = Histogram()
        for part in order:
            merged.merge(part)
        np.testing.assert_array_equal(merged.counts, one_shot.counts)
        assert merged.total == 20000


def test_zeros_need_no_range_until_a_nonzero_value_arrives():
    hist = Histogram(16)
    hist.add(torch.zeros(10))
    assert hist.limit is None and hist.counts[0] == 10 and hist.amax == 0.0
    hist.add(torch.tensor([1.5]))
    assert hist.limit == 2.0 and hist.counts[0] == 10 and hist.counts[12] == 1


def test_rejects_non_finite_data_and_bad_bin_counts():
    with pytest.raises(ValueError, match="NaN or Inf"):
        Histogram().add(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="NaN or Inf"):
        Histogram().add(torch.tensor([float("inf")]))
    with pytest.raises(ValueError, match="power of two"):
        Histogram(1000)
    with pytest.raises(ValueError, match="cannot merge"):
        Histogram(8).merge(Histogram(16))
