/* bench_wire: what sending float32 updates as bfloat16 buys on a link
 * slower than memory.  Given the address of a running ps-server (shaped.sh
 * starts one in a network namespace behind a rate-limited veth), it runs
 * interleaved steps of four pushes, each through the public client API:
 *   (1) a scatter-add of a Zipf batch of float32 rows to a float32 table,
 *   (2) the same batch to a second table as bfloat16 rows, converted by
 *       the bench inside the timed part,
 *   (3) an AssignAdd of a 4 MiB float32 value to a dense float32 variable,
 *   (4) the same with the value converted to bfloat16 inside the timed part,
 * and reports the medians of the bfloat16 pushes against the float32 ones
 * of the same run.  The float32 and bfloat16 pushes go through a client
 * each, so neither finds the other's deduplication of a batch in its
 * client's memo.  Afterwards it reads the four variables back and compares
 * them bit for bit with what the adds must give, computed here.
 * Public API only (paramserver/client.h); exit status 0, 1 when a call
 * failed or a value differs, 2 for a bad option. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16_batch.h"
#include "paramserver/client.h"
#include "zipf.h"

typedef struct opts {
  const char *addr;  /* the ps, HOST:PORT */
  const char *label; /* the rate in the lines' names */
  double link_bps;   /* 0: unknown (no payload bound printed) */
  int64_t rows, dim, batch, dense;
  int steps, warm;
  double zipf;
} opts;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* the @q quantile of @v[0..n) (sorts it) */
static double quantile(double *v, size_t n, double q) {
  qsort(v, n, sizeof *v, cmp_d);
  return v[(size_t)(q * (double)(n - 1) + 0.5)];
}

/* The dense value of element @j at step @i: not a bfloat16 value, so the
 * rounding shows in the check. */
static float dense_value(int64_t i, int64_t j) {
  return (float)((uint64_t)(j * 2654435761ll + i * 40503ll) % 4093u) * (1.0f / 1024.0f) -
         2.0f;
}

/* 0 when the ps's @name equals @want (@n floats) bit for bit. */
static int check_var(ps_client *c, const char *name, const float *want, size_t n) {
  ps_status st;
  ps_read r = {.name = name};
  int rc = 1;
  if (ps_client_read(c, 0, &r, 1, &st) != 0) {
    fprintf(stderr, "bench_wire: read %s: %s\n", name, st.msg);
    return 1;
  }
  const float *got = ps_tensor_data(r.out);
  if (ps_tensor_nbytes(r.out) != n * sizeof *want) {
    fprintf(stderr, "bench_wire: %s has %zu bytes, not %zu\n", name,
            ps_tensor_nbytes(r.out), n * sizeof *want);
  } else if (memcmp(got, want, n * sizeof *want) != 0) {
    size_t k = first_difference(got, want, n);
    fprintf(stderr,
            "bench_wire: %s differs from what the adds give (first at %zu: %.9g, "
            "expected %.9g)\n",
            name, k, (double)got[k], (double)want[k]);
  } else {
    rc = 0;
  }
  ps_tensor_destroy(r.out);
  return rc;
}

static void report(const char *what, double *v, size_t n, double scale,
                   const char *unit) {
  double p10 = quantile(v, n, 0.1), med = quantile(v, n, 0.5), p90 = quantile(v, n, 0.9);
  fprintf(stderr, "  %-26s min %.3f  p10 %.3f  median %.3f  p90 %.3f %s\n", what,
          v[0] * scale, p10 * scale, med * scale, p90 * scale, unit);
}

