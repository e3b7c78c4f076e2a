/* bench_ps's raw TCP baseline (a forked child with no gRPC in it: bulk
 * transfers, and the sparse steps of (d) on its own table) and (d) itself:
 * sparse gathers and scatter-adds on a Zipf-drawn batch of rows, against
 * the TCP peer and against the same work on a table in this process; with
 * the scatter-add, the same steps pushing bfloat16 rows to a second ps
 * table, against the float32 push (checked against a mirror here). */
#include "bench_ps_internal.h"
#include "bf16_batch.h"

/* ---- raw TCP baseline (forked child, no gRPC in it) ---- */

/* A zeroed table on transparent huge pages, as the ps keeps big tensors
 * (common/tensor.c), so that the baselines have the same TLB reach. */
static float *table_alloc(size_t n) {
  size_t huge = (size_t)2 << 20, bytes = (n * sizeof(float) + huge - 1) / huge * huge;
  float *t = aligned_alloc(huge, bytes);
  if (t == NULL) return NULL;
  madvise(t, bytes, MADV_HUGEPAGE);
  memset(t, 0, bytes);
  return t;
}

/* The sparse peer's state: a table and buffers for one step. */
typedef struct sparse_peer {
  float *table, *acc; /* acc: Adagrad's accumulator ('T' with a 4th word 1) */
  int64_t rows, dim;
  int64_t *ids;
  float *vals;
  size_t cap; /* ids and rows of vals */
} sparse_peer;

/* 'T' rows dim cap adagrad: a zeroed table (and an accumulator of
 * ADAGRAD_INIT); 'G' n ids -> n rows; 'S' n ids rows -> an ack, then
 * added in order; 'A' n ids rows -> an ack, then a sparse Adagrad step;
 * 'D' -> the whole table.  The ack goes before the arithmetic, as the ps
 * answers an unreplicated update (DESIGN.md, "A training step"): the peer
 * reads its next command only after it, so the next gather sees it. */
static int sparse_cmd(int fd, char cmd, sparse_peer *p) {
  int64_t h[4];
  if (cmd == 'T') {
    if (read_full(fd, h, sizeof h) != 0) return -1;
    free(p->table);
    free(p->acc);
    p->acc = NULL;
    if (h[3]) {
      p->acc = table_alloc((size_t)(h[0] * h[1]));
      if (p->acc == NULL) return -1;
      for (int64_t i = 0; i < h[0] * h[1]; i++)
        p->acc[i] = ADAGRAD_INIT;
    }
    free(p->ids);
    free(p->vals);
    p->rows = h[0];
    p->dim = h[1];
    p->cap = (size_t)h[2];
    p->table = table_alloc((size_t)(p->rows * p->dim));
    p->ids = malloc(p->cap * sizeof *p->ids);
    p->vals = malloc(p->cap * (size_t)p->dim * sizeof *p->vals);
    return p->table && p->ids && p->vals ? write_full(fd, "k", 1) : -1;
  }
  if (cmd == 'D')
    return write_full(fd, p->table, (size_t)(p->rows * p->dim) * sizeof *p->table);
  int64_t n;
  if (p->table == NULL || read_full(fd, &n, sizeof n) != 0 || n < 0 ||
      (size_t)n > p->cap || read_full(fd, p->ids, (size_t)n * sizeof *p->ids) != 0)
    return -1;
  size_t row = (size_t)p->dim * sizeof(float);
  for (int64_t i = 0; i < n; i++)
    if (p->ids[i] < 0 || p->ids[i] >= p->rows) return -1;
  if (cmd == 'G') {
    for (int64_t i = 0; i < n; i++)
      memcpy(p->vals + i * p->dim, p->table + p->ids[i] * p->dim, row);
    return write_full(fd, p->vals, (size_t)n * row);
  }
  if (read_full(fd, p->vals, (size_t)n * row) != 0 || (cmd == 'A' && p->acc == NULL) ||
      write_full(fd, "k", 1) != 0)
    return -1;
  if (cmd == 'A') {
    for (int64_t i = 0; i < n; i++)
      adagrad_row(p->table + p->ids[i] * p->dim, p->acc + p->ids[i] * p->dim,
                  p->vals + i * p->dim, p->dim, ADAGRAD_LR);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) {
    float *d = p->table + p->ids[i] * p->dim, *v = p->vals + i * p->dim;
    for (int64_t k = 0; k < p->dim; k++)
      d[k] += v[k];
  }
  return 0;
}

