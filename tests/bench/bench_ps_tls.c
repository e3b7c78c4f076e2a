/* bench_ps's (e): what TLS with bearer tokens costs.  Two fresh
 * ps-servers, one plaintext, one with --tls-cert, --tls-key and
 * --auth-token-file; (a)'s transfers and (b)'s round trip on each, the
 * sides alternating. */
#include "bench_ps_internal.h"

/* ---- (e) the cost of TLS ----
 * Two fresh ps-servers started alike, one plaintext, one serving TLS with
 * bearer tokens (--tls-cert, --tls-key, --auth-token-file: the secure
 * configuration, so the figure is what a user pays for it), each with its
 * own client; the certificates come from deploy/gen-certs.sh, as a user's
 * would.  Both servers are fresh so that neither carries the variables or
 * the allocator state of (a)-(d).  Repetitions alternate between the two
 * and so does which side goes first, so a noisy moment or a warm cache
 * favours neither. */

/* meson passes the source tree's script; PS_GEN_CERTS overrides it. */
#ifndef BENCH_GEN_CERTS
#define BENCH_GEN_CERTS "deploy/gen-certs.sh"
#endif

/* One side of (e): a ps, its client, and what was measured on it. */
typedef struct tls_side {
  const char *name; /* "plaintext" or "tls" */
  ps_harness h;
  int up; /* h started: harness_stop owed */
  ps_client *c;
  double *read, *assign;               /* GB/s of each repetition */
  double *lat;                         /* us of each scalar assign_add */
  long adds;                           /* assign_adds the ps must have applied */
  double wall, client_cpu, server_cpu; /* of the timed scalar calls, s */
  /* Of the timed transfers, [read, assign], s: wall time, and CPU time of
   * this process (all its threads: gRPC's too) and of the ps. */
  double bulk_wall[2], bulk_client[2], bulk_server[2];
} tls_side;

/* Certificates and tokens in @dir/certs; 0 or -1 after printing why. */
static int tls_make_certs(const char *dir) {
  const char *gen = harness_prog("PS_GEN_CERTS", BENCH_GEN_CERTS);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' --tokens --clients worker --days 1 '%s/certs'",
           gen, dir);
  char *out = NULL;
  double t = now_s();
  int rc = harness_run(cmd, &out);
  if (rc != 0)
    fprintf(stderr, "bench: %s failed (status %d):\n%s", cmd, rc, out ? out : "");
  else
    fprintf(stderr, "  certificates and tokens by %s in %.1f s\n", gen, now_s() - t);
  free(out);
  return rc == 0 ? 0 : -1;
}

/* Starts @s's ps with @extra and a client with @co, then creates "big"
 * (the bulk variable) and "scalar" (zeros) on it.  0 or -1. */
static int tls_side_start(tls_side *s, const char *const *extra,
                          const ps_client_options *co, int64_t nfloats) {
  ps_status st;
  if (harness_start(&s->h, 1, extra) != 0) {
    fprintf(stderr, "bench: cannot start the %s ps-server\n", s->name);
    return -1;
  }
  s->up = 1;
  if ((s->c = ps_client_create(s->h.cluster, "ps", co, &st)) == NULL)
    return ps_fail("ps_client_create", &st);
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_var_spec specs[2] = {
      {.name = "big", .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {nfloats}}},
      {.name = "scalar", .dtype = PS_DT_FLOAT, .shape = {.rank = 0}, .init = &zeros}};
  const char *name = "scalar";
  /* The first call connects (with TLS, shakes hands too), which no timed
   * call below pays: shown apart. */
  double t = now_s();
  if (ps_client_create_vars(s->c, 0, specs, 2, &st) != 0)
    return ps_fail("create big and scalar", &st);
  fprintf(stderr, "  %s ps/0 on %s (pid %d): first call (connect%s) %.1f ms\n", s->name,
          s->h.addrs[0], (int)s->h.pids[0], co->tls_ca_file ? ", TLS handshake" : "",
          (now_s() - t) * 1e3);
  if (ps_client_initialize(s->c, 0, &name, 1, false, NULL, &st) != 0)
    return ps_fail("initialize scalar", &st);
  return 0;
}

/* Seconds of one read of "big" into @out, or of one assign of @val to it
 * (@assign); < 0 after printing why. */
