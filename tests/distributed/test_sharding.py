"""The owner of (table, ID): stable across processes and runs, balanced, table-wise whole."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ember.distributed.sharding import ShardingPlan, TableSharding, hash_owners, splitmix64, table_salt
from tests.conftest import REPO


def _plan(world: int) -> ShardingPlan:
    return ShardingPlan(world, {"user": TableSharding("user", "row_wise"), "item": TableSharding("item", "row_wise"),
                                "small": TableSharding("small", "table_wise", world - 1)})


def test_splitmix64_reference_values():
    # the first outputs of the reference splitmix64 generator seeded with 0 (state += golden ratio each call)
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        states = np.array([0, golden, golden * np.uint64(2)], dtype=np.uint64)
    assert splitmix64(states).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_owners_are_the_same_in_another_process():
    """No Python hash(), no process seed: a fresh interpreter with another hash seed agrees."""
    ids = np.array([0, 1, -1, 2**62, -(2**63), 123456789, 42], dtype=np.int64)
    here = _plan(5).owners("user", ids).tolist()
    code = ("import numpy as np; from ember.distributed.sharding import ShardingPlan, TableSharding; "
            "p = ShardingPlan(5, {'user': TableSharding('user', 'row_wise')}); "
            f"print(p.owners('user', np.array({ids.tolist()}, dtype=np.int64)).tolist())")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(here)
    assert table_salt("user") == table_salt("user") and table_salt("user") != table_salt("item")


@pytest.mark.parametrize("world", [2, 3, 8])
def test_row_wise_is_balanced_and_differs_per_table(world):
    ids = np.arange(200_000, dtype=np.int64)  # consecutive IDs: the worst case for a plain modulo of a weak hash
    plan = _plan(world)
    counts = np.bincount(plan.owners("user", ids), minlength=world)
    assert counts.sum() == ids.size and counts.min() > 0.97 * ids.size / world and counts.max() < 1.03 * ids.size / world
    strided = np.bincount(plan.owners("user", ids * 1024), minlength=world)  # IDs sharing low bits
    assert strided.min() > 0.97 * ids.size / world
    same = (plan.owners("user", ids) == plan.owners("item", ids)).mean()
    assert abs(same - 1 / world) < 0.02  # each table has its own salt: placements are independent


def test_table_wise_and_owned():
    plan = _plan(3)
    ids = np.arange(100, dtype=np.int64)
    assert set(plan.owners("small", ids).tolist()) == {2}
    masks = [plan.owned("user", ids, r) for r in range(3)]
    assert (np.sum(masks, axis=0) == 1).all()  # every ID has exactly one owner


def test_plan_checks_and_aliases():
    with pytest.raises(ValueError, match="needs a rank"):
        TableSharding("t", "table_wise")
    with pytest.raises(ValueError, match="outside"):
        ShardingPlan(2, {"t": TableSharding("t", "table_wise", 2)})
    plan = _plan(2)
    with pytest.raises(KeyError, match="no table 'nope'"):
        plan.owners("nope", np.zeros(1, np.int64))
    lin = plan.with_aliases({"small__linear": "small", "user__linear": "user"})
    assert lin.spec("small__linear").rank == 1 and lin.spec("user__linear").kind == "row_wise"
    assert hash_owners(np.array([7]), table_salt("x"), 1).tolist() == [0]
