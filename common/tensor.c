/* Data types, shapes, refcounted buffers and elementwise arithmetic.
 *
 * Arithmetic on float/double/integers runs in the native type so the
 * compiler vectorizes it; half and bfloat16 go through float, as
 * TensorFlow's CPU kernels do. */
#include "tensor.h"
#include "common/appendf.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* The numbers are TensorFlow's types.proto DataType values; they travel in
 * requests and checkpoints, so an edit of PS_DTYPE_LIST that changes one
 * must fail to compile.  The sizes must be the C types' sizes. */
_Static_assert(PS_DT_INVALID == 0, "DT_INVALID");
_Static_assert(PS_DT_FLOAT == 1 && PS_DT_DOUBLE == 2 && PS_DT_INT32 == 3 &&
                   PS_DT_UINT8 == 4 && PS_DT_INT16 == 5 && PS_DT_INT8 == 6 &&
                   PS_DT_STRING == 7 && PS_DT_COMPLEX64 == 8 && PS_DT_INT64 == 9 &&
                   PS_DT_BOOL == 10 && PS_DT_BFLOAT16 == 14 && PS_DT_UINT16 == 17 &&
                   PS_DT_COMPLEX128 == 18 && PS_DT_HALF == 19 && PS_DT_UINT32 == 22 &&
                   PS_DT_UINT64 == 23,
               "ps_dtype must be TensorFlow's DataType numbering (types.proto)");
#define SIZE_FLOAT(T, S) (sizeof(T) == (S))
#define SIZE_INT(T, S) (sizeof(T) == (S))
#define SIZE_HALF(T, S) (sizeof(T) == (S))
#define SIZE_BF16(T, S) (sizeof(T) == (S))
#define SIZE_BOOL(T, S) (sizeof(T) == (S))
#define SIZE_COMPLEX(T, S) (2 * sizeof(T) == (S))
#define SIZE_STRING(T, S) ((S) == 0)
#define X(E, N, NAME, SIZE, T, U, KIND)                                                  \
  _Static_assert(SIZE_##KIND(T, SIZE), "size of DT_" #E);
PS_DTYPE_LIST(X)
#undef X

static const struct {
  int dtype;
  size_t size;
  const char *name;
  const char *enum_name;
} dtypes[] = {
#define X(E, N, NAME, SIZE, T, U, KIND) {PS_DT_##E, SIZE, NAME, "DT_" #E},
    PS_DTYPE_LIST(X)
#undef X
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

static int dtype_index(int dtype) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dtype == dtype) return (int)i;
  return -1;
}

size_t ps_dtype_size(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? 0 : dtypes[i].size;
}

const char *ps_dtype_name(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? "unknown" : dtypes[i].name;
}

const char *ps_dtype_enum_name(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? "DT_INVALID" : dtypes[i].enum_name;
}

size_t ps_dtype_stored_size(int dtype) {
  if (dtype_index(dtype) >= 0) return ps_dtype_size(dtype);
  switch (dtype) {
#define X(N, NAME, SIZE)                                                                 \
  case N:                                                                                \
    return SIZE;
    PS_DTYPE_STORED_LIST(X)
#undef X
  default:
    return 0;
  }
}

const char *ps_dtype_any_enum_name(int dtype) {
  if (dtype_index(dtype) >= 0) return ps_dtype_enum_name(dtype);
  switch (dtype) {
#define X(N, NAME, SIZE)                                                                 \
  case N:                                                                                \
    return NAME;
    PS_DTYPE_STORED_LIST(X)
#undef X
  default:
    return NULL;
  }
}

const char *ps_dtype_python_name(int dtype) {
  switch (dtype) {
  case PS_DT_FLOAT:
    return "float32";
  case PS_DT_DOUBLE:
    return "float64";
  case PS_DT_HALF:
    return "float16";
  default:
    return ps_dtype_name(dtype);
  }
}

