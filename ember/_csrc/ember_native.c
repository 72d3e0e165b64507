/* ember._ember_native: the few loops numpy cannot vectorise well (open-addressing probes).
 *
 * Every function works in place on caller-owned, C-contiguous buffers (numpy arrays), with the
 * same table layout as ember.tiers.key_index.KeyIndex: keys int64[cap], slots int32[cap]
 * (-1 empty, -2 deleted), cap a power of two, home bucket = splitmix64(id) & (cap - 1), linear
 * probing. The Python side (ember/_native/) checks dtypes and sizes; here we only check
 * lengths, so a wrong call raises instead of reading out of bounds.
 *
 * Each function below has one wrapper of the same name in ember/_native/ (the only package
 * that imports this one; EMBER_NATIVE=0 keeps it from doing so) with its numpy/torch fallback
 * ``_<name>_py`` written next to it: same arguments, same results. The docstrings of the method
 * table at the end give each function's arguments; ember/_ember_native.pyi types them and
 * tests/native/test_stub.py checks the three agree (and the PyArg_ParseTuple formats).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define EMPTY (-1)
#define DELETED (-2)
#define SKIP_ROW (-2) /* write_rows: a row left out */
#define BLOCK 32 /* IDs whose random reads are prefetched together */
#define SR_COLS 16 /* bf16_pack_sr: columns per block (a multiple of 4) */
#define GRAD_AHEAD 16 /* index_add_features: gradient rows prefetched this many rows ahead */

/* ---- parts of one call on several threads -------------------------------------------------
 * A kernel that splits its work takes a part count k (the Python side picks it: at most
 * torch.get_num_threads(), fewer for small calls) and runs part p = 0..k-1 through run_parts,
 * on OpenMP's threads: built with -fopenmp and loaded after torch, the extension shares torch's
 * libgomp (the same SONAME), so its parts run on the threads torch's own operations use, woken
 * in microseconds (a Python thread pool's hand-off costs ~50 us). The parts write disjoint
 * memory, so the result is the same bits for any k. In a forked child the parent's OpenMP
 * threads do not exist (GNU libgomp would wait on them forever): the parts run in line there. */
static volatile int forked_child = 0;
static void on_fork_child(void) { forked_child = 1; }

typedef void (*part_fn)(void *ctx, Py_ssize_t part);

static void run_parts(part_fn fn, void *ctx, Py_ssize_t k) {
#ifdef _OPENMP
    if (k > 1 && !forked_child) {
#pragma omp parallel for schedule(static, 1) num_threads((int)k)
        for (Py_ssize_t p = 0; p < k; p++) fn(ctx, p);
        return;
    }
#endif
    for (Py_ssize_t p = 0; p < k; p++) fn(ctx, p);
}

/* The bounds of a call's parts over T items (tables, features, segments): parts, int64 [k+1]
 * rising from 0 to T, or when absent the one part {0, T} written into one; *k = the number of
 * parts. NULL with a ValueError naming the kernel when parts do not rise from 0 to T. */
static const int64_t *part_bounds(Py_buffer *parts, Py_ssize_t t, int64_t one[2], Py_ssize_t *k, const char *what) {
    if (!parts->buf) {
        one[0] = 0, one[1] = t, *k = 1;
        return one;
    }
    const int64_t *pb = parts->buf;
    *k = parts->len / 8 - 1;
    int ok = *k >= 1 && parts->len % 8 == 0 && pb[0] == 0 && pb[*k] == t;
    for (Py_ssize_t p = 0; ok && p < *k; p++) ok = pb[p] <= pb[p + 1];
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "ember native %s: parts must rise from 0 to %zd", what, t);
        return NULL;
    }
    return pb;
}

/* A count of equal row ranges over n rows, as asked (parts) within 1 .. max(n, 1); part p of
 * them is rows n * p / parts .. n * (p + 1) / parts - 1. */
static inline Py_ssize_t even_parts(Py_ssize_t parts, Py_ssize_t n) {
    return parts < 1 ? 1 : parts > n ? (n ? n : 1) : parts;
}

/* Rows *lo .. *hi - 1: part p of k equal row ranges over n rows (even_parts). */
static inline void part_rows(Py_ssize_t n, Py_ssize_t k, Py_ssize_t p, Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = n * p / k;
    *hi = n * (p + 1) / k;
}

static inline uint64_t mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}

/* The bf16 bit pattern of float32 bits b: the magnitude plus noise, truncated to its top 16 bits,
 * the sign kept; NaN stays NaN (quiet, sign kept). noise 0x7FFF + the kept part's lowest bit
 * rounds to nearest even (codec._bf16_bits), 16 random bits stochastically (codec.sr_noise). */
static inline uint16_t bf16_round(uint32_t b, uint32_t noise) {
    uint32_t sign = b & 0x80000000u, mag = b & 0x7FFFFFFFu;
    return (uint16_t)(mag > 0x7F800000u ? (sign >> 16) | 0x7FC0u : (sign | ((mag + noise) & 0x7FFF0000u)) >> 16);
}

#define SR_GOLDEN 0x9E3779B97F4A7C15ULL
#define SR_M1 0xBF58476D1CE4E5B9ULL

/* The (seed, step) part of a bf16 row's rounding-noise key (codec.sr_noise): the same for every
 * row of one table at one step. */
static inline uint64_t sr_base(int64_t seed, int64_t step) {
    return mix64(mix64((uint64_t)seed * 2 + 0x5352) ^ ((uint64_t)step * SR_GOLDEN));
}

/* One bf16 table's record x float32[width] packed into row float32[(dim+1)/2 + width - dim]:
 * the first dim columns rounded to bf16 stochastically with the noise of (base, id, column),
 * two per word (an odd dim pads zero bits), then columns dim..width-1 copied as fp32 words. */
static inline void pack_sr_row(const float *x, float *row, int64_t id, uint64_t base, Py_ssize_t dim, Py_ssize_t width) {
    uint64_t key = mix64(base ^ ((uint64_t)id * SR_M1));
    uint16_t *o16 = (uint16_t *)row;
    /* four columns per noise word; the words first (independent hashes overlap), then the
     * columns in a branch-free loop the compiler vectorises */
    for (Py_ssize_t c0 = 0; c0 < dim; c0 += SR_COLS) {
        Py_ssize_t nc = dim - c0 < SR_COLS ? dim - c0 : SR_COLS;
        uint64_t z[SR_COLS / 4];
        uint32_t noise[SR_COLS], b[SR_COLS];
        for (Py_ssize_t q = 0; q < SR_COLS / 4; q++) z[q] = mix64(key + (uint64_t)(c0 / 4 + q + 1) * SR_GOLDEN);
        for (Py_ssize_t c = 0; c < SR_COLS; c++) noise[c] = (uint32_t)((z[c >> 2] >> (16 * (c & 3))) & 0xFFFF);
        memcpy(b, x + c0, (size_t)nc * 4);
        for (Py_ssize_t c = 0; c < nc; c++) o16[c0 + c] = bf16_round(b[c], noise[c]);
    }
    if (dim & 1) o16[dim] = 0;
    memcpy(row + (dim + 1) / 2, x + dim, (size_t)(width - dim) * sizeof(float));
}

/* The inverse: a packed bf16 row's dim weights widened to their exact fp32 values, then its
 * fp32 words copied; out float32[width]. */
static inline void widen_row(const float *row, float *out, Py_ssize_t dim, Py_ssize_t width) {
    const uint16_t *h = (const uint16_t *)row;
    uint32_t *o = (uint32_t *)out;
    for (Py_ssize_t c = 0; c < dim; c++) o[c] = (uint32_t)h[c] << 16;
    memcpy(out + dim, row + (dim + 1) / 2, (size_t)(width - dim) * sizeof(float));
}

/* The slot of ID x (-1 when absent), probing linearly from bucket h. */
static inline int64_t find_slot(const int64_t *k, const int32_t *s, uint64_t mask, int64_t x, uint64_t h, uint64_t *at) {
    for (;;) {
        int32_t v = s[h];
        if (v == EMPTY) return -1;
        if (v >= 0 && k[h] == x) { *at = h; return v; }
        h = (h + 1) & mask;
    }
}

/* The home buckets of ids[i0..i1) into hb, each prefetched (keys and slots): a block's random
 * reads are in flight together before its probes walk them. */
static inline void prefetch_homes(const int64_t *k, const int32_t *s, uint64_t mask, const int64_t *id, int64_t i0,
                                  int64_t i1, uint64_t *hb) {
    for (int64_t i = i0; i < i1; i++) {
        hb[i - i0] = mix64((uint64_t)id[i]) & mask;
        __builtin_prefetch(s + hb[i - i0]);
        __builtin_prefetch(k + hb[i - i0]);
    }
}

static int check_table(Py_buffer *keys, Py_buffer *slots, uint64_t *mask) {
    Py_ssize_t cap = keys->len / 8;
    if (cap <= 0 || (cap & (cap - 1)) != 0 || slots->len != cap * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native: keys/slots must be int64/int32 arrays of one power-of-two length");
        return -1;
    }
    *mask = (uint64_t)cap - 1;
    return 0;
}

/* probe(keys, slots, ids, out_bucket int64[n], out_slot int32[n]) -> number found */
static PyObject *probe(PyObject *self, PyObject *args) {
    Py_buffer keys, slots, ids, ob, os;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*", &keys, &slots, &ids, &ob, &os)) return NULL;
    PyObject *res = NULL;
    uint64_t mask;
    Py_ssize_t n = ids.len / 8;
    if (check_table(&keys, &slots, &mask) < 0) goto done;
    if (ob.len != n * 8 || os.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native probe: output lengths do not match ids");
        goto done;
    }
    {
        const int64_t *k = keys.buf, *id = ids.buf;
        const int32_t *s = slots.buf;
        int64_t *bucket = ob.buf;
        int32_t *slot = os.buf;
        Py_ssize_t found = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t at = 0;
            int64_t sl = find_slot(k, s, mask, id[i], mix64((uint64_t)id[i]) & mask, &at);
            bucket[i] = sl >= 0 ? (int64_t)at : -1;
            slot[i] = (int32_t)sl;
            found += sl >= 0;
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(found);
    }
done:
    PyBuffer_Release(&keys); PyBuffer_Release(&slots); PyBuffer_Release(&ids);
    PyBuffer_Release(&ob); PyBuffer_Release(&os);
    return res;
}

/* cms(table uint16[depth * width], ids int64[n], counts int64[n] or empty, seeds uint64[depth],
 * width, out int64[n]) -> None. A count-min sketch (ember.tiers.policy.CountMinSketch): row r's
 * cell of an ID is mix64(id ^ seeds[r]) & (width - 1). With counts, first adds counts[i] to every
 * row's cell of ids[i] (saturating at 65535), all IDs, then writes each ID's estimate (the
 * minimum over the rows) to out; without, only the estimates. */
static PyObject *cms(PyObject *self, PyObject *args) {
    Py_buffer tb, ib, cb, sb, ob;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "w*y*y*y*nw*", &tb, &ib, &cb, &sb, &width, &ob)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ib.len / 8, depth = sb.len / 8;
    if (width <= 0 || (width & (width - 1)) != 0 || depth < 1 || tb.len != depth * width * 2 || ob.len != n * 8
            || (cb.len != 0 && cb.len != n * 8)) {
        PyErr_SetString(PyExc_ValueError, "ember native cms: table must be uint16 [depth * width] (width a power of "
                        "two), counts int64 [n] or empty, out int64 [n]");
        goto done;
    }
    {
        uint16_t *t = tb.buf;
        const int64_t *id = ib.buf, *c = cb.buf;
        const uint64_t *seed = sb.buf;
        int64_t *out = ob.buf;
        uint64_t mask = (uint64_t)width - 1;
        Py_BEGIN_ALLOW_THREADS
        if (cb.len)
            for (Py_ssize_t i = 0; i < n; i++) {
                if (i + 8 < n)  /* the cells are random in a sketch larger than the caches */
                    for (Py_ssize_t r = 0; r < depth; r++)
                        __builtin_prefetch(t + r * width + (mix64((uint64_t)id[i + 8] ^ seed[r]) & mask), 1);
                for (Py_ssize_t r = 0; r < depth; r++) {
                    uint16_t *cell = t + r * width + (mix64((uint64_t)id[i] ^ seed[r]) & mask);
                    int64_t v = (int64_t)*cell + c[i];
                    *cell = (uint16_t)(v > 65535 ? 65535 : (v < 0 ? 0 : v));
                }
            }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + 8 < n)
                for (Py_ssize_t r = 0; r < depth; r++)
                    __builtin_prefetch(t + r * width + (mix64((uint64_t)id[i + 8] ^ seed[r]) & mask));
            int64_t est = 65535;
            for (Py_ssize_t r = 0; r < depth; r++) {
                int64_t v = t[r * width + (mix64((uint64_t)id[i] ^ seed[r]) & mask)];
                if (v < est) est = v;
            }
            out[i] = est;
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&tb); PyBuffer_Release(&ib); PyBuffer_Release(&cb); PyBuffer_Release(&sb); PyBuffer_Release(&ob);
    return res;
}

/* pair_find(keys, slots, ids int64[n], salt int64[n], slot_id int64[m], count int64[m] or empty,
 * last int64[m] or empty, held int32[m] or empty, clock, out int64[n], parts=1) -> hits.
 * A group cache's probe (ember.tiers.group_cache): the key of (table, ID) is ids[i] ^ salt[i]; a
 * key found at slot v is a hit only if slot_id[v] == ids[i] (out = v), else the key belongs to
 * another pair (out = -2); absent: -1. For each hit, when given: count[v] += 1, last[v] = clock,
 * held[v] += 1 (the IDs of one call are unique, so no slot is touched twice: parts, equal ranges
 * of the IDs, run at once, each waiting on its own random reads). */
struct pair_ctx { const int64_t *k, *id, *salt, *sid; const int32_t *s; int64_t *cnt, *last, *out; int32_t *held; uint64_t mask;
                  Py_ssize_t n, m, parts; int64_t clock; Py_ssize_t *hits, *bad; };

static void pair_part(void *vc, Py_ssize_t p) {
    const struct pair_ctx *c = vc;
    const int64_t *k = c->k, *id = c->id, *salt = c->salt, *sid = c->sid;
    const int32_t *s = c->s;
    int64_t *cnt = c->cnt, *last = c->last, *out = c->out;
    int32_t *held = c->held;
    Py_ssize_t lo, hi, hits = 0, bad = 0, m = c->m;
    part_rows(c->n, c->parts, p, &lo, &hi);
    /* blocks of BLOCK keys, three passes each so that their random reads overlap: prefetch the
     * home buckets; probe, prefetching each found slot's records; verify and touch */
    for (Py_ssize_t i0 = lo; i0 < hi; i0 += BLOCK) {
        Py_ssize_t i1 = i0 + BLOCK < hi ? i0 + BLOCK : hi;
        uint64_t hb[BLOCK];
        for (Py_ssize_t i = i0; i < i1; i++) {
            uint64_t h = mix64((uint64_t)(id[i] ^ salt[i])) & c->mask;
            hb[i - i0] = h;
            __builtin_prefetch(s + h);
            __builtin_prefetch(k + h);
        }
        for (Py_ssize_t i = i0; i < i1; i++) {
            uint64_t at = 0;
            int64_t v = find_slot(k, s, c->mask, id[i] ^ salt[i], hb[i - i0], &at);
            out[i] = v;
            if (v >= 0 && v < m) {
                __builtin_prefetch(sid + v);
                if (cnt) __builtin_prefetch(cnt + v, 1);
                if (last) __builtin_prefetch(last + v, 1);
                if (held) __builtin_prefetch(held + v, 1);
            }
        }
        for (Py_ssize_t i = i0; i < i1; i++) {
            int64_t v = out[i];
            if (v < 0) { out[i] = -1; continue; }
            if (v >= m) { bad = 1; out[i] = -1; continue; }
            if (sid[v] != id[i]) { out[i] = -2; continue; }
            hits++;
            if (cnt) cnt[v] += 1;
            if (last) last[v] = c->clock;
            if (held) held[v] += 1;
        }
    }
    c->hits[p] = hits;
    c->bad[p] = bad;
}

static PyObject *pair_find(PyObject *self, PyObject *args) {
    Py_buffer keys, slots, ib, sb, idb, cb, lb, hb, ob;
    long long clock;
    Py_ssize_t parts = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*w*Lw*|n", &keys, &slots, &ib, &sb, &idb, &cb, &lb, &hb, &clock, &ob, &parts))
        return NULL;
    PyObject *res = NULL;
    uint64_t mask;
    Py_ssize_t n = ib.len / 8, m = idb.len / 8;
    if (check_table(&keys, &slots, &mask) < 0) goto done;
    if (sb.len != n * 8 || ob.len != n * 8 || (cb.len && cb.len != m * 8) || (lb.len && lb.len != m * 8)
            || (hb.len && hb.len != m * 4)) {
        PyErr_SetString(PyExc_ValueError, "ember native pair_find: salt/out must match ids; count/last/held the slot arrays");
        goto done;
    }
    {
        parts = even_parts(parts, n);
        Py_ssize_t *acc = malloc(sizeof(Py_ssize_t) * 2 * parts), hits = 0, bad = 0;  /* each part's hits, bad flag */
        if (!acc) { PyErr_NoMemory(); goto done; }
        struct pair_ctx c = {keys.buf, ib.buf, sb.buf, idb.buf, slots.buf, cb.len ? cb.buf : NULL, lb.len ? lb.buf : NULL,
                             ob.buf, hb.len ? hb.buf : NULL, mask, n, m, parts, clock, acc, acc + parts};
        Py_BEGIN_ALLOW_THREADS
        run_parts(pair_part, &c, parts);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < parts; p++) hits += acc[p], bad |= acc[parts + p];
        free(acc);
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "ember native pair_find: the index holds a slot beyond slot_id");
            goto done;
        }
        res = PyLong_FromSsize_t(hits);
    }
done:
    PyBuffer_Release(&keys); PyBuffer_Release(&slots); PyBuffer_Release(&ib); PyBuffer_Release(&sb);
    PyBuffer_Release(&idb); PyBuffer_Release(&cb); PyBuffer_Release(&lb); PyBuffer_Release(&hb); PyBuffer_Release(&ob);
    return res;
}

/* ---- a group cache's bookkeeping passes (ember.tiers.group_cache) --------------------------
 * The host half of a training lookup runs on two pipeline threads (fetch, update) that share the
 * GIL: its whole-arena and per-row passes run here, the GIL released. The slot arrays are the
 * cache's: last / count / slot_id int64 [m], held / owner int32 [m], live bool [m]. */

#define NEVER INT64_MAX
#define RADIX_BITS 16
#define RADIX (1 << RADIX_BITS)

/* ember.tiers.policy.victim_score of one slot: LRU its last access, LFU count << 32 | the low 32
 * bits of its last access (two's complement wrap, as numpy's int64 shift) */
static inline int64_t victim_key(int lru, int64_t last, int64_t count) {
    return lru ? last : (int64_t)(((uint64_t)count << 32) | ((uint64_t)last & 0xFFFFFFFFULL));
}

/* Sorts n (score, slot) pairs by score, stably (LSD radix on score - lo, 16 bits a pass); the
 * scores lie in [lo, hi]. tmp_s / tmp_v: n each. Returns 0, or -1 when out of memory. */
static int radix_pairs(int64_t *s, int64_t *v, int64_t *tmp_s, int64_t *tmp_v, Py_ssize_t n, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    Py_ssize_t *cnt = malloc(sizeof(Py_ssize_t) * RADIX);
    if (!cnt) return -1;
    for (int shift = 0; shift < 64 && (span >> shift) != 0; shift += RADIX_BITS) {
        memset(cnt, 0, sizeof(Py_ssize_t) * RADIX);
        for (Py_ssize_t i = 0; i < n; i++) cnt[(((uint64_t)s[i] - (uint64_t)lo) >> shift) & (RADIX - 1)]++;
        Py_ssize_t at = 0;
        for (int b = 0; b < RADIX; b++) { Py_ssize_t c = cnt[b]; cnt[b] = at; at += c; }
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t d = cnt[(((uint64_t)s[i] - (uint64_t)lo) >> shift) & (RADIX - 1)]++;
            tmp_s[d] = s[i];
            tmp_v[d] = v[i];
        }
        memcpy(s, tmp_s, sizeof(int64_t) * n);
        memcpy(v, tmp_v, sizeof(int64_t) * n);
    }
    free(cnt);
    return 0;
}

/* gc_scores(last, count, live, held, lru, score int64[m], start, stop, parts=1) -> (valid, lo, hi).
 * The victim scan's first pass over slots [start, stop): score[v] = victim_key of slot v, NEVER
 * where not live or held. Returns how many qualify and their lowest and highest score (lo > hi
 * when none). parts: equal slot ranges run at once (a pass over every slot's arrays, waiting on
 * memory). */
struct scores_ctx { const int64_t *last, *count; const uint8_t *live; const int32_t *held; int64_t *score;
                    Py_ssize_t start, n, parts; int lru; int64_t *acc; };

static void scores_part(void *vc, Py_ssize_t p) {
    const struct scores_ctx *c = vc;
    Py_ssize_t lo, hi, valid = 0;
    part_rows(c->n, c->parts, p, &lo, &hi);
    int64_t mn = NEVER, mx = INT64_MIN;
    for (Py_ssize_t v = c->start + lo; v < c->start + hi; v++) {
        int64_t s = (c->live[v] && c->held[v] <= 0) ? victim_key(c->lru, c->last[v], c->count[v]) : NEVER;
        c->score[v] = s;
        if (s != NEVER) {
            valid++;
            if (s < mn) mn = s;
            if (s > mx) mx = s;
        }
    }
    c->acc[3 * p] = valid, c->acc[3 * p + 1] = mn, c->acc[3 * p + 2] = mx;
}

static PyObject *gc_scores(PyObject *self, PyObject *args) {
    Py_buffer lb, cb, vb, hb, sb;
    int lru;
    Py_ssize_t start, stop, parts = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*pw*nn|n", &lb, &cb, &vb, &hb, &lru, &sb, &start, &stop, &parts)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t m = lb.len / 8;
    if (cb.len != m * 8 || vb.len != m || hb.len != m * 4 || sb.len != m * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_scores: last/count/score int64, live bool, held int32 of one "
                        "length");
        goto done;
    }
    if (start < 0 || stop > m || start > stop) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_scores: the range is not within the slots");
        goto done;
    }
    {
        parts = even_parts(parts, stop - start);
        int64_t *acc = malloc(sizeof(int64_t) * 3 * parts), lo = NEVER, hi = INT64_MIN;  /* each part's valid, lo, hi */
        Py_ssize_t valid = 0;
        if (!acc) { PyErr_NoMemory(); goto done; }
        struct scores_ctx c = {lb.buf, cb.buf, vb.buf, hb.buf, sb.buf, start, stop - start, parts, lru, acc};
        Py_BEGIN_ALLOW_THREADS
        run_parts(scores_part, &c, parts);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < parts; p++) {
            valid += acc[3 * p];
            if (acc[3 * p + 1] < lo) lo = acc[3 * p + 1];
            if (acc[3 * p + 2] > hi) hi = acc[3 * p + 2];
        }
        free(acc);
        res = Py_BuildValue("nLL", valid, (long long)lo, (long long)hi);
    }
done:
    PyBuffer_Release(&lb); PyBuffer_Release(&cb); PyBuffer_Release(&vb); PyBuffer_Release(&hb); PyBuffer_Release(&sb);
    return res;
}

/* gc_select(score int64[m], valid, lo, hi, out_slot int64[k], out_score int64[k]) -> found.
 * The victim scan's selection over the scores gc_scores wrote (valid of them not NEVER, within
 * [lo, hi]): the k lowest (score, slot) pairs (fewer when fewer slots qualify), ascending, into
 * out_*. Ties go to the lower slot, so the choice is one and the same in C and numpy. A radix
 * select: one histogram of the scores' top bits, histograms of the shrinking candidate set until
 * the k-th score is known, one pass to collect, one radix sort of the k. */