/* Child: 'R' -> sends bulk_bytes; 'W' -> receives them into a reused buffer
 * and acks with one byte; 'P' -> reads PING_REQ bytes, answers PING_REPLY
 * (the bare gRPC call's payloads: (b)'s raw TCP round trip); 'T' 'G' 'S'
 * 'D': the sparse peer; EOF -> exits. */
void tcp_child(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  close(lfd);
  if (fd < 0) _exit(1);
  set_nodelay(fd);
  char *buf = malloc(bulk_bytes);
  if (buf == NULL) _exit(1);
  memset(buf, 1, bulk_bytes);
  sparse_peer sp = {0};
  for (;;) {
    char cmd;
    if (read_full(fd, &cmd, 1) != 0) break;
    if (cmd == 'R') {
      if (write_full(fd, buf, bulk_bytes) != 0) break;
    } else if (cmd == 'W') {
      if (read_full(fd, buf, bulk_bytes) != 0 || write_full(fd, "k", 1) != 0) break;
    } else if (cmd == 'P') {
      char req[PING_REQ], rep[PING_REPLY];
      if (read_full(fd, req, sizeof req) != 0) break;
      memcpy(rep, req, sizeof rep);
      if (write_full(fd, rep, sizeof rep) != 0) break;
    } else if (strchr("TGSAD", cmd)) {
      if (sparse_cmd(fd, cmd, &sp) != 0) break;
    } else {
      break;
    }
  }
  free(sp.table);
  free(sp.acc);
  free(sp.ids);
  free(sp.vals);
  free(buf);
  close(fd);
  _exit(0);
}

static void local_gather(const float *t, const int64_t *ids, size_t n, int64_t dim,
                         float *out) {
  for (size_t i = 0; i < n; i++)
    memcpy(out + (int64_t)i * dim, t + ids[i] * dim, (size_t)dim * sizeof *t);
}

/* Built as the client's sum is (worker/client/dedup.c), wide vectors where
 * the CPU has them. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
batch_sum(batch_scratch *w, int64_t n, int64_t dim, const float *g) {
  int32_t seen = 0;
  for (int64_t i = 0; i < n; i++) {
    float *o = w->usum + (int64_t)w->from[i] * dim;
    const float *v = g + i * dim;
    if (w->from[i] == seen) {
      memcpy(o, v, (size_t)dim * sizeof *v);
      seen++;
    } else {
      for (int64_t k = 0; k < dim; k++)
        o[k] += v[k];
    }
  }
}

/* ---- the bfloat16 push (scatter-add only) ---- */

/* A second client of ps 0 for the bfloat16 table: each client remembers
 * its last deduplications (worker/client/dedup.h), and with one client the
 * second table's pull would find the first's, a saving a worker pushing
 * one table does not get. */
static ps_client *second_client(ps_client *c, ps_status *st) {
  char json[600];
  const char *addr = ps_client_address(c, 0);
  if (addr == NULL ||
      snprintf(json, sizeof json, "{\"ps\": [\"%s\"]}", addr) >= (int)sizeof json) {
    st->code = PS_INVALID_ARGUMENT;
    snprintf(st->msg, sizeof st->msg, "no address of ps 0");
    return NULL;
  }
  ps_cluster *cl = ps_cluster_parse(json, strlen(json), NULL, st);
  if (cl == NULL) return NULL;
  ps_client *c2 = ps_client_create(cl, "ps", NULL, st);
  ps_cluster_destroy(cl);
  return c2;
}

static void local_scatter_add(float *t, const int64_t *ids, size_t n, int64_t dim,
                              const float *v) {
  for (size_t i = 0; i < n; i++) {
    float *d = t + ids[i] * dim;
    const float *g = v + (int64_t)i * dim;
    for (int64_t k = 0; k < dim; k++)
      d[k] += g[k];
  }
}

/* One TCP step: 'G' then 'S' on @ids, each distinct id sent once as the
 * ps client sends it (the ids deduplicated once per step: the client's
 * push finds the pull's deduplication in its memo); pull and push
 * seconds. */