ps_dtype ps_dtype_from_name(const char *s) {
  if (s == NULL) return PS_DT_INVALID;
  if (!strcasecmp(s, "float32")) return PS_DT_FLOAT;
  if (!strcasecmp(s, "float64")) return PS_DT_DOUBLE;
  if (!strcasecmp(s, "float16")) return PS_DT_HALF;
  for (size_t i = 0; i < NDTYPES; i++)
    if (!strcasecmp(s, dtypes[i].name) || !strcasecmp(s, dtypes[i].enum_name))
      return (ps_dtype)dtypes[i].dtype;
  return PS_DT_INVALID;
}

/* Per kind: numeric (the ps does arithmetic on it), floating. */
#define NUMERIC_FLOAT 1
#define NUMERIC_INT 1
#define NUMERIC_HALF 1
#define NUMERIC_BF16 1
#define NUMERIC_BOOL 0
#define NUMERIC_COMPLEX 0
#define NUMERIC_STRING 0
#define FLOATING_FLOAT 1
#define FLOATING_INT 0
#define FLOATING_HALF 1
#define FLOATING_BF16 1
#define FLOATING_BOOL 0
#define FLOATING_COMPLEX 0
#define FLOATING_STRING 0

bool ps_dtype_is_numeric(int dtype) {
  switch (dtype) {
#define X(E, N, NAME, SIZE, T, U, KIND)                                                  \
  case PS_DT_##E:                                                                        \
    return NUMERIC_##KIND;
    PS_DTYPE_LIST(X)
#undef X
  default:
    return false;
  }
}

bool ps_dtype_is_floating(int dtype) {
  switch (dtype) {
#define X(E, N, NAME, SIZE, T, U, KIND)                                                  \
  case PS_DT_##E:                                                                        \
    return FLOATING_##KIND;
    PS_DTYPE_LIST(X)
#undef X
  default:
    return false;
  }
}

int64_t ps_shape_num_elements(const ps_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) {
    if (s->dim[i] < 0) return -1;
    if (s->dim[i] != 0 && n > INT64_MAX / s->dim[i]) return -1;
    n *= s->dim[i];
  }
  return n;
}

bool ps_shape_equal(const ps_shape *a, const ps_shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

char *ps_shape_format(const ps_shape *s, char *buf, size_t n) {
  size_t off = 0;
  if (n == 0) return buf;
  buf[0] = '\0';
  ps_appendf(buf, n, &off, "[");
  for (int i = 0; i < s->rank; i++)
    ps_appendf(buf, n, &off, i ? ",%lld" : "%lld", (long long)s->dim[i]);
  ps_appendf(buf, n, &off, "]");
  return buf;
}

char *ps_shape_format_py(const ps_shape *s, char *buf, size_t n) {
  size_t off = 0;
  if (n == 0) return buf;
  buf[0] = '\0';
  if (s->rank < 0) {
    ps_appendf(buf, n, &off, "<unknown>");
    return buf;
  }
  ps_appendf(buf, n, &off, "(");
  for (int i = 0; i < s->rank; i++) {
    if (s->dim[i] < 0)
      ps_appendf(buf, n, &off, i ? ", ?" : "?");
    else
      ps_appendf(buf, n, &off, i ? ", %lld" : "%lld", (long long)s->dim[i]);
  }
  ps_appendf(buf, n, &off, s->rank == 1 ? ",)" : ")");
  return buf;
}

int ps_shape_set(ps_shape *s, const int64_t *dims, size_t rank, ps_status *st) {
  if (rank > PS_MAX_RANK)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "rank %zu exceeds the maximum of %d",
                         rank, PS_MAX_RANK);
  s->rank = (int)rank;
  for (size_t i = 0; i < rank; i++) {
    if (dims[i] < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "dimension %zu is negative (%lld)", i,
                           (long long)dims[i]);
    s->dim[i] = dims[i];
  }
  if (ps_shape_num_elements(s) < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "shape has too many elements");
  return 0;
}

int ps_size_mul(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r) || r > PS_SIZE_MAX) return -1;
  *out = r;
  return 0;
}

int ps_size_add(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r) || r > PS_SIZE_MAX) return -1;
  *out = r;
  return 0;
}

