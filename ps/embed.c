/* Embedding tables (embed.h): the data structure.
 *
 * A stripe keeps its rows as records in chunks of 256 (the first 8 from
 * malloc, the rest from the table's pool of huge-page blocks: "chunks"
 * below), numbered densely 0..nrec-1 (a removed row's place takes the last
 * record), and finds them through an open-addressing index of 32-bit
 * entries, linear probing, at most 3/4 full:
 *
 *   entry  = tag << 26 | (record + 1)      0: empty
 *   record = key (8 bytes) | step (u32) | time (u32) | count (u32)
 *            | row (dim floats) | slots (dim floats each)
 *
 * The tag (6 bits of the key's hash) skips 63 of 64 records that share a
 * probe run without reading them.  Overhead beyond key, row and slots is
 * the 12 bytes of step, time and count, plus 4 bytes of index per entry
 * at a load of 3/8 to 3/4: 17.3 to 22.7 bytes a row.  Removal shifts the
 * probe run back (no tombstones), so a table that churns keeps its size.
 *
 * step is the table's global step when the row was last touched (the
 * largest step a call has brought), time the centiseconds since the
 * table was made (saturating at 497 days), count the training lookups
 * since the row was made (saturating).  They serve expiry (step, time),
 * LRU (time, then step) and LFU (count, then time).
 *
 * Eviction samples: at capacity, 16 records of the stripe picked at
 * random (all of them when it holds no more) are compared and the least
 * recently (or frequently) used goes, Redis's approximation of LRU; an
 * expired one goes first.  Expiry is lazy plus a sweep: a row found
 * expired is removed then, and each training lookup's visit to a stripe
 * examines twice as many records as it touched, plus 16 (an update's:
 * 16), from a cursor that walks the stripe, so every row is seen again
 * while traffic flows and the cost stays proportional to the step.
 *
 * Admission counts unseen keys in a count-min sketch per stripe (depth
 * rows of 16-bit counters, conservative update), never one entry per
 * key: a key gets its row once its estimate reaches min_count.  The
 * sketch may overcount (a key admitted early), never undercount. */
#include "embed.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/embed_key.h"
#include "common/init.h"
#include "common/kernels.h"
#include "common/tensor.h"

#define CHUNK_BITS 8
#define CHUNK_ROWS ((uint32_t)1 << CHUNK_BITS)
#define CHUNK_MASK (CHUNK_ROWS - 1)
#define ID_BITS 26
#define ID_MASK (((uint32_t)1 << ID_BITS) - 1)
#define HDR 20 /* key, step, time, count */
#define SAMPLES 16
#define MIN_INDEX_BITS 4
#define DEFAULT_SEED 87654321
#define HUGE_BYTES ((size_t)2 << 20)
#define MALLOC_CHUNKS 8 /* a stripe's first chunks; the rest come from the pool */
#define BLOCK_HDR 64

/* A 2 MiB block cut into pieces of one size for indexes (ix_alloc). */
struct ixblock {
  uint8_t *base;
  size_t piece;
  uint32_t used; /* a bit per piece */
  struct ixblock *next;
};

/* a freed chunk of a block, on its table's free list */
struct fchunk {
  struct fchunk *prev, *next;
};

typedef struct stripe {
  pthread_mutex_t mu;
  uint32_t *index;
  unsigned bits; /* the index has 1 << bits entries (0: none yet) */
  uint8_t **chunks;
  size_t nchunks, chunks_cap;
  uint32_t nrec;
  uint32_t cursor; /* the sweep's next record */
  uint64_t rng;
  uint16_t *sketch;           /* depth x width, made at the first unseen key */
  struct ps_embed_snap *snap; /* a snapshot that has not copied this stripe yet */
  int64_t cap;                /* rows at most (0: no bound) */
} stripe;

struct ps_embed_table {
  atomic_int refs;
  ps_embed_spec spec; /* normalized; name and init values owned */
  int nslots;
  size_t stride; /* bytes of a record */
  size_t chunk_bytes;
  size_t cpb; /* chunks a block holds (0: every chunk from malloc) */
  struct pool {
    pthread_mutex_t mu;
    uint8_t *cur;        /* the block chunks are carved from, or NULL */
    struct fchunk *free; /* freed chunks of the blocks, to reuse */
    size_t nblocks;
    struct ixblock *ix; /* the blocks that hold indexes (ix_alloc), a list */
  } pool;
  uint64_t seed; /* the initializer's, mixed with the table's name */
  int nstripes;
  unsigned sketch_bits;
  struct timespec born;
  atomic_llong step; /* the largest global step seen */
  atomic_llong rows, bytes, evicted, expired, refused, created;
  stripe stripes[];
};

struct ps_embed_store {
  pthread_mutex_t mu;
  ps_embed_table **v;
  size_t n, cap;
};

/* ---- names ---- */

static const char *const opt_names[] = {"none", "adagrad", "adam", "ftrl"};
static const char *const evict_names[] = {"lru", "lfu"};
static const char *const op_names[] = {"ScatterAdd", "ApplyGradientDescent",
                                       "ApplyAdagrad", "ApplyAdam", "ApplyFtrl"};
static const size_t op_hparams[] = {0, 1, 1, 6, 4};

int ps_embed_optimizer_slots(ps_embed_optimizer o) {
  return o == PS_EMBED_OPT_ADAGRAD ? 1 : o == PS_EMBED_OPT_NONE ? 0 : 2;
}

const char *ps_embed_optimizer_name(ps_embed_optimizer o) {
  return (unsigned)o < 4 ? opt_names[o] : "unknown";
}

int ps_embed_optimizer_from_name(const char *s) {
  for (int i = 0; s && i < 4; i++)
    if (strcmp(s, opt_names[i]) == 0) return i;
  if (s && (strcmp(s, "") == 0 || strcmp(s, "sgd") == 0)) return PS_EMBED_OPT_NONE;
  return -1;
}

const char *ps_embed_evict_name(ps_embed_evict e) {
  return (unsigned)e < 2 ? evict_names[e] : "unknown";
}

int ps_embed_evict_from_name(const char *s) {
  if (s == NULL || s[0] == '\0') return PS_EMBED_EVICT_LRU;
  for (int i = 0; i < 2; i++)
    if (strcmp(s, evict_names[i]) == 0) return i;
  return -1;
}

const char *ps_embed_op_name(ps_embed_op op) {
  return (unsigned)op < PS_EMBED_NUM_OPS ? op_names[op] : "unknown";
}

size_t ps_embed_op_hparams(ps_embed_op op) {
  return (unsigned)op < PS_EMBED_NUM_OPS ? op_hparams[op] : 0;
}

/* ---- the spec ---- */

static int bad(ps_status *st, const char *name, const char *what, long long v,
               const char *range) {
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "TableCreate %s: %s %lld is out of range (%s)", name, what, v,
                       range);
}