static double tls_bulk_once(tls_side *s, int assign, ps_tensor *val, ps_tensor *out) {
  ps_status st;
  ps_update up = {.name = "big", .op = PS_ASSIGN, .value = val};
  ps_read rd = {.name = "big", .out = out};
  double t = now_s();
  int r = assign ? ps_client_update(s->c, 0, &up, 1, &st)
                 : ps_client_read(s->c, 0, &rd, 1, &st);
  t = now_s() - t;
  if (r != 0) {
    fprintf(stderr, "bench: %s of big on the %s ps failed: %s\n",
            assign ? "assign" : "read", s->name, st.msg);
    return -1;
  }
  return t;
}

/* Reads "big" of @s into a cleared @out and compares it with @val. */
static int tls_bulk_check(tls_side *s, ps_tensor *val, ps_tensor *out) {
  memset(ps_tensor_data(out), 0, bulk_bytes);
  if (tls_bulk_once(s, 0, val, out) < 0) return -1;
  if (memcmp(ps_tensor_data(out), ps_tensor_data(val), bulk_bytes) != 0) {
    fprintf(stderr, "bench: the %s ps read back other values than assigned\n", s->name);
    return -1;
  }
  return 0;
}

/* (e, bulk) read and assign of bulk_bytes on both sides, interleaved. */
static int tls_bulk(tls_side *sd, const opts *o) {
  int64_t dims[1] = {(int64_t)(bulk_bytes / 4)};
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  ps_tensor *out = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  int rc = -1;
  if (!val || !out) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  float *pv = ps_tensor_data(val);
  for (size_t i = 0; i < bulk_bytes / 4; i++)
    pv[i] = (float)(i % 4099);
  /* Warm-up (connections, flow-control windows, allocators); checks.  Two
   * assigns: the first timed one otherwise still finds the ps's second
   * buffer for a value (the old one is held until the new one is in)
   * untouched, and pays its page faults. */
  for (int k = 0; k < 2; k++)
    if (tls_bulk_once(&sd[k], 1, val, out) < 0 ||
        tls_bulk_once(&sd[k], 1, val, out) < 0 || tls_bulk_check(&sd[k], val, out) != 0)
      goto out;
  const double gb = (double)bulk_bytes / 1e9;
  for (int r = 0; r < o->reps; r++) {
    for (int op = 0; op < 2; op++)
      for (int k = 0; k < 2; k++) {
        tls_side *s = &sd[(r + k) % 2]; /* odd repetitions: TLS first */
        double c0 = proc_cpu_s(getpid()), s0 = proc_cpu_s(s->h.pids[0]);
        double t = tls_bulk_once(s, op, val, out);
        if (t < 0) goto out;
        (op ? s->assign : s->read)[r] = gb / t;
        s->bulk_wall[op] += t;
        s->bulk_client[op] += proc_cpu_s(getpid()) - c0;
        s->bulk_server[op] += proc_cpu_s(s->h.pids[0]) - s0;
      }
    fprintf(stderr,
            "  rep %d: read plaintext %.2f, tls %.2f; assign plaintext %.2f, tls %.2f "
            "GB/s\n",
            r + 1, sd[0].read[r], sd[1].read[r], sd[0].assign[r], sd[1].assign[r]);
  }
  /* The timed calls left the values as they were. */
  for (int k = 0; k < 2; k++)
    if (tls_bulk_check(&sd[k], val, out) != 0) goto out;
  rc = 0;
out:
  ps_tensor_destroy(val);
  ps_tensor_destroy(out);
  return rc;
}

/* One scalar assign_add on @s, its round trip in us into @lat; 0 or -1. */
static int tls_add_once(tls_side *s, ps_update *up, double *lat) {
  ps_status st;
  double t = now_s();
  if (ps_client_update(s->c, 0, up, 1, &st) != 0) {
    fprintf(stderr, "bench: assign_add of scalar on the %s ps failed: %s\n", s->name,
            st.msg);
    return -1;
  }
  if (lat) *lat = (now_s() - t) * 1e6;
  s->adds++;
  return 0;
}

/* (e, scalar) assign_add round trips on both sides in alternating blocks,
 * as (b) alternates with the bare call. */
