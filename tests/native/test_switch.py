"""EMBER_NATIVE=0: the one switch that keeps the extension out of the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ember

ROUND_TRIP = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from ember import _native
    from ember.tiers import DiskTier
    from ember.tiers.key_index import KeyIndex

    print(_native.is_available(), "ember._ember_native" in sys.modules)
    try:
        _native.require()
    except ImportError as e:
        print("require:", e)
    ids = np.arange(-3000, 3000, dtype=np.int64) * 1_000_003
    idx = KeyIndex(16)  # grows (rehashes) on the way
    idx.insert(ids, np.arange(ids.size, dtype=np.int32))
    gone = idx.remove(ids[::3])
    assert (gone == np.arange(ids.size)[::3]).all()
    want = np.where(np.arange(ids.size) % 3 == 0, -1, np.arange(ids.size))
    assert (idx.lookup(ids) == want).all() and len(idx) == ids.size - gone.size
    from ember.testing import read
    d = DiskTier(sys.argv[1], record_dim=2, rows=100)  # grows the file twice
    t = torch.from_numpy(ids)
    d.put(t, torch.stack([t.float(), -t.float()], 1))
    d.remove(t[::5])
    rows, found = read(d, torch.cat([t, torch.tensor([7, 8])]))
    keep = torch.arange(ids.size) % 5 != 0
    assert torch.equal(found[:-2], keep) and not found[-2:].any()
    assert torch.equal(rows[:-2][keep, 0], t[keep].float())
    print("round trip ok")
    """
)


def _run(tmp_path: Path, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "EMBER_NATIVE"}
    root = str(Path(ember.__file__).parent.parent)  # this checkout's ember, not an installed one
    environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [environ.get("PYTHONPATH")] if p])
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(tmp_path)], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_ember_native_0_keeps_the_extension_out_and_the_tiers_work(tmp_path):
    lines = _run(tmp_path, EMBER_NATIVE="0")
    assert lines[0] == "False False"  # not available, never imported
    assert lines[1].startswith("require:") and "EMBER_NATIVE=0" in lines[1]
    assert lines[-1] == "round trip ok"