static int usage(void) {
  fprintf(
      stderr,
      "usage: bench_wire HOST:PORT [--label NAME] [--link-bps B] [--steps N] "
      "[--warmup N]\n"
      "                  [--rows N] [--dim N] [--batch N] [--zipf S] [--dense-mib N]\n");
  return 2;
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){.label = "none",
              .rows = 1 << 20,
              .dim = 64,
              .batch = 8192,
              .dense = (4 << 20) / 4,
              .steps = 40,
              .warm = 5,
              .zipf = 1.1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (a[0] != '-') {
      if (o->addr) return usage();
      o->addr = a;
      continue;
    }
    if (v == NULL) return usage();
    i++;
    errno = 0;
    if (strcmp(a, "--label") == 0) {
      o->label = v;
      continue;
    }
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= 0)) return usage();
    if (strcmp(a, "--link-bps") == 0)
      o->link_bps = d;
    else if (strcmp(a, "--zipf") == 0 && d > 0)
      o->zipf = d;
    else if (d != floor(d) || d < 1 || d > 1e12)
      return usage();
    else if (strcmp(a, "--steps") == 0 && d <= 1e6)
      o->steps = (int)d;
    else if (strcmp(a, "--warmup") == 0 && d <= 1e6)
      o->warm = (int)d;
    else if (strcmp(a, "--rows") == 0 && d < 2147483647.0)
      o->rows = (int64_t)d;
    else if (strcmp(a, "--dim") == 0 && d <= 65536)
      o->dim = (int64_t)d;
    else if (strcmp(a, "--batch") == 0 && d <= 1 << 24)
      o->batch = (int64_t)d;
    else if (strcmp(a, "--dense-mib") == 0 && d <= 1024)
      o->dense = (int64_t)d * (1 << 20) / 4;
    else
      return usage();
  }
  return o->addr ? 0 : usage();
}

