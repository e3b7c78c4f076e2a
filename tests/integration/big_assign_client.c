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

static int assign(ps_client *c, int shard, const char *name, int64_t elems, uint64_t seed,
                  ps_dtype dt, ps_status *st) {
  ps_shape s = {.rank = 1, .dim = {elems}};
  ps_tensor *t = ps_tensor_create(dt, &s, false);
  if (t == NULL) {
    st->code = PS_RESOURCE_EXHAUSTED;
    snprintf(st->msg, sizeof st->msg, "out of memory");
    return st->code;
  }
  void *p = ps_tensor_data(t);
  if (dt == PS_DT_FLOAT) { /* (most of the calls: the quick way) */
    float *f = p;
    for (int64_t i = 0; i < elems; i++)
      f[i] = (float)elem(seed, i);
  } else {
    for (int64_t i = 0; i < elems; i++)
      ps_elem_set(dt, p, i, elem(seed, i));
  }
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  int rc = ps_client_update(c, shard, &u, 1, st);
  ps_tensor_destroy(t);
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
  char *argv[8];
  int argc = 0;
  for (char *t = strtok(line, " \t\n"); t && argc < 8; t = strtok(NULL, " \t\n"))
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