int ps_embed_check_spec(const ps_embed_spec *sp, ps_status *st) {
  const char *n = sp->name ? sp->name : "";
  const ps_embed_policy *p = &sp->policy;
  if (n[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TableCreate: a table needs a name");
  if (strlen(n) > 255)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableCreate %.64s...: the name is longer than 255 bytes", n);
  if (sp->dtype != PS_DT_FLOAT)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableCreate %s: dtype %s is not supported (a table holds "
                         "float rows)",
                         n, ps_dtype_name(sp->dtype));
  if (sp->dim < 1 || sp->dim > PS_EMBED_MAX_DIM)
    return bad(st, n, "dim", (long long)sp->dim, "1 to 65536");
  if ((unsigned)sp->optimizer > PS_EMBED_OPT_FTRL)
    return bad(st, n, "optimizer", (long long)sp->optimizer, "none, adagrad, adam, ftrl");
  if (!isfinite(sp->slot_init) || sp->slot_init < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableCreate %s: slot_init %g is out of range (0 or more; "
                         "0: 0.1)",
                         n, sp->slot_init);
  if (p->min_count < 0 || p->min_count > PS_EMBED_MAX_MIN_COUNT)
    return bad(st, n, "min_count", (long long)p->min_count, "0 to 65535");
  if (p->sketch_width != 0 &&
      (p->sketch_width < 64 || p->sketch_width > PS_EMBED_MAX_SKETCH_WIDTH))
    return bad(st, n, "sketch_width", (long long)p->sketch_width,
               "64 to 1073741824; 0: 1048576");
  if (p->sketch_depth < 0 || p->sketch_depth > PS_EMBED_MAX_SKETCH_DEPTH)
    return bad(st, n, "sketch_depth", (long long)p->sketch_depth, "1 to 8; 0: 4");
  if (p->ttl_steps < 0)
    return bad(st, n, "ttl_steps", (long long)p->ttl_steps, "0 or more");
  if (p->ttl_seconds < 0 || p->ttl_seconds > (int64_t)(UINT32_MAX / 100))
    return bad(st, n, "ttl_seconds", (long long)p->ttl_seconds, "0 to 42949672");
  if (p->max_rows < 0 || p->max_rows > PS_EMBED_STRIPES * PS_EMBED_MAX_STRIPE_ROWS)
    return bad(st, n, "max_rows", (long long)p->max_rows, "0 to 4294967168");
  if ((unsigned)p->evict > PS_EMBED_EVICT_LFU)
    return bad(st, n, "evict", (long long)p->evict, "lru or lfu");
  ps_shape row = {.rank = 1, .dim = {sp->dim}};
  ps_init_spec init = sp->init;
  if (init.seed == 0) init.seed = DEFAULT_SEED;
  return ps_init_check(&init, n, sp->dtype, &row, 0, sp->dim, st);
}

static void normalize(ps_embed_spec *sp) {
  if (sp->policy.sketch_width == 0)
    sp->policy.sketch_width = PS_EMBED_DEFAULT_SKETCH_WIDTH;
  if (sp->policy.sketch_depth == 0)
    sp->policy.sketch_depth = PS_EMBED_DEFAULT_SKETCH_DEPTH;
  if (sp->policy.min_count == 0) sp->policy.min_count = 1;
  if (sp->slot_init == 0) sp->slot_init = 0.1;
  if (sp->init.seed == 0) sp->init.seed = DEFAULT_SEED;
}

/* The first field in which @a and @b differ, or NULL. */
static const char *spec_diff(const ps_embed_spec *a, const ps_embed_spec *b) {
  const ps_embed_policy *p = &a->policy, *q = &b->policy;
  if (a->dtype != b->dtype) return "dtype";
  if (a->dim != b->dim) return "dim";
  if (a->optimizer != b->optimizer) return "optimizer";
  if (a->slot_init != b->slot_init) return "slot_init";
  if (p->min_count != q->min_count) return "min_count";
  if (p->sketch_width != q->sketch_width) return "sketch_width";
  if (p->sketch_depth != q->sketch_depth) return "sketch_depth";
  if (p->ttl_steps != q->ttl_steps) return "ttl_steps";
  if (p->ttl_seconds != q->ttl_seconds) return "ttl_seconds";
  if (p->max_rows != q->max_rows) return "max_rows";
  if (p->evict != q->evict) return "evict";
  const ps_init_spec *i = &a->init, *j = &b->init;
  if (i->type != j->type || i->value != j->value || i->minval != j->minval ||
      i->maxval != j->maxval || i->mean != j->mean || i->stddev != j->stddev ||
      i->scale != j->scale || i->mode != j->mode || i->distribution != j->distribution ||
      i->seed != j->seed || i->nvalues != j->nvalues ||
      (i->nvalues && memcmp(i->values, j->values, i->nvalues * sizeof *i->values)))
    return "initializer";
  return NULL;
}

static unsigned sketch_bits(int64_t width, int nstripes) {
  unsigned bits = 6;
  while (((int64_t)1 << bits) < width / nstripes)
    bits++;
  return bits;
}

static int stripes_for(const ps_embed_policy *p) {
  /* small capacities stay exact: one stripe holds them all */
  return p->max_rows > 0 && p->max_rows < 65536 ? 1 : PS_EMBED_STRIPES;
}

int64_t ps_embed_sketch_bytes(const ps_embed_spec *spec) {
  ps_embed_spec sp = *spec;
  normalize(&sp);
  if (sp.policy.min_count <= 1) return 0;
  int n = stripes_for(&sp.policy);
  return (int64_t)n * sp.policy.sketch_depth * 2 *
         ((int64_t)1 << sketch_bits(sp.policy.sketch_width, n));
}

/* ---- records ---- */

static inline uint8_t *rec(const ps_embed_table *t, const stripe *s, uint32_t r) {
  return s->chunks[r >> CHUNK_BITS] + (size_t)(r & CHUNK_MASK) * t->stride;
}
static inline int64_t rec_key(const uint8_t *p) {
  int64_t k;
  memcpy(&k, p, sizeof k);
  return k;
}
static inline uint32_t *rec_u32(uint8_t *p, int i) { /* 0 step, 1 time, 2 count */
  return (uint32_t *)(void *)(p + 8 + 4 * i);
}
static inline float *rec_row(uint8_t *p) {
  return (float *)(void *)(p + HDR);
}

/* ---- chunks ----
 *
 * A stripe's first MALLOC_CHUNKS chunks come from malloc, so a small
 * table takes little; the rest come from its table's pool of 2 MiB
 * blocks, mapped at 2 MiB boundaries and marked for huge pages
 * (MADV_HUGEPAGE), so that a lookup at random over a large table misses
 * the TLB far less (issue 25's profile: most of a call's time was that
 * miss).  A block starts with its count of live and carved chunks; its
 * chunks are carved in order, freed ones are reused first, and a block
 * whose chunks are all free again is unmapped.  The pool's lock is taken
 * under a stripe's, once per 256 rows made or removed. */

typedef struct block {
  uint32_t live, carved;
} block;

/* @bytes (a multiple of 2 MiB) mapped at a 2 MiB boundary and marked for
 * huge pages (a kernel without them: no matter), zeroed; NULL: no memory.
 * Maps @bytes + 2 MiB and trims both ends. */
static uint8_t *map_huge(size_t bytes) {
  uint8_t *m = mmap(NULL, bytes + HUGE_BYTES, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  uint8_t *a =
      (uint8_t *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
  if (a > m) munmap(m, (size_t)(a - m));
  munmap(a + bytes, (size_t)(m + HUGE_BYTES - a));
  (void)madvise(a, bytes, MADV_HUGEPAGE);
  return a;
}

static inline block *block_of(const void *chunk) {
  return (block *)((uintptr_t)chunk & ~(uintptr_t)(HUGE_BYTES - 1));
}
static inline uint8_t *block_chunk(const ps_embed_table *t, block *b, uint32_t j) {
  return (uint8_t *)b + BLOCK_HDR + (size_t)j * t->chunk_bytes;
}
static inline bool chunk_pooled(const ps_embed_table *t, size_t k) {
  return t->cpb > 0 && k >= MALLOC_CHUNKS;
}

static void fchunk_unlink(struct pool *p, struct fchunk *f) {
  if (f->prev)
    f->prev->next = f->next;
  else
    p->free = f->next;
  if (f->next) f->next->prev = f->prev;
}

/* Unmaps block @b, its carved chunks (but @except) on the free list. */
static void block_unmap(ps_embed_table *t, block *b, const void *except) {
  for (uint32_t j = 0; j < b->carved; j++) {
    uint8_t *c = block_chunk(t, b, j);
    if (c != except) fchunk_unlink(&t->pool, (struct fchunk *)(void *)c);
  }
  munmap(b, HUGE_BYTES);
  t->pool.nblocks--;
  atomic_fetch_sub(&t->bytes, (long long)HUGE_BYTES);
}

static uint8_t *pool_get(ps_embed_table *t) {
  struct pool *p = &t->pool;
  uint8_t *c = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->free) {
    c = (uint8_t *)p->free;
    fchunk_unlink(p, p->free);
  } else {
    block *b = (block *)p->cur;
    if (b == NULL || b->carved == t->cpb) {
      uint8_t *a = map_huge(HUGE_BYTES);
      if (a == NULL) goto out;
      if (b && b->live == 0) block_unmap(t, b, NULL);
      b = (block *)a;
      b->live = b->carved = 0;
      p->cur = a;
      p->nblocks++;
      atomic_fetch_add(&t->bytes, (long long)HUGE_BYTES);
    }
    c = block_chunk(t, b, b->carved++);
  }
  block_of(c)->live++;
out:
  pthread_mutex_unlock(&p->mu);
  return c;
}

static void pool_put(ps_embed_table *t, uint8_t *c) {
  struct pool *p = &t->pool;
  pthread_mutex_lock(&p->mu);
  block *b = block_of(c);
  if (--b->live == 0 && (uint8_t *)b != p->cur) {
    block_unmap(t, b, c);
  } else {
    struct fchunk *f = (struct fchunk *)(void *)c;
    f->prev = NULL;
    f->next = p->free;
    if (p->free) p->free->prev = f;
    p->free = f;
  }
  pthread_mutex_unlock(&p->mu);
}

/* Stripe @s's next chunk (its number s->nchunks), or NULL. */
static uint8_t *chunk_new(ps_embed_table *t, stripe *s) {
  if (chunk_pooled(t, s->nchunks)) return pool_get(t);
  uint8_t *c = malloc(t->chunk_bytes);
  if (c) atomic_fetch_add(&t->bytes, (long long)t->chunk_bytes);
  return c;
}

/* Frees stripe @s's chunk @k (its last). */
static void chunk_free(ps_embed_table *t, stripe *s, size_t k) {
  if (chunk_pooled(t, k)) {
    pool_put(t, s->chunks[k]);
    return;
  }
  free(s->chunks[k]);
  atomic_fetch_sub(&t->bytes, (long long)t->chunk_bytes);
}

/* Table @t takes over @nt's pool (@nt's stripes' chunks move to @t's). */
static void pool_merge(ps_embed_table *t, ps_embed_table *nt) {
  struct pool *p = &t->pool, *q = &nt->pool;
  pthread_mutex_lock(&p->mu);
  if (q->free) {
    struct fchunk *f = q->free;
    while (f->next)
      f = f->next;
    f->next = p->free;
    if (p->free) p->free->prev = f;
    p->free = q->free;
  }
  p->nblocks += q->nblocks;
  atomic_fetch_add(&t->bytes, (long long)(q->nblocks * HUGE_BYTES));
  atomic_fetch_sub(&nt->bytes, (long long)(q->nblocks * HUGE_BYTES));
  /* nt's block being carved is carved no further */
  block *b = (block *)q->cur;
  if (b && b->live == 0) block_unmap(t, b, NULL);
  q->cur = NULL;
  q->free = NULL;
  q->nblocks = 0;
  /* and the blocks of its indexes */
  if (q->ix) {
    struct ixblock *last = q->ix;
    while (last->next)
      last = last->next;
    last->next = p->ix;
    p->ix = q->ix;
    q->ix = NULL;
  }
  pthread_mutex_unlock(&p->mu);
}

/* ---- indexes ----
 *
 * An index of 256 KiB or more is on huge pages too: at 10M rows a lookup's
 * keys fall on thousands of index pages, more than the TLB holds (13% of
 * a lookup on the ps).  One of 2 MiB or more is mapped by itself; a
 * smaller one is a piece of a 2 MiB block cut into pieces of its size,
 * unmapped once all its pieces are free.  Smaller indexes come from
 * calloc.  An index is allocated only when a stripe's grows, so the
 * pool's list of blocks is searched by a walk; a restore's list joins the
 * table's with its rows (pool_merge). */

#define IX_POOLED_MIN ((size_t)256 << 10)

/* A zeroed index of @bytes (a power of two), or NULL. */
static uint32_t *ix_alloc(ps_embed_table *t, size_t bytes) {
  if (bytes < IX_POOLED_MIN) return calloc(1, bytes);
  if (bytes >= HUGE_BYTES) return (uint32_t *)(void *)map_huge(bytes);
  struct pool *p = &t->pool;
  uint8_t *r = NULL;
  pthread_mutex_lock(&p->mu);
  struct ixblock *b = p->ix;
  uint32_t full = (uint32_t)((1ull << (HUGE_BYTES / bytes)) - 1);
  while (b && (b->piece != bytes || b->used == full))
    b = b->next;
  if (b == NULL) {
    if ((b = malloc(sizeof *b)) == NULL) goto out;
    *b = (struct ixblock){.base = map_huge(HUGE_BYTES), .piece = bytes, .next = p->ix};
    if (b->base == NULL) {
      free(b);
      goto out;
    }
    p->ix = b;
  }
  uint32_t k = (uint32_t)__builtin_ctz(~b->used);
  b->used |= 1u << k;
  r = b->base + (size_t)k * bytes;
  memset(r, 0, bytes); /* (a piece used before) */
out:
  pthread_mutex_unlock(&p->mu);
  return (uint32_t *)(void *)r;
}

static void ix_free(ps_embed_table *t, uint32_t *ix, size_t bytes) {
  if (ix == NULL) return;
  if (bytes < IX_POOLED_MIN) {
    free(ix);
    return;
  }
  if (bytes >= HUGE_BYTES) {
    munmap(ix, bytes);
    return;
  }
  struct pool *p = &t->pool;
  uint8_t *a = (uint8_t *)ix;
  pthread_mutex_lock(&p->mu);
  for (struct ixblock **at = &p->ix; *at; at = &(*at)->next) {
    struct ixblock *b = *at;
    if (a < b->base || a >= b->base + HUGE_BYTES) continue;
    b->used &= ~(1u << ((size_t)(a - b->base) / b->piece));
    if (b->used == 0) {
      munmap(b->base, HUGE_BYTES);
      *at = b->next;
      free(b);
    }
    break;
  }
  pthread_mutex_unlock(&p->mu);
}

/* Frees what is left of @t's pool once every chunk is back. */
static void pool_free(ps_embed_table *t) {
  block *b = (block *)t->pool.cur;
  if (b) block_unmap(t, b, NULL);
  t->pool.cur = NULL;
  while (t->pool.ix) { /* (none: each stripe freed its index) */
    struct ixblock *x = t->pool.ix;
    t->pool.ix = x->next;
    munmap(x->base, HUGE_BYTES);
    free(x);
  }
  pthread_mutex_destroy(&t->pool.mu);
}
static inline uint32_t index_home(uint64_t h, unsigned bits) {
  return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}
static inline uint32_t tag_of(uint64_t h) {
  return (uint32_t)(h >> 58);
}

/* The index position of @key in @s, or (not there) -1 with *@free_pos
 * the empty entry that ends its probe run. */
static int64_t find(const ps_embed_table *t, const stripe *s, int64_t key, uint64_t h,
                    uint32_t *free_pos) {
  if (s->bits == 0) return -1;
  uint32_t mask = ((uint32_t)1 << s->bits) - 1, pos = index_home(h, s->bits);
  uint32_t tag = tag_of(h);
  for (;;) {
    uint32_t e = s->index[pos];
    if (e == 0) {
      if (free_pos) *free_pos = pos;
      return -1;
    }
    if (e >> ID_BITS == tag && rec_key(rec(t, s, (e & ID_MASK) - 1)) == key) return pos;
    pos = (pos + 1) & mask;
  }
}

/* The index at twice the size (or its first one).  -1: out of memory. */
static int grow_index(ps_embed_table *t, stripe *s) {
  unsigned bits = s->bits ? s->bits + 1 : MIN_INDEX_BITS;
  uint32_t *ix = ix_alloc(t, (size_t)4 << bits);
  if (ix == NULL) return -1;
  uint32_t mask = ((uint32_t)1 << bits) - 1;
  for (uint32_t r = 0; r < s->nrec; r++) {
    uint64_t h = ps_embed_key_hash(rec_key(rec(t, s, r)));
    uint32_t pos = index_home(h, bits);
    while (ix[pos])
      pos = (pos + 1) & mask;
    ix[pos] = tag_of(h) << ID_BITS | (r + 1);
  }
  if (s->bits) atomic_fetch_sub(&t->bytes, (long long)((size_t)4 << s->bits));
  atomic_fetch_add(&t->bytes, (long long)((size_t)4 << bits));
  if (s->bits) ix_free(t, s->index, (size_t)4 << s->bits);
  s->index = ix;
  s->bits = bits;
  return 0;
}

/* Empties index entry @pos and shifts its probe run back over it. */
static void index_remove(const ps_embed_table *t, stripe *s, uint32_t pos) {
  uint32_t mask = ((uint32_t)1 << s->bits) - 1, i = pos, j = pos;
  s->index[i] = 0;
  for (;;) {
    j = (j + 1) & mask;
    uint32_t e = s->index[j];
    if (e == 0) return;
    uint32_t k =
        index_home(ps_embed_key_hash(rec_key(rec(t, s, (e & ID_MASK) - 1))), s->bits);
    /* e may move to i unless its home lies cyclically in (i, j] */
    bool stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
    if (stays) continue;
    s->index[i] = e;
    s->index[j] = 0;
    i = j;
  }
}

/* ---- snapshots (copy on write, a page of 16 records at a time) ----
 *
 * A snapshot records each stripe's record count, and a write to one of
 * those records first copies its page (16 records) into the snapshot,
 * once: a training step that touches every stripe right after a save
 * began copies the pages it writes, not the stripes (1.5 GB at 10M rows:
 * a second's pause when it was stripes).  The save then copies each
 * stripe under its lock, taking the copied pages and the live rest. */

#define PAGE_BITS 4
#define PAGE_ROWS ((uint32_t)1 << PAGE_BITS)

struct ps_embed_snap {
  ps_embed_table *t;      /* referenced */
  uint32_t step, now;     /* the table's step and time at the snapshot */
  atomic_bool failed;     /* a copy found no memory: the save fails */
  atomic_bool superseded; /* a newer snapshot came before this one copied a stripe */
  struct {
    uint32_t nrec;   /* the stripe's records at the snapshot */
    uint8_t **pages; /* copies of the pages written since (NULL: none yet) */
    uint8_t *recs;   /* the stripe's records as they were, once collected */
  } s[];
};

/* Detaches the snapshot from stripe @s after a failed copy. */
static void snap_fail(stripe *s) {
  s->snap->failed = true;
  s->snap = NULL;
}

/* Copies page @pg of stripe @s (locked) into its snapshot, if not yet. */
static void cow_page(ps_embed_table *t, stripe *s, uint32_t pg) {
  ps_embed_snap *snap = s->snap;
  int si = (int)(s - t->stripes);
  uint32_t nrec = snap->s[si].nrec, first = pg << PAGE_BITS;
  if (first >= nrec) return;
  if (snap->s[si].pages == NULL &&
      (snap->s[si].pages = calloc(((size_t)nrec + PAGE_ROWS - 1) >> PAGE_BITS,
                                  sizeof *snap->s[si].pages)) == NULL) {
    snap_fail(s);
    return;
  }
  if (snap->s[si].pages[pg]) return;
  /* a page lies in one chunk (PAGE_ROWS divides CHUNK_ROWS) */
  size_t bytes =
      (size_t)(nrec - first < PAGE_ROWS ? nrec - first : PAGE_ROWS) * t->stride;
  uint8_t *c = malloc(bytes);
  if (c == NULL) {
    snap_fail(s);
    return;
  }
  memcpy(c, rec(t, s, first), bytes);
  snap->s[si].pages[pg] = c;
}

/* Before record @r of stripe @s (locked) changes. */
static inline void cow_rec(ps_embed_table *t, stripe *s, uint32_t r) {
  if (s->snap) cow_page(t, s, r >> PAGE_BITS);
}

/* Before records [@from, @to) of stripe @s (locked) change or go. */
static void cow_range(ps_embed_table *t, stripe *s, uint32_t from, uint32_t to) {
  if (s->snap == NULL) return;
  uint32_t nrec = s->snap->s[s - t->stripes].nrec;
  if (to > nrec) to = nrec;
  for (uint32_t pg = from >> PAGE_BITS; s->snap && (pg << PAGE_BITS) < to; pg++)
    cow_page(t, s, pg);
}

/* Removes the row at index entry @pos: its record's place takes the last
 * record. */
static void remove_at(ps_embed_table *t, stripe *s, uint32_t pos) {
  uint32_t r = (s->index[pos] & ID_MASK) - 1;
  index_remove(t, s, pos);
  uint32_t last = s->nrec - 1;
  if (r != last) {
    uint8_t *src = rec(t, s, last);
    int64_t k = rec_key(src);
    uint64_t h = ps_embed_key_hash(k);
    int64_t p = find(t, s, k, h, NULL);
    cow_rec(t, s, r);
    memcpy(rec(t, s, r), src, t->stride);
    s->index[p] = tag_of(h) << ID_BITS | (r + 1);
  }
  s->nrec = last;
  /* a chunk goes once the one before it is empty too (no flapping) */
  size_t need = ((size_t)s->nrec + CHUNK_ROWS - 1) / CHUNK_ROWS;
  while (s->nchunks > need + 1) {
    s->nchunks--;
    cow_range(t, s, (uint32_t)s->nchunks * CHUNK_ROWS,
              (uint32_t)(s->nchunks + 1) * CHUNK_ROWS);
    chunk_free(t, s, s->nchunks);
  }
  atomic_fetch_sub(&t->rows, 1);
}

/* ---- clocks and policies ---- */

static uint32_t now_cs(const ps_embed_table *t) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t cs = (int64_t)(ts.tv_sec - t->born.tv_sec) * 100 +
               (ts.tv_nsec - t->born.tv_nsec) / 10000000;
  return cs < 0 ? 0 : cs > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)cs;
}

static uint32_t clamp_step(int64_t step) {
  return step <= 0 ? 0 : step > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)step;
}

static bool expired(const ps_embed_table *t, uint8_t *p, uint32_t step, uint32_t now) {
  const ps_embed_policy *pol = &t->spec.policy;
  /* step 0: not known (a row restored from a checkpoint without versions,
   * TensorFlow's own tables): it ages by steps once it is touched */
  if (pol->ttl_steps > 0 && *rec_u32(p, 0) != 0 && step > *rec_u32(p, 0) &&
      (int64_t)(step - *rec_u32(p, 0)) > pol->ttl_steps)
    return true;
  return pol->ttl_seconds > 0 && now > *rec_u32(p, 1) &&
         (int64_t)(now - *rec_u32(p, 1)) > pol->ttl_seconds * 100;
}

static uint64_t rng_next(stripe *s) {
  uint64_t x = s->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return s->rng = x;
}

/* Whether record @a should go before record @b. */
static bool colder(const ps_embed_table *t, uint8_t *a, uint8_t *b) {
  uint32_t ta = *rec_u32(a, 1), tb = *rec_u32(b, 1);
  if (t->spec.policy.evict == PS_EMBED_EVICT_LFU) {
    uint32_t ca = *rec_u32(a, 2), cb = *rec_u32(b, 2);
    if (ca != cb) return ca < cb;
    return ta < tb;
  }
  if (ta != tb) return ta < tb;
  return *rec_u32(a, 0) < *rec_u32(b, 0);
}

/* Makes room for one row in full stripe @s. */
static void evict_one(ps_embed_table *t, stripe *s, uint32_t step, uint32_t now,
                      ps_embed_counts *c) {
  uint32_t best = 0;
  bool all = s->nrec <= SAMPLES, old = false;
  for (uint32_t i = 0; i < (all ? s->nrec : SAMPLES) && !old; i++) {
    uint32_t r = all ? i : (uint32_t)(rng_next(s) % s->nrec);
    uint8_t *p = rec(t, s, r);
    if ((old = expired(t, p, step, now)) || i == 0 || colder(t, p, rec(t, s, best)))
      best = r;
  }
  int64_t k = rec_key(rec(t, s, best));
  remove_at(t, s, (uint32_t)find(t, s, k, ps_embed_key_hash(k), NULL));
  if (old) {
    c->expired++;
    atomic_fetch_add(&t->expired, 1);
  } else {
    c->evicted++;
    atomic_fetch_add(&t->evicted, 1);
  }
}

/* Counts one more sighting of unseen key @h in @s's sketch: the key's
 * estimate afterwards (conservative update: only the smallest counters
 * grow).  0 when the sketch cannot be made (nobody is admitted then). */
static uint32_t sketch_add(ps_embed_table *t, stripe *s, uint64_t h) {
  int depth = t->spec.policy.sketch_depth;
  size_t width = (size_t)1 << t->sketch_bits;
  if (s->sketch == NULL) {
    s->sketch = calloc((size_t)depth * width, sizeof *s->sketch);
    if (s->sketch == NULL) return 0;
    atomic_fetch_add(&t->bytes, (long long)((size_t)depth * width * 2));
  }
  size_t at[PS_EMBED_MAX_SKETCH_DEPTH];
  uint32_t min = UINT16_MAX;
  for (int d = 0; d < depth; d++) {
    uint64_t x =
        (h ^ (0x9E3779B97F4A7C15ull * (uint64_t)(d + 1))) * 0xD6E8FEB86659FD93ull;
    at[d] = (size_t)d * width + (size_t)(x >> (64 - t->sketch_bits));
    if (s->sketch[at[d]] < min) min = s->sketch[at[d]];
  }
  if (min == UINT16_MAX) return min;
  for (int d = 0; d < depth; d++)
    if (s->sketch[at[d]] == min) s->sketch[at[d]] = (uint16_t)(min + 1);
  return min + 1;
}

/* ---- rows ---- */

static int fill_default(const ps_embed_table *t, int64_t key, float *out, ps_status *st) {
  ps_init_spec init = t->spec.init;
  uint64_t z = t->seed ^ ps_embed_key_hash(key);
  z = ps_embed_key_hash((int64_t)z);
  init.seed = (int64_t)(z >> 1) | 1;
  ps_shape row = {.rank = 1, .dim = {t->spec.dim}};
  return ps_init_fill(&init, t->spec.name, PS_DT_FLOAT, &row, 0, t->spec.dim, out, st);
}

int ps_embed_default_row(const ps_embed_table *t, int64_t key, float *out,
                         ps_status *st) {
  return fill_default(t, key, out, st);
}

/* A new row for @key in @s (room made already), as its initializer and
 * the optimizer's slot starts say; its record, or NULL (RESOURCE_EXHAUSTED). */
static uint8_t *insert(ps_embed_table *t, stripe *s, int64_t key, uint64_t h,
                       uint32_t step, uint32_t now, bool fill, ps_status *st) {
  if ((int64_t)s->nrec >= PS_EMBED_MAX_STRIPE_ROWS) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                  "table %s: a stripe holds %lld rows, its most (%lld per stripe, %d "
                  "stripes a ps): set max_rows",
                  t->spec.name, (long long)s->nrec, (long long)PS_EMBED_MAX_STRIPE_ROWS,
                  t->nstripes);
    return NULL;
  }
  if (((size_t)s->nrec + 1) * 4 > ((size_t)3 << s->bits) && grow_index(t, s) != 0)
    goto oom;
  if (s->nrec >= s->nchunks * CHUNK_ROWS) {
    if (s->nchunks == s->chunks_cap) {
      size_t cap = s->chunks_cap ? s->chunks_cap * 2 : 4;
      uint8_t **v = realloc(s->chunks, cap * sizeof *v);
      if (v == NULL) goto oom;
      s->chunks = v;
      s->chunks_cap = cap;
    }
    if ((s->chunks[s->nchunks] = chunk_new(t, s)) == NULL) goto oom;
    s->nchunks++;
  }
  cow_rec(t, s, s->nrec);
  uint8_t *p = rec(t, s, s->nrec);
  float *row = rec_row(p);
  if (fill && fill_default(t, key, row, st) != 0) return NULL; /* checked at create */
  memcpy(p, &key, sizeof key);
  *rec_u32(p, 0) = step;
  *rec_u32(p, 1) = now;
  *rec_u32(p, 2) = 0;
  size_t dim = (size_t)t->spec.dim;
  float acc = (float)t->spec.slot_init;
  if (!fill) {
    /* the caller writes the row */
  } else if (t->spec.optimizer == PS_EMBED_OPT_ADAGRAD ||
             t->spec.optimizer == PS_EMBED_OPT_FTRL)
    for (size_t i = 0; i < dim; i++)
      row[dim + i] = acc;
  else if (t->nslots)
    memset(row + dim, 0, dim * sizeof *row);
  if (fill &&
      (t->spec.optimizer == PS_EMBED_OPT_ADAM || t->spec.optimizer == PS_EMBED_OPT_FTRL))
    memset(row + 2 * dim, 0, dim * sizeof *row);
  uint32_t fp = 0;
  find(t, s, key, h, &fp);
  s->index[fp] = tag_of(h) << ID_BITS | (s->nrec + 1);
  s->nrec++;
  atomic_fetch_add(&t->rows, 1);
  atomic_fetch_add(&t->created, 1);
  return p;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "table %s: out of memory for a new row",
                t->spec.name);
  return NULL;
}

