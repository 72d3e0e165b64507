import resource

import numpy as np
import pytest

from ember.errors import ConfigError
from ember.source.config import SyntheticOptions
from ember.source.synthetic import synthetic_records, synthetic_score


def auc(y: np.ndarray, s: np.ndarray) -> float:
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    pos = y.sum()
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos)))


def test_deterministic_and_independent_of_chunking():
    o = SyntheticOptions(num_dense=3, num_sparse=4, multi_hot={"C2": 4}, seed=3)
    whole = synthetic_records(o, "train", 0, 100)
    parts = [synthetic_records(o, "train", a, a + 25) for a in range(0, 100, 25)]
    for name in whole.schema.names:
        assert whole.column(name).to_pylist() == sum((p.column(name).to_pylist() for p in parts), [])
    assert synthetic_records(o, "eval", 0, 100).column("C1") != whole.column("C1")
    other_seed = synthetic_records(SyntheticOptions(num_dense=3, num_sparse=4, multi_hot={"C2": 4}, seed=4), "train", 0, 100)
    assert other_seed.column("C1") != whole.column("C1")
    lengths = [len(v) for v in whole.column("C2").to_pylist()]
    assert min(lengths) >= 1 and max(lengths) == 4


def test_zipf_frequencies():
    o = SyntheticOptions(num_dense=0, num_sparse=1, vocab_size=1_000_000, zipf=1.1)
    ids = synthetic_records(o, "train", 0, 200_000).column("C1").to_numpy()
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    # Power law: frequency of rank r ~ r^-1.1, so rank 1 vs rank 10 about 10^1.1 = 12.6 (loosely).
    assert 6 < counts[0] / counts[9] < 25
    assert counts[0] > 0.05 * ids.size  # a heavy head
    assert counts.size > 20_000  # and a long tail


def test_planted_signal_auc_and_positive_rate():
    o = SyntheticOptions()
    rb = synthetic_records(o, "eval", 0, 100_000)
    y = rb.column("label").to_numpy()
    s = synthetic_score(o, "eval", 0, 100_000)
    assert 0.17 < y.mean() < 0.27
    assert 0.75 < auc(y, s) < 0.86


def test_hidden_effects_shared_between_splits():
    # The same ID carries the same effect in train and eval: a per-ID mean label from train
    # ranks eval rows well above chance.
    o = SyntheticOptions(num_dense=0, num_sparse=1, signal_features=1, vocab_size=50)
    tr, ev = synthetic_records(o, "train", 0, 50_000), synthetic_records(o, "eval", 0, 20_000)
    ids_tr, y_tr = tr.column("C1").to_numpy(), tr.column("label").to_numpy()
    uniq, inv = np.unique(ids_tr, return_inverse=True)
    ctr = np.bincount(inv, weights=y_tr) / np.bincount(inv)
    ids_ev = ev.column("C1").to_numpy()
    pred = ctr[np.clip(np.searchsorted(uniq, ids_ev), 0, uniq.size - 1)]
    assert auc(ev.column("label").to_numpy(), pred) > 0.65


def test_huge_vocab_allocates_nothing_of_vocab_size():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    o = SyntheticOptions(vocab_size=10**9, zipf=0.6)
    ids = synthetic_records(o, "train", 10**9, 10**9 + 50_000).column("C5").to_numpy()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 300
    assert np.unique(ids).size > 40_000  # a flat power law over 1e9 IDs: nearly all distinct


def test_options_validation():
    with pytest.raises(ConfigError, match="multi_hot"):
        SyntheticOptions.parse({"num_sparse": 2, "multi_hot": {"C9": 3}})
    with pytest.raises(ConfigError, match="one per sparse feature"):
        SyntheticOptions.parse({"num_sparse": 2, "vocab_size": [1, 2, 3]})
    for length in (0, 100_000_000):  # (a bag of 10^8 IDs a row took all memory, as the column counts did)
        with pytest.raises(ConfigError, match=r"multi_hot lengths must be in \[1, 10,000\]"):
            SyntheticOptions.parse({"num_sparse": 2, "multi_hot": {"C1": length}})


@pytest.mark.parametrize("key", ["num_sparse", "num_dense"])
def test_column_counts_are_bounded_before_any_memory_is_taken(key, tmp_path, capsys):
    """100 million columns would need more memory than a machine has for one batch (it ended in
    an empty MemoryError): refused as a config error naming the option, at most 10,000."""
    from ember.cli import main

    with pytest.raises(ConfigError, match=rf"'--options.{key}': Input should be less than or equal to 10000"):
        SyntheticOptions.parse({key: 100_000_000}, where="--options")
    assert SyntheticOptions.parse({key: 10_000}).model_dump()[key] == 10_000
    assert main(["generate", "--out", str(tmp_path / "g.csv"), "--rows", "10", "--options", f'{{"{key}": 100000000}}']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ember generate: error: invalid config: '--options.{key}': Input should be less than or equal "
                          "to 10000 (got 100000000)") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "g.csv").exists()