static PyObject *gc_select(PyObject *self, PyObject *args) {
    Py_buffer sb, osb, oscb;
    Py_ssize_t valid;
    long long lo_in, hi_in;
    if (!PyArg_ParseTuple(args, "y*nLLw*w*", &sb, &valid, &lo_in, &hi_in, &osb, &oscb)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t m = sb.len / 8, k = osb.len / 8;
    if (oscb.len != k * 8 || valid < 0 || valid > m) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_select: out_slot/out_score int64 of one length, valid within "
                        "the scores");
        goto done;
    }
    {
        const int64_t *score = sb.buf;
        int64_t *out_v = osb.buf, *out_s = oscb.buf;
        int64_t lo = (int64_t)lo_in, hi = (int64_t)hi_in;
        Py_ssize_t found = 0;
        int oom = 0;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t want = k < valid ? k : valid;
        /* the k-th lowest score t, and how many slots scoring t are taken (the lowest ones) */
        int64_t t = hi;
        Py_ssize_t need = 0;
        int64_t *cand = NULL;
        Py_ssize_t *hist = NULL;
        if (want > 0 && want < valid) {
            hist = malloc(sizeof(Py_ssize_t) * (RADIX + 1));  /* + 1: scores out of range (no branch) */
            if (!hist) oom = 1;
            const int64_t *src = score;  /* the candidates: all scores first, then one bin's */
            Py_ssize_t n_src = m, rest = want;
            int64_t a = lo, b = hi;
            while (!oom) {
                uint64_t span = (uint64_t)b - (uint64_t)a;
                if (span == 0) { t = a; need = rest; break; }
                int shift = 0;
                while ((span >> shift) >= RADIX) shift++;
                memset(hist, 0, sizeof(Py_ssize_t) * (RADIX + 1));
                for (Py_ssize_t i = 0; i < n_src; i++) {
                    uint64_t d = (uint64_t)src[i] - (uint64_t)a;
                    hist[d <= span ? d >> shift : RADIX]++;
                }
                Py_ssize_t before = 0;
                int bin = 0;
                while (before + hist[bin] < rest) before += hist[bin++];
                rest -= before;
                int64_t a2 = (int64_t)((uint64_t)a + ((uint64_t)bin << shift));
                uint64_t top = ((uint64_t)1 << shift) - 1;
                int64_t b2 = (uint64_t)b - (uint64_t)a2 < top ? b : (int64_t)((uint64_t)a2 + top);
                if (shift == 0) { t = a2; need = rest; break; }
                Py_ssize_t nb = hist[bin];
                int64_t *next = malloc(sizeof(int64_t) * (nb ? nb : 1));
                if (!next) { oom = 1; break; }
                Py_ssize_t j = 0;
                uint64_t span2 = (uint64_t)b2 - (uint64_t)a2;
                for (Py_ssize_t i = 0; i < n_src && j < nb; i++) {  /* branch-free: the values are random */
                    int64_t s = src[i];
                    next[j] = s;
                    j += (uint64_t)s - (uint64_t)a2 <= span2;
                }
                free(cand);
                cand = next;
                src = cand;
                n_src = j;
                a = a2;
                b = b2;
            }
        } else if (want > 0) {
            need = valid;  /* every valid slot: all with score <= hi */
        }
        free(cand);
        free(hist);
        if (!oom && want > 0) {
            /* collect in slot order: every score below t, and the first `need` equal to it */
            for (Py_ssize_t v = 0; v < m && found < want; v++) {
                int64_t s = score[v];
                if (s == NEVER || s > t) continue;
                if (s == t) {
                    if (need == 0) continue;
                    need--;
                }
                out_s[found] = s;
                out_v[found] = v;
                found++;
            }
            int64_t *tmp = malloc(sizeof(int64_t) * 2 * (found ? found : 1));
            if (!tmp || radix_pairs(out_s, out_v, tmp, tmp + found, found, lo, t) < 0) oom = 1;
            free(tmp);
        }
        Py_END_ALLOW_THREADS
        if (oom) PyErr_NoMemory();
        else res = PyLong_FromSsize_t(found);
    }
done:
    PyBuffer_Release(&sb); PyBuffer_Release(&osb); PyBuffer_Release(&oscb);
    return res;
}

/* gc_requeue(last, count, live, held, lru, q_slot int64[n], q_score int64[n]) -> kept.
 * The victims queued by the last scan that still qualify (live, not held, score unchanged)
 * moved to the front of q_slot / q_score, in order; returns how many. */
static PyObject *gc_requeue(PyObject *self, PyObject *args) {
    Py_buffer lb, cb, vb, hb, qb, qsb;
    int lru;
    if (!PyArg_ParseTuple(args, "y*y*y*y*pw*w*", &lb, &cb, &vb, &hb, &lru, &qb, &qsb)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t m = lb.len / 8, n = qb.len / 8;
    if (cb.len != m * 8 || vb.len != m || hb.len != m * 4 || qsb.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_requeue: last/count int64, live bool, held int32 of one "
                        "length; q_slot/q_score int64 of one length");
        goto done;
    }
    {
        const int64_t *last = lb.buf, *count = cb.buf;
        const uint8_t *live = vb.buf;
        const int32_t *held = hb.buf;
        int64_t *q = qb.buf, *qs = qsb.buf;
        Py_ssize_t kept = 0, bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v = q[i];
            if (v < 0 || v >= m) { bad = 1; break; }
            if (!live[v] || held[v] > 0 || victim_key(lru, last[v], count[v]) != qs[i]) continue;
            q[kept] = v;
            qs[kept] = qs[i];
            kept++;
        }
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "ember native gc_requeue: a queued slot is out of range");
        else res = PyLong_FromSsize_t(kept);
    }
done:
    PyBuffer_Release(&lb); PyBuffer_Release(&cb); PyBuffer_Release(&vb); PyBuffer_Release(&hb);
    PyBuffer_Release(&qb); PyBuffer_Release(&qsb);
    return res;
}

/* gc_reserve(free int64[c], nfree, new int64[n], tables int64[n], est int64[n], clock, owner, count,
 * last, held, w_slots int64[U]) -> None. Admitted misses reserve slots: the i-th takes
 * r = free[nfree - 1 - i] (the top of the free stack), owner[r] = tables[i], count[r] = est[i],
 * last[r] = clock, held[r] += 1, and w_slots[new[i]] = r (the caller pops n off the stack). */
static PyObject *gc_reserve(PyObject *self, PyObject *args) {
    Py_buffer fb, nb, tb, eb, ob, cb, lb, hb, wb;
    Py_ssize_t nfree;
    long long clock;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*Lw*w*w*w*w*", &fb, &nfree, &nb, &tb, &eb, &clock, &ob, &cb, &lb, &hb, &wb))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = nb.len / 8, m = ob.len / 4, u = wb.len / 8;
    if (tb.len != n * 8 || eb.len != n * 8 || cb.len != m * 8 || lb.len != m * 8 || hb.len != m * 4
            || nfree < n || nfree > fb.len / 8) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_reserve: tables/est must match new, count/last/held owner; "
                        "n <= nfree <= len(free)");
        goto done;
    }
    {
        const int64_t *fr = fb.buf, *nw = nb.buf, *tab = tb.buf, *est = eb.buf;
        int32_t *owner = ob.buf, *held = hb.buf;
        int64_t *cnt = cb.buf, *last = lb.buf, *w = wb.buf;
        Py_ssize_t bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t r = fr[nfree - 1 - i];
            if (r < 0 || r >= m || nw[i] < 0 || nw[i] >= u) { bad = 1; break; }
        }
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            int64_t r = fr[nfree - 1 - i];
            owner[r] = (int32_t)tab[i];
            cnt[r] = est[i];
            last[r] = clock;
            held[r] += 1;
            w[nw[i]] = r;
        }
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "ember native gc_reserve: a slot or position is out of range");
        else { Py_INCREF(Py_None); res = Py_None; }
    }
done:
    PyBuffer_Release(&fb); PyBuffer_Release(&nb); PyBuffer_Release(&tb); PyBuffer_Release(&eb); PyBuffer_Release(&ob);
    PyBuffer_Release(&cb); PyBuffer_Release(&lb); PyBuffer_Release(&hb); PyBuffer_Release(&wb);
    return res;
}

/* gc_insert(keys, slots, ids int64[n], tables int64[n], at int64[n], mix int64[T], slot_id, owner,
 * live, rows_of int64[T]) -> empty buckets used. Admitted rows enter the group's index: key
 * ids[i] ^ mix[tables[i]] -> slot at[i] (absent, unique; the caller reserved room), and the slot
 * arrays: slot_id[at] = ids, owner[at] = tables, live[at] = 1, rows_of[tables] += 1. */
static PyObject *gc_insert(PyObject *self, PyObject *args) {
    Py_buffer keys, slots, ib, tb, ab, mb, sidb, ob, vb, rb;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*w*w*w*w*", &keys, &slots, &ib, &tb, &ab, &mb, &sidb, &ob, &vb, &rb))
        return NULL;
    PyObject *res = NULL;
    uint64_t mask;
    Py_ssize_t n = ib.len / 8, m = sidb.len / 8, nt = mb.len / 8;
    if (check_table(&keys, &slots, &mask) < 0) goto done;
    if (tb.len != n * 8 || ab.len != n * 8 || ob.len != m * 4 || vb.len != m || rb.len != nt * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native gc_insert: tables/at must match ids, owner/live the slot "
                        "arrays, rows_of mix");
        goto done;
    }
    {
        int64_t *k = keys.buf, *sid = sidb.buf, *rows_of = rb.buf;
        int32_t *s = slots.buf, *owner = ob.buf;
        const int64_t *id = ib.buf, *tab = tb.buf, *at = ab.buf, *mix = mb.buf;
        uint8_t *live = vb.buf;
        Py_ssize_t used = 0, full = 0, bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            if (tab[i] < 0 || tab[i] >= nt || at[i] < 0 || at[i] >= m || at[i] > INT32_MAX) { bad = 1; break; }
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            int64_t x = id[i] ^ mix[tab[i]];
            uint64_t h = mix64((uint64_t)x) & mask, step = 0;
            while (s[h] >= 0 && step++ <= mask) h = (h + 1) & mask;
            if (s[h] >= 0) { full = 1; break; }
            used += s[h] == EMPTY;
            k[h] = x;
            s[h] = (int32_t)at[i];
            sid[at[i]] = id[i];
            owner[at[i]] = (int32_t)tab[i];
            live[at[i]] = 1;
            rows_of[tab[i]] += 1;
        }
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "ember native gc_insert: a table or slot is out of range");
        else if (full) PyErr_SetString(PyExc_RuntimeError, "ember native gc_insert: index full (reserve room first)");
        else res = PyLong_FromSsize_t(used);
    }
done:
    PyBuffer_Release(&keys); PyBuffer_Release(&slots); PyBuffer_Release(&ib); PyBuffer_Release(&tb);
    PyBuffer_Release(&ab); PyBuffer_Release(&mb); PyBuffer_Release(&sidb); PyBuffer_Release(&ob);
    PyBuffer_Release(&vb); PyBuffer_Release(&rb);
    return res;
}

/* gc_release(held int32[m], at int64[n]) -> None: held[at[i]] -= 1 (a lookup's held slots are
 * unique: numpy's held[at] -= 1 does the same). */
static PyObject *gc_release(PyObject *self, PyObject *args) {
    Py_buffer hb, ab;
    if (!PyArg_ParseTuple(args, "w*y*", &hb, &ab)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t m = hb.len / 4, n = ab.len / 8;
    {
        int32_t *held = hb.buf;
        const int64_t *at = ab.buf;
        Py_ssize_t bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            if (at[i] < 0 || at[i] >= m) { bad = 1; break; }
        if (!bad)
            for (Py_ssize_t i = 0; i < n; i++) held[at[i]] -= 1;
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "ember native gc_release: a slot is out of range");
        else { Py_INCREF(Py_None); res = Py_None; }
    }
    PyBuffer_Release(&hb); PyBuffer_Release(&ab);
    return res;
}

/* place(keys, slots, ids, new_slots int32[n]) -> empty buckets consumed.
 * The IDs must be absent and unique; the caller keeps the load below 1 (a full table raises
 * RuntimeError after placing the IDs before the first that found no bucket). */
/* ID x -> slot v into the first free (empty or deleted) bucket from its home, linear probing;
 * counts an empty bucket taken in *used. 0 when the table is full (the caller's load check
 * failed). */
static inline int place_one(int64_t *k, int32_t *s, uint64_t mask, int64_t x, int32_t v, Py_ssize_t *used) {
    uint64_t h = mix64((uint64_t)x) & mask, step = 0;
    while (s[h] >= 0 && step++ <= mask) h = (h + 1) & mask;
    if (s[h] >= 0) return 0;
    *used += s[h] == EMPTY;
    k[h] = x;
    s[h] = v;
    return 1;
}

static PyObject *place(PyObject *self, PyObject *args) {
    Py_buffer keys, slots, ids, ns;
    if (!PyArg_ParseTuple(args, "w*w*y*y*", &keys, &slots, &ids, &ns)) return NULL;
    PyObject *res = NULL;
    uint64_t mask;
    Py_ssize_t n = ids.len / 8;
    if (check_table(&keys, &slots, &mask) < 0) goto done;
    if (ns.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native place: len(slots) != len(ids)");
        goto done;
    }
    {
        int64_t *k = keys.buf;
        const int64_t *id = ids.buf;
        int32_t *s = slots.buf;
        const int32_t *v = ns.buf;
        Py_ssize_t used = 0, full = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            if (!place_one(k, s, mask, id[i], v[i], &used)) { full = 1; break; }  /* the caller's load check failed */
        Py_END_ALLOW_THREADS
        if (full) PyErr_SetString(PyExc_RuntimeError, "ember native place: index full (reserve room first)");
        else res = PyLong_FromSsize_t(used);
    }
done:
    PyBuffer_Release(&keys); PyBuffer_Release(&slots); PyBuffer_Release(&ids); PyBuffer_Release(&ns);
    return res;
}

/* rehash(keys, slots, old_keys, old_slots) -> empty buckets used: every live entry of the old
 * table (old_slots[b] >= 0), in bucket order, placed into the new one as place places it (the
 * first free bucket from its home); the caller made the new table large enough. What place of
 * KeyIndex.items() does, without the items' two copies. */
static PyObject *rehash(PyObject *self, PyObject *args) {
    Py_buffer keys, slots, ok, os;
    if (!PyArg_ParseTuple(args, "w*w*y*y*", &keys, &slots, &ok, &os)) return NULL;
    PyObject *res = NULL;
    uint64_t mask;
    if (check_table(&keys, &slots, &mask) < 0) goto done;
    if (ok.len % 8 || os.len * 2 != ok.len) {
        PyErr_SetString(PyExc_ValueError, "ember native rehash: old keys int64 [c], old slots int32 [c]");
        goto done;
    }
    {
        int64_t *k = keys.buf;
        int32_t *s = slots.buf;
        const int64_t *okb = ok.buf;
        const int32_t *osb = os.buf;
        Py_ssize_t n = os.len / 4, used = 0, full = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t b = 0; b < n; b++)
            if (osb[b] >= 0 && !place_one(k, s, mask, okb[b], osb[b], &used)) { full = 1; break; }
        Py_END_ALLOW_THREADS
        if (full) PyErr_SetString(PyExc_RuntimeError, "ember native rehash: the new index is full");
        else res = PyLong_FromSsize_t(used);
    }
done:
    PyBuffer_Release(&keys); PyBuffer_Release(&slots); PyBuffer_Release(&ok); PyBuffer_Release(&os);
    return res;
}

/* unique_segments(ids int64[n], bounds int64[S+1], out_uniq int64[n], out_inverse int64[n],
 *                 out_counts int64[S]) -> total unique
 * Deduplicates each segment ids[bounds[j]:bounds[j+1]] separately, keeping first-occurrence
 * order; the uniques of all segments are written one after another, and every inverse indexes
 * that concatenation (segment j's entries are already shifted by the uniques before it).
 * parts int64 [k+1] (optional): segment bounds of k parts run at once (run_parts). */
struct unique_ctx { const int64_t *id, *bd, *pb; int64_t *uniq, *inv, *counts, *totals; Py_ssize_t cap; int *nomem; };

/* unique_segments' part p: segments pb[p] .. pb[p+1]-1, their uniques written from their first
 * value's position on (closed up after every part is done), inverses from 0 within the part */
static void unique_part(void *vc, Py_ssize_t p) {
    const struct unique_ctx *c = vc;
    const int64_t *id = c->id, *bd = c->bd;
    Py_ssize_t s0 = c->pb[p], s1 = c->pb[p + 1];
    int64_t first = bd[s0], *uniq = c->uniq + first, *inv = c->inv, total = 0;
    int64_t *table = malloc((size_t)c->cap * sizeof(int64_t)); /* index into uniq, -1 empty */
    if (!table) { *c->nomem = 1; return; }
    for (Py_ssize_t j = s0; j < s1; j++) {
        int64_t m = bd[j + 1] - bd[j], start = total;
        uint64_t cap = 16;
        while (cap < 2 * (uint64_t)m) cap <<= 1;
        uint64_t mask = cap - 1;
        for (uint64_t t = 0; t < cap; t++) table[t] = -1;
        for (int64_t i = bd[j]; i < bd[j + 1]; i++) {
            int64_t x = id[i];
            uint64_t h = mix64((uint64_t)x) & mask;
            for (;;) {
                int64_t u = table[h];
                if (u < 0) { table[h] = total; uniq[total] = x; inv[i] = total++; break; }
                if (uniq[u] == x) { inv[i] = u; break; }
                h = (h + 1) & mask;
            }
        }
        c->counts[j] = total - start;
    }
    free(table);
    c->totals[p] = total;
}

static PyObject *unique_segments(PyObject *self, PyObject *args) {
    Py_buffer ids, bounds, ou, oi, oc, parts = {0};
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*|z*", &ids, &bounds, &ou, &oi, &oc, &parts)) return NULL;
    PyObject *res = NULL;
    int64_t *totals = NULL;
    Py_ssize_t n = ids.len / 8, nseg = bounds.len / 8 - 1;
    const int64_t *bd = bounds.buf;
    if (nseg < 0 || ou.len != n * 8 || oi.len != n * 8 || oc.len != nseg * 8 || bd[0] != 0 || bd[nseg] != n) {
        PyErr_SetString(PyExc_ValueError, "ember native unique_segments: inconsistent buffer lengths");
        goto done;
    }
    for (Py_ssize_t j = 0; j < nseg; j++) {
        if (bd[j + 1] < bd[j]) {
            PyErr_SetString(PyExc_ValueError, "ember native unique_segments: bounds must be non-decreasing");
            goto done;
        }
    }
    {
        Py_ssize_t k, longest = 0;
        int64_t one[2];
        const int64_t *pb = part_bounds(&parts, nseg, one, &k, "unique_segments");
        int nomem = 0;
        if (!pb) goto done;
        for (Py_ssize_t j = 0; j < nseg; j++) if (bd[j + 1] - bd[j] > longest) longest = bd[j + 1] - bd[j];
        uint64_t cap = 16;
        while (cap < 2 * (uint64_t)longest) cap <<= 1;
        if (!(totals = PyMem_Calloc((size_t)k, sizeof(int64_t)))) { PyErr_NoMemory(); goto done; }
        struct unique_ctx c = {ids.buf, bd, pb, ou.buf, oi.buf, oc.buf, totals, (Py_ssize_t)cap, &nomem};
        int64_t total = 0, *uniq = ou.buf, *inv = oi.buf;
        Py_BEGIN_ALLOW_THREADS
        run_parts(unique_part, &c, k);
        for (Py_ssize_t p = 0; p < k && !nomem; p++) {  /* close up: part p's uniques after those before it */
            int64_t first = bd[pb[p]];
            if (total && totals[p]) {
                memmove(uniq + total, uniq + first, (size_t)totals[p] * sizeof(int64_t));
                for (int64_t i = first; i < bd[pb[p + 1]]; i++) inv[i] += total;
            }
            total += totals[p];
        }
        Py_END_ALLOW_THREADS
        if (nomem) { PyErr_NoMemory(); goto done; }
        res = PyLong_FromLongLong(total);
    }
done:
    PyMem_Free(totals);
    PyBuffer_Release(&ids); PyBuffer_Release(&bounds); PyBuffer_Release(&ou);
    PyBuffer_Release(&oi); PyBuffer_Release(&oc);
    if (parts.obj) PyBuffer_Release(&parts);
    return res;
}

/* One row of counter-based uniforms (see uniform01): o[c] = u (* m + a when affine). */
static inline void uniform_row(float *o, uint64_t seed, Py_ssize_t dim, int affine, float m, float a) {
    uint64_t base = mix64(seed);
    for (Py_ssize_t c = 0; c < dim; c++) {
        uint64_t bits = mix64(base + (uint64_t)(c + 1) * 0x9E3779B97F4A7C15ULL);
        float u = (float)(bits >> 40) * (float)(1.0 / (1 << 24));
        if (affine) { u = u * m; u = u + a; }
        o[c] = u;
    }
}

/* uniform01(ids int64[n], keys uint64[1 or n], dim, out float32[n*dim], mul, add, parts=1) -> None
 * out[i, c] = u * mul_i + add_i (float32 ops, in that order) with
 * u = (mix64(mix64(ids[i] ^ key_i) + (c + 1) * GOLDEN) >> 40) * 2^-24, exactly the counter-based
 * uniforms of ember.embedding.init._uniform01 (mul = 1, add = 0) or a uniform initialiser's
 * u * (2 scale) - scale; key_i = keys[0] or keys[i] (one key per row lets the tables of a group
 * initialise their new rows in one call); mul and add are numbers, or float32 [n] (a scale per
 * row: tables with different init scales in one call); parts: equal row ranges run at once. */
struct uniform_ctx { float *o; const int64_t *id; const uint64_t *ky; const float *pm, *pa; Py_ssize_t nk, n, dim, parts;
                     float fm, fa; int affine; };

static void uniform_part(void *vc, Py_ssize_t p) {
    const struct uniform_ctx *c = vc;
    Py_ssize_t lo, hi;
    part_rows(c->n, c->parts, p, &lo, &hi);
    for (Py_ssize_t i = lo; i < hi; i++)
        uniform_row(c->o + i * c->dim, (uint64_t)c->id[i] ^ c->ky[c->nk == 1 ? 0 : i], c->dim, c->affine,
                    c->pm ? c->pm[i] : c->fm, c->pa ? c->pa[i] : c->fa);
}

static PyObject *uniform01(PyObject *self, PyObject *args) {
    Py_buffer ids, keys, out, mb = {0}, ab = {0};
    Py_ssize_t dim, parts = 1;
    PyObject *mo = NULL, *ao = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nw*|OOn", &ids, &keys, &dim, &out, &mo, &ao, &parts)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8, nk = keys.len / 8;
    int per_row = mo != NULL && PyObject_CheckBuffer(mo);
    double mul = 1.0, add = 0.0;
    if (per_row) {
        if (ao == NULL || PyObject_GetBuffer(mo, &mb, PyBUF_SIMPLE) < 0) { mo = NULL; goto bad; }
        if (PyObject_GetBuffer(ao, &ab, PyBUF_SIMPLE) < 0) { ao = NULL; goto bad; }
        if (mb.len != n * 4 || ab.len != n * 4) goto bad;
    } else {
        if (mo != NULL && (mul = PyFloat_AsDouble(mo)) == -1.0 && PyErr_Occurred()) goto done;
        if (ao != NULL && (add = PyFloat_AsDouble(ao)) == -1.0 && PyErr_Occurred()) goto done;
    }
    if (dim < 0 || out.len != n * dim * 4 || !(nk == 1 || nk == n)) goto bad;
    {
        struct uniform_ctx c = {out.buf, ids.buf, keys.buf, per_row ? mb.buf : NULL, per_row ? ab.buf : NULL, nk, n, dim,
                                even_parts(parts, n), (float)mul, (float)add, per_row || !(mul == 1.0 && add == 0.0)};
        Py_BEGIN_ALLOW_THREADS
        run_parts(uniform_part, &c, c.parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
        goto done;
    }
bad:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "ember native uniform01: keys uint64 [1 or len(ids)], out float32 [len(ids), dim], "
                        "mul/add numbers or float32 [len(ids)]");
done:
    if (per_row && mo != NULL && mb.obj != NULL) PyBuffer_Release(&mb);
    if (per_row && ao != NULL && ab.obj != NULL) PyBuffer_Release(&ab);
    PyBuffer_Release(&ids); PyBuffer_Release(&keys); PyBuffer_Release(&out);
    return res;
}

/* One standard normal draw of two uniforms (Box-Muller, sqrt(-2 ln(1 - u1)) cos(2 pi u2)), operation
 * for operation ember.portable.normal.box_muller (its reference): float32 additions, multiplications,
 * one division, a square root taken in double (the correctly rounded float root) and an exact range
 * reduction before polynomials, so every CPU and device gets the same bits (-ffp-contract=off: no
 * fused multiply-add). Library logf / cosf differ between CPUs in the last bits. */
static inline float box_muller1(float u1, float u2) {
    const float ln2 = (float)0.6931471805599453, two_pi = (float)6.283185307179586;
    /* x = 1 - u1 in [2^-24, 1] (a normal float) = m 2^e, m in [sqrt(1/2), sqrt(2)), from its bits with
     * integer selects (no branch: the loop vectorises): m = frexp's mantissa, doubled (exponent field
     * 127 instead of 126) when below sqrt(1/2) (mantissa field 0x3504F3) */
    float x = 1.0f, m, c, sn, v;
    x = x - u1;
    uint32_t b, cb, sb, vb;
    memcpy(&b, &x, 4);
    const uint32_t low = (b & 0x7FFFFFu) < 0x3504F3u;
    const float e = (float)((int32_t)((b >> 23) & 0xFFu) - 126 - (int32_t)low);
    b = (b & 0x7FFFFFu) | (0x3F000000u + (low << 23));
    memcpy(&m, &b, 4);
    float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float p = (float)(2.0 / 11.0) * z + (float)(2.0 / 9.0);
    p = p * z + (float)(2.0 / 7.0); p = p * z + (float)(2.0 / 5.0); p = p * z + (float)(2.0 / 3.0); p = p * z + 2.0f;
    float ln = e * ln2 + s * p;
    float r = (float)sqrt((double)(ln * -2.0f));
    /* quarter turns q = floor(4 u2 + 1/2) in 0..4, the rest f in [-1/8, 1/8] (both exact), a = 2 pi f */
    const int32_t q = (int32_t)(u2 * 4.0f + 0.5f);
    float f = u2 - (float)q * 0.25f, a = f * two_pi, a2 = a * a;
    c = (float)(-1.0 / 3628800.0) * a2 + (float)(1.0 / 40320.0);
    c = c * a2 + (float)(-1.0 / 720.0); c = c * a2 + (float)(1.0 / 24.0); c = c * a2 + -0.5f; c = c * a2 + 1.0f;
    float t = (float)(-1.0 / 39916800.0) * a2 + (float)(1.0 / 362880.0);
    t = t * a2 + (float)(-1.0 / 5040.0); t = t * a2 + (float)(1.0 / 120.0); t = t * a2 + (float)(-1.0 / 6.0); t = t * a2 + 1.0f;
    sn = a * t;
    /* cos(a + q pi/2): cos, -sin, -cos, sin, cos for q = 0..4 (a select, and the sign bit flipped for q = 1, 2) */
    memcpy(&cb, &c, 4);
    memcpy(&sb, &sn, 4);
    const uint32_t odd = 0u - (uint32_t)(q & 1);
    vb = ((sb & odd) | (cb & ~odd)) ^ ((uint32_t)(((q + 1) >> 1) & 1) << 31);
    memcpy(&v, &vb, 4);
    return r * v;
}

