/* Fuzz target for the decoders of cluster descriptions: cluster spec JSON
 * (ps_cluster_parse), TF_CONFIG (ps_cluster_from_tf_config), the Slurm
 * step variables (hostlist and tasks-per-node syntax, jobs spec) and
 * device strings.  Besides "no crash, no leak, no UB" it checks properties:
 * an error always carries a message; whatever parses prints back to JSON
 * that parses to the same thing; the task TF_CONFIG or Slurm names is in
 * the cluster; a device string survives parse -> format -> parse.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target.  Otherwise the shared driver (driver.c) runs it over every file (or every
 * file in each directory) named on the command line and then over
 * PS_FUZZ_RUNS (default 4000) deterministic random mutations of them, so
 * it runs as an ordinary test under gcc + ASan/UBSan. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cluster.h"
#include "common/device.h"
#include "driver.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_cluster: " __VA_ARGS__);                                       \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

static void expect_error(const ps_status *st, const char *what) {
  if (st->code == PS_OK || st->msg[0] == '\0')
    FAIL("%s failed without a status message", what);
}

/* Jobs sorted and unique, every address non-empty, and the JSON output
 * parses back to the same JSON. */
static void check_cluster(const ps_cluster *c) {
  if (c->njobs < 1) FAIL("cluster with %d jobs", c->njobs);
  for (int i = 0; i < c->njobs; i++) {
    if (i > 0 && strcmp(c->jobs[i - 1].name, c->jobs[i].name) >= 0)
      FAIL("jobs not sorted: %s, %s", c->jobs[i - 1].name, c->jobs[i].name);
    if (c->jobs[i].ntasks < 1 || c->jobs[i].ntasks > PS_CLUSTER_MAX_TASKS)
      FAIL("job %s has %d tasks", c->jobs[i].name, c->jobs[i].ntasks);
    if (ps_cluster_find_job(c, c->jobs[i].name) != &c->jobs[i])
      FAIL("find_job(%s) misses", c->jobs[i].name);
  }
  char *json = ps_cluster_to_json(c);
  if (json == NULL) FAIL("to_json failed");
  ps_status st = {0};
  ps_cluster *back = ps_cluster_parse(json, strlen(json), "round trip", &st);
  if (back == NULL) FAIL("output does not parse back: %s\n%s", st.msg, json);
  char *again = ps_cluster_to_json(back);
  if (again == NULL || strcmp(json, again) != 0)
    FAIL("round trip changed the spec:\n%s\n%s", json, again ? again : "");
  free(again);
  free(json);
  ps_cluster_destroy(back);
}

static void check_self(const ps_cluster *c, const ps_task_id *self, const char *what) {
  if (ps_cluster_address(c, self->job, self->task) == NULL)
    FAIL("%s: self %s/%d is not in the cluster", what, self->job, self->task);
}

/* "NAME=" followed by room for a value; putenv keeps pointing at it, so
 * rewriting the value needs no allocation per run. */
#define ENV_VALUE_MAX 512
typedef struct env_slot {
  const char *name;
  char buf[64 + ENV_VALUE_MAX];
  int put;
} env_slot;

static void env_set(env_slot *e, const char *v, size_t n) {
  if (n > ENV_VALUE_MAX - 1) n = ENV_VALUE_MAX - 1;
  int o = snprintf(e->buf, sizeof e->buf, "%s=", e->name);
  memcpy(e->buf + o, v, n);
  e->buf[o + (int)n] = '\0';
  if (!e->put) {
    putenv(e->buf);
    e->put = 1;
  }
}

/* Lines of @text: SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE,
 * SLURM_STEP_NUM_TASKS, SLURM_PROCID, jobs spec (missing or "" = default);
 * a missing line takes a harmless default. */
