/* chaos_client: the load of the correctness checker (tests/chaos/chaos.sh),
 * on the public client API alone.
 *
 *   chaos_client --cluster FILE init                 create the variables (zeros)
 *   chaos_client --cluster FILE --id K --clients N --log FILE [--count C] run
 *   chaos_client --cluster FILE read                 print every final value
 *
 * The variables: on every ps task (shard) S, --vars scalar float64
 * variables "chaos/sS/vI" and one table "chaos/sS/table" of --rows rows by
 * 2 columns (float64).  run makes attempts until SIGTERM or --count: each
 * either adds a scalar to one variable (PS_ASSIGN_ADD) or adds the row
 * [u, 1] to 1..3 distinct rows of a table (PS_SCATTER_ADD), where u =
 * j*N + K + 1 for attempt j of client K: every increment of the whole run
 * is a distinct integer, so sums stay exact in float64 (below 2^53) and
 * column 1 of a row counts the adds it got.  Every event is one line of
 * the log, flushed when written:
 *
 *   MS send K.J SHARD NAME ROWS U     ROWS: "-" (a scalar) or "3,17,40"
 *   MS ack K.J VERSION
 *   MS fail K.J CODE MESSAGE          the outcome is unknown (applied or not)
 *
 * MS is the wall clock in milliseconds.  A failed call is logged and the
 * run goes on.  --rate N: at most N attempts a second (0: no limit).  read prints "var
 * NAME VALUE" and "row NAME R C0 C1" lines
 * (%.17g); tests/chaos/chaos_check.py compares them with the logs.
 * init --shard S: only shard S's variables (made again after a ps lost
 * them: the driver's --replicas 1 kill).  init --big-mib N also makes "chaos/big", N MiB
 * of float32 zeros on shard 0 (never updated, never read: the bulk of a shard's state).
 */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <paramserver/client.h>

static volatile sig_atomic_t stop_flag;
static void on_term(int sig) {
  (void)sig;
  stop_flag = 1;
}

typedef struct opts {
  const char *cluster, *log, *cmd;
  int id, clients, vars, rows, rate, big_mib, shard;
  long long count;
  unsigned seed;
  int64_t rpc_timeout_ms;
} opts;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int usage(void) {
  fputs("usage: chaos_client --cluster FILE [--vars V] [--rows R] [--rpc-timeout-ms MS]\n"
        "                    init [--big-mib N] [--shard S] | read |\n"
        "                    --id K --clients N --log FILE [--count C] [--seed S]\n"
        "                    [--rate PER_SEC] run\n",
        stderr);
  return 2;
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi,
                     long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "chaos_client: %s must be an integer in [%lld, %lld], got '%s'\n",
            flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->id = -1;
  o->clients = 1;
  o->vars = 4;
  o->rows = 64;
  o->count = -1;
  o->seed = 1;
  o->rpc_timeout_ms = 10000;
  o->rate = 0;
  o->shard = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    long long v;
    if (a[0] != '-') {
      if (o->cmd) return usage();
      o->cmd = a;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const char *val = argv[++i];
    if (!strcmp(a, "--cluster")) {
      o->cluster = val;
    } else if (!strcmp(a, "--log")) {
      o->log = val;
    } else if (!strcmp(a, "--id")) {
      if (parse_int(a, val, 0, 1 << 20, &v)) return 2;
      o->id = (int)v;
    } else if (!strcmp(a, "--clients")) {
      if (parse_int(a, val, 1, 1 << 20, &v)) return 2;
      o->clients = (int)v;
    } else if (!strcmp(a, "--vars")) {
      if (parse_int(a, val, 1, 1000, &v)) return 2;
      o->vars = (int)v;
    } else if (!strcmp(a, "--rows")) {
      if (parse_int(a, val, 3, 1 << 20, &v)) return 2;
      o->rows = (int)v;
    } else if (!strcmp(a, "--count")) {
      if (parse_int(a, val, 0, 1LL << 30, &v)) return 2;
      o->count = v;
    } else if (!strcmp(a, "--shard")) {
      if (parse_int(a, val, 0, 4095, &v)) return 2;
      o->shard = (int)v;
    } else if (!strcmp(a, "--big-mib")) {
      if (parse_int(a, val, 0, 1 << 16, &v)) return 2;
      o->big_mib = (int)v;
    } else if (!strcmp(a, "--rate")) {
      if (parse_int(a, val, 0, 1000000, &v)) return 2;
      o->rate = (int)v;
    } else if (!strcmp(a, "--seed")) {
      if (parse_int(a, val, 0, 0xffffffffLL, &v)) return 2;
      o->seed = (unsigned)v;
    } else if (!strcmp(a, "--rpc-timeout-ms")) {
      if (parse_int(a, val, 1, 3600000, &v)) return 2;
      o->rpc_timeout_ms = v;
    } else {
      fprintf(stderr, "chaos_client: unknown flag %s\n", a);
      return usage();
    }
  }
  if (!o->cluster || !o->cmd) return usage();
  if (strcmp(o->cmd, "init") && strcmp(o->cmd, "read") && strcmp(o->cmd, "run"))
    return usage();
  if (!strcmp(o->cmd, "run") && (o->id < 0 || !o->log || o->id >= o->clients)) {
    fputs("chaos_client: run needs --id K (0 <= K < --clients) and --log FILE\n", stderr);
    return 2;
  }
  return 0;
}

