"""An ID -> row map that lives on the device and is probed and extended by tensor operations.

A GPU step that looks rows up in a host index waits for the host: every ID of the batch costs
the CPU a hash probe (and the cache's counters) before the device can gather. ``DeviceIndex``
keeps the map in device memory instead, so a step's look-up and its inserts are a fixed
sequence of tensor operations on the device (26 for ``find``, 87 for ``find_or_insert`` on a CPU),
whatever the batch or the table size, with no device->host
synchronisation: nothing reads device data back, and no output's shape depends on it.

Layout: ``buckets`` x ``ways`` entries (a power of two of buckets, 32 ways), each a (key, tag,
row) triple in three planes (int64 keys, int32 tags, int64 rows: 20 bytes). The tag is the
table of a group (an ID of two tables is two entries); a removed entry keeps its key with tag
-1 until a rehash frees its way. Every
(key, tag) has two candidate buckets, from one 64-bit mix; a look-up compares all 2 x ways
entries of both at once. An insert goes to the emptier of the two, ways filled in order; keys of
one batch that pick the same bucket are ranked by a stable sort, and those past the last way
try their other bucket once (two rounds: two-choice hashing keeps every bucket below its ways
at the load limit, 1/2). Rows are numbered in order of first insertion (released rows are reused first, see below).

The host sizes the table without waiting on the device: each insert downloads the entry count
without blocking (``counts``), and ``reserve`` takes the newest download that has arrived plus
the keys of the inserts since (an upper bound) against the load limit; only then is the exact
count read and the table rehashed (rarely: a rehash leaves it at most 3/8 full). An insert that
found no way in either bucket
(never seen at the load limit) is counted on the device and raises ``CapacityError`` at the
next ``reserve`` or ``check``, never dropped silently. Rows of removed pairs that the caller
``release``s go on a free stack on the device, which inserts pop before numbering new rows.

The same code runs on a CPU tensor (tests check it against a dict, and ``DeviceBudget`` counts
its operations and syncs) and on a GPU.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from ember.errors import CapacityError
from ember.tiers.device_budget import mark_device, start_download

__all__ = ["DeviceIndex"]

_MAX_LOAD = 0.5


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLD = _signed(0x9E3779B97F4A7C15)  # spreads a tag over the key's bits
_M1 = _signed(0xBF58476D1CE4E5B9)  # splitmix64's multipliers
_M2 = _signed(0x94D049BB133111EB)


def mix(keys: Tensor, tags: Tensor) -> Tensor:
    """int64 [N]: a 64-bit mix of each (key, tag) (wrapping int64 arithmetic, the same bits on
    every device). Bits 0..30 and 32..62 give the two candidate buckets."""
    z = keys ^ (tags.to(torch.int64) * _GOLD)
    z = z * _M1
    z = z ^ (z >> 31)  # (arithmetic: torch has no unsigned 64-bit shift; still a full mix)
    return z * _M2


class DeviceIndex:
    """Maps (int64 key, int32 tag) pairs to int64 rows, in device memory.

    Args:
        capacity: pairs to hold before the first growth.
        device: where the table lives.
        ways: entries per bucket (a look-up compares 2 x ``ways``).

    Example:
        >>> idx = DeviceIndex(100, "cpu")
        >>> rows, new = idx.find_or_insert(torch.tensor([7, -2, 7]), torch.tensor([0, 0, 1]))
        >>> rows.tolist(), new.tolist()
        ([0, 1, 2], [True, True, True])
        >>> idx.find(torch.tensor([-2, 7, 9]), torch.tensor([0, 1, 0])).tolist()
        [1, 2, -1]
    """

    def __init__(self, capacity: int, device: str | torch.device, ways: int = 32) -> None:
        if ways < 1:
            raise ValueError(f"DeviceIndex: ways must be >= 1, got {ways}")
        self.device = torch.device(device)
        self.ways = ways
        # [rows numbered, inserts that found no way, ways in use (removed pairs' too, until a rehash),
        #  released rows on the free stack]
        self.counts = torch.zeros(4, dtype=torch.int64, device=self.device)
        # the free stack: released rows (``release``) that new pairs take before new numbers; its
        # first counts[3] entries, then room, then one spare entry per row of the largest release
        self.free = torch.zeros(1, dtype=torch.int64, device=self.device)
        mark_device(self.counts, self.free)
        self.generation = 0  # changes whenever a tensor of the index is replaced (a CUDA graph of ``insert`` is stale)
        self._iota = torch.arange(ways, device=self.device)  # (``_arange``)
        self._alloc(self._buckets_for(capacity), spare=ways)
        # downloads of ``counts`` not yet read: (pinned host copy, event or None, keys inserted after
        # it, rows released after it)
        self._pending: deque[list] = deque()
        self._known = (0, 0, 0, 0)  # the newest arrived download
        self._since = 0  # keys of the inserts since that download was issued (an upper bound of new rows)
        self._released = 0  # rows released since that download was issued (an upper bound of the stack's growth)

    def _buckets_for(self, capacity: int) -> int:
        b = 1
        while b * self.ways * _MAX_LOAD < max(capacity, 1):
            b *= 2
        return b

    def _alloc(self, buckets: int, spare: int | None = None) -> None:
        """Empty planes of ``buckets`` buckets, then ``spare`` entries (and as many one-way
        buckets) past them: a call's pair ``i`` that is not written uses spare ``i``, so every
        write is one unmasked scatter whose targets are all distinct (no duplicate writes, which a
        GPU serialises or leaves in an undefined order)."""
        spare = self.spare if spare is None else spare
        self.buckets, self.spare = buckets, spare
        self.generation += 1
        n = buckets * self.ways + spare
        self.keys = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.tags = torch.full((n,), -1, dtype=torch.int32, device=self.device)
        self.rows = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        self.fill = torch.zeros(buckets + spare, dtype=torch.int64, device=self.device)  # ways used (a removal does not free one)
        mark_device(self.keys, self.tags, self.rows, self.fill)

    def _spares(self, n: int) -> Tensor:
        """int64 [n]: 0..n-1, with at least ``n`` spare entries behind the buckets (grown, keeping
        the buckets, when a call brings more pairs than any before)."""
        if n > self.spare:
            spare = -(-max(n, 2 * self.spare) // self.ways) * self.ways
            live, fill = self.keys.numel() - self.spare, self.fill.numel() - self.spare
            planes = [torch.cat((t[:live], t.new_full((spare,), v))) for t, v in
                      ((self.keys, 0), (self.tags, -1), (self.rows, -1))]
            self.keys, self.tags, self.rows = planes
            self.fill = torch.cat((self.fill[:fill], self.fill.new_zeros(spare)))
            self.spare = spare
            self.generation += 1
            mark_device(self.keys, self.tags, self.rows, self.fill)
        return self._arange(n)

    def _arange(self, n: int) -> Tensor:
        """int64 [n]: 0..n-1, a view of one kept on the device (no launch per call)."""
        if self._iota.numel() < n:
            self._iota = torch.arange(max(n, 2 * self._iota.numel()), device=self.device)
            self.generation += 1
        return self._iota[:n]

    def device_tensors(self) -> list[Tensor]:
        """The device memory it keeps between calls (``MappedRows.device_tensors``)."""
        return [self.keys, self.tags, self.rows, self.fill, self.counts, self.free]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.tags, self.rows, self.fill))

    # ---- look-up --------------------------------------------------------------------------
    def _homes(self, keys: Tensor, tags: Tensor) -> Tensor:
        """int64 [N, 2]: the two candidate buckets of each pair."""
        z = mix(keys, tags)
        mask = self.buckets - 1
        return torch.stack(((z >> 32) & mask, z & mask), dim=1)

    def _match(self, keys: Tensor, tags: Tensor, homes: Tensor) -> tuple[Tensor, Tensor]:
        """(found bool [N], flat entry position int64 [N], meaningful where found): both buckets'
        entries gathered as whole rows of ``ways`` (one contiguous read per bucket)."""
        w, n = self.ways, homes.shape[0]
        flat = homes.reshape(-1)
        hit = ((self.keys.view(-1, w).index_select(0, flat).view(n, 2 * w) == keys.unsqueeze(1))
               & (self.tags.view(-1, w).index_select(0, flat).view(n, 2 * w) == tags.unsqueeze(1)))
        first = hit.to(torch.uint8).argmax(dim=1, keepdim=True)  # a pair is in at most one entry
        return hit.any(dim=1), (homes.gather(1, first // w) * w + first % w).squeeze(1)

    def find(self, keys: Tensor, tags: Tensor) -> Tensor:
        """int64 [N]: the row of each (key, tag) pair, -1 where absent (duplicates allowed)."""
        keys, tags = self.pairs(keys, tags)
        found, pos = self._match(keys, tags, self._homes(keys, tags))
        return torch.where(found, self.rows[pos], -1)

    # ---- insert ---------------------------------------------------------------------------
    def find_or_insert(self, keys: Tensor, tags: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(rows int64 [N], new bool [N]): each pair's row, the absent ones inserted with the next
        rows in order. The pairs must be unique (a batch's deduplicated IDs). ``valid`` (bool
        [N]): only those pairs are looked up and inserted, the others (padding) get row -1 and
        change nothing."""
        keys, tags = self.pairs(keys, tags)
        self.prepare(keys.numel())
        rows, new = self.insert(keys, tags, valid)
        self.count_inserted(keys.numel())
        return rows, new

    def prepare(self, n: int) -> None:
        """The host's part of an insert of ``n`` pairs, before any device work: room within the
        load limit (a growth, rarely) and a spare entry per pair. After it, ``insert`` of up to
        ``n`` pairs is device work alone, on tensors that stay where they are (``generation``)."""
        self.reserve(n)
        self._spares(n)

    def insert(self, keys: Tensor, tags: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``find_or_insert``'s device work (after ``prepare`` for at least ``len(keys)`` pairs;
        keys int64, tags int32 on the device): a fixed sequence of tensor operations, no host
        decision and no allocation outside the call's own, so a CUDA graph can replay it."""
        rows, new, _ = self.insert_entries(keys, tags, valid)
        return rows, new

    def insert_entries(self, keys: Tensor, tags: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``insert``, also returning each pair's entry (int64 [N], its flat position in the
        planes; a spare entry for a pair not looked up), which ``drop`` takes."""
        homes = self._homes(keys, tags)
        found, pos = self._match(keys, tags, homes)
        if valid is not None:
            found = found & valid
        new = ~found if valid is None else valid & ~found
        rank = torch.cumsum(new, 0) - 1  # the new pairs' order
        nfree = self.counts[3]
        # the first new pairs pop the free stack (its top first), the others take the next numbers
        popped = self.free[(nfree - 1 - rank).clamp_(min=0)]
        fresh = torch.where(rank < nfree, popped, self.counts[0] + rank - nfree)
        rows = torch.where(found, self.rows[pos], fresh if valid is None else torch.where(new, fresh, -1))
        slot, failed = self._place(homes, new)
        self.keys[slot] = keys
        self.tags[slot] = tags
        self.rows[slot] = rows
        added = new.sum()
        took = torch.minimum(added, nfree)
        self.counts += torch.stack((added - took, failed.sum(), added, -took))
        return rows, new, torch.where(found, pos, slot)

    def drop(self, entries: Tensor, mask: Tensor) -> None:
        """Take the pairs at ``entries[mask]`` (e.g. from ``insert_entries``) out of the index:
        device work alone, after ``prepare`` for as many pairs (``remove`` finds the entries
        itself). Their ways stay used until the next rehash; their rows are the caller's to
        ``release``."""
        spare = self.buckets * self.ways + self._arange(entries.numel())  # (the others: their own spare)
        self.tags[torch.where(mask, entries, spare)] = -1

    def release(self, rows: Tensor, valid: Tensor) -> None:
        """Give rows back (``rows[valid]``: rows of removed pairs that nothing reads or writes any
        more): later inserts reuse them before numbering new ones."""
        n = rows.numel()
        if not n:
            return
        self.prepare_release(n)
        self.push_free(rows.to(self.device), valid.to(self.device))
        self.released(n)

    def prepare_release(self, n: int) -> None:
        """The host's part of a release of up to ``n`` rows, before its device work: room on the
        free stack (a growth, rarely: ``generation`` changes)."""
        self._arrived()
        room = self._known[3] + self._released + n  # (an upper bound of the stack once these are on it)
        if self.free.numel() < room + n:
            size = max(room + n, 2 * self.free.numel())
            self.free = torch.cat((self.free, self.free.new_zeros(size - self.free.numel())))
            self.generation += 1
            mark_device(self.free)

    def push_free(self, rows: Tensor, valid: Tensor) -> None:
        """``release``'s device work (after ``prepare_release`` for ``len(rows)``): ``rows[valid]``
        onto the free stack."""
        n = rows.numel()
        at = self.counts[3] + torch.cumsum(valid, 0) - 1
        spare = self.free.numel() - n + self._arange(n)  # the others' own entries at the end
        self.free[torch.where(valid, at, spare)] = rows
        self.counts[3] += valid.sum()

    def released(self, n: int) -> None:
        """After ``push_free`` of ``n`` rows: the host's bound of the stack's growth (before the
        ``count_inserted`` whose download follows it)."""
        for p in self._pending:
            p[3] += n
        self._released += n

    def _place(self, homes: Tensor, want: Tensor) -> tuple[Tensor, Tensor]:
        """Entries for the pairs ``want`` (homes [N, 2]): the emptier home bucket first, then, for
        those past its last way, the other one. (slot [N]: each pair's flat entry, its spare
        entry for the others and for pairs placed in neither; failed [N]: wanted, placed in
        neither.) The buckets' fill counts the ways taken."""
        w = self.ways
        own = self._spares(homes.shape[0])
        spare = self.buckets + own  # one spare one-way bucket per pair: its fill stays 0
        f = self.fill[homes]
        pick = torch.where(want, torch.where(f[:, 1] < f[:, 0], homes[:, 1], homes[:, 0]), spare)
        way, ok = self._claim(pick, want)
        again = want & ~ok
        pick2 = torch.where(again, torch.where(pick == homes[:, 0], homes[:, 1], homes[:, 0]), spare)
        way2, ok2 = self._claim(pick2, again)
        slot = torch.where(ok, pick * w + way, torch.where(ok2, pick2 * w + way2, self.buckets * w + own))
        return slot, again & ~ok2

    def _claim(self, pick: Tensor, want: Tensor) -> tuple[Tensor, Tensor]:
        """Ways for the pairs ``want`` in their buckets ``pick`` (the others pick their spare):
        the next free ways in order of position (a stable sort ranks the pairs of one bucket);
        (way, ok): ok where the way exists. The buckets' fill counts the ways taken."""
        order = torch.sort(pick, stable=True).indices
        sorted_pick = pick[order]
        rank = self._arange(pick.numel()) - torch.searchsorted(sorted_pick, sorted_pick)
        way = torch.empty_like(pick).index_put_((order,), rank) + self.fill[pick]
        ok = want & (way < self.ways)
        self.fill.index_put_((pick,), ok.to(torch.int64), accumulate=True)  # (deterministic on a GPU, unlike index_add_)
        return way, ok

    # ---- sizing ---------------------------------------------------------------------------
    def count_inserted(self, inserted: int, download: tuple[Tensor, "torch.cuda.Event | None"] | None = None) -> None:
        """After an ``insert`` of ``inserted`` pairs: start a non-blocking download of ``counts``
        (what ``reserve`` and ``bound`` size by, without waiting). ``download``: this index's
        counts already on their way (``start_download`` of a tensor shared by ``share_counts``)."""
        host, event = download if download is not None else start_download(self.counts)
        for p in self._pending:
            p[2] += inserted
        self._since += inserted
        self._pending.append([host, event, 0, 0])

    def share_counts(self, other: "DeviceIndex") -> Tensor:
        """Keep this index's ``counts`` and ``other``'s in one tensor (each a view of it, values
        kept), so one ``start_download`` of it serves both ``count_inserted``: one copy a step
        instead of two. Returns the shared tensor ([8]: this index's 4, then ``other``'s)."""
        both = torch.cat((self.counts, other.counts))
        self.counts, other.counts = both[:4], both[4:]
        self.generation += 1
        other.generation += 1
        mark_device(both)
        return both

    def _arrived(self) -> None:
        """Take the downloads that have arrived (without waiting)."""
        while self._pending and (self._pending[0][1] is None or self._pending[0][1].query()):
            host, _, after, released = self._pending.popleft()
            self._known = tuple(host.tolist())
            self._since, self._released = after, released
        self._raise_failed()

    def _raise_failed(self) -> None:
        if self._known[1]:
            raise CapacityError(
                f"DeviceIndex: {self._known[1]} key(s) found no free way in either of their two buckets "
                f"({self.buckets} buckets x {self.ways} ways at a load limit of {_MAX_LOAD}); their rows were "
                "not indexed. This is not expected at this load: please report it with the table sizes")

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more pairs within the load limit (growing, which waits for the device,
        only when the newest count that has arrived plus the inserts since could pass it)."""
        self._arrived()
        limit = _MAX_LOAD * self.buckets * self.ways
        if self._known[2] + self._since + n <= limit:
            return
        self.check()  # the exact count (a sync: once per growth)
        if self._known[2] + n > limit:
            self._rehash(n)

    def bound(self, n: int) -> int:
        """An upper bound, without waiting, of the rows numbered once ``n`` more pairs are
        inserted: the newest count that has arrived, plus every key inserted since, plus ``n``
        (what a caller sizes the rows' own storage by)."""
        self._arrived()
        return self._known[0] + self._since + n

    def check(self) -> int:
        """Wait for the device and read the exact number of rows; raises ``CapacityError`` if an
        insert found no way."""
        host = self.counts.cpu()
        self._pending.clear()
        self._known, self._since, self._released = tuple(host.tolist()), 0, 0
        self._raise_failed()
        return self._known[0]

    def __len__(self) -> int:
        """Rows numbered so far (removed pairs included; waits for the device)."""
        return self.check()

    def _rehash(self, n: int) -> None:
        """Every live entry into fresh planes with room for ``n`` more pairs (the removed pairs'
        ways free again): as many buckets as now when that leaves the load at most 3/8, else
        the next power of two that does (so the next rehash is many inserts away). Rows are kept."""
        keys, tags, rows = self.items()
        buckets = max(self.buckets, self._buckets_for(keys.numel() + n))
        while keys.numel() + n > 0.75 * _MAX_LOAD * buckets * self.ways:
            buckets *= 2
        self._alloc(buckets)
        step = max(self.spare, 1 << 16)  # placed in parts, so the spares stay the size of a batch
        failed = []
        for a in range(0, keys.numel(), step):
            k, t = keys[a:a + step], tags[a:a + step]
            slot, fail = self._place(self._homes(k, t), torch.ones_like(k, dtype=torch.bool))
            self.keys[slot], self.tags[slot], self.rows[slot] = k, t, rows[a:a + step]
            failed.append(fail.any())
        if failed and bool(torch.stack(failed).any()):
            raise CapacityError(f"DeviceIndex: growing to {self.buckets} buckets left keys without a way; "
                                "please report it with the table sizes")
        self.counts[2] = keys.numel()  # the removed pairs' ways are free again
        self._known = (self._known[0], self._known[1], keys.numel(), self._known[3])

    # ---- removal and listing --------------------------------------------------------------
    def remove(self, keys: Tensor, tags: Tensor) -> Tensor:
        """Take pairs out; returns the rows they held (-1 where absent). Their ways stay used
        until the next rehash; their rows are the caller's until it ``release``s them."""
        keys, tags = self.pairs(keys, tags)
        found, pos = self._match(keys, tags, self._homes(keys, tags))
        rows = torch.where(found, self.rows[pos], -1)
        self._spares(keys.numel())  # (room for ``drop``'s spare entries)
        self.drop(pos, found)
        return rows

    def live(self) -> int:
        """Pairs in the index, removed ones left out (waits for the device)."""
        return int((self.tags[: self.buckets * self.ways] >= 0).sum())

    def items(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every live (keys, tags, rows), in entry order (waits for the device)."""
        live = torch.nonzero(self.tags[: self.buckets * self.ways] >= 0).squeeze(1)  # (not the spares)
        return self.keys[live], self.tags[live], self.rows[live]

    def pairs(self, keys: Tensor, tags: Tensor) -> tuple[Tensor, Tensor]:
        """(keys int64, tags int32) on the index's device, checked to be 1-D of one length."""
        if keys.shape != tags.shape or keys.dim() != 1:
            raise ValueError(f"DeviceIndex: keys and tags must be 1-D of one length, got {tuple(keys.shape)} "
                             f"and {tuple(tags.shape)}")
        return keys.to(self.device, torch.int64), tags.to(self.device, torch.int32)