#define NORMAL_BLOCK 64  /* rows whose uniforms are drawn before one flat (vectorisable) Box-Muller pass */

/* normal01's rows (u2: NORMAL_BLOCK rows' scratch), compiled for AVX-512, AVX2 and any x86-64 (the
 * same bits: IEEE operations, no contraction; -fno-math-errno lets the square root vectorise). */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void normal_rows(float *restrict o, const int64_t *id, const uint64_t *ka, const uint64_t *kb, Py_ssize_t nk,
                        Py_ssize_t n, Py_ssize_t dim, float fs, float *restrict u2) {
    for (Py_ssize_t lo = 0; lo < n; lo += NORMAL_BLOCK) {
        const Py_ssize_t hi = lo + NORMAL_BLOCK < n ? lo + NORMAL_BLOCK : n;
        for (Py_ssize_t i = lo; i < hi; i++) {
            uniform_row(o + i * dim, (uint64_t)id[i] ^ ka[nk == 1 ? 0 : i], dim, 0, 1.0f, 0.0f);
            uniform_row(u2 + (i - lo) * dim, (uint64_t)id[i] ^ kb[nk == 1 ? 0 : i], dim, 0, 1.0f, 0.0f);
        }
        float *restrict u1 = o + lo * dim;
        const Py_ssize_t k = (hi - lo) * dim;
        for (Py_ssize_t c = 0; c < k; c++) u1[c] = box_muller1(u1[c], u2[c]) * fs;
    }
}

/* normal01(ids int64[n], keys1 uint64[1 or n], keys2 uint64[1 or n], dim, out float32[n*dim], std,
 *          parts=1) -> None
 * out[i, c] = box_muller1(u1, u2) * std (float32) with u1, u2 the uniform01 draws of (ids[i], c) under
 * keys1 and keys2 (a normal initialiser's streams 1 and 2): ember.embedding.init's normal rows.
 * parts: equal row ranges run at once, each with its own scratch. */
struct normal_ctx { float *o, *u2; const int64_t *id; const uint64_t *ka, *kb; Py_ssize_t nk, n, dim, parts; float fs; };

static void normal_part(void *vc, Py_ssize_t p) {
    const struct normal_ctx *c = vc;
    Py_ssize_t lo, hi, at;
    part_rows(c->n, c->parts, p, &lo, &hi);
    at = c->nk == 1 ? 0 : lo;  /* one key for every row, or a key per row */
    normal_rows(c->o + lo * c->dim, c->id + lo, c->ka + at, c->kb + at, c->nk, hi - lo, c->dim, c->fs,
                c->u2 + p * (c->dim > 0 ? c->dim : 1) * NORMAL_BLOCK);
}

static PyObject *normal01(PyObject *self, PyObject *args) {
    Py_buffer ids, k1, k2, out;
    Py_ssize_t dim, parts = 1;
    double std;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*d|n", &ids, &k1, &k2, &dim, &out, &std, &parts)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8, nk = k1.len / 8;
    if (dim < 0 || out.len != n * dim * 4 || !(nk == 1 || nk == n) || k2.len != k1.len) {
        PyErr_SetString(PyExc_ValueError, "ember native normal01: keys1 and keys2 uint64 [1 or len(ids)], "
                        "out float32 [len(ids), dim]");
        goto done;
    }
    parts = even_parts(parts, n);
    float *u2 = malloc((size_t)parts * (dim > 0 ? dim : 1) * NORMAL_BLOCK * sizeof(float));  /* a block's second uniforms, per part */
    if (u2 == NULL) { PyErr_NoMemory(); goto done; }
    {
        struct normal_ctx c = {out.buf, u2, ids.buf, k1.buf, k2.buf, nk, n, dim, parts, (float)std};
        Py_BEGIN_ALLOW_THREADS
        run_parts(normal_part, &c, parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
    free(u2);
done:
    PyBuffer_Release(&ids); PyBuffer_Release(&k1); PyBuffer_Release(&k2); PyBuffer_Release(&out);
    return res;
}

/* fresh_uniform(ids int64[n], keys uint64[1 or n], at int64[n], out float32[rows*width], width, dim,
 *               mul, add, fill float32[width-dim], bf16) -> None
 * A new row of a uniform initialiser written where it belongs: out[at[i], :dim] = uniform01's row i
 * (u * mul_i + add_i), rounded to the nearest bf16 (ties to even, as codec._bf16_bits; NaN kept
 * quiet with its sign) when bf16, and out[at[i], dim:] = fill (an optimizer's constant initial
 * state). What GroupLookup.fetch did as init, round, concat and index_copy, in one pass. */
/* fresh_uniform's rows: compiled twice where GCC can dispatch at load time (ifunc), for CPUs with
 * AVX-512 (the column loop's 64-bit multiplies then run 8 to an instruction) and for any x86-64;
 * the same bits either way (integer hashing, exact conversions, and -ffp-contract=off: no fused
 * multiply-add rounds differently). */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))  /* GCC 11+: x86-64-v4 = AVX-512 F/BW/CD/DQ/VL, v3 = AVX2 + FMA */
#endif
static void fresh_rows(float *o, const int64_t *id, const uint64_t *ky, Py_ssize_t nk, const int64_t *pos, Py_ssize_t n,
                       Py_ssize_t width, Py_ssize_t dim, Py_ssize_t rest, const float *pm, const float *pa, float fm,
                       float fa, const float *fl, int bf16) {
    for (Py_ssize_t i = 0; i < n; i++) {
        float *row = o + pos[i] * width;
        uniform_row(row, (uint64_t)id[i] ^ ky[nk == 1 ? 0 : i], dim, 1, pm ? pm[i] : fm, pa ? pa[i] : fa);
        if (bf16) {
            uint32_t *w = (uint32_t *)row;
            for (Py_ssize_t c = 0; c < dim; c++) w[c] = (uint32_t)bf16_round(w[c], 0x7FFFu + ((w[c] >> 16) & 1u)) << 16;
        }
        for (Py_ssize_t c = 0; c < rest; c++) row[dim + c] = fl[c];
    }
}

struct fresh_ctx {
    float *o;
    const int64_t *id, *pos;
    const uint64_t *ky;
    const float *pm, *pa, *fl;
    Py_ssize_t nk, n, width, dim, rest, parts;
    float fm, fa;
    int bf16;
};

/* fresh_uniform's part p: its rows of ids / at (part_rows; each its own row of out) */
static void fresh_part(void *vc, Py_ssize_t p) {
    const struct fresh_ctx *c = vc;
    Py_ssize_t lo, hi;
    part_rows(c->n, c->parts, p, &lo, &hi);
    fresh_rows(c->o, c->id + lo, c->ky + (c->nk == 1 ? 0 : lo), c->nk == 1 ? 1 : hi - lo, c->pos + lo, hi - lo, c->width,
               c->dim, c->rest, c->pm ? c->pm + lo : NULL, c->pa ? c->pa + lo : NULL, c->fm, c->fa, c->fl, c->bf16);
}

static PyObject *fresh_uniform(PyObject *self, PyObject *args) {
    Py_buffer ids, keys, at, out, fill, mb = {0}, ab = {0};
    Py_ssize_t width, dim, parts = 1;
    PyObject *mo, *ao;
    int bf16;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nnOOy*p|n", &ids, &keys, &at, &out, &width, &dim, &mo, &ao, &fill, &bf16, &parts))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8, nk = keys.len / 8;
    int per_row = PyObject_CheckBuffer(mo), got_m = 0, got_a = 0;
    double mul = 1.0, add = 0.0;
    if (per_row) {
        if (PyObject_GetBuffer(mo, &mb, PyBUF_SIMPLE) < 0) goto done;
        got_m = 1;
        if (PyObject_GetBuffer(ao, &ab, PyBUF_SIMPLE) < 0) goto done;
        got_a = 1;
        if (mb.len != n * 4 || ab.len != n * 4) goto bad;
    } else {
        if ((mul = PyFloat_AsDouble(mo)) == -1.0 && PyErr_Occurred()) goto done;
        if ((add = PyFloat_AsDouble(ao)) == -1.0 && PyErr_Occurred()) goto done;
    }
    if (dim < 0 || width < dim || width < 1 || at.len != n * 8 || !(nk == 1 || nk == n) || fill.len != (width - dim) * 4
        || out.len % (width * 4))
        goto bad;
    {
        const int64_t *id = ids.buf, *pos = at.buf;
        const uint64_t *ky = keys.buf;
        const float *pm = per_row ? mb.buf : NULL, *pa = per_row ? ab.buf : NULL, *fl = fill.buf;
        float *o = out.buf;
        const Py_ssize_t rows = out.len / (width * 4), rest = width - dim;
        for (Py_ssize_t i = 0; i < n; i++)
            if (pos[i] < 0 || pos[i] >= rows) {
                PyErr_SetString(PyExc_IndexError, "ember native fresh_uniform: a position lies outside out");
                goto done;
            }
        struct fresh_ctx c = {o, id, pos, ky, pm, pa, fl, nk, n, width, dim, rest, even_parts(parts, n),
                              (float)mul, (float)add, bf16};
        Py_BEGIN_ALLOW_THREADS
        run_parts(fresh_part, &c, c.parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
        goto done;
    }
bad:
    PyErr_SetString(PyExc_ValueError, "ember native fresh_uniform: keys uint64 [1 or len(ids)], at int64 [len(ids)], "
                    "out float32 [rows, width], fill float32 [width - dim], mul/add numbers or float32 [len(ids)]");
done:
    if (got_m) PyBuffer_Release(&mb);
    if (got_a) PyBuffer_Release(&ab);
    PyBuffer_Release(&ids); PyBuffer_Release(&keys); PyBuffer_Release(&at); PyBuffer_Release(&out);
    PyBuffer_Release(&fill);
    return res;
}

/* Disk-tier tag probes (ember.tiers.disk.DiskTier): tags uint16[n_slots] in RAM, 0 empty,
 * 1 deleted, else 16 hash bits of the ID in that slot; linear probing with wrap-around. */
static int check_tags(Py_buffer *tags, Py_buffer *pos, Py_buffer *tag, Py_buffer *out, Py_ssize_t *n) {
    *n = pos->len / 8;
    if (tags->len < 2 || tag->len != *n * 2 || out->len != *n * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native tag probe: tags uint16[S], pos/out int64[n], tag uint16[n]");
        return -1;
    }
    const int64_t *p = pos->buf;
    Py_ssize_t ns = tags->len / 2;
    for (Py_ssize_t i = 0; i < *n; i++)
        if (p[i] < 0 || p[i] >= ns) {
            PyErr_SetString(PyExc_ValueError, "ember native tag probe: start position out of range");
            return -1;
        }
    return 0;
}

/* tag_find(tags, pos int64[n], tag uint16[n], out int64[n]) -> None
 * out[i] = first slot from pos[i] whose tag equals tag[i], or -1 when an empty slot comes first.
 * The caller verifies the ID stored in that slot (tags can collide) and resumes after it. */
static PyObject *tag_find(PyObject *self, PyObject *args) {
    Py_buffer tags, pos, tag, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &tags, &pos, &tag, &out)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n;
    if (check_tags(&tags, &pos, &tag, &out, &n) < 0) goto done;
    {
        const uint16_t *t = tags.buf, *want = tag.buf;
        const int64_t *p = pos.buf;
        int64_t *o = out.buf;
        int64_t ns = (int64_t)(tags.len / 2);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t h = p[i], r = -1;
            for (int64_t step = 0; step < ns; step++) {
                uint16_t v = t[h];
                if (v == want[i]) { r = h; break; }
                if (v == 0) break;
                if (++h == ns) h = 0;
            }
            o[i] = r;
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&tags); PyBuffer_Release(&pos); PyBuffer_Release(&tag); PyBuffer_Release(&out);
    return res;
}

/* tag_claim(tags, pos int64[n], tag uint16[n], out int64[n]) -> empty slots consumed
 * Claims, in order, the first free (empty or deleted) slot from pos[i] for each of n absent,
 * unique IDs, writing its tag; out[i] = the slot. The caller keeps the load below 1. */
static PyObject *tag_claim(PyObject *self, PyObject *args) {
    Py_buffer tags, pos, tag, out;
    if (!PyArg_ParseTuple(args, "w*y*y*w*", &tags, &pos, &tag, &out)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n;
    if (check_tags(&tags, &pos, &tag, &out, &n) < 0) goto done;
    {
        uint16_t *t = tags.buf;
        const uint16_t *want = tag.buf;
        const int64_t *p = pos.buf;
        int64_t *o = out.buf;
        int64_t ns = (int64_t)(tags.len / 2);
        Py_ssize_t used = 0, full = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !full; i++) {
            int64_t h = p[i], step = 0;
            while (t[h] > 1 && step++ < ns) if (++h == ns) h = 0;
            if (t[h] > 1) { full = 1; break; }
            used += t[h] == 0;
            t[h] = want[i];
            o[i] = h;
        }
        Py_END_ALLOW_THREADS
        if (full) PyErr_SetString(PyExc_RuntimeError, "ember native tag_claim: no free slot (table full)");
        else res = PyLong_FromSsize_t(used);
    }
done:
    PyBuffer_Release(&tags); PyBuffer_Release(&pos); PyBuffer_Release(&tag); PyBuffer_Release(&out);
    return res;
}

/* index_add_rows(out float32[U*D], index int64[N], src float32, dim, stride) -> None
 * out[index[i], :] += src[i * stride : i * stride + dim] for i in order (the same sums, in the
 * same order, as torch.index_add_ on one thread); stride >= dim lets src be a row-strided view
 * (e.g. one feature's slice of a [B, F, D] gradient). Indices are checked against U first. */