/* Examines up to @budget records from @s's cursor and removes the
 * expired ones. */
static void sweep_some(ps_embed_table *t, stripe *s, size_t budget, uint32_t step,
                       uint32_t now, ps_embed_counts *c) {
  if (t->spec.policy.ttl_steps == 0 && t->spec.policy.ttl_seconds == 0) return;
  while (budget-- > 0 && s->nrec > 0) {
    if (s->cursor >= s->nrec) s->cursor = 0;
    uint8_t *p = rec(t, s, s->cursor);
    if (s->cursor + 8 < s->nrec) /* the step and time of the records ahead */
      __builtin_prefetch(rec(t, s, s->cursor + 8) + 8, 0, 3);
    if (!expired(t, p, step, now)) {
      s->cursor++;
      continue;
    }
    int64_t k = rec_key(p);
    remove_at(t, s, (uint32_t)find(t, s, k, ps_embed_key_hash(k), NULL));
    if (c) c->expired++;
    atomic_fetch_add(&t->expired, 1);
  }
}

/* ---- prefetching a call's keys ----
 *
 * A key's row costs two cache misses at random (its index entry, then its
 * record).  A stripe's keys are served in windows of PF_WINDOW: first the
 * window's index entries are fetched, then the records they name (each
 * line of each), then the keys are served, so that up to a window's
 * misses overlap instead of coming one after another.  Reads only, and
 * only hints: a record a window's key then moves or removes is still
 * found by find().  always_inline: GCC takes a function of nothing but
 * loads and prefetches for pure and deletes its calls (common/kernels.h,
 * ps_prefetch_row); without it no prefetch was left in the lookups. */