static int tls_scalar(tls_side *sd, const opts *o) {
  ps_shape s0 = {.rank = 0};
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &s0, false);
  if (one == NULL) {
    fprintf(stderr, "bench: out of memory\n");
    return -1;
  }
  *(float *)ps_tensor_data(one) = 1.0f;
  ps_update up = {.name = "scalar", .op = PS_ASSIGN_ADD, .value = one};
  int rc = -1;
  for (int i = 0; i < o->warmup; i++)
    for (int k = 0; k < 2; k++)
      if (tls_add_once(&sd[k], &up, NULL) != 0) goto out;
  const size_t n = (size_t)o->iters, block = 100;
  size_t done[2] = {0, 0};
  double cpu0[2];
  for (int k = 0; k < 2; k++)
    cpu0[k] = proc_cpu_s(sd[k].h.pids[0]);
  for (size_t b = 0; done[0] < n || done[1] < n; b++)
    for (int k = 0; k < 2; k++) {
      tls_side *s = &sd[(b + (size_t)k) % 2]; /* odd blocks: TLS first */
      size_t *i = &done[s - sd];
      double w = now_s(), c = thread_cpu_s();
      for (size_t j = 0; j < block && *i < n; j++, (*i)++)
        if (tls_add_once(s, &up, &s->lat[*i]) != 0) goto out;
      s->wall += now_s() - w;
      s->client_cpu += thread_cpu_s() - c;
    }
  for (int k = 0; k < 2; k++) {
    double c1 = proc_cpu_s(sd[k].h.pids[0]);
    sd[k].server_cpu = cpu0[k] < 0 || c1 < 0 ? -1 : c1 - cpu0[k];
  }
  /* Each ps must have applied every add exactly once. */
  for (int k = 0; k < 2; k++) {
    ps_status st;
    ps_read rd = {.name = "scalar"};
    if (ps_client_read(sd[k].c, 0, &rd, 1, &st) != 0) {
      fprintf(stderr, "bench: read of scalar on the %s ps failed: %s\n", sd[k].name,
              st.msg);
      goto out;
    }
    float got = *(float *)ps_tensor_data(rd.out);
    ps_tensor_destroy(rd.out);
    if (got != (float)sd[k].adds) {
      fprintf(stderr, "bench: the %s ps's scalar is %g after %ld assign_adds of 1\n",
              sd[k].name, (double)got, sd[k].adds);
      goto out;
    }
  }
  rc = 0;
out:
  ps_tensor_destroy(one);
  return rc;
}

/* Median over repetitions of the per-repetition ratio tls / plaintext:
 * the two sides of one repetition ran back to back. */
static double paired_ratio(const double *tls, const double *plain, int n) {
  double *q = malloc((size_t)n * sizeof *q);
  if (q == NULL) return -1;
  for (int i = 0; i < n; i++)
    q[i] = tls[i] / plain[i];
  double m = quantile(q, (size_t)n, 0.5);
  free(q);
  return m;
}

/* (e) the bulk read and assign and the scalar round trip, TLS with tokens
 * against plaintext, in one run. */