static PyObject *index_add_rows(PyObject *self, PyObject *args) {
    Py_buffer out, index, src;
    Py_ssize_t dim, stride;
    if (!PyArg_ParseTuple(args, "w*y*y*nn", &out, &index, &src, &dim, &stride)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = index.len / 8;
    Py_ssize_t u = dim > 0 ? out.len / 4 / dim : 0;
    if (dim <= 0 || stride < dim || out.len != u * dim * 4 || (n > 0 && src.len < ((n - 1) * stride + dim) * 4)) {
        PyErr_SetString(PyExc_ValueError, "ember native index_add_rows: out [U, dim], src rows of dim floats every stride >= dim, index int64 [N]");
        goto done;
    }
    {
        const int64_t *ix = index.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            if (ix[i] < 0 || ix[i] >= u) {
                PyErr_SetString(PyExc_IndexError, "ember native index_add_rows: index out of range");
                goto done;
            }
        float *o = out.buf;
        const float *sv = src.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            float *row = o + ix[i] * dim;
            const float *g = sv + i * stride;
            for (Py_ssize_t c = 0; c < dim; c++) row[c] += g[c];
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&out); PyBuffer_Release(&index); PyBuffer_Release(&src);
    return res;
}

/* index_add_features(out float32[U*D], index int64[F*B], srcs [F arrays or None], strides int64[F],
 *                    B, dim) -> None
 * out[index[f*B + b], :] += srcs[f][b * strides[f] : b * strides[f] + dim] for every feature f
 * whose src is not None: the gradient of a group's single-hot features, each [B, D] and often a
 * row-strided slice of one [B, F', D] tensor. Feature by feature, so the rows written are one
 * table's (they stay in cache); a strided slice defeats the hardware prefetcher (one row per
 * ~2 KB), so its rows are prefetched GRAD_AHEAD ahead: ~1.4 ms per DLRM-26 step, against ~2.0 ms
 * without the prefetch or with tiles of batch rows over all features (bench/RESULTS.md). */
struct add_features_ctx { float *o; const int64_t *ix, *st, *pb; const float **base; Py_ssize_t bsz, dim; };

/* index_add_features' part p: features pb[p] .. pb[p+1]-1 (whole tables: the rows they write are theirs) */
static void add_features_part(void *vc, Py_ssize_t p) {
    const struct add_features_ctx *c = vc;
    Py_ssize_t bsz = c->bsz, dim = c->dim;
    for (Py_ssize_t f = c->pb[p]; f < c->pb[p + 1]; f++) {
        const float *src = c->base[f];
        if (!src) continue;
        const int64_t *fi = c->ix + f * bsz, st = c->st[f];
        for (Py_ssize_t b = 0; b < bsz; b++) {
            if (b + GRAD_AHEAD < bsz) __builtin_prefetch(src + (b + GRAD_AHEAD) * st);
            float *row = c->o + fi[b] * dim;
            const float *g = src + b * st;
            for (Py_ssize_t col = 0; col < dim; col++) row[col] += g[col];
        }
    }
}

static PyObject *index_add_features(PyObject *self, PyObject *args) {
    PyObject *srcs;
    Py_buffer out, index, strides, parts = {0};
    Py_ssize_t bsz, dim;
    if (!PyArg_ParseTuple(args, "w*y*Oy*nn|z*", &out, &index, &srcs, &strides, &bsz, &dim, &parts)) return NULL;
    PyObject *res = NULL, *seq = NULL;
    Py_buffer *sb = NULL;
    const float **base = NULL;
    Py_ssize_t nf = 0;
    Py_ssize_t u = dim > 0 ? out.len / 4 / dim : 0;
    if (!(seq = PySequence_Fast(srcs, "ember native index_add_features: srcs must be a sequence"))) goto done;
    nf = PySequence_Fast_GET_SIZE(seq);
    if (dim <= 0 || bsz < 0 || out.len != u * dim * 4 || index.len != nf * bsz * 8 || strides.len != nf * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native index_add_features: out [U, dim], index int64 [F*B], F srcs, strides int64 [F]");
        goto done;
    }
    sb = PyMem_Calloc((size_t)nf + 1, sizeof(Py_buffer));
    base = PyMem_Calloc((size_t)nf + 1, sizeof(float *));
    if (!sb || !base) { PyErr_NoMemory(); goto done; }
    {
        const int64_t *st = strides.buf, *ix = index.buf;
        for (Py_ssize_t f = 0; f < nf; f++) {
            PyObject *o = PySequence_Fast_GET_ITEM(seq, f);
            if (o == Py_None) continue;
            if (PyObject_GetBuffer(o, &sb[f], PyBUF_C_CONTIGUOUS) < 0) goto done;
            if (st[f] < dim || (bsz > 0 && sb[f].len < ((bsz - 1) * st[f] + dim) * 4)) {
                PyErr_Format(PyExc_ValueError, "ember native index_add_features: src %zd too short for B rows of stride %lld", f, (long long)st[f]);
                goto done;
            }
            base[f] = sb[f].buf;
        }
        for (Py_ssize_t i = 0; i < nf * bsz; i++)
            if (ix[i] < 0 || ix[i] >= u) {
                PyErr_SetString(PyExc_IndexError, "ember native index_add_features: index out of range");
                goto done;
            }
        Py_ssize_t k;
        int64_t one[2];
        const int64_t *pb = part_bounds(&parts, nf, one, &k, "index_add_features");
        if (!pb) goto done;
        struct add_features_ctx c = {out.buf, ix, st, pb, base, bsz, dim};
        Py_BEGIN_ALLOW_THREADS
        run_parts(add_features_part, &c, k);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    if (sb) { for (Py_ssize_t f = 0; f < nf; f++) if (sb[f].obj) PyBuffer_Release(&sb[f]); PyMem_Free(sb); }
    if (base) PyMem_Free(base);
    Py_XDECREF(seq);
    PyBuffer_Release(&out); PyBuffer_Release(&index); PyBuffer_Release(&strides);
    if (parts.obj) PyBuffer_Release(&parts);
    return res;
}

#define ADA_LANES 8

/* Row-wise Adagrad of one row in place: G += mean_j(g_j^2); w_j += (-lr * g_j) / (sqrt(G) + eps).
 * The one arithmetic of rowwise_adagrad and of write_rows' optimizer (bit-identical results). */
static inline void adagrad_row(float *wi, float *st, const float *gi, Py_ssize_t dim, float nlr, float feps, double inv) {
    /* The squares summed in double (those of small gradients would be float denormals, ~20x
     * slower) over ADA_LANES partial sums, column c into sum c % ADA_LANES, then added as a fixed
     * tree: one summation order on every build and CPU (-ffp-contract=off), which the compiler
     * can vectorise, where one running sum made a chain of dim dependent adds (~4 cycles each). */
    double lane[ADA_LANES] = {0.0};
    Py_ssize_t c = 0;
    for (; c + ADA_LANES <= dim; c += ADA_LANES)
        for (int l = 0; l < ADA_LANES; l++) lane[l] += (double)gi[c + l] * gi[c + l];
    for (int l = 0; c + l < dim; l++) lane[l] += (double)gi[c + l] * gi[c + l];
    double sq = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    float acc = *st + (float)(sq * inv);
    *st = acc;
    float denom = sqrtf(acc) + feps;
    for (Py_ssize_t c = 0; c < dim; c++) wi[c] += nlr * gi[c] / denom;
}

/* adagrad_row over n rows (rowwise_adagrad's loop), compiled twice where GCC can dispatch at load
 * time (as write_tier): the squares' partial sums and the columns vectorise with AVX-512; the
 * same bits either way. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void adagrad_rows(float *w, float *st, const float *g, Py_ssize_t n, Py_ssize_t dim, Py_ssize_t rs, Py_ssize_t ss,
                         Py_ssize_t gs, float nlr, float feps, double inv) {
    for (Py_ssize_t i = 0; i < n; i++) adagrad_row(w + i * rs, st + i * ss, g + i * gs, dim, nlr, feps, inv);
}

/* rowwise_adagrad(rows float32, state float32, grads float32, n, dim, row_stride, state_stride,
 *                 grad_stride, lr, eps, parts=1) -> None
 * Row-wise Adagrad in place, one pass per row (ember.optim.RowWiseAdagrad):
 *   G += mean_j(g_j^2);  w_j += (-lr * g_j) / (sqrt(G) + eps).
 * rows/state/grads are row-strided views (e.g. weights and accumulator of one records buffer);
 * parts: equal row ranges run at once (run_parts). */
struct adagrad_ctx { float *w, *st; const float *g; Py_ssize_t n, dim, rs, ss, gs, parts; float nlr, feps; double inv; };

static void adagrad_part(void *vc, Py_ssize_t p) {
    const struct adagrad_ctx *c = vc;
    Py_ssize_t lo, hi;
    part_rows(c->n, c->parts, p, &lo, &hi);
    adagrad_rows(c->w + lo * c->rs, c->st + lo * c->ss, c->g + lo * c->gs, hi - lo, c->dim, c->rs, c->ss, c->gs, c->nlr,
                 c->feps, c->inv);
}

static PyObject *rowwise_adagrad(PyObject *self, PyObject *args) {
    Py_buffer rows, state, grads;
    Py_ssize_t n, dim, rs, ss, gs, parts = 1;
    double lr, eps;
    if (!PyArg_ParseTuple(args, "w*w*y*nnnnndd|n", &rows, &state, &grads, &n, &dim, &rs, &ss, &gs, &lr, &eps, &parts))
        return NULL;
    PyObject *res = NULL;
    if (n < 0 || dim <= 0 || rs < dim || ss < 1 || gs < dim
        || (n > 0 && (rows.len < ((n - 1) * rs + dim) * 4 || state.len < ((n - 1) * ss + 1) * 4 || grads.len < ((n - 1) * gs + dim) * 4))) {
        PyErr_SetString(PyExc_ValueError, "ember native rowwise_adagrad: rows [n, dim], state [n, 1], grads [n, dim] float32 with row strides");
        goto done;
    }
    {
        struct adagrad_ctx c = {rows.buf, state.buf, grads.buf, n, dim, rs, ss, gs, even_parts(parts, n), (float)-lr,
                                (float)eps, 1.0 / (double)dim};
        Py_BEGIN_ALLOW_THREADS
        run_parts(adagrad_part, &c, c.parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&rows); PyBuffer_Release(&state); PyBuffer_Release(&grads);
    return res;
}

/* ---- several memory tiers in one call (the tables of one table group) -------------------
 * ``tables`` is a sequence of T tuples of numpy arrays, one per tier (HostTier's own arrays);
 * the rows of tier j are ids[bounds[j]:bounds[j+1]]. One call replaces T Python-level calls. */

/* Acquire nb buffers from each of the T tuples in ``tables`` (writable where flags[k]);
 * returns a malloc'ed array of T*nb buffers (release with release_tables) or NULL. */
static Py_buffer *acquire_tables(PyObject *tables, Py_ssize_t t, int nb, const int *flags) {
    Py_buffer *b = PyMem_Calloc((size_t)(t * nb + 1), sizeof(Py_buffer));
    if (!b) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t j = 0; j < t; j++) {
        PyObject *tup = PySequence_GetItem(tables, j);
        if (!tup || !PyTuple_Check(tup) || PyTuple_GET_SIZE(tup) != nb) {
            Py_XDECREF(tup);
            PyErr_Format(PyExc_ValueError, "ember native: tables[%zd] must be a tuple of %d arrays", j, nb);
            goto fail;
        }
        for (int k = 0; k < nb; k++) {
            int fl = PyBUF_C_CONTIGUOUS | (flags[k] ? PyBUF_WRITABLE : 0);
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(tup, k), &b[j * nb + k], fl) < 0) {
                Py_DECREF(tup);
                goto fail;
            }
        }
        Py_DECREF(tup);
    }
    return b;
fail:
    for (Py_ssize_t i = 0; i < t * nb; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
    PyMem_Free(b);
    return NULL;
}

static void release_tables(Py_buffer *b, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
    PyMem_Free(b);
}

/* Shared argument checks: bounds int64[T+1] from 0 to n; per-tier int64 arrays of length T. */
static int check_segments(Py_buffer *bounds, Py_ssize_t t, Py_ssize_t n) {
    const int64_t *bd = bounds->buf;
    if (bounds->len != (t + 1) * 8 || bd[0] != 0 || bd[t] != n) return -1;
    for (Py_ssize_t j = 0; j < t; j++) if (bd[j] > bd[j + 1]) return -1;
    return 0;
}

/* probe_rows(tables [(keys, slots)] * T, ids int64[n], bounds int64[T+1], out_slot int64[n], remove) -> found.
 * Several memory tiers' probe in one call (a table group's write: which IDs each tier holds, and
 * where): for every tier j over its segment of ids, out_slot = the ID's slot, -1 when absent.
 * Nothing is counted (a write's probe is no access). remove: each found ID leaves its tier's
 * index (its bucket marked deleted; the IDs of a segment unique); the caller frees the slots. */
static PyObject *probe_rows(PyObject *self, PyObject *args) {
    PyObject *tables;
    Py_buffer ids, bounds, os;
    int remove;
    if (!PyArg_ParseTuple(args, "Oy*y*w*p", &tables, &ids, &bounds, &os, &remove)) return NULL;
    PyObject *res = NULL;
    Py_buffer *tb = NULL;
    Py_ssize_t n = ids.len / 8, t = PySequence_Size(tables);
    static const int read_only[2] = {0, 0}, deleting[2] = {0, 1};
    const int *flags = remove ? deleting : read_only;
    if (t < 0) goto done;
    if (check_segments(&bounds, t, n) < 0 || os.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native probe_rows: bounds [T+1] over ids, out_slot [n]");
        goto done;
    }
    if (!(tb = acquire_tables(tables, t, 2, flags))) goto done;
    for (Py_ssize_t j = 0; j < t; j++) {
        uint64_t mask;
        if (check_table(&tb[2 * j], &tb[2 * j + 1], &mask) < 0) goto done;
    }
    {
        const int64_t *id = ids.buf, *bd = bounds.buf;
        int64_t *osl = os.buf;
        Py_ssize_t found = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < t; j++) {
            const int64_t *k = tb[2 * j].buf;
            int32_t *s = tb[2 * j + 1].buf;
            uint64_t mask = (uint64_t)(tb[2 * j].len / 8) - 1;
            for (int64_t i0 = bd[j]; i0 < bd[j + 1]; i0 += BLOCK) {  /* prefetch a block's home buckets, then probe */
                int64_t i1 = i0 + BLOCK < bd[j + 1] ? i0 + BLOCK : bd[j + 1];
                uint64_t hb[BLOCK];
                prefetch_homes(k, s, mask, id, i0, i1, hb);
                for (int64_t i = i0; i < i1; i++) {
                    uint64_t at;
                    osl[i] = find_slot(k, s, mask, id[i], hb[i - i0], &at);
                    if (osl[i] >= 0) {
                        found++;
                        if (remove) s[at] = DELETED;
                    }
                }
            }
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(found);
    }
done:
    if (tb) release_tables(tb, t * 2);
    PyBuffer_Release(&ids); PyBuffer_Release(&bounds); PyBuffer_Release(&os);
    return res;
}

/* count_ids(tables [(keys int64[cap], counts int32[cap])] * T, ids int64[n], bounds int64[T+1],
 *           adds int32[n] or empty, out int64[n], mode, stats int64[2T], parts=None) -> IDs placed or removed
 * Exact counters of IDs (ember.tiers.policy.IdCounter), several at once (a table group's
 * min_count tables): counter j is an open-addressing table whose bucket b holds ID keys[b] seen
 * counts[b] times (> 0); 0 marks an empty bucket, -1 a deleted one; an ID's home bucket is
 * mix64(id) & (cap - 1), linear probing. Over counter j's segment of ids (unique within it):
 *   mode 0 (get): out = the ID's count, 0 when absent;
 *   mode 1 (add): adds[i] (> 0; 1 each when adds is empty) added to the ID's count (saturating
 *     at 2^31 - 1), an absent ID first placed in the first free (deleted or empty) bucket from
 *     its home: one probe for both; out = the new count; stats[2j] = IDs placed, stats[2j+1] =
 *     empty buckets they took;
 *   mode 2 (remove): the ID's bucket marked deleted; out = the count it had (0 when absent);
 *     stats[2j] = IDs removed.
 * The caller keeps every counter's load below 1 for the adds (IdCounter._reserve): a full table
 * raises RuntimeError. parts: counter bounds of parts run at once (the counters are apart). */
struct count_ctx {
    Py_buffer *tb;
    const int64_t *id, *bd, *pb;
    const int32_t *add;
    int64_t *out, *stats;
    int mode;
    int *full;
};

static void count_part(void *vc, Py_ssize_t p) {
    const struct count_ctx *c = vc;
    for (int64_t j = c->pb[p]; j < c->pb[p + 1]; j++) {
        int64_t *k = c->tb[2 * j].buf;
        int32_t *cn = c->tb[2 * j + 1].buf;
        uint64_t mask = (uint64_t)(c->tb[2 * j].len / 8) - 1;
        int64_t placed = 0, used = 0;
        for (int64_t i0 = c->bd[j]; i0 < c->bd[j + 1]; i0 += BLOCK) {  /* prefetch a block's homes, then probe */
            int64_t i1 = i0 + BLOCK < c->bd[j + 1] ? i0 + BLOCK : c->bd[j + 1];
            uint64_t hb[BLOCK];
            for (int64_t i = i0; i < i1; i++) {
                hb[i - i0] = mix64((uint64_t)c->id[i]) & mask;
                __builtin_prefetch(k + hb[i - i0]);
                __builtin_prefetch(cn + hb[i - i0], 1);
            }
            for (int64_t i = i0; i < i1; i++) {
                int64_t x = c->id[i];
                uint64_t h = hb[i - i0], free_at = mask + 1, step = 0;
                int found = 0;
                for (; step <= mask; step++, h = (h + 1) & mask) {
                    int32_t v = cn[h];
                    if (v == 0) break;
                    if (v > 0 && k[h] == x) { found = 1; break; }
                    if (v < 0 && free_at > mask) free_at = h;
                }
                if (c->mode == 0) {
                    c->out[i] = found ? cn[h] : 0;
                } else if (c->mode == 2) {
                    c->out[i] = found ? cn[h] : 0;
                    if (found) { cn[h] = -1; placed++; }
                } else {
                    if (!found) {
                        if (free_at > mask) {
                            if (step > mask) { *c->full = 1; return; }  /* no free bucket: the caller's load check failed */
                            free_at = h;
                            used++;
                        }
                        h = free_at;
                        k[h] = x;
                        cn[h] = 0;
                        placed++;
                    }
                    int64_t sum = (int64_t)cn[h] + (c->add ? c->add[i] : 1);
                    cn[h] = sum > INT32_MAX ? INT32_MAX : (int32_t)sum;  /* (saturates) */
                    c->out[i] = cn[h];
                }
            }
        }
        c->stats[2 * j] = placed;
        c->stats[2 * j + 1] = used;
    }
}

static PyObject *count_ids(PyObject *self, PyObject *args) {
    PyObject *tables;
    Py_buffer ids, bounds, adds, out, stats, parts = {0};
    int mode;
    if (!PyArg_ParseTuple(args, "Oy*y*y*w*iw*|z*", &tables, &ids, &bounds, &adds, &out, &mode, &stats, &parts)) return NULL;
    PyObject *res = NULL;
    Py_buffer *tb = NULL;
    Py_ssize_t n = ids.len / 8, t = PySequence_Size(tables);
    static const int writable[2] = {1, 1};
    if (t < 0) goto done;
    if (check_segments(&bounds, t, n) < 0 || out.len != n * 8 || stats.len != 2 * t * 8 || (adds.len && adds.len != n * 4)
        || mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "ember native count_ids: bounds [T+1] over ids, adds int32 [n] or empty, out [n], "
                                          "stats [2T], mode 0, 1 or 2");
        goto done;
    }
    if (!(tb = acquire_tables(tables, t, 2, writable))) goto done;
    for (Py_ssize_t j = 0; j < t; j++) {  /* (a counter's counts are laid out as an index's slots) */
        uint64_t mask;
        if (check_table(&tb[2 * j], &tb[2 * j + 1], &mask) < 0) goto done;
    }
    {
        Py_ssize_t k;
        int64_t one[2];
        const int64_t *pb = part_bounds(&parts, t, one, &k, "count_ids");
        if (!pb) goto done;
        int full = 0;
        struct count_ctx c = {tb, ids.buf, bounds.buf, pb, adds.len ? adds.buf : NULL, out.buf, stats.buf, mode, &full};
        Py_BEGIN_ALLOW_THREADS
        run_parts(count_part, &c, k);
        Py_END_ALLOW_THREADS
        if (full) {
            PyErr_SetString(PyExc_RuntimeError, "ember native count_ids: a counter is full (reserve room first)");
            goto done;
        }
        int64_t total = 0;
        const int64_t *st = stats.buf;
        for (Py_ssize_t j = 0; j < t; j++) total += st[2 * j];
        res = PyLong_FromLongLong(total);
    }
done:
    if (tb) release_tables(tb, t * 2);
    PyBuffer_Release(&ids); PyBuffer_Release(&bounds); PyBuffer_Release(&adds);
    PyBuffer_Release(&out); PyBuffer_Release(&stats);
    if (parts.obj) PyBuffer_Release(&parts);
    return res;
}

/* read_rows(tables [(keys, slots, arena, last, count)] * T, ids int64[n], bounds int64[T+1],
 *           out float32[n*W], out_slot int64[n], clocks int64[T], out_hits int64[T], R, dim) -> found
 * A memory tier's read, for every tier j over its segment of ids: probe each ID, copy its record
 * of R words from the arena into out (rows of absent IDs are left as they are), note its slot
 * (-1 absent) and count the access (last = clocks[j], count += 1; not when clocks[j] < 0: a tier
 * that never evicts keeps no statistics); out_hits[j] = IDs found. dim = 0: W = R, the words
 * copied; dim > 0: the arena holds packed bf16 rows (pack_sr_row's layout) and out their fp32
 * records, W = dim + R - (dim+1)/2 (widen_row). Same results as its numpy fallback,
 * ember._native._read_rows_py. */
struct read_ctx {
    Py_buffer *tb;
    const int64_t *id, *bd, *clk, *pb;
    float *o;
    int64_t *osl, *hit;
    Py_ssize_t r, w, dim, *found, *bad;
};

/* read_rows' part p: tiers pb[p] .. pb[p+1]-1 */
static void read_part(void *vc, Py_ssize_t p) {
    const struct read_ctx *c = vc;
    const int64_t *id = c->id, *bd = c->bd, *clk = c->clk;
    float *o = c->o;
    int64_t *osl = c->osl;
    Py_ssize_t r = c->r, w = c->w, dim = c->dim, found = 0, bad = 0;
    for (Py_ssize_t j = c->pb[p]; j < c->pb[p + 1] && !bad; j++) {
        Py_buffer *b = c->tb + j * 5;
        Py_ssize_t before = found;
        const int64_t *k = b[0].buf;
        const int32_t *s = b[1].buf;
        const float *a = b[2].buf;
        int64_t *la = b[3].buf;
        int32_t *cn = b[4].buf;
        uint64_t mask = (uint64_t)(b[0].len / 8) - 1;
        int64_t rows = b[2].len / 4 / r;
        int track = clk[j] >= 0;  /* clock < 0: the tier never evicts, keeps no access statistics */
        /* blocks of BLOCK IDs: prefetch their home buckets, probe them all (prefetching each
         * found row), then copy: the random reads of a block overlap instead of queueing */
        for (int64_t i0 = bd[j]; i0 < bd[j + 1] && !bad; i0 += BLOCK) {
            int64_t i1 = i0 + BLOCK < bd[j + 1] ? i0 + BLOCK : bd[j + 1];
            uint64_t hb[BLOCK];
            prefetch_homes(k, s, mask, id, i0, i1, hb);
            for (int64_t i = i0; i < i1; i++) {
                uint64_t at;
                int64_t sl = find_slot(k, s, mask, id[i], hb[i - i0], &at);
                if (sl >= rows) { bad = 1; break; }
                osl[i] = sl;
                if (sl >= 0) {
                    __builtin_prefetch(a + sl * r);
                    __builtin_prefetch(a + sl * r + r - 1);
                    if (track) { __builtin_prefetch(la + sl, 1); __builtin_prefetch(cn + sl, 1); }
                }
            }
            for (int64_t i = i0; i < i1 && !bad; i++) {
                int64_t sl = osl[i];
                if (sl >= 0) {
                    if (dim) widen_row(a + sl * r, o + i * w, dim, w);
                    else memcpy(o + i * r, a + sl * r, (size_t)r * sizeof(float));
                    if (track) { la[sl] = clk[j]; cn[sl] += 1; }
                    found++;
                }
            }
        }
        c->hit[j] = found - before;
    }
    c->found[p] = found;
    c->bad[p] = bad;
}

static PyObject *read_rows(PyObject *self, PyObject *args) {
    PyObject *tables;
    Py_buffer ids, bounds, out, os, clocks, hits, parts = {0};
    Py_ssize_t r, dim;
    if (!PyArg_ParseTuple(args, "Oy*y*w*w*y*w*nn|z*", &tables, &ids, &bounds, &out, &os, &clocks, &hits, &r, &dim, &parts))
        return NULL;
    PyObject *res = NULL;
    Py_buffer *tb = NULL;
    Py_ssize_t *pres = NULL;
    Py_ssize_t n = ids.len / 8, t = PySequence_Size(tables), w = dim > 0 ? dim + r - (dim + 1) / 2 : r;
    static const int flags[5] = {0, 0, 0, 1, 1};
    if (t < 0) goto done;
    if (r <= 0 || dim < 0 || (dim + 1) / 2 > r || check_segments(&bounds, t, n) < 0 || out.len != n * w * 4 || os.len != n * 8
        || clocks.len != t * 8 || hits.len != t * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native read_rows: bounds [T+1] over ids, out [n, W], out_slot [n], clocks/out_hits [T], "
                                          "0 <= (dim+1)/2 <= R");
        goto done;
    }
    if (!(tb = acquire_tables(tables, t, 5, flags))) goto done;
    for (Py_ssize_t j = 0; j < t; j++) {
        uint64_t mask;
        Py_buffer *b = tb + j * 5;
        Py_ssize_t rows = b[2].len / 4 / r;
        if (check_table(&b[0], &b[1], &mask) < 0) goto done;
        if (b[2].len != rows * r * 4 || b[3].len < rows * 8 || b[4].len < rows * 4) {
            PyErr_Format(PyExc_ValueError, "ember native read_rows: tier %zd: arena [rows, R], last/count [rows]", j);
            goto done;
        }
    }
    {
        Py_ssize_t k, found = 0, bad = 0;
        int64_t one[2];
        const int64_t *pb = part_bounds(&parts, t, one, &k, "read_rows");
        if (!pb) goto done;
        if (!(pres = PyMem_Calloc((size_t)k * 2, sizeof(Py_ssize_t)))) { PyErr_NoMemory(); goto done; }
        struct read_ctx c = {tb, ids.buf, bounds.buf, clocks.buf, pb, out.buf, os.buf, hits.buf,
                             r, w, dim, pres, pres + k};
        Py_BEGIN_ALLOW_THREADS
        run_parts(read_part, &c, k);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < k; p++) { found += pres[p]; bad |= pres[k + p]; }
        if (bad) PyErr_SetString(PyExc_IndexError, "ember native read_rows: a slot lies outside the arena");
        else res = PyLong_FromSsize_t(found);
    }
done:
    if (tb) release_tables(tb, t * 5);
    PyMem_Free(pres);
    PyBuffer_Release(&ids); PyBuffer_Release(&bounds); PyBuffer_Release(&out); PyBuffer_Release(&os);
    PyBuffer_Release(&clocks); PyBuffer_Release(&hits);
    if (parts.obj) PyBuffer_Release(&parts);
    return res;
}

/* write_rows' pass over one tier's rows i0..i1-1 (see write_rows); returns the rows inserted, sets
 * *full when the index has no empty bucket left. Compiled twice where GCC can dispatch at load
 * time (as fresh_rows): the bf16 packing's noise hashes and the optimizer's columns vectorise
 * with AVX-512; the same bits either way. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static Py_ssize_t write_tier(int64_t i0, int64_t i1, const int64_t *id, int64_t *slot, float *src, const float *gr,
                             int64_t *k, int32_t *s, float *a, int64_t *la, int32_t *cn, int64_t *ids_of, uint8_t *held,
                             const int32_t *fr, Py_ssize_t nfree, int64_t *fat, int64_t *nxt, int64_t *us, int64_t clk,
                             uint64_t mask, uint64_t base, Py_ssize_t r, Py_ssize_t w, Py_ssize_t dim, Py_ssize_t gdim,
                             float nlr, float feps, double inv, Py_ssize_t *full) {
    Py_ssize_t inserted = 0;
    for (int64_t i = i0; i < i1; i++) {
        int64_t ahead = i + BLOCK;  /* prefetch the row (or home bucket) BLOCK IDs ahead */
        if (ahead < i1) {
            if (slot[ahead] >= 0) {
                __builtin_prefetch(a + slot[ahead] * r, 1);
                __builtin_prefetch(a + slot[ahead] * r + r - 1, 1);
            } else if (slot[ahead] == -1) {
                uint64_t ha = mix64((uint64_t)id[ahead]) & mask;
                __builtin_prefetch(s + ha, 1);
                __builtin_prefetch(k + ha, 1);
            }
        }
        if (slot[i] == SKIP_ROW) continue;
        if (slot[i] < 0) {
            int64_t x = id[i], v = *fat < nfree ? (int64_t)fr[(*fat)++] : (*nxt)++;
            Py_ssize_t took = 0;
            if (!place_one(k, s, mask, x, (int32_t)v, &took)) { *full = 1; break; }  /* the caller's load check failed */
            *us += took;
            ids_of[v] = x;
            held[v] = 1;
            la[v] = clk;
            cn[v] = 1;
            slot[i] = v;
            inserted++;
        }
        if (gdim) adagrad_row(src + i * w, src + i * w + gdim, gr + i * gdim, gdim, nlr, feps, inv);
        if (dim) pack_sr_row(src + i * w, a + slot[i] * r, id[i], base, dim, w);
        else memcpy(a + slot[i] * r, src + i * r, (size_t)r * sizeof(float));
    }
    return inserted;
}

/* write_rows(tables [(keys, slots, arena, last, count, slot_ids, held, free)] * T, ids int64[n],
 *            bounds int64[T+1], slot int64[n], records float32[n*W], grads float32[n*gdim],
 *            next int64[T], clocks int64[T], used int64[T], free_at int64[T], seeds int64[T],
 *            steps int64[T], hyper float64[T*2], R, dim) -> inserted
 * A memory tier's put for every tier j over its segment: rows with slot[i] >= 0 are
 * overwritten; rows with slot[i] == SKIP_ROW (-2) are left out (neither updated nor written: rows
 * held back by min_count); rows with slot[i] == -1 (absent, unique IDs) get the slot free[free_at[j]++]
 * while tier j's free list (int32, slots of removed rows) lasts, then next[j]++ (written back
 * to slot[i]), an index bucket (linear probing, as place), slot_ids = ID, held = 1,
 * last = clocks[j], count = 1; then arena[slot[i]] = records[i]. used[j] = empty buckets
 * consumed. The caller reserved room: next[j] + new rows beyond the free list <= arena rows,
 * index load < 1. dim = 0: W = R, records are the words (seeds/steps unused, may be empty);
 * dim > 0: records are a bf16 table's fp32 records, W = dim + R - (dim+1)/2, packed on the way
 * (pack_sr_row, the noise of tier j's seeds[j] and steps[j]: bf16_pack_sr's bits).
 * hyper float64 [T, 2] (tier j's lr, eps) with grads float32 [n, gdim] (0 < gdim < W; both empty:
 * no optimizer): each record is first updated in place by row-wise Adagrad (adagrad_row: weights
 * [0, gdim), the accumulator at column gdim), then written: the optimizer's pass and the write
 * in one. */
struct write_ctx {
    Py_buffer *tb;
    const int64_t *id, *bd, *clk, *sd, *st, *pb;
    int64_t *slot, *nxt, *us, *fat;
    float *src;
    const float *gr;
    const double *hp;
    double inv;
    Py_ssize_t r, w, dim, gdim, *inserted, *full;
};

/* write_rows' part p: tiers pb[p] .. pb[p+1]-1 */
static void write_part(void *vc, Py_ssize_t p) {
    const struct write_ctx *c = vc;
    Py_ssize_t inserted = 0, full = 0, dim = c->dim, gdim = c->gdim;
    for (Py_ssize_t j = c->pb[p]; j < c->pb[p + 1] && !full; j++) {
        Py_buffer *b = c->tb + j * 8;
        int64_t *k = b[0].buf, *la = b[3].buf, *ids_of = b[5].buf;
        int32_t *s = b[1].buf, *cn = b[4].buf;
        const int32_t *fr = b[7].buf;
        Py_ssize_t nfree = b[7].len / 4;
        float *a = b[2].buf;
        uint8_t *held = b[6].buf;
        uint64_t mask = (uint64_t)(b[0].len / 8) - 1, base = dim > 0 ? sr_base(c->sd[j], c->st[j]) : 0;
        const float nlr = gdim > 0 ? (float)-c->hp[2 * j] : 0.0f, feps = gdim > 0 ? (float)c->hp[2 * j + 1] : 0.0f;
        c->us[j] = 0;
        inserted += write_tier(c->bd[j], c->bd[j + 1], c->id, c->slot, c->src, c->gr, k, s, a, la, cn, ids_of, held, fr, nfree,
                               c->fat + j, c->nxt + j, c->us + j, c->clk[j], mask, base, c->r, c->w, dim, gdim, nlr, feps,
                               c->inv, &full);
    }
    c->inserted[p] = inserted;
    c->full[p] = full;
}