static void var_name(char *buf, size_t n, int shard, int v) {
  if (v < 0)
    snprintf(buf, n, "chaos/s%d/table", shard);
  else
    snprintf(buf, n, "chaos/s%d/v%d", shard, v);
}

/* chaos/big: a float32 vector of @mib MiB on shard 0, zeros (the state a
 * rejoining replica copies: tests/bench/failover.sh). */
static int init_big(ps_client *c, int mib, ps_status *st) {
  int64_t n = (int64_t)mib << 18;
  ps_var_spec spec = {.name = "chaos/big", .dtype = PS_DT_FLOAT};
  spec.shape.rank = 1;
  spec.shape.dim[0] = n;
  ps_tensor *t = ps_tensor_new(PS_DT_FLOAT, 1, &n);
  if (!t) {
    snprintf(st->msg, sizeof st->msg, "out of memory");
    st->code = PS_RESOURCE_EXHAUSTED;
    return st->code;
  }
  ps_update u = {.name = "chaos/big", .op = PS_ASSIGN, .value = t};
  int rc = ps_client_create_vars(c, 0, &spec, 1, st);
  if (!rc) rc = ps_client_update(c, 0, &u, 1, st);
  ps_tensor_destroy(t);
  return rc;
}

/* init: every variable of every shard, created and set to zeros. */
static int cmd_init(ps_client *c, const opts *o) {
  int nps = ps_client_num_ps(c);
  ps_status st;
  for (int s = 0; s < nps; s++) {
    if (o->shard >= 0 && s != o->shard) continue;
    int nv = o->vars + 1;
    ps_var_spec *specs = calloc((size_t)nv, sizeof *specs);
    char(*names)[64] = calloc((size_t)nv, sizeof *names);
    ps_update *ups = calloc((size_t)nv, sizeof *ups);
    ps_tensor **vals = calloc((size_t)nv, sizeof *vals);
    int rc = 1;
    if (!specs || !names || !ups || !vals) {
      fputs("chaos_client: out of memory\n", stderr);
      goto out;
    }
    for (int v = 0; v < nv; v++) {
      int64_t dims[2] = {o->rows, 2};
      int rank = v < o->vars ? 0 : 2;
      var_name(names[v], sizeof names[v], s, v < o->vars ? v : -1);
      specs[v].name = names[v];
      specs[v].dtype = PS_DT_DOUBLE;
      specs[v].shape.rank = rank;
      if (rank) {
        specs[v].shape.dim[0] = dims[0];
        specs[v].shape.dim[1] = dims[1];
      }
      vals[v] = ps_tensor_new(PS_DT_DOUBLE, rank, dims);
      if (!vals[v]) {
        fputs("chaos_client: out of memory\n", stderr);
        goto out;
      }
      ups[v].name = names[v];
      ups[v].op = PS_ASSIGN;
      ups[v].value = vals[v];
    }
    if (ps_client_create_vars(c, s, specs, (size_t)nv, &st) ||
        ps_client_update(c, s, ups, (size_t)nv, &st)) {
      fprintf(stderr, "chaos_client: init of shard %d: %s: %s\n", s,
              ps_status_code_name(st.code), st.msg);
      goto out;
    }
    rc = 0;
  out:
    for (int v = 0; vals && v < nv; v++)
      ps_tensor_destroy(vals[v]);
    free(vals);
    free(ups);
    free(names);
    free(specs);
    if (rc) return 1;
  }
  if (o->big_mib > 0 && init_big(c, o->big_mib, &st)) {
    fprintf(stderr, "chaos_client: init of chaos/big (%d MiB): %s: %s\n", o->big_mib,
            ps_status_code_name(st.code), st.msg);
    return 1;
  }
  printf("initialized %d shards: %d variables and a %d x 2 table each\n", nps, o->vars,
         o->rows);
  return 0;
}

