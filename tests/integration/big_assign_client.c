/* Large assigns through the public client API, for
 * test_repl_cut_through.sh:
 *   big_assign_client SPEC ETCD REPL_JOB < COMMANDS
 * ETCD and REPL_JOB "-": an unreplicated cluster (R = 1); else R = 2 with
 * the view in etcd.  Runs one command a line, printing one line each
 * (MSG: the error text, its newlines and tabs as spaces):
 *   create SHARD NAME ELEMS   a float [ELEMS] on shard SHARD: "created NAME"
 *   assign SHARD NAME ELEMS SEED [double]
 *                             assigns the float (or double) [ELEMS] value
 *                             of SEED: "ack NAME SEED BYTES"
 *   read SHARD NAME ELEMS SEED
 *                             reads NAME: "same NAME SEED" when it is the
 *                             float [ELEMS] value of SEED, else "differs
 *                             NAME: WHY"
 *   stream SHARD NAME ELEMS STOPFILE
 *                             assigns the values of seeds 1, 2, ... until
 *                             STOPFILE exists, "ack N MS" after each (MS:
 *                             CLOCK_REALTIME milliseconds), then "last N"
 *                             and reads NAME as `read` does with seed N
 *   multi SHARD SEED T TELEMS A AELEMS S SELEMS B BELEMS
 *                             one Update of 4 items, in this order: a
 *                             SCATTER_UPDATE of every row of float [TELEMS]
 *                             T, int64 indices TELEMS-1 down to 0, which
 *                             leaves T the value of SEED; ASSIGNs of the
 *                             values of SEED+1 to A, SEED+2 to S and
 *                             SEED+3 to B.  The request's bulk bytes are
 *                             T's indices, T's rows, A's, S's, B's value:
 *                             "ack multi SEED BYTES" (BYTES: all of them)
 * A command that fails prints "error NAME CODE: MSG" (a stream stops at
 * its first).  Exits 0 when every command succeeded, 1 otherwise, 2 on a
 * usage error or without a client. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paramserver/client.h"
#include "paramserver/tensor.h"

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Element @i of the value of @seed: an integer below 2^24, exact in a
 * float, different for every seed. */
static double elem(uint64_t seed, int64_t i) {
  return (double)((seed * 2654435761u + (uint64_t)i * 40503u) & 0xffffff);
}

static void print_error(const char *name, const ps_status *st) {
  printf("error %s %s: ", name, ps_status_code_name(st->code));
  for (const char *p = st->msg; *p; p++)
    putchar(*p == '\n' || *p == '\t' ? ' ' : *p);
  putchar('\n');
}

static int no_memory(ps_status *st) {
  st->code = PS_RESOURCE_EXHAUSTED;
  snprintf(st->msg, sizeof st->msg, "out of memory");
  return st->code;
}

/* The [elems] value of @seed in @dt; NULL when out of memory. */
static ps_tensor *value(ps_dtype dt, int64_t elems, uint64_t seed) {
  ps_shape s = {.rank = 1, .dim = {elems}};
  ps_tensor *t = ps_tensor_create(dt, &s, false);
  if (t == NULL) return NULL;
  void *p = ps_tensor_data(t);
  if (dt == PS_DT_FLOAT) { /* (most of the calls: the quick way) */
    float *f = p;
    for (int64_t i = 0; i < elems; i++)
      f[i] = (float)elem(seed, i);
  } else {
    for (int64_t i = 0; i < elems; i++)
      ps_elem_set(dt, p, i, elem(seed, i));
  }
  return t;
}

static int assign(ps_client *c, int shard, const char *name, int64_t elems, uint64_t seed,
                  ps_dtype dt, ps_status *st) {
  ps_tensor *t = value(dt, elems, seed);
  if (t == NULL) return no_memory(st);
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  int rc = ps_client_update(c, shard, &u, 1, st);
  ps_tensor_destroy(t);
  return rc;
}

/* `multi` (argv as in the usage above, from SEED on): one Update of a
 * scatter with int64 indices and 3 assigns; the bytes sent in @bytes. */
static int multi(ps_client *c, int shard, uint64_t seed, char **argv, size_t *bytes,
                 ps_status *st) {
  int64_t tn = strtoll(argv[1], NULL, 10);
  ps_shape ts = {.rank = 1, .dim = {tn}};
  ps_tensor *t[5] = {ps_tensor_create(PS_DT_INT64, &ts, false),
                     ps_tensor_create(PS_DT_FLOAT, &ts, false)};
  for (int k = 0; k < 3; k++)
    t[2 + k] = value(PS_DT_FLOAT, strtoll(argv[3 + 2 * k], NULL, 10), seed + 1 + k);
  int rc = 0;
  for (int k = 0; k < 5; k++)
    if (t[k] == NULL) rc = no_memory(st);
  if (rc == 0) {
    int64_t *ix = ps_tensor_data(t[0]);
    float *rows = ps_tensor_data(t[1]);
    for (int64_t k = 0; k < tn; k++) { /* row k of the value goes to ix[k] */
      ix[k] = tn - 1 - k;
      rows[k] = (float)elem(seed, ix[k]);
    }
    ps_update u[4] = {
        {.name = argv[0], .op = PS_SCATTER_UPDATE, .value = t[1], .indices = t[0]},
        {.name = argv[2], .op = PS_ASSIGN, .value = t[2]},
        {.name = argv[4], .op = PS_ASSIGN, .value = t[3]},
        {.name = argv[6], .op = PS_ASSIGN, .value = t[4]},
    };
    *bytes = 0;
    for (int k = 0; k < 5; k++)
      *bytes += ps_tensor_nbytes(t[k]);
    rc = ps_client_update(c, shard, u, 4, st);
  }
  for (int k = 0; k < 5; k++)
    ps_tensor_destroy(t[k]);
  return rc;
}