static PyObject *write_rows(PyObject *self, PyObject *args) {
    PyObject *tables;
    Py_buffer ids, bounds, sl, rec, grads, nx, clocks, used, fa, seeds, steps, hyper, parts = {0};
    Py_ssize_t r, dim;
    if (!PyArg_ParseTuple(args, "Oy*y*w*w*y*w*y*w*w*y*y*y*nn|z*", &tables, &ids, &bounds, &sl, &rec, &grads, &nx, &clocks,
                          &used, &fa, &seeds, &steps, &hyper, &r, &dim, &parts))
        return NULL;
    PyObject *res = NULL;
    Py_buffer *tb = NULL;
    Py_ssize_t *pres = NULL;
    Py_ssize_t n = ids.len / 8, t = PySequence_Size(tables), w = dim > 0 ? dim + r - (dim + 1) / 2 : r;
    Py_ssize_t gdim = hyper.len && n ? grads.len / 4 / n : 0;  /* weights the optimizer steps (0: none) */
    static const int flags[8] = {1, 1, 1, 1, 1, 1, 1, 0};
    if (t < 0) goto done;
    if (r <= 0 || dim < 0 || (dim + 1) / 2 > r || check_segments(&bounds, t, n) < 0 || sl.len != n * 8 || rec.len != n * w * 4
        || nx.len != t * 8 || clocks.len != t * 8 || used.len != t * 8 || fa.len != t * 8
        || (dim > 0 && (seeds.len != t * 8 || steps.len != t * 8))
        || (hyper.len ? hyper.len != t * 16 || grads.len != n * gdim * 4 || (n && (gdim <= 0 || gdim >= w)) : grads.len != 0)) {
        PyErr_SetString(PyExc_ValueError, "ember native write_rows: bounds [T+1] over ids, slot [n], records [n, W], "
                        "next/clocks/used/free_at [T], seeds/steps [T] when dim > 0, 0 <= (dim+1)/2 <= R, "
                        "grads [n, gdim] with hyper [T, 2] (0 < gdim < W), or both empty");
        goto done;
    }
    if (!(tb = acquire_tables(tables, t, 8, flags))) goto done;
    {
        const int64_t *bd = bounds.buf, *nxt = nx.buf, *sv = sl.buf, *fat = fa.buf;
        for (Py_ssize_t j = 0; j < t; j++) {  /* room and sizes, before writing anything */
            uint64_t mask;
            Py_buffer *b = tb + j * 8;
            Py_ssize_t rows = b[2].len / 4 / r, fresh = 0, nfree = b[7].len / 4;
            const int32_t *fr = b[7].buf;
            if (check_table(&b[0], &b[1], &mask) < 0) goto done;
            for (int64_t i = bd[j]; i < bd[j + 1]; i++) {
                if (sv[i] >= rows || sv[i] < SKIP_ROW) {
                    PyErr_SetString(PyExc_IndexError, "ember native write_rows: a slot lies outside the arena");
                    goto done;
                }
                fresh += sv[i] == -1;
            }
            if (fat[j] < 0 || fat[j] > nfree) {
                PyErr_Format(PyExc_ValueError, "ember native write_rows: tier %zd's free_at lies outside its free list", j);
                goto done;
            }
            for (Py_ssize_t f = fat[j]; f < nfree && f < fat[j] + fresh; f++)
                if (fr[f] < 0 || fr[f] >= rows) {
                    PyErr_SetString(PyExc_IndexError, "ember native write_rows: a free slot lies outside the arena");
                    goto done;
                }
            Py_ssize_t beyond = fresh - (nfree - fat[j]);  /* new rows past the free list: at next */
            if (beyond < 0) beyond = 0;
            if (b[2].len != rows * r * 4 || b[3].len < rows * 8 || b[4].len < rows * 4 || b[5].len < rows * 8
                || b[6].len < rows || nxt[j] < 0 || nxt[j] + beyond > rows) {
                PyErr_Format(PyExc_ValueError, "ember native write_rows: tier %zd has no room for %zd new rows", j, fresh);
                goto done;
            }
        }
    }
    {
        Py_ssize_t k, inserted = 0, full = 0;
        int64_t one[2];
        const int64_t *pb = part_bounds(&parts, t, one, &k, "write_rows");
        if (!pb) goto done;
        if (!(pres = PyMem_Calloc((size_t)k * 2, sizeof(Py_ssize_t)))) { PyErr_NoMemory(); goto done; }
        struct write_ctx c = {tb, ids.buf, bounds.buf, clocks.buf, seeds.buf, steps.buf, pb,
                              sl.buf, nx.buf, used.buf, fa.buf, rec.buf, grads.buf, hyper.buf,
                              gdim > 0 ? 1.0 / (double)gdim : 0.0, r, w, dim, gdim, pres, pres + k};
        Py_BEGIN_ALLOW_THREADS
        run_parts(write_part, &c, k);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < k; p++) { inserted += pres[p]; full |= pres[k + p]; }
        if (full) PyErr_SetString(PyExc_RuntimeError, "ember native write_rows: index full (reserve room first)");
        else res = PyLong_FromSsize_t(inserted);
    }
done:
    if (tb) release_tables(tb, t * 8);
    PyMem_Free(pres);
    if (parts.obj) PyBuffer_Release(&parts);
    PyBuffer_Release(&ids); PyBuffer_Release(&bounds); PyBuffer_Release(&sl); PyBuffer_Release(&rec);
    PyBuffer_Release(&nx); PyBuffer_Release(&clocks); PyBuffer_Release(&used); PyBuffer_Release(&fa);
    PyBuffer_Release(&seeds); PyBuffer_Release(&steps); PyBuffer_Release(&grads); PyBuffer_Release(&hyper);
    return res;
}

/* gather_rows(src float32[S*R], slots int64[k], out float32[k*W], W, R=W) -> None
 * out[i] = src[slots[i], :W] for i in order, with the GIL released: on a memory-mapped disk tier
 * each row may be a page fault (a disk read), and a fault taken while holding the GIL would
 * stall every other Python thread (the pipeline's compute) for the length of the read.
 * R >= W: src's rows are R floats apart and the first W are copied (the weights of a group's
 * records [U, width], pooled in place with no contiguous copy); src may end after its last
 * row's W floats. Slots are checked against S first. Same result as numpy's
 * out[:] = src[slots, :W]. */
struct gather_ctx { const float *a; const int64_t *sl; float *o; Py_ssize_t k, w, r, parts; };

static void gather_part(void *vc, Py_ssize_t p) {
    const struct gather_ctx *c = vc;
    const float *a = c->a;
    const int64_t *sl = c->sl;
    Py_ssize_t lo, hi, w = c->w, r = c->r;
    part_rows(c->k, c->parts, p, &lo, &hi);
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (i + BLOCK < hi) {  /* the rows are random: overlap their reads (a row may span two lines) */
            __builtin_prefetch(a + sl[i + BLOCK] * r);
            __builtin_prefetch(a + sl[i + BLOCK] * r + w - 1);
        }
        memcpy(c->o + i * w, a + sl[i] * r, (size_t)w * sizeof(float));
    }
}

static PyObject *gather_rows(PyObject *self, PyObject *args) {
    Py_buffer src, slots, out;
    Py_ssize_t w, r = -1, parts = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*n|nn", &src, &slots, &out, &w, &r, &parts)) return NULL;
    PyObject *res = NULL;
    if (r < 0) r = w;
    /* rows i with i*R + W <= the floats of src: a row-strided view may end after its last row's W */
    Py_ssize_t k = slots.len / 8, f = src.len / 4, s = (w > 0 && r >= w && f >= w) ? (f - w) / r + 1 : 0;
    if (w <= 0 || r < w || src.len % 4 || (r == w && f != s * w) || out.len != k * w * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native gather_rows: src [S, R], slots int64 [k], out [k, W], R >= W");
        goto done;
    }
    {
        const int64_t *sl = slots.buf;
        for (Py_ssize_t i = 0; i < k; i++)
            if (sl[i] < 0 || sl[i] >= s) {
                PyErr_SetString(PyExc_IndexError, "ember native gather_rows: slot out of range");
                goto done;
            }
        struct gather_ctx c = {src.buf, sl, out.buf, k, w, r, even_parts(parts, k)};
        Py_BEGIN_ALLOW_THREADS
        run_parts(gather_part, &c, c.parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&src); PyBuffer_Release(&slots); PyBuffer_Release(&out);
    return res;
}

/* scatter_rows(dst float32[S*W], slots int64[k], rows float32[k*W], W) -> None
 * dst[slots[i]] = rows[i] for i in order (a later duplicate slot wins, as in numpy), with the
 * GIL released for the same reason as gather_rows. */
static PyObject *scatter_rows(PyObject *self, PyObject *args) {
    Py_buffer dst, slots, rows;
    Py_ssize_t w;
    if (!PyArg_ParseTuple(args, "w*y*y*n", &dst, &slots, &rows, &w)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t k = slots.len / 8, s = w > 0 ? dst.len / 4 / w : 0;
    if (w <= 0 || dst.len != s * w * 4 || rows.len != k * w * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native scatter_rows: dst [S, W], slots int64 [k], rows [k, W]");
        goto done;
    }
    {
        const int64_t *sl = slots.buf;
        for (Py_ssize_t i = 0; i < k; i++)
            if (sl[i] < 0 || sl[i] >= s) {
                PyErr_SetString(PyExc_IndexError, "ember native scatter_rows: slot out of range");
                goto done;
            }
        float *d = dst.buf;
        const float *r = rows.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) memcpy(d + sl[i] * w, r + i * w, (size_t)w * sizeof(float));
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&dst); PyBuffer_Release(&slots); PyBuffer_Release(&rows);
    return res;
}

/* bf16_pack_sr(records float32[N*W], ids int64[N], seeds int64[N], steps int64[N],
 *              out float32[N*words], dim, width, parts=1) -> None
 * A bf16 table's rows packed for its tiers (ember.embedding.codec): the first dim columns
 * rounded to bf16 *stochastically* (16 noise bits per value from mix64 of the row's seed, step
 * and ID and the column, as codec.sr_noise: add to the magnitude bits, truncate 16; NaN stays a
 * quiet NaN), two per word (an odd dim pads zero bits), then columns dim..W-1 copied as fp32
 * words. Bit-identical to its fallback and to the codec's torch path. parts: equal row ranges run
 * at once. */
struct pack_ctx { const float *r; const int64_t *id, *sd, *st; float *o; Py_ssize_t n, dim, width, words, parts; };

static void pack_part(void *vc, Py_ssize_t p) {
    const struct pack_ctx *c = vc;
    Py_ssize_t lo, hi;
    part_rows(c->n, c->parts, p, &lo, &hi);
    uint64_t base = 0;  /* the (seed, step) part of the key: the same for every row of a table */
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (i == lo || c->sd[i] != c->sd[i - 1] || c->st[i] != c->st[i - 1]) base = sr_base(c->sd[i], c->st[i]);
        pack_sr_row(c->r + i * c->width, c->o + i * c->words, c->id[i], base, c->dim, c->width);
    }
}

static PyObject *bf16_pack_sr(PyObject *self, PyObject *args) {
    Py_buffer rec, ids, seeds, steps, out;
    Py_ssize_t dim, width, parts = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nn|n", &rec, &ids, &seeds, &steps, &out, &dim, &width, &parts)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8, half = (dim + 1) / 2, words = half + width - dim;
    if (dim <= 0 || width < dim || rec.len != n * width * 4 || seeds.len != n * 8 || steps.len != n * 8 ||
        out.len != n * words * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native bf16_pack_sr: records [N, width], ids/seeds/steps int64 [N], "
                                          "out [N, (dim+1)//2 + width - dim], 0 < dim <= width");
        goto done;
    }
    {
        struct pack_ctx c = {rec.buf, ids.buf, seeds.buf, steps.buf, out.buf, n, dim, width, words, even_parts(parts, n)};
        Py_BEGIN_ALLOW_THREADS
        run_parts(pack_part, &c, c.parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&rec); PyBuffer_Release(&ids); PyBuffer_Release(&seeds); PyBuffer_Release(&steps);
    PyBuffer_Release(&out);
    return res;
}

/* willneed(table float32[S*W], slots int64[k] (sorted), W) -> pages advised
 * madvise(MADV_WILLNEED) over the pages holding rows slots[i] of a memory-mapped table, the GIL
 * released: the kernel starts reading every missing page at once (many reads in flight)
 * instead of one page fault after another when the rows are then copied. Only a hint: rows
 * already in memory, an anonymous table or a failed call change nothing. Consecutive slots on
 * one page advise it once. */
static PyObject *willneed(PyObject *self, PyObject *args) {
    Py_buffer table, slots;
    Py_ssize_t w;
    if (!PyArg_ParseTuple(args, "y*y*n", &table, &slots, &w)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t k = slots.len / 8, s = w > 0 ? table.len / 4 / w : 0;
    if (w <= 0 || table.len != s * w * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native willneed: table [S, W], slots int64 [k]");
        goto done;
    }
    {
        const int64_t *sl = slots.buf;
        for (Py_ssize_t i = 0; i < k; i++)
            if (sl[i] < 0 || sl[i] >= s) {
                PyErr_SetString(PyExc_IndexError, "ember native willneed: slot out of range");
                goto done;
            }
        uintptr_t base = (uintptr_t)table.buf, page = (uintptr_t)sysconf(_SC_PAGESIZE), last = 0;
        Py_ssize_t advised = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            uintptr_t lo = (base + (uintptr_t)sl[i] * (uintptr_t)w * 4) & ~(page - 1);
            uintptr_t hi = (base + ((uintptr_t)sl[i] + 1) * (uintptr_t)w * 4 - 1) & ~(page - 1);
            if (lo == last && advised) lo += page;  /* its first page was advised for the slot before */
            if (lo > hi) continue;
            madvise((void *)lo, hi - lo + page, MADV_WILLNEED);
            advised += (Py_ssize_t)((hi - lo) / page + 1);
            last = hi;
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(advised);
    }
done:
    PyBuffer_Release(&table); PyBuffer_Release(&slots);
    return res;
}

/* willneed_cold(table float32[S*W], slots int64[k] (sorted), W) -> pages advised
 * As willneed, but only for the pages that are not in the page cache: mincore() first, over
 * windows of the mapping that cover nearby requested pages (a window extends while the next
 * requested page is within WN_GAP pages, up to WN_WIN pages), then madvise(MADV_WILLNEED) once
 * per run of consecutive cold requested pages. On a file that is in memory (the common case
 * of a tier that fits the page cache) this is one cheap syscall per window instead of one per
 * page (~1 us each: 6 ms of a 12 ms tiered step on a 2-vCPU EPYC VM). mincore costs ~1 ns per
 * page spanned, so a gap of 256 pages costs less than the syscall it saves. Where mincore
 * fails (not a mapping, old kernel) the window's pages are all advised, as willneed does.
 * Only a hint: the rows read afterwards are the same either way. GIL released. */
#define WN_GAP 256
#define WN_WIN 65536

/* The page numbers (relative to the mapping's first page p0) of slot sl's row. */
#define ROW_PAGES(sl, lo, hi) do { \
        (lo) = (base + (size_t)(sl) * rb - p0) / page; \
        (hi) = (base + ((size_t)(sl) + 1) * rb - 1 - p0) / page; } while (0)

/* willneed_cold's pass over k sorted slots of rows of rb bytes at base (vec: WN_WIN bytes);
 * returns the pages advised. Called with the GIL released. */
static Py_ssize_t advise_cold(uintptr_t base, size_t rb, const int64_t *sl, Py_ssize_t k, unsigned char *vec) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), p0 = base & ~(page - 1);
    Py_ssize_t advised = 0, i = 0;
    while (i < k) {
        size_t ws, we, lo, hi;  /* window [ws, we] of pages, slots [i, j) */
        ROW_PAGES(sl[i], ws, we);
        Py_ssize_t j = i;
        while (j < k) {
            ROW_PAGES(sl[j], lo, hi);
            if (j > i && (lo > we + WN_GAP || hi - ws >= WN_WIN)) break;
            if (hi > we) we = hi;
            j++;
        }
        int known = mincore((void *)(p0 + ws * page), (we - ws + 1) * page, vec) == 0;
        size_t run_lo = 0, run_hi = 0, last = (size_t)-1;
        int in_run = 0;
        for (Py_ssize_t q = i; q < j; q++) {
            ROW_PAGES(sl[q], lo, hi);
            for (size_t pg = lo; pg <= hi; pg++) {
                if (pg == last) continue;  /* advised (or found warm) for the slot before */
                last = pg;
                if (known && (vec[pg - ws] & 1)) continue;  /* in the page cache */
                if (in_run && pg == run_hi + 1) { run_hi = pg; continue; }
                if (in_run) {
                    madvise((void *)(p0 + run_lo * page), (run_hi - run_lo + 1) * page, MADV_WILLNEED);
                    advised += (Py_ssize_t)(run_hi - run_lo + 1);
                }
                run_lo = run_hi = pg;
                in_run = 1;
            }
        }
        if (in_run) {
            madvise((void *)(p0 + run_lo * page), (run_hi - run_lo + 1) * page, MADV_WILLNEED);
            advised += (Py_ssize_t)(run_hi - run_lo + 1);
        }
        i = j;
    }
    return advised;
}

static PyObject *willneed_cold(PyObject *self, PyObject *args) {
    Py_buffer table, slots;
    Py_ssize_t w;
    if (!PyArg_ParseTuple(args, "y*y*n", &table, &slots, &w)) return NULL;
    PyObject *res = NULL;
    unsigned char *vec = NULL;
    Py_ssize_t k = slots.len / 8, s = w > 0 ? table.len / 4 / w : 0;
    if (w <= 0 || table.len != s * w * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native willneed_cold: table [S, W], slots int64 [k]");
        goto done;
    }
    {
        const int64_t *sl = slots.buf;
        for (Py_ssize_t i = 0; i < k; i++)
            if (sl[i] < 0 || sl[i] >= s || (i && sl[i] < sl[i - 1])) {
                PyErr_SetString(PyExc_IndexError, "ember native willneed_cold: slot out of range or not sorted");
                goto done;
            }
        vec = malloc(WN_WIN);
        if (!vec) { PyErr_NoMemory(); goto done; }
        Py_ssize_t advised;
        Py_BEGIN_ALLOW_THREADS
        advised = advise_cold((uintptr_t)table.buf, (size_t)w * 4, sl, k, vec);
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(advised);
    }
done:
    free(vec);
    PyBuffer_Release(&table); PyBuffer_Release(&slots);
    return res;
}

typedef struct { int64_t slot, i; } slot_at;


/* Sorts a[0..n) by slot (0 <= slot <= max_slot), stably: an LSD radix sort of 11-bit digits
 * through tmp[n] (qsort took ~260 us for 3,300 rows, this ~20). Returns a or tmp, whichever
 * holds the result. */
static slot_at *sort_by_slot(slot_at *a, slot_at *tmp, Py_ssize_t n, int64_t max_slot) {
    size_t count[2048];
    for (int shift = 0; shift == 0 || (max_slot >> shift) > 0; shift += 11) {
        memset(count, 0, sizeof count);
        for (Py_ssize_t q = 0; q < n; q++) count[(a[q].slot >> shift) & 2047]++;
        size_t sum = 0;
        for (int d = 0; d < 2048; d++) { size_t c = count[d]; count[d] = sum; sum += c; }
        for (Py_ssize_t q = 0; q < n; q++) tmp[count[(a[q].slot >> shift) & 2047]++] = a[q];
        slot_at *t = a; a = tmp; tmp = t;
    }
    return a;
}

/* disk_find(tags uint16[S], table float32[S*W], ids int64[n], out_slot int64[n],
 *           out_rows float32[n*(W-2)] or empty, W, parts=1) -> slots read
 * The disk tier's whole probe in one pass with the GIL released (ember.tiers.disk, the
 * numpy reference is _native._disk_find_py): each ID's home slot and 16-bit tag from mix64
 * (as DiskTier._hash), the first slot from home with that tag (as tag_find), then, for every
 * candidate in file order, after advising the candidates' pages that are not in the page
 * cache (advise_cold), the ID stored in the slot: equal, out_slot[i] = the slot and its record
 * is copied into out_rows[i] (when out_rows is not empty); else (tags collide) probing goes on
 * after it. out_slot[i] = -1 for IDs not found; their out_rows stay untouched. Returns the
 * slots whose stored ID was read (found or not), as the reference counts them. parts: equal
 * ranges of the IDs run at once, each waiting on its own page faults. */
struct disk_find_ctx { const uint16_t *t; const int64_t *id; int64_t *os; const float *tb; float *orw; Py_ssize_t n, ns, w, parts;
                      slot_at *cand; int64_t *sorted; unsigned char *vec; Py_ssize_t *read; };

static void disk_find_part(void *vc, Py_ssize_t p) {
    const struct disk_find_ctx *c = vc;
    const uint16_t *t = c->t;
    const int64_t *id = c->id;
    int64_t *os = c->os;
    const float *tb = c->tb;
    Py_ssize_t lo, hi, ns = c->ns, w = c->w, r = w - 2, read = 0, m = 0;
    part_rows(c->n, c->parts, p, &lo, &hi);
    slot_at *cand = c->cand + 2 * lo;  /* this part's candidates and the radix sort's buffer */
    int64_t *sorted = c->sorted + lo;
    /* homes first (into out_slot), so the tag reads can be prefetched a few IDs ahead */
    for (Py_ssize_t i = lo; i < hi; i++) {
        uint64_t h = mix64((uint64_t)id[i]);
        os[i] = (int64_t)(((h >> 32) * (uint64_t)ns) >> 32);
    }
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (i + 16 < hi) __builtin_prefetch(t + os[i + 16]);
        uint64_t h = mix64((uint64_t)id[i]);
        int64_t at = os[i], hit = -1;
        uint16_t want = (uint16_t)((h & 0xFFFF) % 65534 + 2);
        for (int64_t step = 0; step < ns; step++) {
            uint16_t v = t[at];
            if (v == want) { hit = at; break; }
            if (v == 0) break;
            if (++at == ns) at = 0;
        }
        os[i] = -1;
        if (hit >= 0) { cand[m].slot = hit; cand[m].i = i; m++; }
    }
    slot_at *by = sort_by_slot(cand, cand + (hi - lo), m, ns - 1);
    for (Py_ssize_t q = 0; q < m; q++) sorted[q] = by[q].slot;
    if (m > 0) advise_cold((uintptr_t)tb, (size_t)w * 4, sorted, m, c->vec + p * WN_WIN);
    for (Py_ssize_t q = 0; q < m; q++) {
        if (q + 8 < m) __builtin_prefetch(tb + by[q + 8].slot * w);
        int64_t at = by[q].slot, i = by[q].i;
        uint64_t h = mix64((uint64_t)id[i]);
        uint16_t want = (uint16_t)((h & 0xFFFF) % 65534 + 2);
        for (int64_t step = 0; step < ns; step++) {  /* at: a slot whose tag matches */
            int64_t stored;
            memcpy(&stored, tb + at * w, 8);
            read++;
            if (stored == id[i]) {
                os[i] = at;
                if (c->orw) memcpy(c->orw + i * r, tb + at * w + 2, (size_t)r * sizeof(float));
                break;
            }
            int64_t nx = -1;  /* a tag collision: the next match after it, before an empty slot */
            for (int64_t s2 = 0; s2 < ns; s2++) {
                if (++at == ns) at = 0;
                uint16_t v = t[at];
                if (v == want) { nx = at; break; }
                if (v == 0) break;
            }
            if (nx < 0) break;
            at = nx;
        }
    }
    c->read[p] = read;
}

static PyObject *disk_find(PyObject *self, PyObject *args) {
    Py_buffer tags, table, ids, oslot, orows;
    Py_ssize_t w, parts = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*n|n", &tags, &table, &ids, &oslot, &orows, &w, &parts)) return NULL;
    PyObject *res = NULL;
    slot_at *cand = NULL;
    int64_t *sorted = NULL;
    unsigned char *vec = NULL;
    Py_ssize_t *read = NULL;
    Py_ssize_t n = ids.len / 8, ns = tags.len / 2, r = w - 2;
    if (w <= 2 || ns < 1 || table.len != ns * w * 4 || oslot.len != n * 8 || (orows.len != 0 && orows.len != n * r * 4)) {
        PyErr_SetString(PyExc_ValueError, "ember native disk_find: tags uint16[S], table float32 [S, W], ids/out_slot "
                                          "int64[n], out_rows float32 [n, W-2] or empty");
        goto done;
    }
    parts = even_parts(parts, n);
    cand = malloc((size_t)(n ? n : 1) * 2 * sizeof(slot_at));  /* + the radix sort's buffer */
    sorted = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    vec = malloc((size_t)WN_WIN * parts);
    read = malloc(sizeof(Py_ssize_t) * parts);
    if (!cand || !sorted || !vec || !read) { PyErr_NoMemory(); goto done; }
    {
        struct disk_find_ctx c = {tags.buf, ids.buf, oslot.buf, table.buf, orows.len ? (float *)orows.buf : NULL, n, ns, w,
                                  parts, cand, sorted, vec, read};
        Py_ssize_t total = 0;
        Py_BEGIN_ALLOW_THREADS
        run_parts(disk_find_part, &c, parts);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < parts; p++) total += read[p];
        res = PyLong_FromSsize_t(total);
    }
done:
    free(cand); free(sorted); free(vec); free(read);
    PyBuffer_Release(&tags); PyBuffer_Release(&table); PyBuffer_Release(&ids); PyBuffer_Release(&oslot);
    PyBuffer_Release(&orows);
    return res;
}

/* disk_write(table float32[S*W], slots int64[k], ids int64[k], recs float32[k*(W-2)], W, parts=1) -> None
 * The disk tier's write in one pass with the GIL released (ember.tiers.disk; the numpy
 * reference is _native._disk_write_py): slot slots[i] of the memory-mapped table gets
 * [ids[i] as two words | recs[i]], written in file order (slot, then i: a later duplicate slot
 * wins, as in numpy) after advising the pages not in memory (advise_cold: a store to a page
 * that is not in memory reads it first). parts: equal ranges of the rows run at once, each in
 * its own file order (a duplicate slot in two parts: either may win; the tier's slots are
 * unique). */
struct disk_write_ctx { float *tb; const int64_t *sl, *id; const float *rc; Py_ssize_t k, s, w, parts; slot_at *order;
                       int64_t *sorted; unsigned char *vec; };

static void disk_write_part(void *vc, Py_ssize_t p) {
    const struct disk_write_ctx *c = vc;
    float *tb = c->tb;
    Py_ssize_t lo, hi, w = c->w, r = w - 2;
    part_rows(c->k, c->parts, p, &lo, &hi);
    slot_at *order = c->order + 2 * lo;  /* this part's rows and the radix sort's buffer */
    int64_t *sorted = c->sorted + lo;
    Py_ssize_t k = hi - lo;
    for (Py_ssize_t i = 0; i < k; i++) { order[i].slot = c->sl[lo + i]; order[i].i = lo + i; }
    slot_at *by = sort_by_slot(order, order + k, k, c->s - 1);  /* stable: slot, then i */
    for (Py_ssize_t q = 0; q < k; q++) sorted[q] = by[q].slot;
    if (k > 0) advise_cold((uintptr_t)tb, (size_t)w * 4, sorted, k, c->vec + p * WN_WIN);
    for (Py_ssize_t q = 0; q < k; q++) {
        if (q + 8 < k) __builtin_prefetch(tb + by[q + 8].slot * w, 1);
        float *dst = tb + by[q].slot * w;
        memcpy(dst, c->id + by[q].i, 8);
        memcpy(dst + 2, c->rc + by[q].i * r, (size_t)r * sizeof(float));
    }
}