/* read: every final value, one line each. */
static int cmd_read(ps_client *c, const opts *o) {
  int nps = ps_client_num_ps(c);
  ps_status st;
  for (int s = 0; s < nps; s++) {
    int nv = o->vars + 1;
    ps_read *r = calloc((size_t)nv, sizeof *r);
    char(*names)[64] = calloc((size_t)nv, sizeof *names);
    int rc = 1;
    if (!r || !names) {
      fputs("chaos_client: out of memory\n", stderr);
      goto out;
    }
    for (int v = 0; v < nv; v++) {
      var_name(names[v], sizeof names[v], s, v < o->vars ? v : -1);
      r[v].name = names[v];
    }
    if (ps_client_read(c, s, r, (size_t)nv, &st)) {
      fprintf(stderr, "chaos_client: read of shard %d: %s: %s\n", s,
              ps_status_code_name(st.code), st.msg);
      goto out;
    }
    for (int v = 0; v < nv; v++) {
      const double *d = ps_tensor_data(r[v].out);
      int64_t n = ps_tensor_num_elements(r[v].out);
      if (r[v].out->dtype != PS_DT_DOUBLE || n != (v < o->vars ? 1 : 2LL * o->rows)) {
        fprintf(stderr, "chaos_client: %s: %" PRId64 " elements of %s\n", names[v], n,
                ps_dtype_name(r[v].out->dtype));
        goto out;
      }
      if (v < o->vars)
        printf("var %s %.17g\n", names[v], d[0]);
      else
        for (int64_t i = 0; i < o->rows; i++)
          printf("row %s %" PRId64 " %.17g %.17g\n", names[v], i, d[2 * i], d[2 * i + 1]);
    }
    rc = 0;
  out:
    for (int v = 0; r && v < nv; v++)
      ps_tensor_destroy(r[v].out);
    free(r);
    free(names);
    if (rc) return 1;
  }
  return fflush(stdout) ? 1 : 0;
}

/* One line of the log, flushed: a line the driver reads is whole. */
static int logf_line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int logf_line(FILE *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(f, "%lld ", now_ms());
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  return fflush(f);
}