int main(int argc, char **argv) {
  opts o;
  int prc = parse(argc, argv, &o);
  if (prc) return prc;
  const int64_t rows = o.rows, dim = o.dim, b = o.batch, nd = o.dense;
  const size_t ns = (size_t)o.steps, nall = (size_t)o.warm + ns;
  const size_t tn = (size_t)(rows * dim), gn = (size_t)(b * dim);
  int rc = 1;
  ps_status st;
  ps_cluster *cl = NULL;
  ps_client *c32 = NULL, *c16 = NULL;
  if (ps_library_init() != 0) {
    fprintf(stderr, "bench_wire: library init failed\n");
    return 1;
  }
  int64_t *ids = zipf_ids(rows, o.zipf, nall, (size_t)b);
  float *m32 = calloc(tn, sizeof(float)), *m16 = calloc(tn, sizeof(float));
  float *e32 = calloc((size_t)nd, sizeof(float)),
        *e16 = calloc((size_t)nd, sizeof(float));
  float *dv = malloc((size_t)nd * sizeof(float));
  batch_scratch w = {.stamp = calloc((size_t)rows, sizeof(int32_t)),
                     .slot = calloc((size_t)rows, sizeof(int32_t)),
                     .uid = malloc((size_t)b * sizeof(int64_t)),
                     .from = malloc((size_t)b * sizeof(int32_t)),
                     .usum = malloc(gn * sizeof(float))};
  /* sparse f32, sparse bf16, its conversion, dense f32, dense bf16, its
   * conversion */
  double *t[6];
  int tok = 1;
  for (int k = 0; k < 6; k++)
    tok &= (t[k] = calloc(ns + 1, sizeof(double))) != NULL;
  int64_t gd[2] = {b, dim};
  ps_tensor *ix = ps_tensor_new(PS_DT_INT64, 1, &b);
  ps_tensor *g32 = ps_tensor_new(PS_DT_FLOAT, 2, gd),
            *g16 = ps_tensor_new(PS_DT_BFLOAT16, 2, gd);
  ps_tensor *d32 = ps_tensor_new(PS_DT_FLOAT, 1, &nd),
            *d16 = ps_tensor_new(PS_DT_BFLOAT16, 1, &nd);
  if (!ids || !m32 || !m16 || !e32 || !e16 || !dv || !w.stamp || !w.slot || !w.uid ||
      !w.from || !w.usum || !tok || !ix || !g32 || !g16 || !d32 || !d16) {
    fprintf(stderr, "bench_wire: out of memory\n");
    goto out;
  }
  if (!bf16_conversion_ok("bench_wire")) goto out;
  char json[600];
  if (snprintf(json, sizeof json, "{\"ps\": [\"%s\"]}", o.addr) >= (int)sizeof json) {
    fprintf(stderr, "bench_wire: address too long\n");
    goto out;
  }
  if ((cl = ps_cluster_parse(json, strlen(json), NULL, &st)) == NULL ||
      (c32 = ps_client_create(cl, "ps", NULL, &st)) == NULL ||
      (c16 = ps_client_create(cl, "ps", NULL, &st)) == NULL) {
    fprintf(stderr, "bench_wire: client of %s: %s\n", o.addr, st.msg);
    goto out;
  }
  static const char *names[4] = {"wire_emb_f32", "wire_emb_bf16", "wire_dense_f32",
                                 "wire_dense_bf16"};
  ps_client_delete(c32, 0, names, 4, PS_DELETE_MISSING_OK, NULL, NULL);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_var_spec spec[4];
  for (int k = 0; k < 4; k++)
    spec[k] = (ps_var_spec){.name = names[k],
                            .dtype = PS_DT_FLOAT,
                            .shape = k < 2 ? (ps_shape){.rank = 2, .dim = {rows, dim}}
                                           : (ps_shape){.rank = 1, .dim = {nd}},
                            .init = &z};
  if (ps_client_create_vars(c32, 0, spec, 4, &st) != 0 ||
      ps_client_initialize(c32, 0, names, 4, false, NULL, &st) != 0) {
    fprintf(stderr, "bench_wire: create the variables: %s\n", st.msg);
    goto out;
  }
  fprintf(
      stderr,
      "bench_wire %s on %s: table %lld x %lld float32 (%.0f MiB, twice), batch %lld "
      "ids of Zipf(%.2f); dense %.1f MiB float32 (twice); %zu steps after %d warm-up\n",
      o.label, o.addr, (long long)rows, (long long)dim, (double)tn * 4 / 1048576.0,
      (long long)b, o.zipf, (double)nd * 4 / 1048576.0, ns, o.warm);
  double nu_sum = 0;
  for (size_t i = 0; i < nall; i++) {
    const int64_t *si = ids + i * (size_t)b;
    float *g = ps_tensor_data(g32);
    for (size_t j = 0; j < gn; j++)
      g[j] = grad_value((int64_t)i, (int64_t)j);
    memcpy(ps_tensor_data(ix), si, (size_t)b * sizeof *si);
    for (int64_t j = 0; j < nd; j++)
      dv[j] = dense_value((int64_t)i, j);
    memcpy(ps_tensor_data(d32), dv, (size_t)nd * sizeof *dv);
    /* the order of the four rotates, so that drift hits each alike */
    for (int k = 0; k < 4; k++) {
      int which = (int)((i + (size_t)k) % 4);
      double t0 = now_s(), t1 = t0;
      int urc;
      if (which == 0) {
        ps_update u = {
            .name = names[0], .op = PS_SCATTER_ADD, .value = g32, .indices = ix};
        urc = ps_client_update(c32, 0, &u, 1, &st);
      } else if (which == 1) {
        ps_update u = {
            .name = names[1], .op = PS_SCATTER_ADD, .value = g16, .indices = ix};
        bf16_from_float(ps_tensor_data(g16), g, gn);
        t1 = now_s();
        urc = ps_client_update(c16, 0, &u, 1, &st);
      } else if (which == 2) {
        ps_update u = {.name = names[2], .op = PS_ASSIGN_ADD, .value = d32};
        urc = ps_client_update(c32, 0, &u, 1, &st);
      } else {
        ps_update u = {.name = names[3], .op = PS_ASSIGN_ADD, .value = d16};
        bf16_from_float(ps_tensor_data(d16), dv, (size_t)nd);
        t1 = now_s();
        urc = ps_client_update(c16, 0, &u, 1, &st);
      }
      double t2 = now_s();
      if (urc != 0) {
        fprintf(stderr, "bench_wire: push to %s: %s\n", names[which], st.msg);
        goto out;
      }
      if (i >= (size_t)o.warm) {
        size_t s = i - (size_t)o.warm;
        static const int slot[4] = {0, 1, 3, 4};
        t[slot[which]][s] = t2 - t0;
        if (which == 1 || which == 3) t[slot[which] + 1][s] = t1 - t0;
      }
    }
    /* what the four pushes must have done */
    for (int64_t q = 0; q < b; q++)
      for (int64_t k = 0; k < dim; k++)
        m32[si[q] * dim + k] += g[q * dim + k]; /* exact: multiples of 1/8 */
    nu_sum += (double)bf16_mirror_step(m16, &w, si, b, dim, g);
    for (int64_t j = 0; j < nd; j++) {
      e32[j] += dv[j];
      e16[j] += ps_bf16_to_float(ps_float_to_bf16(dv[j]));
    }
  }
  if (check_var(c32, names[0], m32, tn) || check_var(c16, names[1], m16, tn) ||
      check_var(c32, names[2], e32, (size_t)nd) ||
      check_var(c16, names[3], e16, (size_t)nd))
    goto out;
  fprintf(stderr, "  the four variables equal what the adds give after %zu steps\n",
          nall);
  /* the payload of one push: the distinct ids (int64) and their rows */
  double nu = nu_sum / (double)nall;
  double sp32 = nu * (8.0 + 4.0 * (double)dim), sp16 = nu * (8.0 + 2.0 * (double)dim);
  double dp32 = 4.0 * (double)nd, dp16 = 2.0 * (double)nd;
  fprintf(stderr,
          "  payload per push: sparse %.0f distinct ids: %.0f KiB float32, %.0f KiB "
          "bfloat16; dense %.0f KiB, %.0f KiB\n",
          nu, sp32 / 1024, sp16 / 1024, dp32 / 1024, dp16 / 1024);
  if (o.link_bps > 0)
    fprintf(stderr,
            "  at %.3g bit/s the payload alone takes: sparse %.3f / %.3f ms, "
            "dense %.3f / %.3f ms (float32 / bfloat16)\n",
            o.link_bps, sp32 * 8 / o.link_bps * 1e3, sp16 * 8 / o.link_bps * 1e3,
            dp32 * 8 / o.link_bps * 1e3, dp16 * 8 / o.link_bps * 1e3);
  static const char *what[6] = {"sparse push float32",      "sparse push bfloat16",
                                "  of which conversion",    "dense AssignAdd float32",
                                "dense AssignAdd bfloat16", "  of which conversion"};
  for (int k = 0; k < 6; k++)
    report(what[k], t[k], ns, 1e3, "ms");
  double s32 = (double)b / quantile(t[0], ns, 0.5) / 1e6,
         s16 = (double)b / quantile(t[1], ns, 0.5) / 1e6;
  double a32 = dp32 / quantile(t[3], ns, 0.5) / 1e9,
         a16 = dp32 / quantile(t[4], ns, 0.5) / 1e9;
  fprintf(stderr, "  float32: sparse push %.2f M rows/s, dense AssignAdd %.3f GB/s\n",
          s32, a32);
  printf("bench: wire_%s_sparse_push_rows_bf16 %.2f M/s baseline=%.2f ratio=%.2f\n",
         o.label, s16, s32, s16 / s32);
  printf("bench: wire_%s_assign_add_%gMiB_bf16 %.3f GB/s baseline=%.3f ratio=%.2f\n",
         o.label, (double)nd * 4 / 1048576.0, a16, a32, a16 / a32);
  fflush(stdout);
  rc = 0;
out:
  if (c32) ps_client_delete(c32, 0, names, 4, PS_DELETE_MISSING_OK, NULL, NULL);
  ps_client_destroy(c32);
  ps_client_destroy(c16);
  ps_cluster_destroy(cl);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(g32);
  ps_tensor_destroy(g16);
  ps_tensor_destroy(d32);
  ps_tensor_destroy(d16);
  for (int k = 0; k < 6; k++)
    free(t[k]);
  free(ids);
  free(m32);
  free(m16);
  free(e32);
  free(e16);
  free(dv);
  free(w.stamp);
  free(w.slot);
  free(w.uid);
  free(w.from);
  free(w.usum);
  ps_library_shutdown();
  return rc;
}
