/* inspect_checkpoint: a checkpoint's tensors listed as TensorFlow's tool
 * lists them, and (--all) their values printed as numpy prints arrays. */
#include "paramserver/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tensor.h"

/* ---- inspect_checkpoint --------------------------------------------------- */

/* TensorFlow's DataType name of @dtype, known or not. */
static const char *dtype_name(int dtype, char *buf, size_t n) {
  const char *name =
      dtype == PS_DT_INVALID ? "DT_INVALID" : ps_dtype_any_enum_name(dtype);
  if (name) return name;
  snprintf(buf, n, "DT_UNKNOWN_%d", dtype);
  return buf;
}

/* Python's repr() of bytes. */
static void put_bytes_repr(sbuf *b, const char *s, size_t n) {
  bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
  char q = sq && !dq ? '"' : '\'';
  ps_sb_putc_(b, 'b');
  ps_sb_putc_(b, q);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == (unsigned char)q || c == '\\') {
      ps_sb_putc_(b, '\\');
      ps_sb_putc_(b, (char)c);
    } else if (c == '\t') {
      ps_sb_puts_(b, "\\t");
    } else if (c == '\n') {
      ps_sb_puts_(b, "\\n");
    } else if (c == '\r') {
      ps_sb_puts_(b, "\\r");
    } else if (c < 0x20 || c >= 0x7f) {
      char x[8];
      snprintf(x, sizeof x, "\\x%02x", c);
      ps_sb_puts_(b, x);
    } else {
      ps_sb_putc_(b, (char)c);
    }
  }
  ps_sb_putc_(b, q);
}

/* Element @i of a tensor's values, as numpy's str() shows it. */
/* A complex element as Python prints one: "(1+2j)". */
static void put_complex(sbuf *b, int dtype, const uint8_t *p, int64_t i) {
  double re, im;
  if (dtype == PS_DT_COMPLEX64) {
    float f[2];
    memcpy(f, p + 8 * i, 8);
    re = f[0], im = f[1];
  } else {
    memcpy(&re, p + 16 * i, 8);
    memcpy(&im, p + 16 * i + 8, 8);
  }
  int kind = dtype == PS_DT_COMPLEX64 ? K_FLOAT : K_DOUBLE;
  ps_sb_putc_(b, '(');
  ps_repr_float_(b, re, kind, true);
  if (!(signbit(im) && !isnan(im))) ps_sb_putc_(b, '+');
  ps_repr_float_(b, im, kind, true);
  ps_sb_puts_(b, "j)");
}

/* Element @i of a tensor of @dtype, as numpy prints it. */
static void put_element(sbuf *b, int dtype, const void *data,
                        const ps_bundle_strings *strs, int64_t i) {
  char t[48];
  const uint8_t *p = data;
#define PS_CASE_FLOAT(T, U)                                                              \
  do {                                                                                   \
    T v;                                                                                 \
    memcpy(&v, p + sizeof v * (size_t)i, sizeof v);                                      \
    ps_repr_float_(b, v, sizeof v == 4 ? K_FLOAT : K_DOUBLE, false);                     \
  } while (0)
#define PS_CASE_INT(T, U)                                                                \
  do {                                                                                   \
    T v;                                                                                 \
    memcpy(&v, p + sizeof v * (size_t)i, sizeof v);                                      \
    if (_Generic((T)0, int8_t : 1, int16_t : 1, int32_t : 1, int64_t : 1, default : 0))  \
      snprintf(t, sizeof t, "%" PRId64, (int64_t)v);                                     \
    else                                                                                 \
      snprintf(t, sizeof t, "%" PRIu64, (uint64_t)v);                                    \
    ps_sb_puts_(b, t);                                                                   \
  } while (0)
  bool native = true;
  PS_DTYPE_SWITCH_NATIVE(dtype, native = false)
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
  if (native) return;
  uint16_t h;
  switch (dtype) {
  case PS_DT_HALF:
    memcpy(&h, p + 2 * i, 2);
    ps_repr_float_(b, ps_half_to_float(h), K_HALF, false);
    return;
  case PS_DT_BFLOAT16:
    memcpy(&h, p + 2 * i, 2);
    ps_repr_float_(b, ps_bf16_to_float(h), K_BF16, false);
    return;
  case PS_DT_COMPLEX64:
  case PS_DT_COMPLEX128:
    put_complex(b, dtype, p, i);
    return;
  case PS_DT_BOOL:
    ps_sb_puts_(b, p[i] ? "True" : "False");
    return;
  case PS_DT_STRING:
    put_bytes_repr(b, strs->str[i], strs->len[i]);
    return;
  default:
    ps_sb_puts_(b, "?");
    return;
  }
}

#define SUMMARY_THRESHOLD 1000 /* numpy's print threshold and edgeitems */
#define EDGE_ITEMS 3

typedef struct printer {
  sbuf *b;
  int dtype;
  const void *data;
  const ps_bundle_strings *strs;
  const ps_shape *shape;
  int64_t stride[PS_MAX_RANK];
  bool summarize;
} printer;

/* Between items of @axis: a space in the innermost dimension, else one
 * newline per enclosed dimension and an indent of axis+1. */
static void put_separator(printer *pr, int axis) {
  int rank = pr->shape->rank;
  if (axis == rank - 1) {
    ps_sb_putc_(pr->b, ' ');
    return;
  }
  for (int i = 0; i < rank - 1 - axis; i++)
    ps_sb_putc_(pr->b, '\n');
  for (int i = 0; i <= axis; i++)
    ps_sb_putc_(pr->b, ' ');
}