static PyObject *disk_write(PyObject *self, PyObject *args) {
    Py_buffer table, slots, ids, recs;
    Py_ssize_t w, parts = 1;
    if (!PyArg_ParseTuple(args, "w*y*y*y*n|n", &table, &slots, &ids, &recs, &w, &parts)) return NULL;
    PyObject *res = NULL;
    slot_at *order = NULL;
    int64_t *sorted = NULL;
    unsigned char *vec = NULL;
    Py_ssize_t k = slots.len / 8, s = w > 2 ? table.len / 4 / w : 0, r = w - 2;
    if (w <= 2 || table.len != s * w * 4 || ids.len != k * 8 || recs.len != k * r * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native disk_write: table float32 [S, W], slots/ids int64 [k], "
                                          "recs float32 [k, W-2]");
        goto done;
    }
    {
        const int64_t *sl = slots.buf;
        for (Py_ssize_t i = 0; i < k; i++)
            if (sl[i] < 0 || sl[i] >= s) {
                PyErr_SetString(PyExc_IndexError, "ember native disk_write: slot out of range");
                goto done;
            }
        parts = even_parts(parts, k);
        order = malloc((size_t)(k ? k : 1) * 2 * sizeof(slot_at));  /* + the radix sort's buffer */
        sorted = malloc((size_t)(k ? k : 1) * sizeof(int64_t));
        vec = malloc((size_t)WN_WIN * parts);
        if (!order || !sorted || !vec) { PyErr_NoMemory(); goto done; }
        struct disk_write_ctx c = {table.buf, sl, ids.buf, recs.buf, k, s, w, parts, order, sorted, vec};
        Py_BEGIN_ALLOW_THREADS
        run_parts(disk_write_part, &c, parts);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    free(order); free(sorted); free(vec);
    PyBuffer_Release(&table); PyBuffer_Release(&slots); PyBuffer_Release(&ids); PyBuffer_Release(&recs);
    return res;
}

/* ---- hashing categorical values straight from Arrow's buffers (ember.featurize.hashing) ------
 * An Arrow array of n values starting at element `off` of its buffers: validity a bitmap (bit
 * off+i set = value i present; an empty buffer = no nulls), then the values. The hash is
 * ember.featurize.hashing's exactly: an integer v (sign- or zero-extended to 64 bits) gets
 * mix64(v ^ salt); a string of len bytes h = mix64(salt ^ (len + 1) * GOLDEN), then
 * h = mix64(h ^ w) over its little-endian 8-byte words (the last zero-padded). A null is hashed
 * as 0 or "" and flagged in out_valid (0); the return value is the number of nulls. */

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static int check_validity(Py_buffer *valid, Py_ssize_t off, Py_ssize_t n, Py_buffer *out, Py_buffer *ok) {
    if (off < 0 || n < 0 || (valid->len != 0 && valid->len * 8 < off + n) || out->len != n * 8 || ok->len != n) {
        PyErr_SetString(PyExc_ValueError, "ember native arrow hash: validity must cover off + n bits (or be empty), "
                                          "out int64[n], out_valid bool[n]");
        return 0;
    }
    return 1;
}

/* arrow_hash_strings(offsets, data, validity, off, n, width, salt, out int64[n], out_valid bool[n], parts=1)
 * -> nulls: a string array's n values; parts: equal value ranges run at once (run_parts). */
struct hash_str_ctx { const uint8_t *d, *vb; const void *offs; int64_t *h; uint8_t *ok; Py_ssize_t off, n, width, dlen, parts;
                      uint64_t salt; int has_valid; Py_ssize_t *nulls, *bad; };

static void hash_str_part(void *vc, Py_ssize_t p) {
    const struct hash_str_ctx *c = vc;
    const int32_t *o4 = c->offs;
    const int64_t *o8 = c->offs;
    Py_ssize_t lo, hi, nulls = 0, bad = -1;
    part_rows(c->n, c->parts, p, &lo, &hi);
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t j = c->off + i;
        int present = !c->has_valid || ((c->vb[j >> 3] >> (j & 7)) & 1);
        int64_t a = c->width == 4 ? (int64_t)o4[j] : o8[j];
        int64_t b = c->width == 4 ? (int64_t)o4[j + 1] : o8[j + 1];
        if (!present) { b = a; nulls++; }
        if (a < 0 || b < a || b > c->dlen) { bad = i; break; }
        uint64_t len = (uint64_t)(b - a), z = mix64(c->salt ^ ((len + 1) * 0x9E3779B97F4A7C15ULL));
        const uint8_t *q = c->d + a;
        uint64_t k = 0;
        for (; k + 8 <= len; k += 8) z = mix64(z ^ load_le64(q + k));
        if (k < len) {
            uint64_t w = 0;
            for (uint64_t e = 0; k + e < len; e++) w |= (uint64_t)q[k + e] << (8 * e);
            z = mix64(z ^ w);
        }
        c->h[i] = (int64_t)z;
        c->ok[i] = (uint8_t)present;
    }
    c->nulls[p] = nulls;
    c->bad[p] = bad;
}

static PyObject *arrow_hash_strings(PyObject *self, PyObject *args) {
    Py_buffer offs, data, valid, out, ok;
    Py_ssize_t off, n, width, parts = 1;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "y*y*y*nnnKw*w*|n", &offs, &data, &valid, &off, &n, &width, &salt, &out, &ok, &parts))
        return NULL;
    PyObject *res = NULL;
    if (!check_validity(&valid, off, n, &out, &ok)) goto done;
    if ((width != 4 && width != 8) || offs.len < (off + n + 1) * width) {
        PyErr_SetString(PyExc_ValueError, "ember native arrow_hash_strings: offsets int32 or int64 (width 4 or 8) of at least off + n + 1 entries");
        goto done;
    }
    {
        parts = even_parts(parts, n);
        Py_ssize_t *acc = malloc(sizeof(Py_ssize_t) * 2 * parts), nulls = 0, bad = -1;  /* each part's nulls, first bad value */
        if (!acc) { PyErr_NoMemory(); goto done; }
        struct hash_str_ctx c = {data.buf, valid.buf, offs.buf, out.buf, ok.buf, off, n, width, data.len, parts, salt,
                                 valid.len != 0, acc, acc + parts};
        Py_BEGIN_ALLOW_THREADS
        run_parts(hash_str_part, &c, parts);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < parts; p++) {
            nulls += acc[p];
            if (bad < 0) bad = acc[parts + p];
        }
        free(acc);
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError, "ember native arrow_hash_strings: offsets of value %zd out of the data's range", bad);
            goto done;
        }
        res = PyLong_FromSsize_t(nulls);
    }
done:
    PyBuffer_Release(&offs); PyBuffer_Release(&data); PyBuffer_Release(&valid); PyBuffer_Release(&out); PyBuffer_Release(&ok);
    return res;
}

/* arrow_hash_ints(values, validity, off, n, width, signed, salt, out int64[n], out_valid bool[n], parts=1)
 * -> nulls: an integer array's n values; parts: equal value ranges run at once (run_parts). */
struct hash_int_ctx { const uint8_t *vb, *raw; int64_t *h; uint8_t *ok; Py_ssize_t off, n, width, parts; uint64_t salt;
                      int has_valid, is_signed; Py_ssize_t *nulls; };

static void hash_int_part(void *vc, Py_ssize_t p) {
    const struct hash_int_ctx *c = vc;
    const uint8_t *raw = c->raw;
    Py_ssize_t lo, hi, nulls = 0;
    part_rows(c->n, c->parts, p, &lo, &hi);
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t j = c->off + i;
        int present = !c->has_valid || ((c->vb[j >> 3] >> (j & 7)) & 1);
        uint64_t v = 0;
        if (present) {
            switch (c->width) {
            case 1: v = c->is_signed ? (uint64_t)(int64_t)((const int8_t *)raw)[j] : ((const uint8_t *)raw)[j]; break;
            case 2: v = c->is_signed ? (uint64_t)(int64_t)((const int16_t *)raw)[j] : ((const uint16_t *)raw)[j]; break;
            case 4: v = c->is_signed ? (uint64_t)(int64_t)((const int32_t *)raw)[j] : ((const uint32_t *)raw)[j]; break;
            default: v = ((const uint64_t *)raw)[j]; break;
            }
        } else {
            nulls++;
        }
        c->h[i] = (int64_t)mix64(v ^ c->salt);
        c->ok[i] = (uint8_t)present;
    }
    c->nulls[p] = nulls;
}

static PyObject *arrow_hash_ints(PyObject *self, PyObject *args) {
    Py_buffer vals, valid, out, ok;
    Py_ssize_t off, n, width, parts = 1;
    int is_signed;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "y*y*nnnpKw*w*|n", &vals, &valid, &off, &n, &width, &is_signed, &salt, &out, &ok, &parts))
        return NULL;
    PyObject *res = NULL;
    if (!check_validity(&valid, off, n, &out, &ok)) goto done;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || vals.len < (off + n) * width) {
        PyErr_SetString(PyExc_ValueError, "ember native arrow_hash_ints: values of width 1, 2, 4 or 8 bytes, at least off + n of them");
        goto done;
    }
    {
        parts = even_parts(parts, n);
        Py_ssize_t *acc = malloc(sizeof(Py_ssize_t) * parts), nulls = 0;  /* each part's nulls */
        if (!acc) { PyErr_NoMemory(); goto done; }
        struct hash_int_ctx c = {valid.buf, vals.buf, out.buf, ok.buf, off, n, width, parts, salt, valid.len != 0, is_signed, acc};
        Py_BEGIN_ALLOW_THREADS
        run_parts(hash_int_part, &c, parts);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < parts; p++) nulls += acc[p];
        free(acc);
        res = PyLong_FromSsize_t(nulls);
    }
done:
    PyBuffer_Release(&vals); PyBuffer_Release(&valid); PyBuffer_Release(&out); PyBuffer_Release(&ok);
    return res;
}

/* Decimal integer IDs from an Arrow string array's buffers (ember.featurize.transforms.parse_ints
 * on a CSV column): a value is missing (state 1) when null or empty, an ID (state 0) when it is
 * -?[0-9]{1,19} within int64, else bad (state 2); out = the ID, 0 otherwise. A byte other than
 * a digit or '-' anywhere returns -1 at once: blanks, '+' and the rest are the reference's to
 * judge (Unicode whitespace trimming, the regex). Else returns the number of bad values. */
static PyObject *arrow_parse_ints(PyObject *self, PyObject *args) {
    Py_buffer offs, data, valid, out, state;
    Py_ssize_t off, n, width;
    if (!PyArg_ParseTuple(args, "y*y*y*nnnw*w*", &offs, &data, &valid, &off, &n, &width, &out, &state)) return NULL;
    PyObject *res = NULL;
    if (off < 0 || n < 0 || (valid.len != 0 && valid.len * 8 < off + n) || out.len != n * 8 || state.len != n ||
        (width != 4 && width != 8) || offs.len < (off + n + 1) * width) {
        PyErr_SetString(PyExc_ValueError, "ember native arrow_parse_ints: offsets int32/int64 (width 4/8) of off + n + 1 "
                                          "entries, validity covering off + n bits (or empty), out int64[n], state uint8[n]");
        goto done;
    }
    {
        const uint8_t *d = data.buf, *vb = valid.buf;
        const int32_t *o4 = offs.buf;
        const int64_t *o8 = offs.buf;
        int64_t *x = out.buf;
        uint8_t *st = state.buf;
        Py_ssize_t bad = 0, range_err = -1, dlen = data.len;
        int foreign = 0, has_valid = valid.len != 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t j = off + i;
            int64_t a = width == 4 ? (int64_t)o4[j] : o8[j];
            int64_t b = width == 4 ? (int64_t)o4[j + 1] : o8[j + 1];
            x[i] = 0;
            if (has_valid && !((vb[j >> 3] >> (j & 7)) & 1)) { st[i] = 1; continue; }
            if (a < 0 || b < a || b > dlen) { range_err = i; break; }
            if (a == b) { st[i] = 1; continue; }
            const uint8_t *p = d + a, *e = d + b;
            int neg = *p == '-';
            if (neg) p++;
            uint64_t v = 0;
            int digits = 0, ok = p < e;
            for (; p < e; p++) {
                unsigned c = *p;
                if (c - '0' <= 9u) {
                    if (++digits <= 19) v = v * 10 + (c - '0');  /* 19 digits < 2^64: no wrap */
                } else if (c == '-') {
                    ok = 0;  /* a '-' not in front: bad, as the regex says */
                } else {
                    foreign = 1;
                    break;
                }
            }
            if (foreign) break;
            ok = ok && digits >= 1 && digits <= 19 && v <= (neg ? 9223372036854775808ULL : 9223372036854775807ULL);
            if (ok) {
                x[i] = neg ? (int64_t)(0 - v) : (int64_t)v;
                st[i] = 0;
            } else {
                st[i] = 2;
                bad++;
            }
        }
        Py_END_ALLOW_THREADS
        if (range_err >= 0) {
            PyErr_Format(PyExc_ValueError, "ember native arrow_parse_ints: offsets of value %zd out of the data's range", range_err);
            goto done;
        }
        res = PyLong_FromSsize_t(foreign ? -1 : bad);
    }
done:
    PyBuffer_Release(&offs); PyBuffer_Release(&data); PyBuffer_Release(&valid); PyBuffer_Release(&out); PyBuffer_Release(&state);
    return res;
}

/* featurize_ids(columns, n, out_values, out_lengths, out_offsets, out_counts) -> total: the
 * single-valued sparse columns of one record batch (ember.featurize.featurizer) in one call, the
 * GIL released. Each column is a tuple (kind, values, data, validity, off, width, signed, hash,
 * salt, listed): kind 0 an integer array (values: its width-byte integers, data b""), kind 1 a
 * (large_)string or binary one, hashed, kind 2 one of decimal integer IDs, not hashed (values:
 * its int32/int64 offsets, width 4/8; data: its bytes); validity and off as for
 * arrow_hash_strings. A value is kept unless null or listed (listed: a tuple of bytes for kinds
 * 1 and 2, compared as bytes; of integers, as 64-bit patterns of the sign/zero-extended value,
 * for kind 0), or empty for kind 2; a kept value becomes hash ? its ID (arrow_hash_*'s hash) :
 * the integer itself (kind 2: arrow_parse_ints' ID). Column c's kept values go to out_values
 * (int64) one after the other, after the columns before it (out_counts[c]: how many);
 * out_lengths int64 [C * n] is 0/1 per row, out_offsets int64 [C, n + 1] their running sums
 * (from 0). A kind 2 column holding a value that is not an ID (a byte other than 0-9 and '-', or
 * a bad ID; listed values aside) is declined: out_counts[c] = -1, its values not kept (its
 * lengths and offsets are then garbage), for the caller's general path. */
/* A record batch as pyarrow exports it (the Arrow C data interface, __arrow_c_array__: a schema
 * and an array capsule; a struct array whose children are the columns): its columns' buffers
 * read in place, no Python object a column. The structs are the interface's (a stable ABI). */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static void arrow_view(Py_buffer *b, const void *p, Py_ssize_t len) {
    memset(b, 0, sizeof(*b));  /* obj NULL: PyBuffer_Release leaves it alone */
    b->buf = (void *)p;
    b->len = p ? len : 0;
}

/* column `child` of the exported batch `batch` ((schema capsule, array capsule), n rows): its
 * values (kind 0: integers of width bytes, signed or not) or offsets (kind 1: string or binary,
 * kind 2 / strings: string only; width 4 or 8) and bytes, its validity (empty without nulls)
 * and offset, as the buffer form of a column passes them; 0 with ValueError when the batch or
 * the column's type does not fit */
static int arrow_column(PyObject *batch, Py_ssize_t child, Py_ssize_t n, int kind, Py_ssize_t width, int is_signed,
                        int binary_ok, Py_buffer *vals, Py_buffer *data, Py_buffer *valid, Py_ssize_t *off) {
    struct ArrowSchema *sc = NULL;
    struct ArrowArray *ar = NULL;
    if (PyTuple_Check(batch) && PyTuple_GET_SIZE(batch) == 2) {
        sc = PyCapsule_GetPointer(PyTuple_GET_ITEM(batch, 0), "arrow_schema");
        ar = sc ? PyCapsule_GetPointer(PyTuple_GET_ITEM(batch, 1), "arrow_array") : NULL;
    }
    if (!sc || !ar) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "ember native: batch is a record batch's __arrow_c_array__() (schema, array)");
        return 0;
    }
    if (strcmp(sc->format, "+s") != 0 || ar->offset < 0 || ar->length != n || ar->null_count > 0 || child < 0
        || child >= ar->n_children || child >= sc->n_children) {
        PyErr_Format(PyExc_ValueError, "ember native: the batch is no struct of %zd rows with a column %zd", n, child);
        return 0;
    }
    const struct ArrowArray *a = ar->children[child];
    const char *f = sc->children[child]->format;
    static const char ints[] = "CcSsIiLl";  /* uint8, int8, ..., int64: index 2 log2(width) + signed */
    int fits;
    if (kind == 0) {
        int lg = width == 1 ? 0 : width == 2 ? 1 : width == 4 ? 2 : width == 8 ? 3 : -1;
        fits = lg >= 0 && f[0] == ints[2 * lg + (is_signed ? 1 : 0)] && f[1] == 0 && a->n_buffers == 2;
    } else {
        fits = ((width == 4 && (f[0] == 'u' || (binary_ok && f[0] == 'z'))) || (width == 8 && (f[0] == 'U' || (binary_ok && f[0] == 'Z'))))
               && f[1] == 0 && a->n_buffers == 3;
    }
    if (!fits || a->length < ar->offset + n || a->offset < 0) {  /* the struct's offset applies to its children */
        PyErr_Format(PyExc_ValueError, "ember native: column %zd of the batch (format '%s', %lld rows) is not what its "
                     "kind %d, width %zd and sign ask", child, f, (long long)a->length, kind, width);
        return 0;
    }
    *off = (Py_ssize_t)(a->offset + ar->offset);
    Py_ssize_t end = *off + n;
    arrow_view(valid, a->null_count != 0 ? a->buffers[0] : NULL, (end + 7) / 8);
    if (kind == 0) {
        arrow_view(vals, a->buffers[1], end * width);
        arrow_view(data, NULL, 0);
    } else {
        arrow_view(vals, a->buffers[1], (end + 1) * width);
        int64_t last = !a->buffers[1] ? 0 : width == 4 ? (int64_t)((const int32_t *)a->buffers[1])[end] : ((const int64_t *)a->buffers[1])[end];
        if (last < 0 || (last > 0 && !a->buffers[2])) {
            PyErr_Format(PyExc_ValueError, "ember native: column %zd of the batch has offsets past its data", child);
            return 0;
        }
        arrow_view(data, a->buffers[2], (Py_ssize_t)last);
    }
    return 1;
}

#define FZ_MAX_LISTED 16
typedef struct {
    Py_buffer vals, data, valid;
    int held;  /* buffers acquired: 0 or 3 */
    int kind, is_signed, hash, n_listed;
    Py_ssize_t off, width;
    unsigned long long salt;
    const uint8_t *listed[FZ_MAX_LISTED];
    Py_ssize_t listed_len[FZ_MAX_LISTED];
    uint64_t listed_int[FZ_MAX_LISTED];
} fz_column;

static int fz_parse_column(PyObject *item, Py_ssize_t n, PyObject *batch, fz_column *c) {
    PyObject *listed;
    Py_ssize_t child;
    c->held = 0;
    if (batch != NULL) {  /* (kind, child, width, signed, hash, salt, listed): the buffers from the batch */
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "innppKO!", &c->kind, &child, &c->width, &c->is_signed, &c->hash,
                                                      &c->salt, &PyTuple_Type, &listed)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ember native featurize_ids: a column is a tuple");
            return 0;
        }
        if (!arrow_column(batch, child, n, c->kind, c->width, c->is_signed, c->kind == 1, &c->vals, &c->data, &c->valid,
                          &c->off))
            return 0;
    } else {
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iy*y*y*nnppKO!", &c->kind, &c->vals, &c->data, &c->valid,
                                                      &c->off, &c->width, &c->is_signed, &c->hash, &c->salt,
                                                      &PyTuple_Type, &listed)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ember native featurize_ids: a column is a tuple");
            return 0;
        }
        c->held = 3;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(listed);
    int ok = c->off >= 0 && (c->valid.len == 0 || c->valid.len * 8 >= c->off + n) && k <= FZ_MAX_LISTED;
    if (c->kind == 0)
        ok = ok && (c->width == 1 || c->width == 2 || c->width == 4 || c->width == 8) && c->vals.len >= (c->off + n) * c->width;
    else
        ok = ok && ((c->kind == 1 && c->hash) || (c->kind == 2 && !c->hash)) && (c->width == 4 || c->width == 8)
             && c->vals.len >= (c->off + n + 1) * c->width;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "ember native featurize_ids: a column must be kind 0 (integers of width 1, 2, 4, 8: "
                     "off + n of them), 1 (hashed strings) or 2 (integer IDs as text, not hashed) with offsets of width "
                     "4 or 8 (off + n + 1 of them), validity "
                     "covering off + n bits or empty, at most %d listed values", FZ_MAX_LISTED);
        return 0;
    }
    c->n_listed = (int)k;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *v = PyTuple_GET_ITEM(listed, i);
        if (c->kind != 0) {
            char *p;
            if (!PyBytes_Check(v) || PyBytes_AsStringAndSize(v, &p, &c->listed_len[i]) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ember native featurize_ids: a string column's listed values are bytes");
                return 0;
            }
            c->listed[i] = (const uint8_t *)p;  /* the tuple (an argument) keeps it alive */
        } else {
            c->listed_int[i] = PyLong_AsUnsignedLongLongMask(v);
            if (PyErr_Occurred()) return 0;
        }
    }
    return 1;
}

static inline uint64_t fz_hash_bytes(const uint8_t *p, uint64_t len, uint64_t salt) {
    uint64_t z = mix64(salt ^ ((len + 1) * 0x9E3779B97F4A7C15ULL)), k = 0;
    for (; k + 8 <= len; k += 8) z = mix64(z ^ load_le64(p + k));
    if (k < len) {
        uint64_t w = 0;
        for (uint64_t c = 0; k + c < len; c++) w |= (uint64_t)p[k + c] << (8 * c);
        z = mix64(z ^ w);
    }
    return z;
}

/* fz_parse_id's end: the digits' value v, negated when sign (1), as the ID when within int64
 * (1), else 0 (a bad ID); without a branch on the sign */
static inline int fz_id_of(uint64_t v, uint64_t sign, int64_t *id) {
    if (v > 9223372036854775807ULL + sign) return 0;
    *id = (int64_t)((v ^ (0 - sign)) + sign);  /* -v when negative (two's complement) */
    return 1;
}

/* kind 2's ID: -?[0-9]{1,19} within int64 (arrow_parse_ints); 0 a bad ID, -1 a byte other
 * than a digit or '-'. Eight digits a step where they are all digits (one multiply-shift
 * reduction of the little-endian word); any other byte sends the value to the byte loop. */