int ps_size_elems(int dtype, int64_t count, size_t *out) {
  size_t es = ps_dtype_size(dtype);
  if (es == 0 || count < 0) return -1;
  return ps_size_mul((size_t)count, es, out);
}

int ps_size_bytes(int dtype, const ps_shape *s, size_t *out) {
  size_t es = ps_dtype_size(dtype), n = es;
  if (es == 0 || s->rank < 0 || s->rank > PS_MAX_RANK) return -1;
  for (int i = 0; i < s->rank; i++)
    if (s->dim[i] < 0 || ps_size_mul(n, (size_t)s->dim[i], &n) != 0) return -1;
  *out = n;
  return 0;
}

/* Recently freed big buffers, reused by exact size.  glibc hands every
 * allocation above 32 MiB to mmap, so without this each 64 MiB assign on
 * the ps pays ~16k page faults and an munmap; with it, a same-size buffer
 * comes back warm.  Bounded (PS_BUF_CACHE_MB, default 256 MiB), and
 * emptied by ps_buf_cache_release() when the ps has been idle a while
 * (rpc_monitor.c), so that a ps at rest holds only its variables. */
#define CACHE_SLOTS 4
#define CACHE_MIN ((size_t)1 << 20)
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  size_t size;
  void *data;
} cache[CACHE_SLOTS];
static size_t cache_bytes;
static size_t cache_cap;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_cap_init(void) {
  const char *e = getenv("PS_BUF_CACHE_MB");
  long long mb = e ? atoll(e) : 256;
  if (mb < 0) mb = 0;
  if (mb > (1LL << 30)) mb = 1LL << 30; /* no shift overflow */
  cache_cap = (size_t)mb << 20;
}

/* Read by every thread that frees a buffer: set once (pthread_once). */
static size_t cache_limit(void) {
  pthread_once(&cache_once, cache_cap_init);
  return cache_cap;
}

static void *cache_take(size_t alloc) {
  void *p = NULL;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (cache[i].data && cache[i].size == alloc) {
      p = cache[i].data;
      cache[i].data = NULL;
      cache_bytes -= alloc;
      break;
    }
  pthread_mutex_unlock(&cache_mu);
  return p;
}

/* Returns true if the cache took @p. */
static bool cache_put(void *p, size_t alloc) {
  if (alloc < CACHE_MIN || alloc > cache_limit()) return false;
  void *evict[CACHE_SLOTS];
  int ne = 0;
  bool taken = false;
  pthread_mutex_lock(&cache_mu);
  /* make room: drop entries until it fits, oldest slot first */
  for (int i = 0; i < CACHE_SLOTS && cache_bytes + alloc > cache_limit(); i++)
    if (cache[i].data) {
      evict[ne++] = cache[i].data;
      cache_bytes -= cache[i].size;
      cache[i].data = NULL;
    }
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (cache[i].data == NULL) {
      cache[i].data = p;
      cache[i].size = alloc;
      cache_bytes += alloc;
      taken = true;
      break;
    }
  pthread_mutex_unlock(&cache_mu);
  for (int i = 0; i < ne; i++)
    free(evict[i]);
  return taken;
}

size_t ps_buf_cache_release(void) {
  void *drop[CACHE_SLOTS];
  int n = 0;
  size_t bytes;
  pthread_mutex_lock(&cache_mu);
  bytes = cache_bytes;
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (cache[i].data) {
      drop[n++] = cache[i].data;
      cache[i].data = NULL;
    }
  cache_bytes = 0;
  pthread_mutex_unlock(&cache_mu);
  for (int i = 0; i < n; i++)
    free(drop[i]);
  return bytes;
}

/* Big tensors (an embedding table) on transparent huge pages where the
 * kernel offers them on request (THP "madvise"): random row updates then
 * miss the TLB far less.  Only whole 2 MiB pages inside the buffer. */
#define HUGE_PAGE ((uintptr_t)2 << 20)
static void advise_huge(void *p, size_t n) {
  if (n < 4 * HUGE_PAGE) return;
  uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  uintptr_t e = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
  if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
}