#define PF_WINDOW 32

__attribute__((always_inline)) static inline void
prefetch_window(const ps_embed_table *t, const stripe *s, const uint64_t *hs, uint32_t a,
                uint32_t b) {
  if (s->bits == 0) return;
  for (uint32_t k = a; k < b; k++)
    __builtin_prefetch(&s->index[index_home(hs[k], s->bits)], 0, 3);
  uint32_t mask = ((uint32_t)1 << s->bits) - 1;
  for (uint32_t k = a; k < b; k++) {
    /* the first entry of the key's probe run with its tag */
    uint32_t pos = index_home(hs[k], s->bits), tag = tag_of(hs[k]), e;
    for (int i = 0; (e = s->index[pos]) != 0 && e >> ID_BITS != tag && i < 8; i++)
      pos = (pos + 1) & mask;
    if (e == 0 || e >> ID_BITS != tag || (e & ID_MASK) - 1 >= s->nrec) continue;
    const uint8_t *p = rec(t, s, (e & ID_MASK) - 1);
    for (size_t off = 0; off < t->stride; off += 64)
      __builtin_prefetch(p + off, 1, 3);
    __builtin_prefetch(p + t->stride - 1, 1, 3);
  }
}

/* Prefetches the window that starts at @k, if one does, of the keys
 * [@first, @end) of stripe @s. */
