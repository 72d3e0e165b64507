from __future__ import annotations

import pytest
import torch

from ember.batch import JaggedFeature, SparseFeatures


def test_round_trip_dict():
    sf = SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 7]), torch.tensor([2, 1, 1, 0]), torch.tensor([1.0, 2, 3, 4]))
    back = SparseFeatures.from_dict(sf.to_dict())
    assert back.keys == sf.keys
    assert torch.equal(back.values, sf.values) and torch.equal(back.lengths, sf.lengths)
    assert torch.equal(back.weights, sf.weights)
    back.validate()


def test_bad_lengths_message():
    with pytest.raises(ValueError, match="not a multiple of len"):
        SparseFeatures(["a", "b"], torch.tensor([1]), torch.tensor([1, 0, 0]))
    sf = SparseFeatures(["a"], torch.tensor([1, 2]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="sum to len\\(values\\)=2, got a sum of 1"):
        sf.validate()


def test_from_dict_mixed_weights():
    a = JaggedFeature(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), None)
    b = JaggedFeature(torch.tensor([3]), torch.tensor([0, 0, 1]), torch.tensor([0.5]))
    sf = SparseFeatures.from_dict({"a": a, "b": b})
    assert sf.weights.tolist() == [1.0, 1.0, 0.5]
    assert sf["b"].offsets.tolist() == [0, 0, 1]


@pytest.mark.parametrize("values, lengths, weights, error, says", [
    (torch.tensor([1.5]), torch.tensor([1]), None, TypeError, "values must be a 1-D tensor of an integer dtype, got torch.float32"),
    ([1, 2], torch.tensor([1, 1]), None, TypeError, "values must be a torch.Tensor, got list"),
    (torch.tensor([1, 2]), [1, 1], None, TypeError, "lengths must be a torch.Tensor, got list"),
    (torch.tensor([[1, 2]]), torch.tensor([1, 1]), None, TypeError, "values must be a 1-D tensor"),
    (torch.tensor([1, 2]), torch.tensor([1.0, 1.0]), None, TypeError, "lengths must be a 1-D tensor of an integer"),
    (torch.tensor([1, 2]), torch.tensor([1, 1]), torch.tensor([1, 2]), TypeError, "weights must be a 1-D tensor of a floating"),
    (torch.tensor([1, 2]), torch.tensor([1, 1]), torch.tensor([1.0]), ValueError, "1 weights for 2 values"),
])
def test_construction_refuses_what_would_be_read_wrong(values, lengths, weights, error, says):
    with pytest.raises(error, match=says):
        SparseFeatures(["a"], values, lengths, weights)
    with pytest.raises(ValueError, match=r"keys must be unique, got \['a', 'a'\]"):
        SparseFeatures(["a", "a"], torch.tensor([1, 2]), torch.tensor([1, 1]))


@pytest.mark.parametrize("values, lengths, says", [
    ([1, 2, 3, 4], [1, 1], "sum to len\\(values\\)=4, got a sum of 2"),  # (more values: pooled into the last sample)
    ([1, 2, 3], [1, 1, 1, 1], "sum to len\\(values\\)=3, got a sum of 4"),  # (fewer: the dedupe read past them)
    ([1, 2], [-1, 3], "a length of -1"),
])
def test_lengths_that_do_not_cover_the_values_are_refused_before_any_read(values, lengths, says):
    sf = SparseFeatures(["a", "b"] if len(lengths) == 4 else ["a"], torch.tensor(values), torch.tensor(lengths))
    with pytest.raises(ValueError, match=says):
        sf.key_ranges()
    with pytest.raises(ValueError, match=says):
        sf.validate()


def test_min_length_is_the_shortest_bag():
    """What the grouped pooling asks to tell single-hot batches from others (found with
    key_ranges, once)."""
    assert SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 4]), torch.tensor([1, 1, 1, 1])).min_length() == 1
    assert SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 4]), torch.tensor([2, 0, 1, 1])).min_length() == 0
    assert SparseFeatures(["a"], torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)).min_length() == 0
