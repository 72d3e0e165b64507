# Typed stub of the compiled core, ember._ember_native (ember/_csrc/ember_native.c).
#
# Import it only through ember._native: each function has a wrapper there of the same name (and
# semantics) with its numpy/torch fallback, and EMBER_NATIVE=0 keeps this module from loading.
# Buffers are C-contiguous numpy arrays of the dtype noted; outputs are written in place; every
# argument is positional. tests/native/test_stub.py checks this file against the C method table
# (names, argument names and counts) and against the built module.
from typing import Sequence

import numpy as np

# 1 when built with OpenMP: the kernels that take ``parts`` run them on OpenMP's threads (torch's
# libgomp); parts = a count of equal row ranges, or int64 [k+1] bounds over tables / features /
# segments (None: one part). Any split gives the same bits.
OPENMP: int

# key index: keys int64 [cap], slots int32 [cap] (-1 empty, -2 deleted), cap a power of two;
# probe: ids int64 [n]; out_bucket int64 [n], out_slot int32 [n] (-1 absent); returns IDs found
def probe(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, out_bucket: np.ndarray, out_slot: np.ndarray, /) -> int: ...

# count-min sketch: table uint16 [depth * width], ids int64 [n], counts int64 [n] (or empty: estimate
# only), seeds uint64 [depth]; adds (saturating), then writes each ID's estimate to out int64 [n]
def cms(table: np.ndarray, ids: np.ndarray, counts: np.ndarray, seeds: np.ndarray, width: int, out: np.ndarray, /) -> None: ...

# group cache probe: key ids[i] ^ salt[i] (int64 [n]); out int64 [n] = slot (slot_id[slot] == id),
# -2 (the key is another pair's) or -1; count/last int64 [m], held int32 [m] (or empty) updated per hit
def pair_find(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, salt: np.ndarray, slot_id: np.ndarray, count: np.ndarray, last: np.ndarray, held: np.ndarray, clock: int, out: np.ndarray, parts: int = 1, /) -> int: ...

# group cache bookkeeping, GIL released; slot arrays last / count / score int64 [m], live bool [m],
# held int32 [m]. gc_scores: the victim scan's scores of slots [start, stop) (int64 max where not live
# or held); returns (how many qualify, their lowest, highest score). gc_select: the len(out_slot)
# lowest (score, slot) pairs among them, ascending (ties: lower slot); returns how many. gc_requeue: the queued q_slot /
# q_score (int64 [n]) still valid moved to the front; returns how many. gc_insert: ids / tables /
# at int64 [n] into the index (key ids ^ mix[tables]) and slot_id / owner (int32) / live / rows_of;
# returns empty buckets used. gc_release: held[at] -= 1 (at int64 [n], unique). gc_reserve: admitted
# misses (positions new) take the top of the free stack free[:nfree]: owner / count / last / held
# of those slots set, w_slots[new] = them
def gc_scores(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool, score: np.ndarray, start: int, stop: int, parts: int = 1, /) -> tuple[int, int, int]: ...
def gc_select(score: np.ndarray, valid: int, lo: int, hi: int, out_slot: np.ndarray, out_score: np.ndarray, /) -> int: ...
def gc_requeue(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool, q_slot: np.ndarray, q_score: np.ndarray, /) -> int: ...
def gc_reserve(free: np.ndarray, nfree: int, new: np.ndarray, tables: np.ndarray, est: np.ndarray, clock: int, owner: np.ndarray, count: np.ndarray, last: np.ndarray, held: np.ndarray, w_slots: np.ndarray, /) -> None: ...
def gc_insert(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, tables: np.ndarray, at: np.ndarray, mix: np.ndarray, slot_id: np.ndarray, owner: np.ndarray, live: np.ndarray, rows_of: np.ndarray, /) -> int: ...
def gc_release(held: np.ndarray, at: np.ndarray, /) -> None: ...