static int tcp_sparse_step(int fd, batch_scratch *w, const int64_t *ids, int64_t n,
                           const float *grad, float *rows, int64_t dim, char op,
                           double *tp, double *tq) {
  double t0 = now_s();
  size_t row = (size_t)dim * sizeof(float);
  char ack;
  int64_t nu = batch_unique(w, ids, n);
  if (write_full(fd, "G", 1) != 0 || write_full(fd, &nu, sizeof nu) != 0 ||
      write_full(fd, w->uid, (size_t)nu * sizeof *ids) != 0 ||
      read_full(fd, w->urows, (size_t)nu * row) != 0)
    return -1;
  for (int64_t i = 0; i < n; i++)
    memcpy(rows + i * dim, w->urows + (int64_t)w->from[i] * dim, row);
  double t1 = now_s();
  batch_sum(w, n, dim, grad); /* the pull's deduplication, as the client reuses it */
  if (write_full(fd, &op, 1) != 0 || write_full(fd, &nu, sizeof nu) != 0 ||
      write_full(fd, w->uid, (size_t)nu * sizeof *ids) != 0 ||
      write_full(fd, w->usum, (size_t)nu * row) != 0 || read_full(fd, &ack, 1) != 0)
    return -1;
  *tp = t1 - t0;
  *tq = now_s() - t1;
  return 0;
}

static void sparse_report(const char *what, double *v, size_t n) {
  double med = quantile(v, n, 0.5);
  fprintf(stderr, "  %-22s min %.3f  p10 %.3f  median %.3f  p90 %.3f ms\n", what,
          v[0] * 1e3, quantile(v, n, 0.1) * 1e3, med * 1e3, quantile(v, n, 0.9) * 1e3);
}