/* Zeroes @n bytes of new memory.  calloc would, but its big blocks (an
 * mmap of glibc's) start 16 bytes into a page, not 64-byte aligned as a
 * ps_buf must be.  Big ones keep calloc's lazily zeroed pages: the whole
 * pages inside are handed back (MADV_DONTNEED: an anonymous private page
 * reads as zeros when next touched), only the partial pages at the ends
 * are written. */
static void zero_fresh(void *p, size_t n) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t s = (uintptr_t)p, e = s + n;
  uintptr_t a = (s + page - 1) & ~(page - 1), z = e & ~(page - 1);
  if (n < CACHE_MIN || z <= a || madvise((void *)a, z - a, MADV_DONTNEED) != 0) {
    memset(p, 0, n);
    return;
  }
  memset(p, 0, a - s);
  memset((void *)z, 0, e - z);
}

/* This machine's memory: no buffer larger is asked of the allocator (a
 * size from outside, e.g. a .meta's [2^40] variable, fails as out of
 * memory; under ASan such a request would abort instead). */
static size_t phys_mem(void) {
  static _Atomic size_t mem;
  size_t m = atomic_load(&mem);
  if (m == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0 || ps_size_mul((size_t)pages, (size_t)psz, &m) != 0)
      m = PS_SIZE_MAX;
    atomic_store(&mem, m);
  }
  return m;
}

static ps_buf *buf_create(size_t size, bool zero, bool huge) {
  if (size > PS_SIZE_MAX) return NULL; /* the rounding below cannot wrap */
  if (size > phys_mem()) return NULL;
  ps_buf *b = malloc(sizeof *b);
  if (b == NULL) return NULL;
  size_t alloc = (size + 63) & ~(size_t)63;
  if (alloc == 0) alloc = 64;
  b->alloc = alloc;
  b->data = alloc >= CACHE_MIN ? cache_take(alloc) : NULL;
  bool warm = b->data != NULL;
  if (!warm) b->data = aligned_alloc(64, alloc);
  if (b->data == NULL) {
    free(b);
    return NULL;
  }
  if (zero) {
    if (warm)
      memset(b->data, 0, alloc);
    else
      zero_fresh(b->data, alloc);
  }
  if (huge) advise_huge(b->data, alloc);
  atomic_init(&b->refs, 1);
  b->size = size;
  return b;
}

ps_buf *ps_buf_create(size_t size, bool zero) {
  return buf_create(size, zero, true);
}

/* New memory faulted in 4 KiB pages: a 2 MiB page is zeroed whole on its
 * first touch, and on a VM that hands free memory back to its host (free
 * page reporting) every such page is a host fault too: 1-2 s of CPU per
 * GiB here, against 0.4-0.7 s in 4 KiB pages (tests/bench/README.md,
 * bench_ckpt).  Huge pages are asked for once the bytes are in
 * (ps_buf_advise_huge): khugepaged merges them in the background. */
ps_buf *ps_buf_create_for_read(size_t size) {
  return buf_create(size, false, false);
}

void ps_buf_advise_huge(ps_buf *b) {
  if (b) advise_huge(b->data, b->alloc);
}

ps_buf *ps_buf_ref(ps_buf *b) {
  if (b) atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  return b;
}

void ps_buf_unref(ps_buf *b) {
  if (b == NULL) return;
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
    if (!cache_put(b->data, b->alloc)) free(b->data);
    free(b);
  }
}

ps_tensor *ps_tensor_create(ps_dtype dtype, const ps_shape *shape, bool zero) {
  size_t bytes;
  if (ps_size_bytes(dtype, shape, &bytes) != 0) return NULL;
  ps_tensor *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->dtype = dtype;
  t->shape = *shape;
  t->buf = ps_buf_create(bytes, zero);
  if (t->buf == NULL) {
    free(t);
    return NULL;
  }
  return t;
}

ps_tensor *ps_tensor_new(ps_dtype dtype, int rank, const int64_t *dims) {
  ps_shape s;
  if (ps_shape_set(&s, dims, rank < 0 ? 0 : (size_t)rank, NULL) != 0) return NULL;
  return ps_tensor_create(dtype, &s, true);
}