static void fuzz_slurm(const char *text) {
  static env_slot slots[] = {{"SLURM_STEP_NODELIST", "", 0},
                             {"SLURM_STEP_TASKS_PER_NODE", "", 0},
                             {"SLURM_STEP_NUM_TASKS", "", 0},
                             {"SLURM_PROCID", "", 0}};
  static const char *const dflt[] = {"n1", "1", "1", "0", ""};
  const char *p = text;
  char jobs[ENV_VALUE_MAX];
  for (size_t i = 0; i < 5; i++) {
    const char *nl = p ? strchr(p, '\n') : NULL;
    const char *v = p ? p : dflt[i];
    size_t n = p ? (nl ? (size_t)(nl - p) : strlen(p)) : strlen(dflt[i]);
    if (i < 4)
      env_set(&slots[i], v, n);
    else
      snprintf(jobs, sizeof jobs, "%.*s", (int)(n < 511 ? n : 511), v);
    p = nl ? nl + 1 : NULL;
  }
  ps_status st = {0};
  ps_task_id self;
  ps_cluster *c = ps_cluster_from_slurm(jobs[0] ? jobs : NULL, 8888, &self, &st);
  if (c == NULL) {
    expect_error(&st, "ps_cluster_from_slurm");
    return;
  }
  check_self(c, &self, "Slurm");
  check_cluster(c);
  ps_cluster_destroy(c);
}

static void fuzz_device(const char *text) {
  ps_status st = {0};
  ps_device d, d2;
  char buf[PS_DEVICE_STRING_MAX], buf2[PS_DEVICE_STRING_MAX];
  if (ps_device_parse(text, &d, &st) != 0) {
    expect_error(&st, "ps_device_parse");
    return;
  }
  ps_device_format(&d, buf, sizeof buf);
  if (ps_device_parse(buf, &d2, &st) != 0)
    FAIL("device '%s' does not parse back: %s", buf, st.msg);
  if (!ps_device_equal(&d, &d2) ||
      strcmp(buf, ps_device_format(&d2, buf2, sizeof buf2)) != 0)
    FAIL("device round trip changed '%s' to '%s'", buf, buf2);
  ps_device_merge(&d2, &d);
  if (!ps_device_equal(&d, &d2)) FAIL("merge into itself changed '%s'", buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ps_status st = {0};
  ps_cluster *c = ps_cluster_parse((const char *)data, size, "fuzz", &st);
  if (c != NULL) {
    check_cluster(c);
    ps_cluster_destroy(c);
  } else {
    expect_error(&st, "ps_cluster_parse");
  }

  char *text = malloc(size + 1);
  if (text == NULL) return 0;
  if (size > 0) memcpy(text, data, size);
  text[size] = '\0';
  ps_task_id self;
  ps_status_clear(&st);
  c = ps_cluster_from_tf_config(text, &self, &st);
  if (c != NULL) {
    check_self(c, &self, "TF_CONFIG");
    check_cluster(c);
    ps_cluster_destroy(c);
  } else {
    expect_error(&st, "ps_cluster_from_tf_config");
  }
  fuzz_slurm(text);
  fuzz_device(text);
  free(text);
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of the input languages, so mutations reach deep paths. */
static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    " ",
    "\n",
    "null",
    "true",
    "0",
    "1",
    "65535",
    "65536",
    "-1",
    "99999999999",
    "\\u0000",
    "\\\"",
    "\xff",
    "\"ps\"",
    "\"worker\"",
    "\"chief\"",
    "\"cluster\"",
    "\"security\"",
    "\"require_auth\"",
    "\"ca\"",
    "\"task\"",
    "\"type\"",
    "\"index\"",
    "\"0\"",
    "\"3\"",
    "\"h:1\"",
    "\"[::1]:0\"",
    "\"127.0.0.1:0\"",
    "{\"0\": \"a:1\"}",
    "[\"a:1\",\"b:2\"]",
    "n[01-03]",
    "[1-2,5]",
    "(x2)",
    "3(x2),2",
    "ps:2,worker:2",
    "/job:ps",
    "/task:1",
    "/device:GPU:*",
    "/cpu:0",
    "/replica:0",
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(4);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(8)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte */
      if (n) buf[fuzz_rnd(n)] = (uint8_t)fuzz_rng();
      break;
    case 2:   /* insert a token */
    case 3: { /* (twice as likely) */
      const char *t = tokens[fuzz_rnd(NTOKENS)];
      n = fuzz_insert(buf, n, cap, pos, t, strlen(t));
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range */
      n = fuzz_duplicate(buf, n, cap, pos, 64);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
