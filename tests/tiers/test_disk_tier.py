"""DiskTier: survives close/reopen, refuses an unclean reopen, and a full disk is a TierIOError."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ember import _native
from ember.errors import TierIOError
from ember.tiers import DiskTier
from ember.testing import read


def test_close_and_reopen_keeps_rows(tmp_path):
    d = DiskTier(tmp_path, record_dim=3, rows=10)
    ids = torch.arange(-50, 50) * 1_000_003
    rec = torch.randn(100, 3)
    d.put(ids, rec)  # grows the file twice
    d.remove(ids[:10])
    d.close()
    again = DiskTier(tmp_path, record_dim=3, reopen=True)
    assert len(again) == 90
    rows, found = read(again, ids)
    assert found.tolist() == [False] * 10 + [True] * 90
    assert torch.equal(rows[10:], rec[10:])


def test_reopen_keeps_the_load_the_file_was_sized_for(tmp_path):
    # Sized for 900 rows at load 0.9 (1000 slots); reopened without max_load it must not fall
    # back to the 0.85 default and double the file when it fills to 900 rows.
    d = DiskTier(tmp_path, record_dim=2, rows=900, max_load=0.9)
    d.put(torch.arange(800), torch.zeros(800, 2))
    d.close()
    again = DiskTier(tmp_path, record_dim=2, reopen=True)
    assert again.max_load == 0.9
    again.put(torch.arange(800, 900), torch.ones(100, 2))
    assert again.n_slots == 1000 and len(again) == 900
    rows, found = read(again, torch.arange(900))
    assert bool(found.all()) and rows[850].tolist() == [1.0, 1.0]


@pytest.mark.skipif(not _native.is_available(), reason="native core not built")
def test_native_and_numpy_probes_find_the_same_rows(tmp_path, monkeypatch):
    # 60 k IDs in ~70 k slots with 16-bit tags: many tag collisions and long probe runs, plus
    # deletions (tombstones) and reinsertion, through both probe implementations (the second
    # tier runs every kernel's fallback, as under EMBER_NATIVE=0).
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(-(2**62), 2**62, (60_000,), generator=g).unique()
    rec = torch.randn(ids.numel(), 3, generator=g)
    query = torch.cat([ids, torch.randint(-(2**62), 2**62, (5_000,), generator=g)])
    results, tiers = [], []
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(_native, "_core", None)
            d = DiskTier(tmp_path / str(native), record_dim=3, rows=ids.numel(), max_load=0.9)
            d.put(ids, rec)
            d.remove(ids[::7])
            d.put(ids[::14], -rec[::14])
            results.append(read(d, query))
            tiers.append(d)
    (rn, fn), (rp, fp) = results
    assert torch.equal(fn, fp) and torch.equal(rn, rp)
    expect = torch.ones(ids.numel(), dtype=torch.bool)
    expect[::7] = False
    expect[::14] = True
    assert torch.equal(fn[: ids.numel()], expect) and not bool(fn[ids.numel():].any())
    assert torch.equal(rn[:14:14], -rec[:14:14]) and torch.equal(rn[1], rec[1])
    assert len(tiers[0]) == len(tiers[1]) == int(expect.sum())
    # each implementation reads the other's tags and slots (the IDs of one insert may have
    # landed in each other's slots)
    tiers[0]._tags, tiers[1]._tags = tiers[1]._tags, tiers[0]._tags
    tiers[0]._mm, tiers[1]._mm = tiers[1]._mm, tiers[0]._mm
    tiers[0]._memo = tiers[1]._memo = None
    assert torch.equal(read(tiers[0], query)[1], fn)
    with monkeypatch.context() as m:
        m.setattr(_native, "_core", None)
        assert torch.equal(read(tiers[1], query)[0], rn)


def test_unclean_files_are_not_trusted(tmp_path):
    d = DiskTier(tmp_path, record_dim=2, rows=10)
    d.put(torch.tensor([1]), torch.ones(1, 2))
    d.flush()  # no close(): as if the process had been killed
    with pytest.raises(TierIOError, match="not close this tier cleanly"):
        DiskTier(tmp_path, record_dim=2, reopen=True)
    with pytest.raises(TierIOError, match="record_dim"):
        d.close()
        DiskTier(tmp_path, record_dim=5, reopen=True)


def test_ram_per_row_is_the_tag_array(tmp_path):
    d = DiskTier(tmp_path, record_dim=17, rows=100_000, max_load=0.85)
    assert d.ram_bytes / 100_000 < 2.5  # 2-byte tag per slot
    assert d.nbytes == d.n_slots * (8 + 4 * 17)


@pytest.mark.parametrize("when", ["create", "grow"])
def test_full_disk_raises_tier_io_error(tmp_path, when):
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk, in a child process."""
    code = textwrap.dedent(
        f"""
        import resource, signal, sys, torch
        from ember.errors import TierIOError
        from ember.tiers import DiskTier
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            d = DiskTier({str(tmp_path)!r}, record_dim=16, rows={10**6 if when == "create" else 1000})
            d.put(torch.arange(20000), torch.ones(20000, 16))
        except TierIOError as e:
            print("TierIOError:", e)
            sys.exit(3)
        sys.exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot reserve" in out.stdout and "disk_path" in out.stdout


def test_closing_a_cache_writes_its_rows_back_to_disk(tmp_path):
    from ember.tiers import CachedTier, HostTier

    ids = torch.arange(200) * 7
    c = CachedTier(HostTier(2, capacity=50, policy="lfu"), DiskTier(tmp_path, record_dim=2, rows=256), admit_after=1)
    c.put(ids, torch.zeros(200, 2))
    for _ in range(3):  # the first 40 IDs get hot and are promoted into the cache
        read(c, ids[:40])
    c.put(ids[:40], torch.ones(40, 2))
    assert len(c.fast) > 0
    c.close()
    again = DiskTier(tmp_path, record_dim=2, reopen=True)
    rows, found = read(again, ids)
    assert bool(found.all()) and len(again) == 200
    assert torch.equal(rows[:40], torch.ones(40, 2)) and torch.equal(rows[40:], torch.zeros(160, 2))


def test_failed_reservation_leaves_no_file_or_directory(tmp_path, monkeypatch):
    import errno

    import ember.tiers.disk as disk_mod
    from ember.errors import TierIOError

    def no_space(fd, offset, length):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_mod.os, "posix_fallocate", no_space)
    with pytest.raises(TierIOError, match=r"cannot reserve .* bytes\) for"):
        DiskTier(tmp_path / "t", record_dim=2, rows=100)
    assert list(tmp_path.iterdir()) == []


def test_tables_that_fit_one_by_one_but_not_together_fail_before_any_file(tmp_path, monkeypatch):
    import ember.tiers.storage as storage_mod
    from ember.errors import CapacityError
    from ember.tiers.storage import StorageConfig, check_disk_together, plan_storage

    cfg = StorageConfig(disk_path=str(tmp_path / "disk"), disk_rows=10_000)
    plans = [plan_storage(cfg, 4, name) for name in ("a", "b")]
    free = plans[0].disk_bytes + plans[0].disk_bytes // 2  # room for one, not two
    monkeypatch.setattr(storage_mod, "free_bytes", lambda path: free)
    for p in plans:
        p.check()  # each alone fits
    with pytest.raises(CapacityError, match=r"tables 'a' .* 'b' .* together"):
        check_disk_together(plans)
    assert list(tmp_path.iterdir()) == []


def test_plan_matches_what_the_built_tiers_allocate(tmp_path):
    """The capacity plan (printed before training, checked against free RAM and disk) is the
    tiers' real allocation once the host cache is full: arena, metadata, key index, admission
    sketch and the disk tier's tag array in RAM; the slot file on disk."""
    from ember.tiers import StorageConfig, build_tier, plan_storage

    storage = StorageConfig(host_rows=3000, disk_path=str(tmp_path), disk_rows=20_000, disk_max_load=0.9)
    plan = plan_storage(storage, record_dim=9, name="t")
    tier = build_tier(storage, record_dim=9, name="t")
    ids = torch.arange(20_000, dtype=torch.int64)
    tier.put(ids, torch.randn(20_000, 9))
    out = torch.empty(3000, 9)
    for _ in range(3):  # hot reads: promotions fill the host cache
        tier.get_into(ids[:3000], out)
    assert len(tier.fast) == 3000
    assert tier.slow.nbytes == plan.disk_bytes
    assert tier.fast.nbytes + tier.sketch.nbytes + tier.slow.ram_bytes == plan.host_bytes


def test_slots_remembered_from_a_read_stay_exact_through_changes(tmp_path):
    """The slots a get_into remembers (so a cache's follow-up remove and put of parts of the
    batch skip their probes) follow every insert, removal, eviction and file rebuild: each
    later lookup of those IDs equals a fresh probe, and the rows read back are the ones put."""
    import numpy as np

    rng = np.random.default_rng(5)
    d = DiskTier(tmp_path, record_dim=2, rows=300)
    truth: dict[int, float] = {}
    pool = rng.choice(2**40, 2000, replace=False).astype(np.int64)
    first = torch.from_numpy(pool[:200].copy())
    d.put(first, torch.arange(200, dtype=torch.float32)[:, None].repeat(1, 2))
    truth.update({int(i): float(v) for v, i in enumerate(pool[:200])})
    recalls = 0
    for step in range(40):
        batch = torch.from_numpy(rng.choice(pool[: 300 + 40 * step], 120, replace=False))
        out = torch.zeros(120, 2)
        d.get_into(batch, out)
        b = batch.numpy()
        parts = np.array_split(rng.permutation(b), 3)
        gone = torch.from_numpy(parts[0].copy())
        d.remove(gone)  # recalled, not probed
        for i in parts[0].tolist():
            truth.pop(i, None)
        new = torch.from_numpy(np.unique(np.concatenate([parts[1], pool[1000 + 20 * step : 1020 + 20 * step]])))
        vals = torch.full((new.numel(), 2), float(step + 1000))
        d.put(new, vals)  # grows (rebuild) now and then
        truth.update({i: float(step + 1000) for i in new.tolist()})
        if step % 7 == 3:
            ev, _ = d.evict(5)
            for i in ev.tolist():
                truth.pop(i)
        fresh, _ = d._probe(b, want_rows=False)
        recalled = d._recall(b)
        assert recalled is None or np.array_equal(recalled, fresh)
        recalls += recalled is not None
        assert np.array_equal(d.contains(batch).numpy(), np.array([i in truth for i in b.tolist()]))
    ids = torch.tensor(sorted(truth))
    out = torch.zeros(len(truth), 2)
    assert bool(d.get_into(ids, out).all())
    assert out[:, 0].tolist() == [truth[i] for i in ids.tolist()]
    assert len(d) == len(truth)
    assert recalls > 30  # evictions forget, the rest of the steps recall


def test_a_gpu_cache_plan_says_what_lies_on_the_gpu_and_what_on_the_host(monkeypatch):
    """A GPU cache's line names its records on the GPU and its index on the host, the two parts
    the plan's totals count (its one figure was both, beside a device total of the records alone)."""
    from ember.tiers import StorageConfig, plan_storage, storage as storage_module

    monkeypatch.setattr(storage_module, "_device", lambda s: torch.device("cuda"))
    plan = plan_storage(StorageConfig(device_rows=50_000), record_dim=17, name="C1")
    line = plan.describe().splitlines()[1]
    arena = 50_000 * 17 * 4
    index = storage_module.memory_row_bytes(17, 50_000) - arena
    assert plan.device_bytes == arena
    assert f"cuda cache, lfu, {storage_module._fmt(arena)} on the GPU + {storage_module._fmt(index)} of host index" in line


def test_a_group_of_mixed_tiers_reads_and_writes_side_by_side_as_on_one_thread(tmp_path, monkeypatch):
    """A group whose tables' tiers differ (in memory, host cache before disk) reads and writes
    each table's segment on the kernels' threads side by side (``run_each``): the rows, found
    masks and every tier's contents equal the same calls on one thread."""
    from ember.tiers import StorageConfig, build_tier
    from ember.tiers.segments import read_segments, write_segments

    def group(root):
        return [build_tier(StorageConfig(), 5, "a"),
                build_tier(StorageConfig(host_rows=40, disk_path=str(root), disk_rows=2000), 5, "b"),
                build_tier(StorageConfig(host_rows=1500), 5, "c"),
                build_tier(StorageConfig(host_rows=25, disk_path=str(root), disk_rows=2000), 5, "d")]

    g = torch.Generator().manual_seed(3)
    steps = []
    for _ in range(12):
        ids = [torch.unique(torch.randint(0, 1500, (int(n),), generator=g)) for n in torch.randint(1, 300, (4,), generator=g)]
        steps.append((ids, torch.randn(sum(i.numel() for i in ids), 5, generator=g)))
    import threading

    from ember.tiers.cached import CachedTier

    put, on = CachedTier.put, []
    monkeypatch.setattr(CachedTier, "put", lambda self, *a: on.append(threading.current_thread().name) or put(self, *a))
    results = {}
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        tiers, seen = group(tmp_path / str(threads)), []
        for ids, rows in steps:
            out = torch.zeros(rows.shape[0], 5)
            found = read_segments(tiers, ids, out)
            seen.append((out.clone(), found.clone()))
            write_segments(tiers, ids, out + rows * found.logical_not().unsqueeze(1) + 0.5 * rows)
        everything = torch.arange(1500)
        state = []
        for t in tiers:
            out = torch.zeros(1500, 5)
            state.append((out, t.get_into(everything, out)))
        results[threads] = (seen, state)
    for (a, fa), (b, fb) in zip(results[1][0] + results[1][1], results[2][0] + results[2][1]):
        assert torch.equal(a, b) and torch.equal(fa, fb)
    assert results[2][1][1][1].sum() > 0 and results[2][1][3][1].sum() > 0  # the disk tables hold rows
    assert any(name.startswith("ember-kernel") for name in on)  # two threads: the pool wrote some tables


@pytest.mark.skipif(not _native.is_available(), reason="native core not built: the parts are the core's")
def test_a_disk_tier_probes_and_writes_in_id_ranges_as_on_one_thread(tmp_path, monkeypatch):
    """A batch's probe (``disk_find``) and write (``disk_write``) go in ID ranges on OpenMP's
    threads: found masks, rows, the read and write counters and the file itself equal one
    thread's (the ranges really split: the core's calls are asked for three parts)."""
    g = torch.Generator().manual_seed(11)
    pool = torch.randperm(1 << 20, generator=g)[:3000].to(torch.int64) * 7919
    steps = [(pool[torch.randperm(3000, generator=g)[:900]], torch.randn(900, 6, generator=g)) for _ in range(8)]
    parts: dict[tuple[str, int], set[int]] = {}
    threads = 1
    for name in ("disk_find", "disk_write"):
        real = getattr(_native._core, name)
        monkeypatch.setattr(_native._core, name, lambda *a, _n=name, _r=real: parts.setdefault((_n, threads), set()).add(a[-1])
                            or _r(*a))
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 100)
    tiers = {}
    for threads in (1, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        d, got = DiskTier(tmp_path / str(threads), record_dim=6, rows=1000), []
        for ids, rows in steps:
            out = torch.zeros(ids.numel(), 6)
            found = d.get_into(ids, out)
            got.append((found, out))
            d.put(ids, out + rows)
        tiers[threads] = (d, got)
    (one, a), (three, b) = tiers[1], tiers[3]
    split = 3 if _native.native_parts() else 1
    assert parts == {("disk_find", 1): {1}, ("disk_write", 1): {1}, ("disk_find", 3): {split}, ("disk_write", 3): {split}}
    for (fa, oa), (fb, ob) in zip(a, b):
        assert torch.equal(fa, fb) and torch.equal(oa, ob)
    assert (one.reads, one.writes, one.hits, len(one)) == (three.reads, three.writes, three.hits, len(three))
    # the file, bit for bit (an ID's two words read as floats may be NaNs)
    assert np.array_equal(np.asarray(one._mm).view(np.int32), np.asarray(three._mm).view(np.int32))
    assert np.array_equal(one._tags, three._tags)
