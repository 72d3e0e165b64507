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
    with pytest.raises(ValueError, match="sum\\(lengths\\)"):
        sf.validate()


def test_from_dict_mixed_weights():
    a = JaggedFeature(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), None)
    b = JaggedFeature(torch.tensor([3]), torch.tensor([0, 0, 1]), torch.tensor([0.5]))
    sf = SparseFeatures.from_dict({"a": a, "b": b})
    assert sf.weights.tolist() == [1.0, 1.0, 0.5]
    assert sf["b"].offsets.tolist() == [0, 0, 1]