int bench_tls(const opts *o) {
  tls_side sd[2] = {{.name = "plaintext"}, {.name = "tls"}};
  char dir[64] = "/tmp/ps-bench-tls-XXXXXX", f[3][128];
  int rc = -1;
  if (mkdtemp(dir) == NULL) {
    perror("bench: mkdtemp");
    return -1;
  }
  const size_t reps = (size_t)o->reps, n = (size_t)o->iters;
  for (int k = 0; k < 2; k++) {
    sd[k].read = calloc(reps, sizeof *sd[k].read);
    sd[k].assign = calloc(reps, sizeof *sd[k].assign);
    sd[k].lat = calloc(n, sizeof *sd[k].lat);
    if (!sd[k].read || !sd[k].assign || !sd[k].lat) {
      fprintf(stderr, "bench: out of memory\n");
      goto out;
    }
  }
  if (tls_make_certs(dir) != 0) goto out;
  snprintf(f[0], sizeof f[0], "%s/certs/server.crt", dir);
  snprintf(f[1], sizeof f[1], "%s/certs/server.key", dir);
  snprintf(f[2], sizeof f[2], "%s/certs/tokens", dir);
  char ca[128], token[128], threads[16];
  snprintf(ca, sizeof ca, "%s/certs/ca.crt", dir);
  snprintf(token, sizeof token, "%s/certs/worker.token", dir);
  /* The same options on both; the TLS one adds only security flags. */
  const char *plain_args[5];
  const int np = bench_ps_args(o, plain_args, threads);
  const char *tls_args[11] = {"--tls-cert",        f[0], "--tls-key", f[1],
                              "--auth-token-file", f[2]};
  for (int k = 0; k <= np; k++)
    tls_args[6 + k] = plain_args[k];
  ps_client_options plain_co, tls_co;
  ps_client_options_default(&plain_co); /* main() cleared PS_TLS_* etc. */
  ps_client_options_default(&tls_co);
  tls_co.tls_ca_file = ca;
  tls_co.token_file = token; /* a worker's token: reads and assigns */
  const int64_t nfloats = (int64_t)(bulk_bytes / 4);
  if (tls_side_start(&sd[0], np ? plain_args : NULL, &plain_co, nfloats) != 0 ||
      tls_side_start(&sd[1], tls_args, &tls_co, nfloats) != 0)
    goto out;
  pid_t servers[2] = {sd[0].h.pids[0], sd[1].h.pids[0]};

  /* Placement as in (a) for the transfers, as in (b) for round trips. */
  fprintf(stderr, "  %d MiB read and assign, %d reps each side\n", o->bulk_mib, o->reps);
  place(o, servers, 2, 1);
  int r = tls_bulk(sd, o);
  unplace(o, servers, 2);
  if (r != 0) goto out;
  fprintf(stderr, "  scalar assign_add, %d calls each side\n", o->iters);
  place(o, servers, 2, 0);
  r = tls_scalar(sd, o);
  unplace(o, servers, 2);
  if (r != 0) goto out;

  /* Paired ratios first: quantile() sorts the arrays it is given. */
  double pr = paired_ratio(sd[1].read, sd[0].read, o->reps);
  double pa = paired_ratio(sd[1].assign, sd[0].assign, o->reps);
  double rd[2], as[2], lm[2];
  for (int k = 0; k < 2; k++) {
    tls_side *s = &sd[k];
    print_reps(k ? "tls read" : "plaintext read", s->read, o->reps);
    print_reps(k ? "tls assign" : "plaintext assign", s->assign, o->reps);
    /* Both near the wall time: CPU-bound on both ends; their sum near it:
     * the two ends take turns instead of overlapping. */
    for (int op = 0; op < 2; op++)
      fprintf(stderr,
              "  %s %s: per transfer %.1f ms wall; CPU %.1f ms client, %.1f ms "
              "server\n",
              s->name, op ? "assign" : "read", s->bulk_wall[op] * 1e3 / o->reps,
              s->bulk_client[op] * 1e3 / o->reps, s->bulk_server[op] * 1e3 / o->reps);
    rd[k] = quantile(s->read, reps, 0.5);
    as[k] = quantile(s->assign, reps, 0.5);
    lm[k] = quantile(s->lat, n, 0.5);
    fprintf(stderr,
            "  %s assign_add: min %.1f p10 %.1f median %.1f p90 %.1f p99 %.1f us, "
            "%.0f calls/s; CPU per call: server %.1f us, client thread %.1f us\n",
            s->name, s->lat[0], quantile(s->lat, n, 0.1), lm[k], quantile(s->lat, n, 0.9),
            quantile(s->lat, n, 0.99), (double)n / s->wall,
            s->server_cpu < 0 ? -1.0 : s->server_cpu * 1e6 / (double)n,
            s->client_cpu * 1e6 / (double)n);
  }
  fprintf(stderr, "  median of the per-repetition ratios: read %.2f, assign %.2f\n", pr,
          pa);
  int mib = o->bulk_mib;
  double rr = rd[1] / rd[0], ar = as[1] / as[0], added = lm[1] - lm[0];
  printf("bench: tls_read_%dMiB_ratio %.2f tls=%.2f GB/s plaintext=%.2f GB/s "
         "target=>= 0.7\n",
         mib, rr, rd[1], rd[0]);
  printf("bench: tls_assign_%dMiB_ratio %.2f tls=%.2f GB/s plaintext=%.2f GB/s "
         "target=>= 0.7\n",
         mib, ar, as[1], as[0]);
  printf("bench: tls_scalar_added_us %.1f us tls=%.1f us plaintext=%.1f us "
         "target=<= 30\n",
         added, lm[1], lm[0]);
  printf("bench: tls_targets read=%s assign=%s scalar=%s\n", rr >= 0.7 ? "met" : "missed",
         ar >= 0.7 ? "met" : "missed", added <= 30 ? "met" : "missed");
  fflush(stdout);
  rc = 0;
out:
  for (int k = 0; k < 2; k++) {
    ps_client_destroy(sd[k].c);
    if (sd[k].up && harness_stop(&sd[k].h) != 0) {
      fprintf(stderr, "bench: the %s ps-server did not stop cleanly\n", sd[k].name);
      rc = -1;
    }
    free(sd[k].read);
    free(sd[k].assign);
    free(sd[k].lat);
  }
  if (harness_scratch_remove(dir) != 0) rc = -1;
  return rc;
}