# place: ids int64 [n] (absent, unique), new_slots int32 [n]; returns empty buckets used
def place(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, new_slots: np.ndarray, /) -> int: ...
# every live entry of an old table placed into a new, larger one (bucket order); empty buckets used
def rehash(keys: np.ndarray, slots: np.ndarray, old_keys: np.ndarray, old_slots: np.ndarray, /) -> int: ...

# disk tier tags: tags uint16 [S] (0 empty, 1 deleted), pos int64 [n], tag uint16 [n], out int64 [n];
# tag_claim returns empty slots used
def tag_find(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray, /) -> None: ...
def tag_claim(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray, /) -> int: ...

# a bf16 table's rows packed with stochastic rounding (ember.embedding.codec): records float32
# [N, width], ids / seeds / steps int64 [N], out float32 [N, (dim+1)//2 + width - dim]
def bf16_pack_sr(records: np.ndarray, ids: np.ndarray, seeds: np.ndarray, steps: np.ndarray, out: np.ndarray,
                 dim: int, width: int, parts: int = 1, /) -> None: ...

# disk tier rows, GIL released (a page fault per row must not stall other threads): src / dst
# float32 [S, w] (the slot file's mapping), slots int64 [k] in 0..S-1, out / rows float32 [k, w]
def gather_rows(src: np.ndarray, slots: np.ndarray, out: np.ndarray, w: int, r: int = ..., parts: int = 1, /) -> None: ...
def scatter_rows(dst: np.ndarray, slots: np.ndarray, rows: np.ndarray, w: int, /) -> None: ...
# madvise(MADV_WILLNEED) over the pages of rows slots (int64 [k], sorted) of table [S, w]; returns pages advised
def willneed(table: np.ndarray, slots: np.ndarray, w: int, /) -> int: ...
def willneed_cold(table: np.ndarray, slots: np.ndarray, w: int, /) -> int: ...
def disk_find(tags: np.ndarray, table: np.ndarray, ids: np.ndarray, out_slot: np.ndarray, out_rows: np.ndarray, w: int, parts: int = 1, /) -> int: ...
def disk_write(table: np.ndarray, slots: np.ndarray, ids: np.ndarray, recs: np.ndarray, w: int, parts: int = 1, /) -> None: ...