/* A string tensor's buffer: n + 1 offsets (uint64, the last one the end),
 * then the strings, each with its NUL. */
ps_tensor *ps_tensor_new_strings(const char *const *s, size_t n) {
  size_t head, bytes = 0;
  if (ps_size_mul(n + 1, sizeof(uint64_t), &head) != 0) return NULL;
  for (size_t i = 0; i < n; i++)
    if (s[i] == NULL || ps_size_add(bytes, strlen(s[i]) + 1, &bytes) != 0) return NULL;
  if (ps_size_add(bytes, head, &bytes) != 0 || n > INT64_MAX) return NULL;
  ps_tensor *t = calloc(1, sizeof *t);
  if (t == NULL || (t->buf = ps_buf_create(bytes, false)) == NULL) {
    free(t);
    return NULL;
  }
  t->dtype = PS_DT_STRING;
  t->shape.rank = 1;
  t->shape.dim[0] = (int64_t)n;
  uint64_t *off = (uint64_t *)t->buf->data;
  char *p = (char *)t->buf->data + head;
  uint64_t at = head;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(s[i]) + 1;
    off[i] = at;
    memcpy(p, s[i], len);
    p += len;
    at += len;
  }
  off[n] = at;
  return t;
}

const char *ps_tensor_string(const ps_tensor *t, int64_t i) {
  if (t == NULL || t->dtype != PS_DT_STRING || t->buf == NULL || t->shape.rank != 1 ||
      i < 0 || i >= t->shape.dim[0])
    return NULL;
  const uint64_t *off = (const uint64_t *)t->buf->data;
  return (const char *)t->buf->data + off[i];
}

void ps_tensor_destroy(ps_tensor *t) {
  if (t == NULL) return;
  ps_buf_unref(t->buf);
  free(t);
}

/* The library's exported symbol; code inside the project gets the inline
 * version through the macro in tensor.h (hence the parentheses). */
void *(ps_tensor_data)(const ps_tensor *t) {
  return ps_tensor_data_inline(t);
}

size_t ps_tensor_nbytes(const ps_tensor *t) {
  size_t n = 0;
  return ps_size_bytes(t->dtype, &t->shape, &n) == 0 ? n : 0;
}

int64_t ps_tensor_num_elements(const ps_tensor *t) {
  return ps_shape_num_elements(&t->shape);
}

float ps_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t ps_float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* inf or nan */
    return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow */
  if (absx < 0x38800000u) { /* subnormal or zero in half */
    if (absx < 0x33000000u) return (uint16_t)sign;
    uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
    /* value = m * 2^(e-150); a half subnormal counts units of 2^-24 */
    int s = 126 - (int)e;
    uint32_t r = m >> s;
    uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

float ps_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t ps_float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* Plain loops the compiler vectorizes (no target_clones here: an ifunc
 * of an external name is exported from libpsworker whatever its
 * visibility, and ifunc resolvers run before ThreadSanitizer's runtime is
 * up, which kills every program of common/ under TSan). */
static void bf16_widen(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &x, sizeof x);
  }
}

static void bf16_narrow(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x;
    memcpy(&x, &src[i], sizeof x);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    dst[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r);
  }
}

void ps_bf16_widen(float *dst, const uint16_t *src, size_t n) {
  bf16_widen(dst, src, n);
}

void ps_bf16_narrow(uint16_t *dst, const float *src, size_t n) {
  bf16_narrow(dst, src, n);
}

/* Element access per kind: native types convert as a C cast does; half
 * and bfloat16 go through float; bool reads nonzero as 1 and stores v != 0;
 * complex and string have no single value (get 0, set nothing). */
#define GET_FLOAT(E, T)                                                                  \
  case PS_DT_##E:                                                                        \
    return ((const T *)p)[i];
#define GET_INT(E, T)                                                                    \
  case PS_DT_##E:                                                                        \
    return (double)((const T *)p)[i];