static inline int fz_parse_id(const uint8_t *p, const uint8_t *e, int64_t *id) {
    int neg = *p == '-', ok = 1, digits = 0;
    uint64_t v = 0, sign = (uint64_t)neg;
    p += neg;  /* (no branch: signs vary at random in hashed IDs, a mispredicted jump each other ID) */
    if (e - p >= 1 && e - p <= 19) {
        const uint8_t *q = p;
        for (; e - q >= 8; q += 8) {
            uint64_t w = load_le64(q);
            if (((w & 0xF0F0F0F0F0F0F0F0ULL) | (((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4))
                != 0x3333333333333333ULL) goto bytewise;
            w = ((w & 0x0F0F0F0F0F0F0F0FULL) * 2561) >> 8;
            w = ((w & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
            w = ((w & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32;
            v = v * 100000000ULL + w;
        }
        for (; q < e; q++) {
            unsigned ch = (unsigned)*q - '0';
            if (ch > 9u) goto bytewise;
            v = v * 10 + ch;
        }
        return fz_id_of(v, sign, id);
    }
bytewise:
    v = 0;
    ok = p < e;
    for (; p < e; p++) {
        unsigned ch = *p;
        if (ch - '0' <= 9u) {
            if (++digits <= 19) v = v * 10 + (ch - '0');  /* 19 digits < 2^64: no wrap */
        } else if (ch == '-') {
            ok = 0;
        } else {
            return -1;
        }
    }
    return ok && digits <= 19 ? fz_id_of(v, sign, id) : 0;
}

/* every value of an integer column without nulls or listed values kept: value j's ID, its length
 * 1 and running sum (what fz_column_run's general loop gives them, in one tight loop a width) */
#define FZ_INTS(load)                                                                  \
    do {                                                                               \
        const int hash = c->hash;                                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                           \
            Py_ssize_t j = c->off + i;                                                 \
            uint64_t v = (load);                                                       \
            vo[i] = (int64_t)(hash ? mix64(v ^ salt) : v);                             \
            lens[i] = 1;                                                               \
            offs[i + 1] = i + 1;                                                       \
        }                                                                              \
    } while (0)

/* one column: returns the values kept, -1 - i when value i's offsets leave the data, or
 * PY_SSIZE_T_MIN when it declines (kind 2) */
static Py_ssize_t fz_column_run(const fz_column *c, Py_ssize_t n, int64_t *vo, int64_t *lens, int64_t *offs) {
    const uint8_t *vb = c->valid.buf, *raw = c->vals.buf, *d = c->data.buf;
    const int32_t *o4 = c->vals.buf;
    const int64_t *o8 = c->vals.buf;
    int has_valid = c->valid.len != 0, nl = c->n_listed;
    Py_ssize_t kept = 0, dlen = c->data.len;
    uint64_t salt = c->salt;
    offs[0] = 0;
    if (c->kind == 0 && !has_valid && nl == 0) {  /* integers, every one kept: the loop below without its tests */
        switch (c->width) {
        case 1: FZ_INTS(c->is_signed ? (uint64_t)(int64_t)((const int8_t *)raw)[j] : ((const uint8_t *)raw)[j]); break;
        case 2: FZ_INTS(c->is_signed ? (uint64_t)(int64_t)((const int16_t *)raw)[j] : ((const uint16_t *)raw)[j]); break;
        case 4: FZ_INTS(c->is_signed ? (uint64_t)(int64_t)((const int32_t *)raw)[j] : ((const uint32_t *)raw)[j]); break;
        default: FZ_INTS(((const uint64_t *)raw)[j]); break;
        }
        return n;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = c->off + i;
        int keep = !has_valid || ((vb[j >> 3] >> (j & 7)) & 1);
        uint64_t id = 0;
        if (keep && c->kind != 0) {
            int64_t a = c->width == 4 ? (int64_t)o4[j] : o8[j];
            int64_t b = c->width == 4 ? (int64_t)o4[j + 1] : o8[j + 1];
            if (a < 0 || b < a || b > dlen) return -1 - i;
            const uint8_t *p = d + a;
            Py_ssize_t len = (Py_ssize_t)(b - a);
            for (int t = 0; t < nl; t++)
                if (c->listed_len[t] == len && (len == 0 || memcmp(c->listed[t], p, (size_t)len) == 0)) { keep = 0; break; }
            if (keep && c->kind == 1) {
                id = fz_hash_bytes(p, (uint64_t)len, salt);
            } else if (keep) {
                int64_t x = 0;
                if (len == 0) keep = 0;  /* an empty field: missing */
                else if (fz_parse_id(p, p + len, &x) <= 0) return PY_SSIZE_T_MIN;
                id = (uint64_t)x;
            }
        } else if (keep) {
            uint64_t v;
            switch (c->width) {
            case 1: v = c->is_signed ? (uint64_t)(int64_t)((const int8_t *)raw)[j] : ((const uint8_t *)raw)[j]; break;
            case 2: v = c->is_signed ? (uint64_t)(int64_t)((const int16_t *)raw)[j] : ((const uint16_t *)raw)[j]; break;
            case 4: v = c->is_signed ? (uint64_t)(int64_t)((const int32_t *)raw)[j] : ((const uint32_t *)raw)[j]; break;
            default: v = ((const uint64_t *)raw)[j]; break;
            }
            for (int t = 0; t < nl; t++)
                if (c->listed_int[t] == v) { keep = 0; break; }
            id = c->hash ? mix64(v ^ salt) : v;
        }
        if (keep) vo[kept++] = (int64_t)id;
        lens[i] = keep;
        offs[i + 1] = kept;
    }
    return kept;
}

static PyObject *featurize_ids(PyObject *self, PyObject *args) {
    PyObject *columns;
    Py_ssize_t n;
    Py_buffer out, lens, offs, counts;
    PyObject *batch = Py_None;
    if (!PyArg_ParseTuple(args, "O!nw*w*w*w*|O", &PyList_Type, &columns, &n, &out, &lens, &offs, &counts, &batch)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t nc = PyList_GET_SIZE(columns), got = 0;
    fz_column *cols = PyMem_Calloc(nc ? (size_t)nc : 1, sizeof(fz_column));
    if (!cols) { PyErr_NoMemory(); goto done; }
    if (n < 0 || out.len < nc * n * 8 || lens.len != nc * n * 8 || offs.len != nc * (n + 1) * 8 || counts.len != nc * 8) {
        PyErr_SetString(PyExc_ValueError, "ember native featurize_ids: out_values int64 [>= C * n], out_lengths int64 "
                                          "[C * n], out_offsets int64 [C, n + 1], out_counts int64 [C] for C columns");
        goto done;
    }
    for (; got < nc; got++)
        if (!fz_parse_column(PyList_GET_ITEM(columns, got), n, batch == Py_None ? NULL : batch, &cols[got])) { got += cols[got].held ? 1 : 0; goto done; }
    {
        int64_t *vo = out.buf, *lp = lens.buf, *op = offs.buf, *cp = counts.buf;
        Py_ssize_t total = 0, bad = 0, bad_col = -1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t c = 0; c < nc; c++) {
            Py_ssize_t kept = fz_column_run(&cols[c], n, vo + total, lp + c * n, op + c * (n + 1));
            if (kept == PY_SSIZE_T_MIN) { cp[c] = -1; continue; }  /* declined: the next column writes over it */
            if (kept < 0) { bad = -1 - kept; bad_col = c; break; }
            cp[c] = kept;
            total += kept;
        }
        Py_END_ALLOW_THREADS
        if (bad_col >= 0) {
            PyErr_Format(PyExc_ValueError, "ember native featurize_ids: column %zd: offsets of value %zd out of the data's range", bad_col, bad);
            goto done;
        }
        res = PyLong_FromSsize_t(total);
    }
done:
    if (cols) {
        for (Py_ssize_t c = 0; c < got; c++)
            if (cols[c].held) { PyBuffer_Release(&cols[c].vals); PyBuffer_Release(&cols[c].data); PyBuffer_Release(&cols[c].valid); }
        PyMem_Free(cols);
    }
    PyBuffer_Release(&out); PyBuffer_Release(&lens); PyBuffer_Release(&offs); PyBuffer_Release(&counts);
    return res;
}

/* dense_floats(columns, n, out, out_done) -> columns done: integer columns and string columns of
 * plain integers and empty fields (Criteo's counts as CSV text) as float64, as parse_floats
 * reads them, in one call, the GIL released. Each column is (kind, values, data, validity, off,
 * width, signed, row): kind 0 an integer array (values its width-byte integers; data b""), kind
 * 1 a string array (values its offsets of width 4 or 8, data its bytes, as for
 * arrow_parse_ints); row: its row of out (float64 [R, n]). An integer is rounded to float64 (a C
 * conversion, as numpy's astype); a string -?[0-9]{1,19} within int64 likewise (a "-0" is -0.0,
 * as a decimal parse makes it); null or empty, NaN. A string column with any other value is not
 * done (out_done[c] = 0, its row of out undefined): the caller's general parse judges it. */
/* dense_floats' integer column of C type T: every value converted (nulls set after) */
#define DF_INTS(T)                                                                     \
    do {                                                                               \
        const T *src_ = (const T *)raw + m[0];                                         \
        for (Py_ssize_t i = 0; i < n; i++) row[i] = (double)src_[i];                   \
    } while (0)

static PyObject *dense_floats(PyObject *self, PyObject *args) {
    PyObject *columns;
    Py_ssize_t n;
    Py_buffer out, done;
    PyObject *batch = Py_None;
    if (!PyArg_ParseTuple(args, "O!nw*w*|O", &PyList_Type, &columns, &n, &out, &done, &batch)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t nc = PyList_GET_SIZE(columns), got = 0, rows = n ? out.len / (n * 8) : PY_SSIZE_T_MAX;
    Py_buffer *bufs = PyMem_Calloc(nc ? (size_t)nc * 3 : 1, sizeof(Py_buffer));
    Py_ssize_t *meta = PyMem_Calloc(nc ? (size_t)nc * 5 : 1, sizeof(Py_ssize_t));  /* off, width, row, kind, signed */
    if (!bufs || !meta) { PyErr_NoMemory(); goto done; }
    if (n < 0 || (n && out.len % (n * 8)) || done.len != nc) {
        PyErr_SetString(PyExc_ValueError, "ember native dense_floats: out float64 [R, n], out_done uint8 [C] for C columns");
        goto done;
    }
    for (; got < nc; got++) {
        PyObject *item = PyList_GET_ITEM(columns, got);
        Py_ssize_t *m = meta + 5 * got;
        int kind = 0, is_signed = 0;
        Py_ssize_t child;
        if (batch != Py_None) {  /* (kind, child, width, signed, row): the buffers from the batch */
            if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "innpn", &kind, &child, &m[1], &is_signed, &m[2])) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ember native dense_floats: a column is a tuple");
                goto done;
            }
            if (!arrow_column(batch, child, n, kind, m[1], is_signed, 0, &bufs[3 * got], &bufs[3 * got + 1],
                              &bufs[3 * got + 2], &m[0]))
                goto done;
            if (kind == 0 && bufs[3 * got + 2].len != 0) {  /* integers with nulls: not done (Arrow's cast decides) */
                m[3] = -1;
                continue;
            }
        } else if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iy*y*y*nnpn", &kind, &bufs[3 * got], &bufs[3 * got + 1],
                                                             &bufs[3 * got + 2], &m[0], &m[1], &is_signed, &m[2])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ember native dense_floats: a column is a tuple");
            goto done;
        }
        Py_buffer *b = bufs + 3 * got;
        m[3] = kind;
        m[4] = is_signed;
        int fits = kind == 1 ? (m[1] == 4 || m[1] == 8) && b[0].len >= (m[0] + n + 1) * m[1]
                 : kind == 0 && (m[1] == 1 || m[1] == 2 || m[1] == 4 || m[1] == 8) && b[0].len >= (m[0] + n) * m[1];
        if (!fits || m[0] < 0 || m[2] < 0 || m[2] >= rows || (b[2].len != 0 && b[2].len * 8 < m[0] + n)) {
            got++;
            PyErr_SetString(PyExc_ValueError, "ember native dense_floats: kind 0 (integers of width 1, 2, 4 or 8, off + n "
                                              "of them) or 1 (strings, offsets of width 4 or 8, off + n + 1 of them), "
                                              "validity covering off + n bits or empty, row within out");
            goto done;
        }
    }
    {
        double *x = out.buf;
        uint8_t *dn = done.buf;
        Py_ssize_t count = 0, range_err = -1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t c = 0; c < nc && range_err < 0; c++) {
            const Py_buffer *b = bufs + 3 * c;
            const Py_ssize_t *m = meta + 5 * c;
            const uint8_t *d = b[1].buf, *vb = b[2].buf;
            const int32_t *o4 = b[0].buf;
            const int64_t *o8 = b[0].buf;
            double *row = x + m[2] * n;
            int ok = 1, has_valid = b[2].len != 0;
            if (m[3] < 0) { dn[c] = 0; continue; }  /* declined when read from the batch */
            if (m[3] == 0) {
                const uint8_t *raw = b[0].buf;
                int sg = (int)m[4];
                switch (m[1] * 2 + sg) {  /* a loop a type (vectorised conversions), then the nulls */
                case 2: DF_INTS(uint8_t); break;
                case 3: DF_INTS(int8_t); break;
                case 4: DF_INTS(uint16_t); break;
                case 5: DF_INTS(int16_t); break;
                case 8: DF_INTS(uint32_t); break;
                case 9: DF_INTS(int32_t); break;
                case 16: DF_INTS(uint64_t); break;
                default: DF_INTS(int64_t); break;
                }
                if (has_valid)
                    for (Py_ssize_t i = 0; i < n; i++) {
                        Py_ssize_t j = m[0] + i;
                        if (!((vb[j >> 3] >> (j & 7)) & 1)) row[i] = NAN;
                    }
                dn[c] = 1;
                count++;
                continue;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_ssize_t j = m[0] + i;
                if (has_valid && !((vb[j >> 3] >> (j & 7)) & 1)) { row[i] = NAN; continue; }
                int64_t a = m[1] == 4 ? (int64_t)o4[j] : o8[j];
                int64_t e = m[1] == 4 ? (int64_t)o4[j + 1] : o8[j + 1];
                if (a < 0 || e < a || e > b[1].len) { range_err = c; break; }
                if (a == e) { row[i] = NAN; continue; }
                int64_t v;
                if (fz_parse_id(d + a, d + e, &v) <= 0) { ok = 0; break; }
                row[i] = (v == 0 && d[a] == '-') ? -0.0 : (double)v;
            }
            dn[c] = (uint8_t)ok;
            count += ok;
        }
        Py_END_ALLOW_THREADS
        if (range_err >= 0) {
            PyErr_Format(PyExc_ValueError, "ember native dense_floats: column %zd: offsets out of the data's range", range_err);
            goto done;
        }
        res = PyLong_FromSsize_t(count);
    }
done:
    if (bufs) {
        for (Py_ssize_t c = 0; c < got; c++) {
            PyBuffer_Release(&bufs[3 * c]); PyBuffer_Release(&bufs[3 * c + 1]); PyBuffer_Release(&bufs[3 * c + 2]);
        }
        PyMem_Free(bufs);
    }
    PyMem_Free(meta);
    PyBuffer_Release(&out); PyBuffer_Release(&done);
    return res;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* dense_prepare_run's table look-up, 4 values a step (AVX2; four scalar loads, not a gather: gathers
 * are slow on CPUs with Intel's gather mitigation): v[i] = copysign(t[|v[i]|], v[i]) where |v[i]|
 * is an integer below k, else v[i] kept and i appended to r (*left counts them); returns the
 * values done (a multiple of 4), the rest for the scalar loop */
__attribute__((target("avx2"))) static Py_ssize_t dense_table_avx2(double *v, Py_ssize_t n, const double *t, Py_ssize_t k,
                                                                  int64_t *r, Py_ssize_t *left) {
    const __m256d sign = _mm256_set1_pd(-0.0), kd = _mm256_set1_pd((double)k);
    Py_ssize_t i = 0, got = *left;
    int32_t at[4];
    for (; i + 4 <= n; i += 4) {
        __m256d a = _mm256_loadu_pd(v + i);
        __m256d m = _mm256_andnot_pd(sign, a);
        __m256d in = _mm256_cmp_pd(m, kd, _CMP_LT_OQ);
        __m128i j = _mm256_cvttpd_epi32(_mm256_and_pd(m, in));  /* 0 where out of the table */
        __m256d hit = _mm256_and_pd(in, _mm256_cmp_pd(_mm256_cvtepi32_pd(j), m, _CMP_EQ_OQ));
        _mm_storeu_si128((__m128i *)at, j);
        __m256d look = _mm256_set_pd(t[at[3]], t[at[2]], t[at[1]], t[at[0]]);
        __m256d res = _mm256_or_pd(look, _mm256_and_pd(a, sign));  /* t >= 0: a's sign */
        _mm256_storeu_pd(v + i, _mm256_blendv_pd(a, res, hit));
        int bits = _mm256_movemask_pd(hit);
        if (bits != 15)
            for (int q = 0; q < 4; q++)
                if (!((bits >> q) & 1)) r[got++] = i + q;
    }
    *left = got;
    return i;
}
#endif

/* dense_prepare's pass over one run (the GIL released): the values left for numpy, or -1 */
__attribute__((target_clones("arch=x86-64-v3", "default")))  /* AVX2: the -0.0 scan's 64-bit compares */
static Py_ssize_t dense_prepare_run(double *v, Py_ssize_t n, double fill, double lo, double hi, int mode,
                                    const double *t, Py_ssize_t k, int64_t *r) {
    const uint64_t *bits = (const uint64_t *)v;
    uint64_t declined = 0;
    Py_ssize_t left = 0;
    /* a -0.0 anywhere (or a NaN to fill with -0.0): the run is numpy's, untouched; the caller's
     * bounds are no -0.0, so a value becomes one only as it was one */
    for (Py_ssize_t i = 0; i < n; i++) declined |= bits[i] == 0x8000000000000000ULL;
    if (fill == 0.0 && signbit(fill))
        for (Py_ssize_t i = 0; i < n; i++) declined |= v[i] != v[i];
    if (declined) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {  /* fill, clip: no branch (vectorised) */
        double a = v[i];
        a = a != a ? fill : a;
        a = a < lo ? lo : a;
        v[i] = a > hi ? hi : a;
    }
    if (mode == 0) return 0;
    if (mode == 1)
        for (Py_ssize_t i = 0; i < n; i++) v[i] = v[i] < 0.0 ? 0.0 : v[i];
    Py_ssize_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) i = dense_table_avx2(v, n, t, k, r, &left);  /* 4 values a step */
#endif
    for (; i < n; i++) {  /* log1p from the table, or left for numpy */
        double a = v[i], m = fabs(a);
        if (m < (double)k) {
            int64_t j = (int64_t)m;
            if ((double)j == m) { v[i] = copysign(t[j], a); continue; }  /* a is no -0.0 */
        }
        r[left++] = i;
    }
    return left;
}

/* dense_prepare(x, fill, lo, hi, mode, table, rest) -> values left, or -1: one run of dense
 * features (float64 rows of x, in place) through dense_transform's first steps, as numpy takes
 * them: NaN -> fill, clip to [lo, hi], then for mode 1 (log1p) max(x, 0) and log1p, for mode 2
 * (sign_log1p) sign(x) * log1p(|x|). log1p is table[k] (numpy's log1p of k, made by the caller:
 * the same bits by construction) where |x| is an integer k below the table's length; the other
 * values are left clipped (and max(x, 0)'d) with their positions in rest (int64, one per value
 * at least), for numpy's log1p. Returns -1, x untouched, when a value is -0.0 after fill and
 * clip (numpy's max and sign of a signed zero are not pinned down: the caller's numpy path
 * decides); the caller keeps fill, lo and hi free of NaN and signed-zero bounds. */
static PyObject *dense_prepare(PyObject *self, PyObject *args) {
    Py_buffer x, table, rest;
    double fill, lo, hi;
    int mode;
    if (!PyArg_ParseTuple(args, "w*dddiy*w*", &x, &fill, &lo, &hi, &mode, &table, &rest)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = x.len / 8, k = table.len / 8;
    if (x.len % 8 || table.len % 8 || rest.len < n * 8 || mode < 0 || mode > 2 || fill != fill || lo != lo || hi != hi) {
        PyErr_SetString(PyExc_ValueError, "ember native dense_prepare: x float64, table float64, rest int64 of x's "
                                          "size or more, mode 0, 1 or 2, fill / lo / hi not NaN");
        goto done;
    }
    {
        double *v = x.buf;
        const double *t = table.buf;
        int64_t *r = rest.buf;
        Py_ssize_t left;
        Py_BEGIN_ALLOW_THREADS
        left = dense_prepare_run(v, n, fill, lo, hi, mode, t, k, r);
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(left);
    }
done:
    PyBuffer_Release(&x); PyBuffer_Release(&table); PyBuffer_Release(&rest);
    return res;
}

/* dense_finish(x, scaled, means, stds, out) -> None: the dense rows x (float64 [R, n]) as the
 * batch's float32 [n, R], row r standardized first where scaled[r] ((x - mean) / std, two
 * roundings as numpy makes them), then rounded to float32 (as numpy's astype). */
static PyObject *dense_finish(PyObject *self, PyObject *args) {
    Py_buffer x, scaled, means, stds, out;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*", &x, &scaled, &means, &stds, &out)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t rows = scaled.len, n = rows ? x.len / 8 / rows : 0;
    if (x.len % 8 || means.len != rows * 8 || stds.len != rows * 8 || (rows && x.len != rows * n * 8) || out.len != x.len / 2) {
        PyErr_SetString(PyExc_ValueError, "ember native dense_finish: x float64 [R, n], scaled uint8 [R], means and "
                                          "stds float64 [R], out float32 [n, R]");
        goto done;
    }
    {
        const double *v = x.buf, *mu = means.buf, *sd = stds.buf;
        const uint8_t *sc = scaled.buf;
        float *o = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t a = 0; a < n; a += 64) {  /* tiles of 64 batch rows: each output line written while in cache */
            Py_ssize_t b = a + 64 < n ? a + 64 : n;
            for (Py_ssize_t r = 0; r < rows; r++) {
                const double *row = v + r * n;
                if (sc[r]) {
                    double m = mu[r], s = sd[r];
                    for (Py_ssize_t i = a; i < b; i++) o[i * rows + r] = (float)((row[i] - m) / s);
                } else {
                    for (Py_ssize_t i = a; i < b; i++) o[i * rows + r] = (float)row[i];
                }
            }
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    PyBuffer_Release(&x); PyBuffer_Release(&scaled); PyBuffer_Release(&means); PyBuffer_Release(&stds);
    PyBuffer_Release(&out);
    return res;
}

/* csv_bytes' pass, 32 bytes a step (GCC's vector extension: AVX2 or two SSE2 halves; one read of
 * each byte): newlines counted in 8-bit lanes for up to 255 steps at a time, quotes, CRs and
 * high bits OR-ed per lane; the rest byte by byte. Flags 1, 2, 4 as csv_bytes says. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static Py_ssize_t csv_bytes_run(const uint8_t *d, Py_ssize_t n, long *flags) {
    Py_ssize_t lines = 0, i = 0;
    uint8_t quote = 0, cr = 0, high = 0;
#if defined(__GNUC__)
    typedef uint8_t u8x32 __attribute__((vector_size(32)));
    u8x32 vq = {0}, vr = {0}, vh = {0};
    while (n - i >= 32) {
        u8x32 count = {0};
        Py_ssize_t steps = (n - i) / 32 < 255 ? (n - i) / 32 : 255;
        for (Py_ssize_t k = 0; k < steps; k++, i += 32) {
            u8x32 v;
            memcpy(&v, d + i, 32);
            count -= (u8x32)(v == '\n');  /* a true lane is all ones: -1 */
            vq |= (u8x32)(v == '"');
            vr |= (u8x32)(v == '\r');
            vh |= v;
        }
        for (int k = 0; k < 32; k++) lines += count[k];
    }
    for (int k = 0; k < 32; k++) { quote |= vq[k]; cr |= vr[k]; high |= vh[k]; }
#endif
    for (; i < n; i++) {
        uint8_t b = d[i];
        lines += b == '\n';
        quote |= b == '"';
        cr |= b == '\r';
        high |= b;
    }
    *flags = (quote ? 1 : 0) | (cr ? 2 : 0) | (high & 0x80 ? 4 : 0);
    return lines;
}

/* csv_bytes(data) -> (newlines, flags): what ember.source.csv asks of a block of CSV text before
 * it splits it, in one pass instead of four (a newline count, two byte searches and an ASCII
 * check): the number of '\n' bytes, and flags 1 = a '"' byte, 2 = a '\r', 4 = a byte >= 0x80 (not
 * ASCII). */
static PyObject *csv_bytes(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    long flags = 0;
    Py_ssize_t lines;
    Py_BEGIN_ALLOW_THREADS
    lines = csv_bytes_run(buf.buf, buf.len, &flags);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("nl", lines, flags);
}

/* csv_hazards(data) -> flags: what in a block of CSV text a typed read (pyarrow's CSV number
 * parsers) would take differently from ember's text path (ember.source.csv): 1 = an 'x' or 'X'
 * byte (Arrow reads "0x1f" as an integer), 2 = a '(' (Arrow reads "nan(1)" as NaN), 4 = a run
 * of 20 or more ASCII digits (Arrow reads zero-padded integers of any length). One pass: memchr
 * for the bytes, 8 bytes a step for the digit runs. */
static PyObject *csv_hazards(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const uint8_t *d = buf.buf;
    Py_ssize_t n = buf.len;
    long flags = 0;
    Py_BEGIN_ALLOW_THREADS
    if (memchr(d, 'x', n) || memchr(d, 'X', n)) flags |= 1;
    if (memchr(d, '(', n)) flags |= 2;
    Py_ssize_t run = 0, i = 0;
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t hi = 0x8080808080808080ULL;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, d + i, 8);
        /* per byte: high bit set iff the byte is an ASCII digit ('0' <= b <= '9', b < 0x80) */
        uint64_t ge0 = (w | hi) - 0x3030303030303030ULL;
        uint64_t gt9 = (w & ~hi) + 0x4646464646464646ULL;
        uint64_t other = ~(ge0 & ~gt9 & ~w) & hi;  /* high bit of each byte that is not a digit */
        if (!other) {
            if ((run += 8) >= 20) { flags |= 4; break; }
            continue;
        }
        if (run + (__builtin_ctzll(other) >> 3) >= 20) { flags |= 4; break; }
        run = __builtin_clzll(other) >> 3;  /* digits at the word's end (a run inside it is < 8) */
    }
#endif
    if (!(flags & 4)) {
        for (; i < n; i++) {
            if ((unsigned)(d[i] - '0') <= 9u) {
                if (++run >= 20) { flags |= 4; break; }
            } else {
                run = 0;
            }
        }
        if (run >= 20) flags |= 4;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromLong(flags);
}