__attribute__((always_inline)) static inline void
prefetch_at(const ps_embed_table *t, const stripe *s, const uint64_t *hs, uint32_t k,
            uint32_t first, uint32_t end) {
  if ((k - first) % PF_WINDOW == 0)
    prefetch_window(t, s, hs, k, end - k < PF_WINDOW ? end : k + PF_WINDOW);
}

/* ---- grouping keys by stripe ---- */

/* The positions of @keys ordered by stripe: @order[start[s]..start[s+1]),
 * and @hs[k] the hash of keys[order[k]] (each key hashed once a call). */
static int group(const ps_embed_table *t, const int64_t *keys, size_t n, uint32_t *order,
                 uint64_t *hs, uint32_t start[PS_EMBED_STRIPES + 1]) {
  uint32_t cnt[PS_EMBED_STRIPES] = {0};
  uint64_t *h = malloc((n ? n : 1) * sizeof *h);
  if (h == NULL) return -1;
  uint64_t mask = (uint64_t)(t->nstripes - 1);
  for (size_t i = 0; i < n; i++) {
    h[i] = ps_embed_key_hash(keys[i]);
    cnt[(h[i] >> 32) & mask]++;
  }
  start[0] = 0;
  for (int s = 0; s < PS_EMBED_STRIPES; s++)
    start[s + 1] = start[s] + (s < t->nstripes ? cnt[s] : 0);
  uint32_t at[PS_EMBED_STRIPES];
  memcpy(at, start, sizeof at);
  for (size_t i = 0; i < n; i++) {
    uint32_t k = at[(h[i] >> 32) & mask]++;
    order[k] = (uint32_t)i;
    hs[k] = h[i];
  }
  free(h);
  return 0;
}

/* A call's keys grouped (group); *@order and *@hs are one allocation:
 * free(*order). */
static int prepare(ps_embed_table *t, const int64_t *keys, size_t n, int64_t step,
                   bool advance, uint32_t **order, uint64_t **hs,
                   uint32_t start[PS_EMBED_STRIPES + 1], uint32_t *cur_step,
                   ps_status *st) {
  if (n > UINT32_MAX)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "table %s: %zu keys in one call",
                         t->spec.name, n);
  /* only a call that changes the table moves its clock: an inference
   * lookup's step (a serving client's, maybe not a step at all) cannot
   * expire rows */
  long long seen = atomic_load(&t->step);
  while (advance && step > seen && !atomic_compare_exchange_weak(&t->step, &seen, step)) {
  }
  *cur_step = clamp_step(advance && step > seen ? step : seen);
  size_t m = n ? n : 1;
  *hs = malloc(m * (sizeof **hs + sizeof **order));
  *order = *hs ? (uint32_t *)(*hs + m) : NULL;
  if (*hs == NULL || group(t, keys, n, *order, *hs, start) != 0) {
    free(*hs);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "table %s: out of memory",
                         t->spec.name);
  }
  *order = (uint32_t *)(*hs + m);
  return 0;
}
int ps_embed_lookup(ps_embed_table *t, const int64_t *keys, size_t n, bool train,
                    int64_t step, float *out, ps_embed_counts *c, ps_status *st) {
  uint32_t *order = NULL, start[PS_EMBED_STRIPES + 1], cur = 0;
  uint64_t *hs = NULL;
  memset(c, 0, sizeof *c);
  int rc = prepare(t, keys, n, step, train, &order, &hs, start, &cur, st);
  if (rc != 0) return rc;
  size_t dim = (size_t)t->spec.dim;
  uint32_t now = now_cs(t);
  int64_t min_count = t->spec.policy.min_count;
  for (int si = 0; si < t->nstripes && rc == 0; si++) {
    if (start[si] == start[si + 1]) continue;
    stripe *s = &t->stripes[si];
    pthread_mutex_lock(&s->mu);
    for (uint32_t k = start[si]; k < start[si + 1] && rc == 0; k++) {
      prefetch_at(t, s, hs, k, start[si], start[si + 1]);
      uint32_t i = order[k];
      int64_t key = keys[i];
      uint64_t h = hs[k];
      float *dst = out + (size_t)i * dim;
      int64_t pos = find(t, s, key, h, NULL);
      uint8_t *p = pos >= 0 ? rec(t, s, (s->index[pos] & ID_MASK) - 1) : NULL;
      if (p && expired(t, p, cur, now)) {
        if (!train) { /* inference changes nothing: the row is as gone */
          p = NULL;
        } else {
          remove_at(t, s, (uint32_t)pos);
          c->expired++;
          atomic_fetch_add(&t->expired, 1);
          p = NULL;
          pos = -1;
        }
      }
      if (p == NULL && train) {
        if (min_count > 1 && sketch_add(t, s, h) < (uint32_t)min_count) {
          c->refused++;
          atomic_fetch_add(&t->refused, 1);
        } else {
          if (s->cap > 0 && (int64_t)s->nrec >= s->cap) evict_one(t, s, cur, now, c);
          if ((p = insert(t, s, key, h, cur, now, true, st)) == NULL) {
            rc = st->code;
            break;
          }
          c->created++;
        }
      }
      if (p == NULL) {
        c->missing++;
        if ((rc = fill_default(t, key, dst, st)) != 0) break;
        continue;
      }
      if (train) {
        if (pos >= 0) cow_rec(t, s, (s->index[pos] & ID_MASK) - 1); /* (insert copied) */
        *rec_u32(p, 0) = cur;
        *rec_u32(p, 1) = now;
        if (*rec_u32(p, 2) < UINT32_MAX) (*rec_u32(p, 2))++;
      }
      memcpy(dst, rec_row(p), dim * sizeof *dst);
    }
    if (train)
      sweep_some(t, s, 2 * (size_t)(start[si + 1] - start[si]) + 16, cur, now, c);
    pthread_mutex_unlock(&s->mu);
  }
  free(hs);
  return rc;
}