int bench_sparse(ps_client *c, int tfd, const opts *o) {
  const int64_t rows = o->rows, dim = o->dim, b = o->batch;
  const size_t warm = 10, ns = (size_t)o->sparse_steps, nall = warm + ns;
  const size_t rb = (size_t)(b * dim) * sizeof(float);
  const int bf16 = !o->adagrad; /* the bfloat16 push: with the scatter-add only */
  const int nslot = bf16 ? 4 : 3;
  int rc = -1;
  ps_client *c2 = NULL;
  int64_t *ids = zipf_ids(rows, o->zipf, nall, (size_t)b);
  float *local = table_alloc((size_t)(rows * dim));
  float *lacc = o->adagrad ? table_alloc((size_t)(rows * dim)) : NULL;
  float *lrows = malloc(rb), *trows = malloc(rb);
  float *peer = malloc((size_t)(rows * dim) * sizeof *peer);
  float *mirror = bf16 ? table_alloc((size_t)(rows * dim)) : NULL;
  batch_scratch w = {.stamp = calloc((size_t)rows, sizeof(int32_t)),
                     .slot = calloc((size_t)rows, sizeof(int32_t)),
                     .uid = malloc((size_t)b * sizeof(int64_t)),
                     .from = malloc((size_t)b * sizeof(int32_t)),
                     .urows = malloc(rb),
                     .usum = malloc(rb)};
  /* ps pull, push, step; tcp; local; ps bfloat16 pull, push, step, and the
   * conversion inside its push */
  double *t[13];
  for (int k = 0; k < 13; k++)
    t[k] = calloc(ns + 1, sizeof(double));
  ps_tensor *ix = ps_tensor_new(PS_DT_INT64, 1, &b);
  int64_t gd[2] = {b, dim};
  ps_tensor *gt = ps_tensor_new(PS_DT_FLOAT, 2, gd),
            *out = ps_tensor_new(PS_DT_FLOAT, 2, gd);
  ps_tensor *gh = bf16 ? ps_tensor_new(PS_DT_BFLOAT16, 2, gd) : NULL;
  ps_read whole = {.name = "emb"}, whole16 = {.name = "emb_bf16"};
  int tok = 1;
  for (int k = 0; k < 13; k++)
    tok &= t[k] != NULL;
  if (!ids || !local || (o->adagrad && !lacc) || !lrows || !trows || !peer ||
      (bf16 && (!mirror || !gh)) || !ix || !gt || !out || !tok || !w.stamp || !w.slot ||
      !w.uid || !w.from || !w.urows || !w.usum) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  if (bf16 && !bf16_conversion_ok("bench")) goto out;
  size_t uniq = 0;
  {
    int64_t *s = malloc((size_t)b * sizeof *s);
    if (s) {
      memcpy(s, ids, (size_t)b * sizeof *s);
      qsort(s, (size_t)b, sizeof *s, cmp_i64);
      for (int64_t i = 0; i < b; i++)
        uniq += i == 0 || s[i] != s[i - 1];
      free(s);
    }
  }
  fprintf(stderr,
          "  table %lld x %lld float32 (%.0f MiB), batch %lld ids of Zipf(%.2f): "
          "%zu unique in the first\n",
          (long long)rows, (long long)dim, (double)(rows * dim * 4) / 1048576.0,
          (long long)b, o->zipf, uniq);
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_init_spec a0;
  ps_init_spec_default(&a0, PS_INIT_CONSTANT);
  a0.value = ADAGRAD_INIT;
  /* emb and its Adagrad slot, or emb and emb_bf16 (the same, zeroed) */
  ps_var_spec spec[2] = {{.name = "emb",
                          .dtype = PS_DT_FLOAT,
                          .shape = {.rank = 2, .dim = {rows, dim}},
                          .init = &z},
                         {.name = "emb/Adagrad",
                          .dtype = PS_DT_FLOAT,
                          .shape = {.rank = 2, .dim = {rows, dim}},
                          .init = &a0}};
  if (bf16)
    spec[1] = (ps_var_spec){
        .name = "emb_bf16", .dtype = PS_DT_FLOAT, .shape = spec[0].shape, .init = &z};
  const char *nm[2] = {"emb", spec[1].name};
  size_t nv = 2;
  if (ps_client_create_vars(c, 0, spec, nv, &st) != 0 ||
      ps_client_initialize(c, 0, nm, nv, false, NULL, &st) != 0) {
    rc = ps_fail(bf16 ? "create emb, emb_bf16" : "create emb", &st);
    goto out;
  }
  if (bf16 && (c2 = second_client(c, &st)) == NULL) {
    rc = ps_fail("second client", &st);
    goto out;
  }
  if (o->adagrad)
    for (int64_t i = 0; i < rows * dim; i++)
      lacc[i] = ADAGRAD_INIT;
  fprintf(stderr, "  push: %s\n",
          o->adagrad ? "sparse Adagrad (lr 0.01; rows of an id summed first, as "
                       "TensorFlow's optimizer does)"
                     : "scatter-add; and the same as bfloat16 rows (converted in the "
                       "timed push) to emb_bf16 through a second client");
  int64_t hdr[4] = {rows, dim, b, o->adagrad};
  char ack;
  if (write_full(tfd, "T", 1) != 0 || write_full(tfd, hdr, sizeof hdr) != 0 ||
      read_full(tfd, &ack, 1) != 0) {
    fprintf(stderr, "bench: tcp sparse peer failed\n");
    goto out;
  }
  for (size_t i = 0; i < nall; i++) {
    const int64_t *si = ids + i * (size_t)b;
    float *g = ps_tensor_data(gt);
    for (int64_t j = 0; j < b * dim; j++)
      g[j] = grad_value((int64_t)i, j);
    memcpy(ps_tensor_data(ix), si, (size_t)b * sizeof *si);
    double tp, tq;
    /* the order of the three (four) rotates, so that drift hits each alike;
     * the cycle is ps, TCP, (ps bfloat16,) in-process: the float32 ps still
     * follows the in-process step, whose server CPU is idle, and not the
     * other ps table's push */
    static const int cycle3[3] = {0, 1, 2}, cycle4[4] = {0, 1, 3, 2};
    const int *cycle = bf16 ? cycle4 : cycle3;
    for (int k = 0; k < nslot; k++) {
      int which = cycle[(i + (size_t)k) % (size_t)nslot];
      if (which == 0) { /* the ps */
        ps_read r = {.name = "emb", .indices = ix, .out = out};
        ps_update u = {.name = "emb", .op = PS_SCATTER_ADD, .value = gt, .indices = ix};
        double t0 = now_s();
        if (ps_client_read(c, 0, &r, 1, &st) != 0) {
          rc = ps_fail("sparse pull", &st);
          goto out;
        }
        double t1 = now_s();
        ps_tensor *uix = NULL, *ug = NULL;
        if (o->adagrad) { /* the optimizer's SumDuplicateRows, then the apply */
          int64_t nu = batch_unique(&w, si, b), ud[2] = {nu, dim};
          batch_sum(&w, b, dim, g);
          uix = ps_tensor_new(PS_DT_INT64, 1, &nu);
          ug = ps_tensor_new(PS_DT_FLOAT, 2, ud);
          if (uix == NULL || ug == NULL) {
            fprintf(stderr, "bench: out of memory\n");
            ps_tensor_destroy(uix);
            ps_tensor_destroy(ug);
            goto out;
          }
          memcpy(ps_tensor_data(uix), w.uid, (size_t)nu * sizeof *w.uid);
          memcpy(ps_tensor_data(ug), w.usum, (size_t)(nu * dim) * sizeof *w.usum);
          static const char *slots[1] = {"emb/Adagrad"};
          static const double hp[1] = {ADAGRAD_LR};
          u = (ps_update){.name = "emb",
                          .op = PS_APPLY_ADAGRAD,
                          .value = ug,
                          .indices = uix,
                          .slots = slots,
                          .nslots = 1,
                          .hparams = hp,
                          .nhparams = 1};
        }
        int urc = ps_client_update(c, 0, &u, 1, &st);
        ps_tensor_destroy(uix);
        ps_tensor_destroy(ug);
        if (urc != 0) {
          rc = ps_fail("sparse push", &st);
          goto out;
        }
        tp = t1 - t0, tq = now_s() - t1;
        if (i >= warm) t[0][i - warm] = tp, t[1][i - warm] = tq, t[2][i - warm] = tp + tq;
      } else if (which == 1) { /* raw TCP */
        if (tcp_sparse_step(tfd, &w, si, b, g, trows, dim, o->adagrad ? 'A' : 'S', &tp,
                            &tq) != 0) {
          fprintf(stderr, "bench: tcp sparse step failed\n");
          goto out;
        }
        if (i >= warm) t[3][i - warm] = tp, t[4][i - warm] = tq, t[5][i - warm] = tp + tq;
      } else if (which == 3) { /* the ps, bfloat16 rows, through its own client */
        ps_read r = {.name = "emb_bf16", .indices = ix, .out = out};
        ps_update u = {
            .name = "emb_bf16", .op = PS_SCATTER_ADD, .value = gh, .indices = ix};
        double t0 = now_s();
        if (ps_client_read(c2, 0, &r, 1, &st) != 0) {
          rc = ps_fail("sparse pull (emb_bf16)", &st);
          goto out;
        }
        double t1 = now_s();
        bf16_from_float(ps_tensor_data(gh), g, (size_t)(b * dim));
        double t2 = now_s();
        if (ps_client_update(c2, 0, &u, 1, &st) != 0) {
          rc = ps_fail("sparse push (bfloat16)", &st);
          goto out;
        }
        tp = t1 - t0, tq = now_s() - t1;
        if (i >= warm) {
          t[9][i - warm] = tp, t[10][i - warm] = tq, t[11][i - warm] = tp + tq;
          t[12][i - warm] = t2 - t1;
        }
        bf16_mirror_step(mirror, &w, si, b, dim, g);
      } else { /* in this process */
        double t0 = now_s();
        local_gather(local, si, (size_t)b, dim, lrows);
        double t1 = now_s();
        int64_t nu = batch_unique(&w, si, b);
        batch_sum(&w, b, dim, g);
        if (o->adagrad)
          for (int64_t q = 0; q < nu; q++)
            adagrad_row(local + w.uid[q] * dim, lacc + w.uid[q] * dim, w.usum + q * dim,
                        dim, ADAGRAD_LR);
        else
          local_scatter_add(local, w.uid, (size_t)nu, dim, w.usum);
        if (i >= warm) {
          t[6][i - warm] = t1 - t0, t[7][i - warm] = now_s() - t1;
          t[8][i - warm] = now_s() - t0;
        }
      }
    }
  }
  /* every table got the same adds in the same order: equal bit for bit */
  if (ps_client_read(c, 0, &whole, 1, &st) != 0) {
    rc = ps_fail("read emb", &st);
    goto out;
  }
  if (write_full(tfd, "D", 1) != 0 ||
      read_full(tfd, peer, (size_t)(rows * dim) * sizeof *peer) != 0) {
    fprintf(stderr, "bench: tcp sparse peer failed\n");
    goto out;
  }
  size_t tb = (size_t)(rows * dim) * sizeof(float);
  if (memcmp(ps_tensor_data(whole.out), local, tb) != 0 || memcmp(peer, local, tb) != 0) {
    fprintf(stderr, "bench: the ps's table differs from the local one after the steps\n");
    goto out;
  }
  fprintf(stderr, "  tables equal after %zu steps (ps, tcp peer, local)\n", nall);
  if (bf16) {
    if (ps_client_read(c2, 0, &whole16, 1, &st) != 0) {
      rc = ps_fail("read emb_bf16", &st);
      goto out;
    }
    const float *p16 = ps_tensor_data(whole16.out);
    if (memcmp(p16, mirror, tb) != 0) {
      size_t k = first_difference(p16, mirror, tb / sizeof *p16);
      fprintf(stderr,
              "bench: the ps's emb_bf16 differs from its mirror after the steps "
              "(first at row %zu column %zu: %.9g, mirror %.9g)\n",
              k / (size_t)dim, k % (size_t)dim, (double)p16[k], (double)mirror[k]);
      goto out;
    }
    /* how far the bfloat16 pushes took it from the float32 table */
    double dmax = 0;
    size_t ndiff = 0;
    for (size_t k = 0; k < (size_t)(rows * dim); k++) {
      double d = fabs((double)p16[k] - (double)local[k]);
      ndiff += d != 0;
      dmax = d > dmax ? d : dmax;
    }
    fprintf(stderr,
            "  emb_bf16 equals its mirror after %zu steps; %zu of its values differ "
            "from the float32 table's, by at most %.6g\n",
            nall, ndiff, dmax);
  }
  const char *what[13] = {
      "ps pull",      "ps push",      "ps step",           "tcp pull",   "tcp push",
      "tcp step",     "local gather", "local scatter-add", "local step", "ps bf16 pull",
      "ps bf16 push", "ps bf16 step", "bf16 conversion"};
  for (int k = 0; k < (bf16 ? 13 : 9); k++)
    sparse_report(what[k], t[k], ns);
  double ps_step = quantile(t[2], ns, 0.5), tcp_step = quantile(t[5], ns, 0.5);
  double pp = (double)b / quantile(t[0], ns, 0.5) / 1e6,
         tp = (double)b / quantile(t[3], ns, 0.5) / 1e6;
  double pq = (double)b / quantile(t[1], ns, 0.5) / 1e6,
         tq = (double)b / quantile(t[4], ns, 0.5) / 1e6;
  fprintf(stderr, "  local step (gather + scatter-add in process) %.3f ms\n",
          quantile(t[8], ns, 0.5) * 1e3);
  const char *sfx = o->adagrad ? "_adagrad" : "";
  printf("bench: sparse_step%s %.3f ms baseline=%.3f ratio=%.2f target=<= 1.25\n", sfx,
         ps_step * 1e3, tcp_step * 1e3, ps_step / tcp_step);
  printf("bench: sparse_pull_rows%s %.2f M/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         sfx, pp, tp, pp / tp);
  printf("bench: sparse_push_rows%s %.2f M/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         sfx, pq, tq, pq / tq);
  if (bf16) { /* against the float32 push of this run */
    double hq = (double)b / quantile(t[10], ns, 0.5) / 1e6,
           h_step = quantile(t[11], ns, 0.5);
    printf(
        "bench: sparse_push_rows_bf16 %.2f M/s baseline=%.2f ratio=%.2f target=>= 1.0\n",
        hq, pq, hq / pq);
    printf("bench: sparse_step_bf16 %.3f ms baseline=%.3f ratio=%.2f target=<= 1.0\n",
           h_step * 1e3, ps_step * 1e3, h_step / ps_step);
  }
  rc = 0;
out : {
  ps_status dst;
  const char *nm2[2] = {"emb", "emb_bf16"};
  ps_client_delete(c, 0, nm2, bf16 ? 2 : 1, PS_DELETE_MISSING_OK | PS_DELETE_SLOTS, NULL,
                   &dst);
}
  ps_client_destroy(c2);
  ps_tensor_destroy(whole.out);
  ps_tensor_destroy(whole16.out);
  ps_tensor_destroy(gh);
  free(mirror);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(gt);
  ps_tensor_destroy(out);
  for (int k = 0; k < 13; k++)
    free(t[k]);
  free(ids);
  free(local);
  free(lrows);
  free(trows);
  free(lacc);
  free(w.stamp);
  free(w.slot);
  free(w.uid);
  free(w.from);
  free(w.urows);
  free(w.usum);
  free(peer);
  return rc;
}