/* csv_split(data, delimiter, ncols, slots, n, out_starts, out_offsets, crlf=0) -> n, or -1: the
 * fields of a block of n CSV lines without quotes (ember.source.csv; each line ends with '\n' and
 * holds exactly ncols fields split on the delimiter byte, as pyarrow splits such text). slots
 * int64 [ncols]: the output slot of each field, -1 for none; for slot s and row i,
 * out_starts[s * n + i] (int32) is where the field starts in data and out_offsets[s, :] (int32
 * [k, n + 1]) the running sums of the fields' lengths from 0 (Arrow string offsets; all 0 for a
 * slot no field fills). -1 when a
 * line holds another number of fields, there are not n lines, or the data do not end with
 * '\n' (the caller's pyarrow path then judges the block). crlf: the block holds CRs, each of
 * which must end a line (CRLF; else -1: pyarrow reads a lone CR as a line end); none is part of
 * its line's last field. Without crlf the caller has seen no CR. Two passes: every separator's position
 * in order (64 bytes at a time as bit masks flattened eight positions a step, SSE2; else eight
 * bytes a step between them), then each read field's starts and lengths slot by slot, from the
 * positions (field j of line r ends at separator r * ncols + j). One pass driving a per-field
 * state machine spent ~13 ns a field on its branches (the separators of a 64-byte chunk vary in
 * number) and wrote 2k column-major streams through a staging buffer. */
#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define CSV_SPLIT_SSE2 1
#endif

#ifdef CSV_SPLIT_SSE2
/* csv_split's pass 1 over the block's whole 64-byte chunks: the separators' positions appended
 * to pos (cnt of them, nls newlines; ok = 0 past cap); returns the bytes done. Compiled twice
 * where GCC dispatches at load time: with POPCNT (x86-64-v2) and without, where each popcount is
 * a call into libgcc (15 % of the split's time, measured); the same positions either way. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v2", "default")))
#endif
static Py_ssize_t csv_seps_sse2(const uint8_t *d, Py_ssize_t len, int delim, int32_t *pos, Py_ssize_t cap,
                                Py_ssize_t *cnt_out, Py_ssize_t *nls_out, int *ok) {
    const __m128i dv = _mm_set1_epi8((char)delim), nv = _mm_set1_epi8('\n');
    Py_ssize_t i = 0, cnt = *cnt_out, nls = *nls_out;
    for (; i + 64 <= len; i += 64) {
        uint64_t dm = 0, nm = 0;
        for (int q = 0; q < 4; q++) {
            __m128i w = _mm_loadu_si128((const __m128i *)(d + i + 16 * q));
            dm |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(w, dv)) << (16 * q);
            nm |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(w, nv)) << (16 * q);
        }
        uint64_t m = dm | nm;
        int c = __builtin_popcountll(m);
        if (cnt + c > cap) { *ok = 0; break; }
        nls += __builtin_popcountll(nm);
        int32_t *p = pos + cnt, base = (int32_t)i;
        while (m) {  /* eight a step, whatever the count (past the last: garbage the next chunk overwrites) */
            for (int u = 0; u < 8; u++) {
                p[u] = base + __builtin_ctzll(m | (1ULL << 63));  /* (63 once m is spent: no undefined ctz(0)) */
                m &= m - 1;
            }
            p += 8;
        }
        cnt += c;
    }
    *cnt_out = cnt;
    *nls_out = nls;
    return i;
}
#endif

static PyObject *csv_split(PyObject *self, PyObject *args) {
    Py_buffer buf, slots, starts, offs;
    int delim;
    Py_ssize_t ncols, n;
    int crlf = 0;
    if (!PyArg_ParseTuple(args, "y*iny*nw*w*|p", &buf, &delim, &ncols, &slots, &n, &starts, &offs, &crlf)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t k = 0;
    const int64_t *map = slots.buf;
    if (ncols < 1 || n < 0 || delim < 0 || delim > 255 || delim == '\n' || slots.len != ncols * 8 || buf.len > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "ember native csv_split: ncols >= 1, slots int64 [ncols], a delimiter byte "
                                          "other than '\\n', data under 2 GiB");
        goto done;
    }
    for (Py_ssize_t j = 0; j < ncols; j++) {
        if (map[j] >= ncols || map[j] < -1) {
            PyErr_SetString(PyExc_ValueError, "ember native csv_split: slots must be -1 or below ncols");
            goto done;
        }
        if (map[j] >= k) k = map[j] + 1;
    }
    if (starts.len < k * n * 4 || offs.len < k * (n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native csv_split: out_starts int32 [k * n], out_offsets int32 [k, n + 1] "
                                          "for k = max(slots) + 1");
        goto done;
    }
    {
        const uint8_t *d = buf.buf;
        Py_ssize_t len = buf.len, i = 0;
        int32_t *st = starts.buf, *of = offs.buf;
        Py_ssize_t cap = n * ncols, cnt = 0, nls = 0;
        if (n > len || cap > len) {  /* more separators than bytes: not n lines of ncols fields (no allocation for it) */
            res = PyLong_FromSsize_t(-1);
            goto done;
        }
        int32_t *pos = PyMem_Malloc(((size_t)cap + 72) * sizeof(int32_t));  /* + slack: flattening writes 8 at a time */
        if (!pos) {
            PyErr_NoMemory();
            goto done;
        }
        int ok = 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t s = 0; s < k; s++) {  /* a slot no field fills: no fields, all empty */
            int used = 0;
            for (Py_ssize_t j = 0; j < ncols && !used; j++) used = map[j] == s;
            if (!used) {
                memset(st + s * n, 0, (size_t)n * 4);
                memset(of + s * (n + 1), 0, (size_t)(n + 1) * 4);
            }
        }
        /* pass 1: every separator's position, in order (at most n * ncols of them) */
#ifdef CSV_SPLIT_SSE2
        i = csv_seps_sse2(d, len, delim, pos, cap, &cnt, &nls, &ok);
#endif
        {
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            const uint64_t dm = ones * (uint64_t)delim, nm = ones * (uint64_t)'\n';
            while (ok && i < len) {
                if (i + 8 <= len) {  /* the first separator among the next 8 bytes, if any */
                    uint64_t w = load_le64(d + i), a = w ^ dm, b = w ^ nm;
                    uint64_t t = ((a - ones) & ~a & high) | ((b - ones) & ~b & high);
                    if (!t) { i += 8; continue; }
                    i += __builtin_ctzll(t) >> 3;  /* the lowest flagged byte is exact */
                }
                uint8_t c = d[i];
                if (c == delim || c == '\n') {
                    if (cnt >= cap) { ok = 0; break; }
                    pos[cnt++] = (int32_t)i;
                    nls += c == '\n';
                }
                i++;
            }
        }
        /* n lines of ncols fields: n * ncols separators, n of them newlines, each line's last one
         * among them (so no other), the last at the data's end */
        ok = ok && cnt == cap && nls == n && (n ? pos[cap - 1] == len - 1 : len == 0);
        for (Py_ssize_t r = 0; ok && r < n; r++) ok = d[pos[r * ncols + ncols - 1]] == '\n';
        if (ok && crlf) {  /* every CR ends its line's last field, just before the LF (a CRLF line end) */
            Py_ssize_t crs = 0, ends = 0;
            for (const uint8_t *p = d, *e = d + len; (p = memchr(p, '\r', (size_t)(e - p))) != NULL; p++) crs++;
            for (Py_ssize_t r = 0; r < n; r++) {
                int32_t e = pos[r * ncols + ncols - 1], a = r * ncols + ncols - 1 ? pos[r * ncols + ncols - 2] + 1 : 0;
                ends += e > a && d[e - 1] == '\r';
            }
            ok = crs == ends;
        }
        /* pass 2: each read field's starts and lengths, slot by slot (runs in the outputs) */
        for (Py_ssize_t j = 0; ok && j < ncols; j++) {
            int64_t s = map[j];
            if (s < 0) continue;
            int32_t *ss = st + s * n, *ls = of + s * (n + 1) + 1;
            const int32_t *end = pos + j;
            for (Py_ssize_t r = 0; r < n; r++) {
                int32_t a = j || r ? end[r * ncols - 1] + 1 : 0;  /* after the separator before it */
                ss[r] = a;
                ls[r] = end[r * ncols] - a;  /* a length; summed after */
            }
            if (crlf && j == ncols - 1)  /* a CRLF line end's CR is no part of the last field */
                for (Py_ssize_t r = 0; r < n; r++) ls[r] -= ls[r] > 0 && d[end[r * ncols] - 1] == '\r';
        }
        for (Py_ssize_t s = 0; ok && s < k; s++) {
            int32_t *o = of + s * (n + 1);
            int64_t sum = 0;
            o[0] = 0;
            for (Py_ssize_t r = 1; r <= n; r++) { sum += o[r]; o[r] = (int32_t)sum; }
        }
        Py_END_ALLOW_THREADS
        PyMem_Free(pos);
        res = PyLong_FromSsize_t(ok ? n : -1);
    }
done:
    PyBuffer_Release(&buf); PyBuffer_Release(&slots); PyBuffer_Release(&starts); PyBuffer_Release(&offs);
    return res;
}

/* csv_ints(data, starts, offsets, n, out, valid, nulls) -> None: csv_split's fields of m slots
 * (starts int32 [m * n], offsets int32 [m, n + 1]: the first m slots of its outputs, or a slice
 * of them) read as decimal integer IDs where every field of a slot is one, without gathering their
 * text: for slot s and row i, an empty field is null (valid bit 0, out 0), else the ID
 * fz_parse_id reads (featurize_ids' kind 2: -?[0-9]{1,19} within int64); out int64 [m * n],
 * valid uint8 [m, (n + 7) / 8] (Arrow's validity bits), nulls int64 [m]: the slot's empty fields,
 * or -1 when a field is no ID (the slot's out and valid then undefined: the caller keeps its
 * text). Tiles of CSV_INT_ROWS rows, slot by slot within a tile (each slot's inputs and outputs
 * in runs: a row at a time over all slots read and wrote 4m streams 4n-8n bytes apart, 1.6-2x
 * slower), each field's bytes prefetched CSV_INT_AHEAD rows ahead (a line ~560 bytes from the
 * last one's: without, its first byte's load was the kernel's largest stall). */
#define CSV_INT_ROWS 64
#define CSV_INT_AHEAD 8

/* csv_ints' pass with the ID parse PARSE: returns 1 when a field lies outside the data */
#define CSV_INTS_BODY(PARSE)                                                                                  \
    Py_ssize_t nb = (n + 7) / 8;                                                                             \
    for (Py_ssize_t i0 = 0; i0 < n; i0 += CSV_INT_ROWS) {                                                    \
        Py_ssize_t i1 = i0 + CSV_INT_ROWS < n ? i0 + CSV_INT_ROWS : n;                                       \
        for (Py_ssize_t s = 0; s < m; s++) {                                                                 \
            const int32_t *os = of + s * (n + 1), *ss = st + s * n;                                          \
            int64_t *out_s = o + s * n;                                                                      \
            uint8_t *v_s = v + s * nb;                                                                       \
            for (Py_ssize_t i = i0; i < i1 && nu[s] >= 0; i++) {                                             \
                if (i + CSV_INT_AHEAD < n) __builtin_prefetch(d + ss[i + CSV_INT_AHEAD]);                    \
                int64_t a = ss[i], len = (int64_t)os[i + 1] - os[i], x = 0;                                  \
                if (a < 0 || len < 0 || a + len > dlen) return 1;                                            \
                if (len == 0) {                                                                              \
                    nu[s]++;                                                                                 \
                } else if (PARSE(d + a, d + a + len, &x) > 0) {                                              \
                    v_s[i >> 3] |= (uint8_t)(1u << (i & 7));                                                 \
                } else {                                                                                     \
                    nu[s] = -1;                                                                              \
                    break;                                                                                   \
                }                                                                                            \
                out_s[i] = x;                                                                                \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    return 0;

#define CSV_INTS_ARGS const uint8_t *d, Py_ssize_t dlen, const int32_t *st, const int32_t *of, Py_ssize_t n, \
                      Py_ssize_t m, int64_t *o, uint8_t *v, int64_t *nu

static int csv_ints_run(CSV_INTS_ARGS) { CSV_INTS_BODY(fz_parse_id) }

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <smmintrin.h>
#define FZ_SSE41 1
/* fz_parse_id with the first 16 digits of a 16-19 digit ID converted at once (SSE4.1: digit pairs,
 * then groups of 4 and 8 by multiply-adds), the rest as fz_parse_id does; any other text goes to
 * fz_parse_id itself: the same IDs and the same refusals. */
__attribute__((target("sse4.1"))) static inline int fz_parse_id_sse41(const uint8_t *p, const uint8_t *e, int64_t *id) {
    int neg = *p == '-';
    const uint8_t *q = p + neg;
    Py_ssize_t len = e - q;
    if (len < 16 || len > 19) return fz_parse_id(p, e, id);
    __m128i t = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)q), _mm_set1_epi8('0'));
    __m128i nine = _mm_set1_epi8(9);
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(t, nine), nine)) != 0xFFFF) return fz_parse_id(p, e, id);
    t = _mm_maddubs_epi16(t, _mm_set_epi8(1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10));
    t = _mm_madd_epi16(t, _mm_set_epi16(1, 100, 1, 100, 1, 100, 1, 100));
    t = _mm_packus_epi32(t, t);
    t = _mm_madd_epi16(t, _mm_set_epi16(1, 10000, 1, 10000, 1, 10000, 1, 10000));
    uint64_t v = (uint64_t)(uint32_t)_mm_cvtsi128_si32(t) * 100000000ULL + (uint32_t)_mm_extract_epi32(t, 1);
    for (q += 16; q < e; q++) {
        unsigned ch = (unsigned)*q - '0';
        if (ch > 9u) return fz_parse_id(p, e, id);
        v = v * 10 + ch;
    }
    return fz_id_of(v, (uint64_t)neg, id);
}

__attribute__((target("sse4.1"))) static int csv_ints_sse41(CSV_INTS_ARGS) { CSV_INTS_BODY(fz_parse_id_sse41) }
#endif

static PyObject *csv_ints(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, offs, out, valid, nulls;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*w*w*", &buf, &starts, &offs, &n, &out, &valid, &nulls)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t m = nulls.len / 8, nb = (n + 7) / 8;
    if (n < 0 || nulls.len != m * 8 || starts.len != m * n * 4 || offs.len != m * (n + 1) * 4 || out.len != m * n * 8
        || valid.len != m * nb) {
        PyErr_SetString(PyExc_ValueError, "ember native csv_ints: starts int32 [m * n], offsets int32 [m, n + 1], "
                                          "out int64 [m * n], valid uint8 [m, (n + 7) / 8], nulls int64 [m]");
        goto done;
    }
    {
        const uint8_t *d = buf.buf;
        const int32_t *st = starts.buf, *of = offs.buf;
        int64_t *o = out.buf, *nu = nulls.buf;
        uint8_t *v = valid.buf;
        Py_ssize_t dlen = buf.len;
        int bad;
        Py_BEGIN_ALLOW_THREADS
        memset(v, 0, (size_t)(m * nb));
        for (Py_ssize_t s = 0; s < m; s++) nu[s] = 0;
#ifdef FZ_SSE41
        if (__builtin_cpu_supports("sse4.1")) bad = csv_ints_sse41(d, dlen, st, of, n, m, o, v, nu);
        else
#endif
        bad = csv_ints_run(d, dlen, st, of, n, m, o, v, nu);
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "ember native csv_ints: a field lies outside data (offsets must rise)");
        else { Py_INCREF(Py_None); res = Py_None; }
    }
done:
    PyBuffer_Release(&buf); PyBuffer_Release(&starts); PyBuffer_Release(&offs); PyBuffer_Release(&out);
    PyBuffer_Release(&valid); PyBuffer_Release(&nulls);
    return res;
}

/* csv_gather(data, starts, offsets, n, outs) -> None: csv_split's fields copied out, one Arrow
 * string data buffer per slot: outs a list of k writable buffers, out s of offsets[s, n] bytes,
 * gets field i of slot s (data[starts[s * n + i]:] of offsets[s, i + 1] - offsets[s, i] bytes)
 * at offsets[s, i]. The GIL released. */
static PyObject *csv_gather(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, offs;
    PyObject *outs;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*y*nO!", &buf, &starts, &offs, &n, &PyList_Type, &outs)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t k = PyList_GET_SIZE(outs), got = 0;
    Py_buffer *ob = PyMem_Calloc(k ? (size_t)k : 1, sizeof(Py_buffer));
    if (!ob) { PyErr_NoMemory(); goto done; }
    if (n < 0 || starts.len < k * n * 4 || offs.len < k * (n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "ember native csv_gather: starts int32 [k * n], offsets int32 [k, n + 1] for k outs");
        goto done;
    }
    const int32_t *st = starts.buf, *of = offs.buf;
    for (; got < k; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(outs, got), &ob[got], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        const int32_t *o = of + got * (n + 1);
        int bad = ob[got].len != o[n] || o[0] != 0;
        for (Py_ssize_t r = 0; !bad && r < n; r++)
            bad = o[r + 1] < o[r] || st[got * n + r] < 0 || (Py_ssize_t)st[got * n + r] + (o[r + 1] - o[r]) > buf.len;
        if (bad) {
            got++;
            PyErr_SetString(PyExc_ValueError, "ember native csv_gather: out s must hold offsets[s, n] bytes, offsets rise "
                                              "from 0 and every field lies within data");
            goto done;
        }
    }
    {
        const uint8_t *d = buf.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t s = 0; s < k; s++) {
            uint8_t *out = ob[s].buf;
            const int32_t *o = of + s * (n + 1), *ss = st + s * n;
            Py_ssize_t olen = ob[s].len, dlen = buf.len;
            for (Py_ssize_t r = 0; r < n; r++) {
                Py_ssize_t len = o[r + 1] - o[r];
                /* a short field as one fixed 32-byte copy where both sides have the room: the bytes
                 * past it are the next fields', written after it */
                if (len <= 32 && ss[r] + 32 <= dlen && o[r] + 32 <= olen) memcpy(out + o[r], d + ss[r], 32);
                else memcpy(out + o[r], d + ss[r], (size_t)len);
            }
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    if (ob) {
        for (Py_ssize_t s = 0; s < got; s++) PyBuffer_Release(&ob[s]);
        PyMem_Free(ob);
    }
    PyBuffer_Release(&buf); PyBuffer_Release(&starts); PyBuffer_Release(&offs);
    return res;
}

static PyMethodDef methods[] = {
    /* "name(arguments) -> result": ember/_ember_native.pyi and tests/native/test_stub.py rely on
     * these (names and count of arguments, "=" for optional ones, as PyArg_ParseTuple parses) */
    {"arrow_hash_strings", arrow_hash_strings, METH_VARARGS,
     "arrow_hash_strings(offsets, data, validity, off, n, width, salt, out, out_valid, parts=1) -> nulls"},
    {"arrow_hash_ints", arrow_hash_ints, METH_VARARGS,
     "arrow_hash_ints(values, validity, off, n, width, signed, salt, out, out_valid, parts=1) -> nulls"},
    {"arrow_parse_ints", arrow_parse_ints, METH_VARARGS,
     "arrow_parse_ints(offsets, data, validity, off, n, width, out, state) -> bad or -1"},
    {"featurize_ids", featurize_ids, METH_VARARGS,
     "featurize_ids(columns, n, out_values, out_lengths, out_offsets, out_counts, batch=None) -> total"},
    {"dense_floats", dense_floats, METH_VARARGS, "dense_floats(columns, n, out, out_done, batch=None) -> columns done"},
    {"dense_prepare", dense_prepare, METH_VARARGS, "dense_prepare(x, fill, lo, hi, mode, table, rest) -> values left"},
    {"dense_finish", dense_finish, METH_VARARGS, "dense_finish(x, scaled, means, stds, out) -> None"},
    {"csv_bytes", csv_bytes, METH_VARARGS, "csv_bytes(data) -> (newlines, flags)"},
    {"csv_hazards", csv_hazards, METH_VARARGS, "csv_hazards(data) -> flags"},
    {"csv_split", csv_split, METH_VARARGS, "csv_split(data, delimiter, ncols, slots, n, out_starts, out_offsets, crlf=False) -> n or -1"},
    {"csv_gather", csv_gather, METH_VARARGS, "csv_gather(data, starts, offsets, n, outs) -> None"},
    {"csv_ints", csv_ints, METH_VARARGS, "csv_ints(data, starts, offsets, n, out, valid, nulls) -> None"},
    {"probe_rows", probe_rows, METH_VARARGS, "probe_rows(tables, ids, bounds, out_slot, remove) -> found"},
    {"count_ids", count_ids, METH_VARARGS, "count_ids(tables, ids, bounds, adds, out, mode, stats, parts=None) -> placed or removed"},
    {"read_rows", read_rows, METH_VARARGS, "read_rows(tables, ids, bounds, out, out_slot, clocks, out_hits, r, dim, parts=None) -> found"},
    {"write_rows", write_rows, METH_VARARGS, "write_rows(tables, ids, bounds, slot, records, grads, next, clocks, used, free_at, seeds, steps, hyper, r, dim, parts=None) -> inserted"},
    {"index_add_features", index_add_features, METH_VARARGS, "index_add_features(out, index, srcs, strides, b, dim, parts=None) -> None"},
    {"rowwise_adagrad", rowwise_adagrad, METH_VARARGS, "rowwise_adagrad(rows, state, grads, n, dim, rs, ss, gs, lr, eps, parts=1) -> None"},
    {"bf16_pack_sr", bf16_pack_sr, METH_VARARGS, "bf16_pack_sr(records, ids, seeds, steps, out, dim, width, parts=1) -> None"},
    {"willneed", willneed, METH_VARARGS, "willneed(table, slots, w) -> pages advised"},
    {"willneed_cold", willneed_cold, METH_VARARGS, "willneed_cold(table, slots, w) -> pages advised"},
    {"disk_find", disk_find, METH_VARARGS, "disk_find(tags, table, ids, out_slot, out_rows, w, parts=1) -> slots read"},
    {"disk_write", disk_write, METH_VARARGS, "disk_write(table, slots, ids, recs, w, parts=1) -> None"},
    {"gather_rows", gather_rows, METH_VARARGS, "gather_rows(src, slots, out, w, r=w, parts=1) -> None"},
    {"scatter_rows", scatter_rows, METH_VARARGS, "scatter_rows(dst, slots, rows, w) -> None"},
    {"index_add_rows", index_add_rows, METH_VARARGS, "index_add_rows(out, index, src, dim, stride) -> None"},
    {"tag_find", tag_find, METH_VARARGS, "tag_find(tags, pos, tag, out) -> None"},
    {"tag_claim", tag_claim, METH_VARARGS, "tag_claim(tags, pos, tag, out) -> empty slots used"},
    {"uniform01", uniform01, METH_VARARGS, "uniform01(ids, keys, dim, out, mul=1, add=0, parts=1) -> None"},
    {"normal01", normal01, METH_VARARGS, "normal01(ids, keys1, keys2, dim, out, std, parts=1) -> None"},
    {"fresh_uniform", fresh_uniform, METH_VARARGS,
     "fresh_uniform(ids, keys, at, out, width, dim, mul, add, fill, bf16, parts=1) -> None"},
    {"probe", probe, METH_VARARGS, "probe(keys, slots, ids, out_bucket, out_slot) -> found"},
    {"cms", cms, METH_VARARGS, "cms(table, ids, counts, seeds, width, out) -> None"},
    {"pair_find", pair_find, METH_VARARGS,
     "pair_find(keys, slots, ids, salt, slot_id, count, last, held, clock, out, parts=1) -> hits"},
    {"gc_scores", gc_scores, METH_VARARGS, "gc_scores(last, count, live, held, lru, score, start, stop, parts=1) -> (valid, lo, hi)"},
    {"gc_select", gc_select, METH_VARARGS, "gc_select(score, valid, lo, hi, out_slot, out_score) -> found"},
    {"gc_requeue", gc_requeue, METH_VARARGS, "gc_requeue(last, count, live, held, lru, q_slot, q_score) -> kept"},
    {"gc_reserve", gc_reserve, METH_VARARGS,
     "gc_reserve(free, nfree, new, tables, est, clock, owner, count, last, held, w_slots) -> None"},
    {"gc_insert", gc_insert, METH_VARARGS,
     "gc_insert(keys, slots, ids, tables, at, mix, slot_id, owner, live, rows_of) -> empty buckets used"},
    {"gc_release", gc_release, METH_VARARGS, "gc_release(held, at) -> None"},
    {"place", place, METH_VARARGS, "place(keys, slots, ids, new_slots) -> empty buckets used"},
    {"rehash", rehash, METH_VARARGS, "rehash(keys, slots, old_keys, old_slots) -> empty buckets used"},
    {"unique_segments", unique_segments, METH_VARARGS,
     "unique_segments(ids, bounds, out_uniq, out_inverse, out_counts, parts=None) -> total unique"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ember_native", NULL, -1, methods};

/* The module; OPENMP = 1 when its kernels' parts run on OpenMP's threads (run_parts). */
PyMODINIT_FUNC PyInit__ember_native(void) {
    PyObject *m = PyModule_Create(&module);
#ifdef _OPENMP
    const long openmp = 1;
#else
    const long openmp = 0;
#endif
    if (m && PyModule_AddIntConstant(m, "OPENMP", openmp) < 0) { Py_DECREF(m); return NULL; }
    pthread_atfork(NULL, NULL, on_fork_child);
    return m;
}