static int cmd_run(ps_client *c, const opts *o) {
  FILE *f = fopen(o->log, "a");
  if (!f) {
    fprintf(stderr, "chaos_client: %s: %s\n", o->log, strerror(errno));
    return 1;
  }
  int nps = ps_client_num_ps(c);
  int64_t one[1] = {0};
  int64_t rdims[2] = {3, 2}, idims[1] = {3};
  ps_tensor *scalar = ps_tensor_new(PS_DT_DOUBLE, 0, one);
  ps_tensor *rowvals[3], *idx[3];
  for (int k = 0; k < 3; k++) {
    rdims[0] = idims[0] = k + 1;
    rowvals[k] = ps_tensor_new(PS_DT_DOUBLE, 2, rdims);
    idx[k] = ps_tensor_new(PS_DT_INT64, 1, idims);
  }
  int rc = 0;
  for (int k = 0; k < 3; k++)
    if (!rowvals[k] || !idx[k]) rc = 1;
  if (!scalar || rc) {
    fputs("chaos_client: out of memory\n", stderr);
    rc = 1;
    goto out;
  }
  unsigned seed = o->seed * 2654435761u + (unsigned)o->id;
  long long acked = 0, failed = 0, j;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (j = 0; !stop_flag && (o->count < 0 || j < o->count); j++) {
    if (o->rate > 0) { /* attempt j at t0 + j / rate */
      long long at_ns = (long long)t0.tv_nsec + j * (1000000000LL / o->rate);
      struct timespec at = {t0.tv_sec + (time_t)(at_ns / 1000000000LL),
                            (long)(at_ns % 1000000000LL)};
      while (!stop_flag &&
             clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
        ;
      if (stop_flag) break;
    }
    double u = (double)(j * o->clients + o->id + 1);
    int s = rand_r(&seed) % nps;
    char name[64], rows[64] = "-";
    ps_update up = {0};
    ps_update_result res = {0};
    up.result = &res;
    if (rand_r(&seed) % 10 < 7) {
      var_name(name, sizeof name, s, rand_r(&seed) % o->vars);
      up.op = PS_ASSIGN_ADD;
      *(double *)ps_tensor_data(scalar) = u;
      up.value = scalar;
    } else {
      int k = rand_r(&seed) % 3, len = 0;
      int64_t *ix = ps_tensor_data(idx[k]);
      double *rv = ps_tensor_data(rowvals[k]);
      for (int i = 0; i <= k; i++) {
        int64_t r;
        bool dup;
        do { /* distinct rows: one add per row */
          r = rand_r(&seed) % o->rows;
          dup = false;
          for (int p = 0; p < i; p++)
            dup |= ix[p] == r;
        } while (dup);
        ix[i] = r;
        rv[2 * i] = u;
        rv[2 * i + 1] = 1;
        len += snprintf(rows + len, sizeof rows - (size_t)len, "%s%" PRId64, i ? "," : "",
                        r);
      }
      var_name(name, sizeof name, s, -1);
      up.op = PS_SCATTER_ADD;
      up.value = rowvals[k];
      up.indices = idx[k];
    }
    up.name = name;
    if (logf_line(f, "send %d.%lld %d %s %s %.17g", o->id, j, s, name, rows, u)) {
      fprintf(stderr, "chaos_client: %s: %s\n", o->log, strerror(errno));
      rc = 1;
      break;
    }
    ps_status st;
    int code = ps_client_update(c, s, &up, 1, &st);
    int w;
    if (code == PS_OK) {
      acked++;
      w = logf_line(f, "ack %d.%lld %" PRId64, o->id, j, res.version);
    } else {
      failed++;
      for (char *p = st.msg; *p; p++)
        if (*p == '\n') *p = ' ';
      w = logf_line(f, "fail %d.%lld %s %s", o->id, j, ps_status_code_name(code), st.msg);
    }
    if (w) {
      fprintf(stderr, "chaos_client: %s: %s\n", o->log, strerror(errno));
      rc = 1;
      break;
    }
  }
  fprintf(stderr, "chaos_client %d: %lld attempts, %lld acknowledged, %lld failed\n",
          o->id, j, acked, failed);
out:
  ps_tensor_destroy(scalar);
  for (int k = 0; k < 3; k++) {
    ps_tensor_destroy(rowvals[k]);
    ps_tensor_destroy(idx[k]);
  }
  if (fclose(f)) rc = 1;
  return rc;
}

int main(int argc, char **argv) {
  opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  if (ps_library_init()) {
    fputs("chaos_client: ps_library_init failed\n", stderr);
    return 1;
  }
  ps_status st;
  ps_cluster *cl = ps_cluster_load_file(o.cluster, &st);
  if (!cl) {
    fprintf(stderr, "chaos_client: %s\n", st.msg);
    ps_library_shutdown();
    return 1;
  }
  ps_client_options co;
  ps_client_options_default(&co);
  co.rpc_timeout_ms = o.rpc_timeout_ms;
  ps_client *c = ps_client_create(cl, "ps", &co, &st);
  if (!c) {
    fprintf(stderr, "chaos_client: %s: %s\n", ps_status_code_name(st.code), st.msg);
    rc = 1;
  } else if (!strcmp(o.cmd, "init")) {
    rc = cmd_init(c, &o);
  } else if (!strcmp(o.cmd, "read")) {
    rc = cmd_read(c, &o);
  } else {
    rc = cmd_run(c, &o);
  }
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc;
}
