"""Real data: DLRM (configs/criteo.yaml) and ember's logistic regression on the Criteo sample in
../shared/data/criteo (train on train.tsv, eval on dev.tsv + test.tsv, 800 rows). Skipped when
that folder is absent.

Measured (this 2-core machine, eval AUC on dev + test, data/train seeds 0, 1, 2):

- DLRM, configs/criteo.yaml (dim 4, adagrad 0.05, 2 epochs): 0.708, 0.689, 0.699
- LR (one weight per ID + Linear on dense, 3 epochs):         0.719, 0.718, 0.714

On 7,200 training rows DLRM does not beat a well-configured LR (no DLRM setting tried did,
robustly); both clear the shared data README's reference LR (0.685-0.697, bucketed integer
features). With 800 eval rows (~180 clicks) the AUC's standard error is about 0.02, so the test
asserts that DLRM learns (> 0.62) and stays within 0.04 of LR, not that it wins.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.config import load
from ember.train.loop import train
from tests.conftest import REPO, shared_data_dir

CRITEO = shared_data_dir() / "criteo"
SEED = 0


def _overrides(tmp_path: Path, name: str) -> list[str]:
    return [
        f"data.train={CRITEO / 'train.tsv'}",
        f"data.eval=[{CRITEO / 'dev.tsv'}, {CRITEO / 'test.tsv'}]",
        f"data.seed={SEED}",
        "data.prefetch=0",
        f"train.seed={SEED}",
        f"train.out_dir={tmp_path}",
        f"train.run_name={name}",
        "train.progress=false",
        "train.threads=1",
    ]


@pytest.fixture
def criteo_dir() -> Path:
    if not all((CRITEO / f).exists() for f in ("train.tsv", "dev.tsv", "test.tsv")):
        pytest.skip(f"the Criteo sample is not at {CRITEO} (set EMBER_DATA_DIR)")
    return CRITEO


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_dlrm_learns_real_criteo_and_keeps_up_with_logistic_regression(tmp_path, criteo_dir):
    config = REPO / "configs" / "criteo.yaml"
    dlrm = train(load(config, _overrides(tmp_path, "dlrm")))
    lr = train(load(config, _overrides(tmp_path, "lr") + [
        "model={type: lr}", "train.epochs=3", "train.dense_optimizer={type: adam, lr: 0.01}", "data.batch_size=256",
    ]))
    auc_dlrm, auc_lr = dlrm.metrics["auc/label"], lr.metrics["auc/label"]
    print(f"criteo eval AUC (dev+test): dlrm={auc_dlrm:.4f} lr={auc_lr:.4f}")
    assert dlrm.metrics["rows"] == lr.metrics["rows"] == 800
    assert auc_dlrm > 0.62, dlrm.metrics
    assert auc_lr > 0.62, lr.metrics
    assert auc_dlrm >= auc_lr - 0.04, (auc_dlrm, auc_lr)  # measured gap 0.01-0.03 (seeds 0-2)