#define GET_HALF(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    return ps_half_to_float(((const T *)p)[i]);
#define GET_BF16(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    return ps_bf16_to_float(((const T *)p)[i]);
#define GET_BOOL(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    return ((const T *)p)[i] != 0;
#define GET_COMPLEX(E, T)
#define GET_STRING(E, T)
#define SET_FLOAT(E, T)                                                                  \
  case PS_DT_##E:                                                                        \
    ((T *)p)[i] = (T)v;                                                                  \
    break;
#define SET_INT(E, T)                                                                    \
  case PS_DT_##E:                                                                        \
    ((T *)p)[i] = (T)v;                                                                  \
    break;
#define SET_HALF(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    ((T *)p)[i] = ps_float_to_half((float)v);                                            \
    break;
#define SET_BF16(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    ((T *)p)[i] = ps_float_to_bf16((float)v);                                            \
    break;
#define SET_BOOL(E, T)                                                                   \
  case PS_DT_##E:                                                                        \
    ((T *)p)[i] = v != 0;                                                                \
    break;
#define SET_COMPLEX(E, T)
#define SET_STRING(E, T)

double ps_elem_get(int dtype, const void *p, int64_t i) {
  switch (dtype) {
#define X(E, N, NAME, SIZE, T, U, KIND) GET_##KIND(E, T)
    PS_DTYPE_LIST(X)
#undef X
  default:
    return 0;
  }
}

void ps_elem_set(int dtype, void *p, int64_t i, double v) {
  switch (dtype) {
#define X(E, N, NAME, SIZE, T, U, KIND) SET_##KIND(E, T)
    PS_DTYPE_LIST(X)
#undef X
  default:
    break;
  }
}

/* Integers wrap (PS_WRAP_ADD, common/tensor.h); for floating types U is
 * T. */
#define APPLY_NATIVE(T, U)                                                               \
  do {                                                                                   \
    T *d = dst;                                                                          \
    const T *s = src;                                                                    \
    if (op == '+')                                                                       \
      for (int64_t i = 0; i < n; i++)                                                    \
        d[i] = PS_WRAP_ADD(T, U, d[i], s[i]);                                            \
    else if (op == '-')                                                                  \
      for (int64_t i = 0; i < n; i++)                                                    \
        d[i] = PS_WRAP_SUB(T, U, d[i], s[i]);                                            \
    else                                                                                 \
      memcpy(d, s, (size_t)n * sizeof(T));                                               \
    return 0;                                                                            \
  } while (0)

/* Half and bfloat16 add through float; bool only assigns. */
#define APPLY_FLOAT(E, T, U)                                                             \
  case PS_DT_##E:                                                                        \
    APPLY_NATIVE(T, U);
#define APPLY_INT(E, T, U)                                                               \
  case PS_DT_##E:                                                                        \
    APPLY_NATIVE(T, U);
#define APPLY_HALF(E, T, U)                                                              \
  case PS_DT_##E:                                                                        \
    return apply_via_float(dtype, op, dst, src, n);
#define APPLY_BF16(E, T, U)                                                              \
  case PS_DT_##E:                                                                        \
    return apply_via_float(dtype, op, dst, src, n);
#define APPLY_BOOL(E, T, U)                                                              \
  case PS_DT_##E:                                                                        \
    if (op != '=') return -1;                                                            \
    memcpy(dst, src, (size_t)n * sizeof(T));                                             \
    return 0;
#define APPLY_COMPLEX(E, T, U)
#define APPLY_STRING(E, T, U)

static int apply_via_float(int dtype, char op, void *dst, const void *src, int64_t n) {
  if (op == '=') {
    memcpy(dst, src, (size_t)n * ps_dtype_size(dtype));
    return 0;
  }
  for (int64_t i = 0; i < n; i++) {
    double a = ps_elem_get(dtype, dst, i), b = ps_elem_get(dtype, src, i);
    ps_elem_set(dtype, dst, i, op == '+' ? a + b : a - b);
  }
  return 0;
}

int ps_elem_apply(int dtype, char op, void *dst, const void *src, int64_t n) {
  switch (dtype) {
#define X(E, N, NAME, SIZE, T, U, KIND) APPLY_##KIND(E, T, U)
    PS_DTYPE_LIST(X)
#undef X
  default:
    return -1;
  }
}