static bool op_fits(const ps_embed_table *t, ps_embed_op op) {
  switch (op) {
  case PS_EMBED_SCATTER_ADD:
  case PS_EMBED_SGD:
    return true;
  case PS_EMBED_ADAGRAD:
    return t->spec.optimizer == PS_EMBED_OPT_ADAGRAD;
  case PS_EMBED_ADAM:
    return t->spec.optimizer == PS_EMBED_OPT_ADAM;
  case PS_EMBED_FTRL:
    return t->spec.optimizer == PS_EMBED_OPT_FTRL;
  default:
    return false;
  }
}

/* ps_kernel_table_row (common/kernels.c, built without errno so that its
 * square roots vectorize) numbers the ops as ps_embed_op does. */
_Static_assert((int)PS_EMBED_SCATTER_ADD == (int)PS_KERNEL_ROW_SCATTER_ADD &&
                   (int)PS_EMBED_SGD == (int)PS_KERNEL_ROW_SGD &&
                   (int)PS_EMBED_ADAGRAD == (int)PS_KERNEL_ROW_ADAGRAD &&
                   (int)PS_EMBED_ADAM == (int)PS_KERNEL_ROW_ADAM &&
                   (int)PS_EMBED_FTRL == (int)PS_KERNEL_ROW_FTRL,
               "ps_embed_op and ps_kernel_row_op differ");

int ps_embed_update(ps_embed_table *t, ps_embed_op op, const int64_t *keys, size_t n,
                    const float *grads, const double *hp, int64_t step,
                    ps_embed_counts *c, ps_status *st) {
  memset(c, 0, sizeof *c);
  if (!op_fits(t, op))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableUpdate %s: %s needs a table made for its optimizer; "
                         "%s was made with optimizer %s",
                         t->spec.name, ps_embed_op_name(op), t->spec.name,
                         ps_embed_optimizer_name(t->spec.optimizer));
  float h[6] = {0};
  for (size_t i = 0; i < ps_embed_op_hparams(op); i++)
    h[i] = (float)hp[i];
  uint32_t *order = NULL, start[PS_EMBED_STRIPES + 1], cur = 0;
  uint64_t *hs = NULL;
  int rc = prepare(t, keys, n, step, true, &order, &hs, start, &cur, st);
  if (rc != 0) return rc;
  size_t dim = (size_t)t->spec.dim;
  uint32_t now = now_cs(t);
  for (int si = 0; si < t->nstripes; si++) {
    if (start[si] == start[si + 1]) continue;
    stripe *s = &t->stripes[si];
    pthread_mutex_lock(&s->mu);
    for (uint32_t k = start[si]; k < start[si + 1]; k++) {
      prefetch_at(t, s, hs, k, start[si], start[si + 1]);
      uint32_t i = order[k];
      int64_t pos = find(t, s, keys[i], hs[k], NULL);
      uint8_t *p = pos >= 0 ? rec(t, s, (s->index[pos] & ID_MASK) - 1) : NULL;
      if (p && expired(t, p, cur, now)) {
        remove_at(t, s, (uint32_t)pos);
        c->expired++;
        atomic_fetch_add(&t->expired, 1);
        p = NULL;
      }
      if (p == NULL) {
        c->missing++;
        continue;
      }
      cow_rec(t, s, (s->index[pos] & ID_MASK) - 1);
      ps_kernel_table_row((int)op, rec_row(p), dim, grads + (size_t)i * dim, h);
      *rec_u32(p, 0) = cur;
      *rec_u32(p, 1) = now;
    }
    sweep_some(t, s, 16, cur, now, c);
    pthread_mutex_unlock(&s->mu);
  }
  free(hs);
  return 0;
}

int64_t ps_embed_sweep(ps_embed_table *t) {
  ps_embed_counts c = {0};
  uint32_t cur = clamp_step(atomic_load(&t->step)), now = now_cs(t);
  for (int si = 0; si < t->nstripes; si++) {
    stripe *s = &t->stripes[si];
    pthread_mutex_lock(&s->mu);
    s->cursor = 0;
    sweep_some(t, s, s->nrec, cur, now, &c);
    pthread_mutex_unlock(&s->mu);
  }
  return c.expired;
}

/* ---- snapshots and restores ---- */

static ps_embed_table *table_new(const ps_embed_spec *spec, ps_status *st);

static const char *const slot_names[4][2] = {
    {NULL, NULL}, {"Adagrad", NULL}, {"Adam", "Adam_1"}, {"Ftrl", "Ftrl_1"}};

const char *ps_embed_slot_name(ps_embed_optimizer o, int k) {
  return (unsigned)o < 4 && (unsigned)k < 2 ? slot_names[o][k] : NULL;
}

ps_embed_snap *ps_embed_snap_begin(ps_embed_table *t) {
  ps_embed_snap *snap = calloc(1, sizeof *snap + (size_t)t->nstripes * sizeof snap->s[0]);
  if (snap == NULL) return NULL;
  atomic_fetch_add(&t->refs, 1);
  snap->t = t;
  snap->step = clamp_step(atomic_load(&t->step));
  snap->now = now_cs(t);
  for (int si = 0; si < t->nstripes; si++) {
    stripe *s = &t->stripes[si];
    pthread_mutex_lock(&s->mu);
    /* an older snapshot still waiting for this stripe is given up (its save
     * fails, saying so): copying it here would hold the gate, and one
     * whose save never comes would keep a copy of every table */
    if (s->snap) s->snap->superseded = true;
    s->snap = snap;
    snap->s[si].nrec = s->nrec;
    pthread_mutex_unlock(&s->mu);
  }
  return snap;
}

int64_t ps_embed_snap_rows(const ps_embed_snap *snap) {
  return atomic_load(&snap->t->rows);
}

const ps_embed_spec *ps_embed_snap_spec(const ps_embed_snap *snap) {
  return &snap->t->spec;
}

/* Copies stripe @si's records as they were into snap->s[si].recs: its
 * copied pages, and (@live: the stripe is locked and still waits for the
 * snapshot) the rest from the stripe.  The pages are freed. */
static void gather(ps_embed_table *t, ps_embed_snap *snap, int si, bool live) {
  stripe *s = &t->stripes[si];
  uint32_t nrec = snap->s[si].nrec;
  uint8_t **pages = snap->s[si].pages, *out = snap->s[si].recs;
  for (uint32_t pg = 0; (pg << PAGE_BITS) < nrec; pg++) {
    uint32_t first = pg << PAGE_BITS;
    size_t bytes =
        (size_t)(nrec - first < PAGE_ROWS ? nrec - first : PAGE_ROWS) * t->stride;
    const uint8_t *src = pages && pages[pg] ? pages[pg] : live ? rec(t, s, first) : NULL;
    if (src == NULL) { /* (a failed copy detached the stripe: the save fails) */
      snap->failed = true;
      break;
    }
    memcpy(out + (size_t)first * t->stride, src, bytes);
  }
  if (pages)
    for (uint32_t pg = 0; (pg << PAGE_BITS) < nrec; pg++)
      free(pages[pg]);
  free(pages);
  snap->s[si].pages = NULL;
}