# probe_rows: tables [(keys, slots)] * T, ids int64 [n], bounds int64 [T+1]; out_slot int64 [n] =
# each ID's slot in its tier, -1 absent; returns the number found (no access counted); remove: the
# found IDs' buckets marked deleted (a segment's IDs unique)
def probe_rows(tables: list[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray, out_slot: np.ndarray, remove: bool, /) -> int: ...

# count_ids: exact counters, tables [(keys int64 [cap], counts int32 [cap])] * T (counts > 0 live,
# 0 empty, -1 deleted), ids int64 [n] unique per segment, bounds int64 [T+1], adds int32 [n] or
# empty (1 each); mode 0 get / 1 add / 2 remove; out int64 [n] the counts; stats int64 [T, 2]
# (placed or removed, empty buckets used); returns the IDs placed or removed
def count_ids(tables: list[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray, adds: np.ndarray, out: np.ndarray, mode: int, stats: np.ndarray, parts: np.ndarray | None = None, /) -> int: ...

# memory tiers of a table group: tables[j] = (keys, slots, arena float32 [rows, r], last int64,
# count int32) for read_rows, + (slot_ids int64, held bool, free int32) for write_rows; ids int64 [n],
# bounds int64 [T+1]; out / records float32 [n, r] (dim > 0: a bf16 table's fp32 records, [n, dim + r - (dim+1)//2],
# widened from / packed into its words); out_slot / slot int64 [n]; per tier int64 [T];
# read_rows returns IDs found, write_rows rows inserted; write_rows' slot -1: absent (inserted),
# -2 (SKIP_ROW): the row left out (neither updated nor written)
def read_rows(
    tables: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ids: np.ndarray,
    bounds: np.ndarray,
    out: np.ndarray,
    out_slot: np.ndarray,
    clocks: np.ndarray,
    out_hits: np.ndarray,
    r: int,
    dim: int,
    parts: np.ndarray | None = None,
    /,
) -> int: ...

def write_rows(
    tables: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ids: np.ndarray,
    bounds: np.ndarray,
    slot: np.ndarray,
    records: np.ndarray,
    grads: np.ndarray,
    next: np.ndarray,
    clocks: np.ndarray,
    used: np.ndarray,
    free_at: np.ndarray,
    seeds: np.ndarray,
    steps: np.ndarray,
    hyper: np.ndarray,
    r: int,
    dim: int,
    parts: np.ndarray | None = None,
    /,
) -> int: ...

# ids int64 [n], bounds int64 [S+1]; out_uniq / out_inverse int64 [n], out_counts int64 [S];
# returns the number of uniques of all segments
def unique_segments(
    ids: np.ndarray, bounds: np.ndarray, out_uniq: np.ndarray, out_inverse: np.ndarray, out_counts: np.ndarray,
    parts: np.ndarray | None = None, /
) -> int: ...

# ids int64 [n], keys uint64 [1 or n], out float32 [n, dim]
def uniform01(
    ids: np.ndarray, keys: np.ndarray, dim: int, out: np.ndarray, mul: float | np.ndarray = 1.0, add: float | np.ndarray = 0.0,
    parts: int = 1, /
) -> None: ...

# ids int64 [n], keys1 / keys2 uint64 [1 or n] (a normal's two uniform streams), out float32 [n, dim]
def normal01(ids: np.ndarray, keys1: np.ndarray, keys2: np.ndarray, dim: int, out: np.ndarray, std: float, parts: int = 1, /) -> None: ...

# ids int64 [n], keys uint64 [1 or n], at int64 [n] (rows of out), out float32 [rows, width], fill float32 [width - dim]
def fresh_uniform(
    ids: np.ndarray, keys: np.ndarray, at: np.ndarray, out: np.ndarray, width: int, dim: int, mul: float | np.ndarray,
    add: float | np.ndarray, fill: np.ndarray, bf16: bool, parts: int = 1, /
) -> None: ...

# out float32 [U, dim]; index int64; src / srcs[f] float32 rows of dim floats every stride (strides int64 [F])
def index_add_rows(out: np.ndarray, index: np.ndarray, src: np.ndarray, dim: int, stride: int, /) -> None: ...
def index_add_features(
    out: np.ndarray, index: np.ndarray, srcs: Sequence[np.ndarray | None], strides: np.ndarray, b: int, dim: int,
    parts: np.ndarray | None = None, /
) -> None: ...

# rows float32 [n, dim] every rs, state float32 [n, 1] every ss, grads float32 [n, dim] every gs
def rowwise_adagrad(
    rows: np.ndarray,
    state: np.ndarray,
    grads: np.ndarray,
    n: int,
    dim: int,
    rs: int,
    ss: int,
    gs: int,
    lr: float,
    eps: float,
    parts: int = 1,
    /,
) -> None: ...

# categorical hashing straight from an Arrow array's buffers (any bytes-like object: pyarrow
# Buffers as they are): validity bitmap or b"" (no nulls), string offsets int32 (width 4) or
# int64 (width 8) and their bytes, or integers of width 1/2/4/8 bytes; n values from element
# off; out int64 [n], out_valid bool [n]; returns the number of nulls
def arrow_hash_strings(offsets: object, data: object, validity: object, off: int, n: int, width: int, salt: int,
                       out: np.ndarray, out_valid: np.ndarray, parts: int = 1, /) -> int: ...
def arrow_hash_ints(values: object, validity: object, off: int, n: int, width: int, signed: bool, salt: int,
                    out: np.ndarray, out_valid: np.ndarray, parts: int = 1, /) -> int: ...

# decimal integer IDs from a string array's buffers (as arrow_hash_strings): out int64 [n], state
# uint8 [n] (0 ID, 1 missing, 2 bad); returns the bad count, or -1 for a byte other than 0-9 or -
def arrow_parse_ints(offsets: object, data: object, validity: object, off: int, n: int, width: int, out: np.ndarray,
                     state: np.ndarray, /) -> int: ...
# a record batch's single-valued sparse columns in one pass, GIL released: columns a list of
# (kind 0 ints / 1 hashed strings, values or offsets, data, validity, off, width, signed, hash,
# salt, listed tuple); kept values of column c after those before it in out_values int64 [>= C*n],
# out_lengths int64 [C*n] 0/1, out_offsets int64 [C, n+1], out_counts int64 [C]; returns the total
# (batch: a record batch's __arrow_c_array__(); each column then (kind, child, width, signed, hash, salt, listed))
def featurize_ids(columns: list[tuple[int, object, object, object, int, int, bool, bool, int, tuple[object, ...]]]
                  | list[tuple[int, int, int, bool, bool, int, tuple[object, ...]]], n: int,
                  out_values: np.ndarray, out_lengths: np.ndarray, out_offsets: np.ndarray, out_counts: np.ndarray,
                  batch: tuple[object, object] | None = None, /) -> int: ...
# integer columns (kind 0) and string columns of plain integers / empty fields (kind 1) as float64
# rows of out [R, n] (-0 is -0.0, null or empty NaN), columns a list of (kind, values or offsets,
# data, validity, off, width, signed, row); out_done uint8 [C] 1 or 0 (a string column with another
# value: not done); returns the columns done (GIL released)
# (batch: as featurize_ids'; each column then (kind, child, width, signed, row))
def dense_floats(columns: list[tuple[int, object, object, object, int, int, bool, int]] | list[tuple[int, int, int, bool, int]],
                 n: int, out: np.ndarray, out_done: np.ndarray, batch: tuple[object, object] | None = None, /) -> int: ...
# a run of dense rows through fill, clip and log1p / sign_log1p (table: numpy's log1p of 0..k-1);
# the values left for numpy's log1p (their positions in rest), or -1 on a signed zero
def dense_prepare(x: np.ndarray, fill: float, lo: float, hi: float, mode: int, table: np.ndarray,
                  rest: np.ndarray, /) -> int: ...
# dense rows float64 [R, n] -> float32 [n, R], standardized where scaled
def dense_finish(x: np.ndarray, scaled: np.ndarray, means: np.ndarray, stds: np.ndarray, out: np.ndarray, /) -> None: ...
# flags of what a typed CSV read takes differently from the text path: 1 'x'/'X', 2 '(', 4 20+ digits in a row
def csv_hazards(data: bytes, /) -> int: ...

# a block of CSV text's newline count and flags (1 a quote, 2 a CR, 4 a byte >= 0x80), one pass
def csv_bytes(data: object, /) -> tuple[int, int]: ...
# a block of n CSV lines without quotes (crlf: CRs only before LFs) split on a delimiter byte, ncols fields a line:
# slots int64 [ncols] (output slot or -1), out_starts int32 [k*n] field starts, out_offsets int32
# [k, n+1] Arrow offsets; returns n, or -1 for another field or line count (GIL released)
def csv_split(data: object, delimiter: int, ncols: int, slots: np.ndarray, n: int, out_starts: np.ndarray,
              out_offsets: np.ndarray, crlf: bool = False, /) -> int: ...
# csv_split's fields copied into one uint8 buffer per slot (outs[s] of offsets[s, n] bytes)
def csv_gather(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, outs: list[np.ndarray], /) -> None: ...
# csv_split's fields of m slots read as decimal integer IDs (empty: null; nulls[s] = -1: a field that is no ID)
def csv_ints(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, out: np.ndarray, valid: np.ndarray,
             nulls: np.ndarray, /) -> None: ...