static void put_axis(printer *pr, int axis, int64_t off) {
  if (axis == pr->shape->rank) {
    put_element(pr->b, pr->dtype, pr->data, pr->strs, off);
    return;
  }
  int64_t d = pr->shape->dim[axis];
  bool skip = pr->summarize && d > 2 * EDGE_ITEMS;
  ps_sb_putc_(pr->b, '[');
  for (int64_t i = 0; i < d; i++) {
    if (skip && i == EDGE_ITEMS) {
      put_separator(pr, axis);
      ps_sb_puts_(pr->b, "...");
      i = d - EDGE_ITEMS;
    }
    if (i > 0) put_separator(pr, axis);
    put_axis(pr, axis + 1, off + i * pr->stride[axis]);
  }
  ps_sb_putc_(pr->b, ']');
}

static int put_values(sbuf *b, ps_bundle_reader *r, const ps_bundle_entry *e,
                      ps_status *st) {
  ps_tensor *t = NULL;
  ps_bundle_strings *strs = NULL;
  const void *data = NULL;
  int rc;
  if (e->dtype == PS_DT_STRING) {
    rc = ps_bundle_reader_read_strings(r, e->key, &strs, st);
  } else if (ps_dtype_size(e->dtype) > 0) {
    rc = ps_bundle_reader_read(r, e->key, &t, st);
    if (rc == 0) data = ps_tensor_data(t);
  } else {
    char nb[32];
    ps_sb_puts_(b, "(values of type ");
    ps_sb_puts_(b, dtype_name(e->dtype, nb, sizeof nb));
    ps_sb_puts_(b, " are not shown)\n");
    return 0;
  }
  if (rc != 0) return rc;
  printer pr = {
      .b = b, .dtype = e->dtype, .data = data, .strs = strs, .shape = &e->shape};
  int64_t stride = 1;
  for (int a = e->shape.rank - 1; a >= 0; a--) {
    pr.stride[a] = stride;
    stride *= e->shape.dim[a];
  }
  pr.summarize = ps_shape_num_elements(&e->shape) > SUMMARY_THRESHOLD;
  put_axis(&pr, 0, 0);
  ps_sb_putc_(b, '\n');
  ps_tensor_destroy(t);
  ps_bundle_strings_destroy(strs);
  return 0;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int flush_sbuf(sbuf *b, FILE *out, const char *prefix, ps_status *st) {
  if (b->oom) {
    b->oom = false;
    b->len = 0;
    return ps_ckpt_oom_(st);
  }
  size_t n = b->len;
  b->len = 0;
  if (n && fwrite(b->p, 1, n, out) != n)
    return ps_status_set(st, PS_UNKNOWN, "inspecting %s: write error: %s", prefix,
                         strerror(errno));
  return 0;
}

int ps_ckpt_inspect(FILE *out, const char *prefix, bool all_values, ps_status *st) {
  char *latest = NULL;
  struct stat sb;
  int rc;
  ps_status local;
  if (st == NULL) st = &local;
  if (stat(prefix, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    if ((rc = ps_latest_checkpoint(prefix, &latest, st)) != 0) return rc;
    prefix = latest;
  }
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, st);
  if (r == NULL) {
    rc = st->code;
    if (rc == PS_NOT_FOUND && (ends_with(prefix, ".index") || strstr(prefix, ".data-"))) {
      char m[PS_STATUS_MSG_MAX];
      snprintf(m, sizeof m, "%s", st->msg);
      ps_status_set(
          st, rc, "%.900s (give the checkpoint prefix, without .index or .data-...)", m);
    }
    free(latest);
    return rc;
  }
  sbuf b = {0};
  ps_sb_puts_(&b, "");
  rc = 0;
  for (size_t i = 0; i < ps_bundle_reader_count(r) && rc == 0; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    if (e->is_slice) continue;
    char shape[PS_MAX_RANK * 21 + 3], nb[32];
    if (all_values) {
      /* print_tensors_in_checkpoint_file(all_tensors=True): the name, then
       * the value as numpy prints it */
      ps_sb_puts_(&b, "tensor_name:  ");
      ps_sb_puts_(&b, e->key);
      ps_sb_putc_(&b, '\n');
      rc = put_values(&b, r, e, st);
    } else {
      /* the reader's debug string: name (dtype) shape */
      ps_sb_puts_(&b, e->key);
      ps_sb_puts_(&b, " (");
      ps_sb_puts_(&b, dtype_name(e->dtype, nb, sizeof nb));
      ps_sb_puts_(&b, ") ");
      ps_sb_puts_(&b, ps_shape_format(&e->shape, shape, sizeof shape));
      ps_sb_putc_(&b, '\n');
    }
    /* Print as we go, so a huge checkpoint does not sit in memory. */
    if (b.len > (1u << 16) && rc == 0) rc = flush_sbuf(&b, out, prefix, st);
  }
  /* What was printed before an error stays printed. */
  ps_status fst;
  if (flush_sbuf(&b, out, prefix, &fst) != 0 && rc == 0) {
    *st = fst;
    rc = fst.code;
  }
  if (rc == 0 && fflush(out) != 0)
    rc = ps_status_set(st, PS_UNKNOWN, "inspecting %s: write error: %s", prefix,
                       strerror(errno));
  free(b.p);
  ps_bundle_reader_close(r);
  free(latest);
  return rc;
}