/* Collects every stripe's records as they were and detaches the snapshot.
 * Each stripe's buffer is made and faulted in before its lock is taken:
 * training waits for a copy, never for the kernel's fresh pages. */
static void collect(ps_embed_snap *snap) {
  ps_embed_table *t = snap->t;
  for (int si = 0; si < t->nstripes && !snap->failed; si++) {
    stripe *s = &t->stripes[si];
    size_t bytes = (size_t)snap->s[si].nrec * t->stride;
    if (bytes == 0) {
      pthread_mutex_lock(&s->mu);
      if (s->snap == snap) s->snap = NULL;
      pthread_mutex_unlock(&s->mu);
      continue;
    }
    if ((snap->s[si].recs = malloc(bytes)) == NULL) {
      snap->failed = true;
      break;
    }
    memset(snap->s[si].recs, 0, bytes);
    pthread_mutex_lock(&s->mu);
    bool live = s->snap == snap;
    gather(t, snap, si, live);
    if (live) s->snap = NULL;
    pthread_mutex_unlock(&s->mu);
  }
}

void ps_embed_export_fini(ps_embed_export *e) {
  free(e->keys);
  free(e->values);
  free(e->slots[0]);
  free(e->slots[1]);
  free(e->versions);
  free(e->freqs);
  memset(e, 0, sizeof *e);
}

int ps_embed_snap_export(ps_embed_snap *snap, ps_embed_export *e, ps_status *st) {
  ps_embed_table *t = snap->t;
  memset(e, 0, sizeof *e);
  collect(snap);
  if (snap->superseded)
    return ps_status_set(st, PS_ABORTED,
                         "table %s: a newer snapshot was taken before this save copied "
                         "the table; save again",
                         t->spec.name);
  if (snap->failed)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "table %s: no memory to keep its snapshot while it changed",
                         t->spec.name);
  size_t n = 0, dim = (size_t)t->spec.dim;
  for (int si = 0; si < t->nstripes; si++)
    for (uint32_t r = 0; r < snap->s[si].nrec; r++)
      n += !expired(t, snap->s[si].recs + (size_t)r * t->stride, snap->step, snap->now);
  e->n = (int64_t)n;
  e->dim = (int64_t)dim;
  e->nslots = t->nslots;
  e->keys = malloc((n + 1) * sizeof *e->keys);
  e->values = malloc((n * dim + 1) * sizeof *e->values);
  e->versions = malloc((n + 1) * sizeof *e->versions);
  e->freqs = malloc((n + 1) * sizeof *e->freqs);
  bool ok = e->keys && e->values && e->versions && e->freqs;
  for (int k = 0; k < t->nslots && ok; k++)
    ok = (e->slots[k] = malloc((n * dim + 1) * sizeof(float))) != NULL;
  if (!ok) {
    ps_embed_export_fini(e);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "table %s: out of memory to save it",
                         t->spec.name);
  }
  size_t i = 0;
  for (int si = 0; si < t->nstripes; si++)
    for (uint32_t r = 0; r < snap->s[si].nrec; r++) {
      uint8_t *p = snap->s[si].recs + (size_t)r * t->stride;
      if (expired(t, p, snap->step, snap->now)) continue;
      const float *row = rec_row(p);
      e->keys[i] = rec_key(p);
      memcpy(e->values + i * dim, row, dim * sizeof(float));
      for (int k = 0; k < t->nslots; k++)
        memcpy(e->slots[k] + i * dim, row + (size_t)(k + 1) * dim, dim * sizeof(float));
      e->versions[i] = *rec_u32(p, 0);
      e->freqs[i] = *rec_u32(p, 2);
      i++;
    }
  return 0;
}

void ps_embed_snap_free(ps_embed_snap *snap) {
  if (snap == NULL) return;
  ps_embed_table *t = snap->t;
  for (int si = 0; si < t->nstripes; si++) {
    stripe *s = &t->stripes[si];
    pthread_mutex_lock(&s->mu);
    if (s->snap == snap) s->snap = NULL;
    pthread_mutex_unlock(&s->mu);
    free(snap->s[si].recs);
    uint8_t **pages = snap->s[si].pages;
    for (uint32_t pg = 0; pages && (pg << PAGE_BITS) < snap->s[si].nrec; pg++)
      free(pages[pg]);
    free(pages);
  }
  ps_embed_unref(t);
  free(snap);
}

/* Empties stripe @s (locked) of @t: its rows, index and chunks go. */
static void stripe_clear(ps_embed_table *t, stripe *s) {
  for (size_t k = s->nchunks; k-- > 0;)
    chunk_free(t, s, k);
  if (s->bits) atomic_fetch_sub(&t->bytes, (long long)((size_t)4 << s->bits));
  atomic_fetch_sub(&t->rows, (long long)s->nrec);
  free(s->chunks);
  if (s->bits) ix_free(t, s->index, (size_t)4 << s->bits);
  s->chunks = NULL;
  s->index = NULL;
  s->nchunks = s->chunks_cap = 0;
  s->bits = 0;
  s->nrec = s->cursor = 0;
}

ps_embed_table *ps_embed_replace_prepare(ps_embed_table *t, const ps_embed_export *in,
                                         ps_status *st) {
  const ps_embed_spec *sp = &t->spec;
  if (in->dim != sp->dim) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "table %s: the rows have dim %lld, the table's dim is %lld", sp->name,
                  (long long)in->dim, (long long)sp->dim);
    return NULL;
  }
  /* the rows go into a new table of the same spec first: a failure there
   * changes nothing */
  ps_embed_table *nt = table_new(sp, st);
  if (nt == NULL) return NULL;
  size_t dim = (size_t)sp->dim;
  uint32_t now = now_cs(t), top = 0;
  ps_embed_counts c = {0};
  int rc = 0;
  for (int64_t i = 0; i < in->n && rc == 0; i++) {
    int64_t key = in->keys[i];
    uint64_t h = ps_embed_key_hash(key);
    stripe *s = &nt->stripes[(h >> 32) & (uint64_t)(nt->nstripes - 1)];
    uint32_t step = clamp_step(in->versions ? in->versions[i] : 0);
    if (step > top) top = step;
    int64_t pos = find(nt, s, key, h, NULL);
    uint8_t *p = pos >= 0 ? rec(nt, s, (s->index[pos] & ID_MASK) - 1) : NULL;
    if (p == NULL) {
      if (s->cap > 0 && (int64_t)s->nrec >= s->cap) evict_one(nt, s, step, now, &c);
      if ((p = insert(nt, s, key, h, step, now, false, st)) == NULL) {
        rc = st->code;
        break;
      }
    }
    float *row = rec_row(p);
    memcpy(row, in->values + (size_t)i * dim, dim * sizeof *row);
    for (int k = 0; k < nt->nslots; k++) {
      if (in->slots[k]) {
        memcpy(row + (size_t)(k + 1) * dim, in->slots[k] + (size_t)i * dim,
               dim * sizeof *row);
      } else {
        bool acc = k == 0 && (sp->optimizer == PS_EMBED_OPT_ADAGRAD ||
                              sp->optimizer == PS_EMBED_OPT_FTRL);
        for (size_t j = 0; j < dim; j++)
          row[(size_t)(k + 1) * dim + j] = acc ? (float)sp->slot_init : 0.0f;
      }
    }
    *rec_u32(p, 0) = step;
    *rec_u32(p, 2) = in->freqs ? clamp_step(in->freqs[i]) : 0;
  }
  if (rc != 0) {
    ps_embed_unref(nt);
    return NULL;
  }
  atomic_store(&nt->step, top);
  return nt;
}

void ps_embed_replace_commit(ps_embed_table *t, ps_embed_table *nt) {
  /* each stripe takes the new one's rows at once; a snapshot waiting for
   * it copies the old rows first */
  pool_merge(t, nt);
  for (int si = 0; si < t->nstripes; si++) {
    stripe *s = &t->stripes[si], *n = &nt->stripes[si];
    pthread_mutex_lock(&s->mu);
    /* a snapshot waiting for the old rows copies what it has not yet */
    if (s->snap) {
      cow_range(t, s, 0, UINT32_MAX);
      if (s->snap) s->snap = NULL; /* its pages hold every record now */
    }
    stripe_clear(t, s);
    s->chunks = n->chunks;
    s->nchunks = n->nchunks;
    s->chunks_cap = n->chunks_cap;
    s->index = n->index;
    s->bits = n->bits;
    s->nrec = n->nrec;
    atomic_fetch_add(&t->rows, (long long)n->nrec);
    size_t own = t->cpb > 0 && n->nchunks > MALLOC_CHUNKS ? MALLOC_CHUNKS : n->nchunks;
    atomic_fetch_add(&t->bytes, (long long)(own * t->chunk_bytes +
                                            (n->bits ? (size_t)4 << n->bits : 0)));
    n->chunks = NULL;
    n->index = NULL;
    n->nchunks = n->chunks_cap = 0;
    n->bits = 0;
    n->nrec = 0;
    pthread_mutex_unlock(&s->mu);
  }
  /* the table's clock is the checkpoint's: rows fresh when saved are
   * fresh after the restore, whatever step this ps had reached */
  atomic_store(&t->step, atomic_load(&nt->step));
  ps_embed_unref(nt);
}