/* 0 and "same", or 1 and "differs"/"error" printed */
static int check(ps_client *c, int shard, const char *name, int64_t elems,
                 uint64_t seed) {
  ps_status st;
  ps_status_clear(&st);
  ps_read r = {.name = name};
  if (ps_client_read(c, shard, &r, 1, &st) != 0) {
    print_error(name, &st);
    return 1;
  }
  int rc = 1;
  if (ps_tensor_num_elements(r.out) != elems ||
      ps_tensor_nbytes(r.out) != (size_t)elems * sizeof(float)) {
    printf("differs %s: %lld elements of %zu bytes, want %lld floats\n", name,
           (long long)ps_tensor_num_elements(r.out), ps_tensor_nbytes(r.out),
           (long long)elems);
  } else {
    const float *v = ps_tensor_data(r.out);
    int64_t i = 0;
    while (i < elems && (double)v[i] == elem(seed, i))
      i++;
    if (i == elems) {
      printf("same %s %llu\n", name, (unsigned long long)seed);
      rc = 0;
    } else {
      printf("differs %s: element %lld is %.0f, the value of seed %llu has %.0f\n", name,
             (long long)i, (double)v[i], (unsigned long long)seed, elem(seed, i));
    }
  }
  ps_tensor_destroy(r.out);
  return rc;
}

static int run(ps_client *c, char *line) {
  char *argv[12];
  int argc = 0;
  for (char *t = strtok(line, " \t\n"); t && argc < 12; t = strtok(NULL, " \t\n"))
    argv[argc++] = t;
  if (argc == 0) return 0;
  ps_status st;
  ps_status_clear(&st);
  int shard = argc > 1 ? atoi(argv[1]) : 0;
  const char *name = argc > 2 ? argv[2] : "";
  int64_t elems = argc > 3 ? strtoll(argv[3], NULL, 10) : 0;
  uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
  if (strcmp(argv[0], "create") == 0 && argc == 4) {
    ps_var_spec spec = {.name = name, .dtype = PS_DT_FLOAT, .shape = {1, {elems}}};
    if (ps_client_create_vars(c, shard, &spec, 1, &st) != 0) {
      print_error(name, &st);
      return 1;
    }
    printf("created %s\n", name);
    return 0;
  }
  if (strcmp(argv[0], "assign") == 0 && (argc == 5 || argc == 6)) {
    ps_dtype dt =
        argc == 6 && strcmp(argv[5], "double") == 0 ? PS_DT_DOUBLE : PS_DT_FLOAT;
    if (assign(c, shard, name, elems, seed, dt, &st) != 0) {
      print_error(name, &st);
      return 1;
    }
    printf("ack %s %llu %zu\n", name, (unsigned long long)seed,
           (size_t)elems * ps_dtype_size(dt));
    return 0;
  }
  if (strcmp(argv[0], "read") == 0 && argc == 5)
    return check(c, shard, name, elems, seed);
  if (strcmp(argv[0], "multi") == 0 && argc == 11) {
    size_t bytes = 0;
    if (multi(c, shard, strtoull(argv[2], NULL, 10), argv + 3, &bytes, &st) != 0) {
      print_error("multi", &st);
      return 1;
    }
    printf("ack multi %s %zu\n", argv[2], bytes);
    return 0;
  }
  if (strcmp(argv[0], "stream") == 0 && argc == 5) {
    uint64_t n = 0;
    int rc = 0;
    while (access(argv[4], F_OK) != 0) {
      if (assign(c, shard, name, elems, n + 1, PS_DT_FLOAT, &st) != 0) {
        print_error(name, &st);
        rc = 1;
        break;
      }
      printf("ack %llu %lld\n", (unsigned long long)++n, now_ms());
      fflush(stdout);
    }
    printf("last %llu\n", (unsigned long long)n);
    fflush(stdout);
    return rc != 0 || n == 0 ? 1 : check(c, shard, name, elems, n);
  }
  printf("error %s usage: a bad command\n", argv[0]);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: big_assign_client SPEC ETCD|- REPL_JOB|- < COMMANDS\n");
    return 2;
  }
  ps_library_init();
  ps_status st;
  ps_status_clear(&st);
  int rc = 2;
  ps_client *c = NULL;
  ps_cluster *cl = ps_cluster_load_file(argv[1], &st);
  if (cl) {
    ps_client_options o;
    ps_client_options_default(&o);
    if (strcmp(argv[2], "-") != 0) {
      o.etcd = argv[2];
      o.repl_job = argv[3];
      o.replicas = 2;
    }
    c = ps_client_create(cl, "ps", &o, &st);
  }
  if (c) {
    char line[1024];
    rc = 0;
    while (fgets(line, sizeof line, stdin)) {
      if (run(c, line) != 0) rc = 1;
      fflush(stdout);
    }
  } else {
    fprintf(stderr, "big_assign_client: %s\n", st.msg);
  }
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc;
}