int ps_embed_replace(ps_embed_table *t, const ps_embed_export *in, ps_status *st) {
  ps_embed_table *nt = ps_embed_replace_prepare(t, in, st);
  if (nt == NULL) return st->code;
  ps_embed_replace_commit(t, nt);
  return 0;
}

/* ---- tables ---- */

static void table_free(ps_embed_table *t) {
  for (int i = 0; i < t->nstripes; i++) {
    stripe *s = &t->stripes[i];
    for (size_t k = s->nchunks; k-- > 0;)
      chunk_free(t, s, k);
    free(s->chunks);
    if (s->bits) ix_free(t, s->index, (size_t)4 << s->bits);
    free(s->sketch);
    pthread_mutex_destroy(&s->mu);
  }
  pool_free(t);
  free((char *)t->spec.name);
  free((double *)t->spec.init.values);
  free(t);
}

void ps_embed_unref(ps_embed_table *t) {
  if (t && atomic_fetch_sub(&t->refs, 1) == 1) table_free(t);
}

static ps_embed_table *table_new(const ps_embed_spec *spec, ps_status *st) {
  ps_embed_spec sp = *spec;
  normalize(&sp);
  /* small capacities stay exact: one stripe holds them all */
  int nstripes =
      sp.policy.max_rows > 0 && sp.policy.max_rows < 65536 ? 1 : PS_EMBED_STRIPES;
  ps_embed_table *t = calloc(1, sizeof *t + (size_t)nstripes * sizeof(stripe));
  char *name = strdup(sp.name);
  double *vals = sp.init.nvalues ? malloc(sp.init.nvalues * sizeof *vals) : NULL;
  if (t == NULL || name == NULL || (sp.init.nvalues && vals == NULL)) {
    free(t);
    free(name);
    free(vals);
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableCreate %s: out of memory", spec->name);
    return NULL;
  }
  if (vals) memcpy(vals, sp.init.values, sp.init.nvalues * sizeof *vals);
  sp.name = name;
  sp.init.values = vals;
  t->spec = sp;
  atomic_init(&t->refs, 1);
  t->nslots = ps_embed_optimizer_slots(sp.optimizer);
  t->stride = HDR + (size_t)sp.dim * sizeof(float) * (size_t)(1 + t->nslots);
  t->chunk_bytes = t->stride * CHUNK_ROWS;
  t->cpb = t->chunk_bytes <= HUGE_BYTES - BLOCK_HDR
               ? (HUGE_BYTES - BLOCK_HDR) / t->chunk_bytes
               : 0;
  pthread_mutex_init(&t->pool.mu, NULL);
  t->seed = (uint64_t)sp.init.seed ^ ps_init_name_hash(name);
  t->nstripes = nstripes;
  int64_t w = sp.policy.sketch_width / nstripes;
  unsigned bits = 6;
  while (((int64_t)1 << bits) < w)
    bits++;
  t->sketch_bits = bits;
  clock_gettime(CLOCK_MONOTONIC, &t->born);
  for (int i = 0; i < nstripes; i++) {
    stripe *s = &t->stripes[i];
    pthread_mutex_init(&s->mu, NULL);
    s->rng = 0x2545F4914F6CDD1Dull * (uint64_t)(i + 1);
    if (sp.policy.max_rows > 0)
      s->cap =
          sp.policy.max_rows / nstripes + (i < sp.policy.max_rows % nstripes ? 1 : 0);
  }
  return t;
}

ps_embed_store *ps_embed_store_create(void) {
  ps_embed_store *s = calloc(1, sizeof *s);
  if (s) pthread_mutex_init(&s->mu, NULL);
  return s;
}

void ps_embed_store_destroy(ps_embed_store *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->n; i++)
    ps_embed_unref(s->v[i]);
  free(s->v);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static ssize_t find_table(ps_embed_store *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i]->spec.name, name) == 0) return (ssize_t)i;
  return -1;
}

int ps_embed_create(ps_embed_store *s, const ps_embed_spec *spec, bool *created,
                    ps_status *st) {
  *created = false;
  int rc = ps_embed_check_spec(spec, st);
  if (rc != 0) return rc;
  ps_embed_table *t = table_new(spec, st);
  if (t == NULL) return st->code;
  pthread_mutex_lock(&s->mu);
  ssize_t at = find_table(s, spec->name);
  if (at >= 0) {
    const char *d = spec_diff(&s->v[at]->spec, &t->spec);
    if (d)
      rc = ps_status_set(st, PS_ALREADY_EXISTS,
                         "TableCreate %s: the table exists with another %s", spec->name,
                         d);
  } else if (s->n >= PS_EMBED_MAX_TABLES) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "TableCreate %s: this ps holds %d tables, the most it takes",
                       spec->name, PS_EMBED_MAX_TABLES);
  } else if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    ps_embed_table **v = realloc(s->v, cap * sizeof *v);
    if (v == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableCreate %s: out of memory",
                         spec->name);
    } else {
      s->v = v;
      s->cap = cap;
    }
  }
  if (rc == 0 && at < 0) {
    s->v[s->n++] = t;
    *created = true;
    t = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  ps_embed_unref(t);
  return rc;
}

ps_embed_table *ps_embed_find(ps_embed_store *s, const char *name, ps_status *st) {
  pthread_mutex_lock(&s->mu);
  ssize_t at = find_table(s, name);
  ps_embed_table *t = at >= 0 ? s->v[at] : NULL;
  if (t) atomic_fetch_add(&t->refs, 1);
  pthread_mutex_unlock(&s->mu);
  if (t == NULL) ps_status_set(st, PS_NOT_FOUND, "table %s not found", name);
  return t;
}

int ps_embed_drop(ps_embed_store *s, const char *name, ps_status *st) {
  pthread_mutex_lock(&s->mu);
  ssize_t at = find_table(s, name);
  ps_embed_table *t = NULL;
  if (at >= 0) {
    t = s->v[at];
    s->v[at] = s->v[--s->n];
  }
  pthread_mutex_unlock(&s->mu);
  if (t == NULL) return ps_status_set(st, PS_NOT_FOUND, "table %s not found", name);
  ps_embed_unref(t);
  return 0;
}

const ps_embed_spec *ps_embed_table_spec(const ps_embed_table *t) {
  return &t->spec;
}

void ps_embed_table_stats(ps_embed_table *t, ps_embed_stats *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->name, sizeof o->name, "%s", t->spec.name);
  o->dim = t->spec.dim;
  o->optimizer = t->spec.optimizer;
  o->rows = atomic_load(&t->rows);
  o->bytes = atomic_load(&t->bytes);
  o->evicted_total = atomic_load(&t->evicted);
  o->expired_total = atomic_load(&t->expired);
  o->refused_total = atomic_load(&t->refused);
  o->created_total = atomic_load(&t->created);
  o->policy = t->spec.policy;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const ps_embed_stats *)a)->name, ((const ps_embed_stats *)b)->name);
}

ps_embed_stats *ps_embed_list(ps_embed_store *s, size_t *n) {
  pthread_mutex_lock(&s->mu);
  ps_embed_stats *v = s->n ? malloc(s->n * sizeof *v) : NULL;
  *n = v ? s->n : 0;
  for (size_t i = 0; i < *n; i++)
    ps_embed_table_stats(s->v[i], &v[i]);
  pthread_mutex_unlock(&s->mu);
  if (v) qsort(v, *n, sizeof *v, by_name);
  return v;
}

static int table_by_name(const void *a, const void *b) {
  return strcmp((*(ps_embed_table *const *)a)->spec.name,
                (*(ps_embed_table *const *)b)->spec.name);
}

ps_embed_table **ps_embed_tables(ps_embed_store *s, size_t *n) {
  pthread_mutex_lock(&s->mu);
  *n = s->n;
  ps_embed_table **v = malloc((s->n + 1) * sizeof *v);
  for (size_t i = 0; v && i < s->n; i++) {
    v[i] = s->v[i];
    atomic_fetch_add(&v[i]->refs, 1);
  }
  pthread_mutex_unlock(&s->mu);
  if (v) qsort(v, *n, sizeof *v, table_by_name);
  return v;
}

void ps_embed_totals(ps_embed_store *s, int64_t *tables, int64_t *rows, int64_t *bytes) {
  pthread_mutex_lock(&s->mu);
  *tables = (int64_t)s->n;
  *rows = *bytes = 0;
  for (size_t i = 0; i < s->n; i++) {
    *rows += atomic_load(&s->v[i]->rows);
    *bytes += atomic_load(&s->v[i]->bytes);
  }
  pthread_mutex_unlock(&s->mu);
}
