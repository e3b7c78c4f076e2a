/* Unit tests for common/cluster.c: the cluster spec from JSON files,
 * TF_CONFIG and Slurm, and every error a user can reach, by its text.
 * Files go to a fresh mkdtemp() directory per test, removed afterwards;
 * TF_CONFIG and the Slurm variables are set with setenv in each test (and
 * cleared first, so the tests also pass with CK_FORK=no). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cluster.h"
#include "testdir.h"
#include "tests/support/assert.h"

static const char *tmp_path(const char *name) {
  static char path[2][512];
  static int k;
  k ^= 1;
  snprintf(path[k], sizeof path[k], "%s/%s", tmpdir, name);
  return path[k];
}

static const char *write_tmp(const char *name, const char *text) {
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
  return path;
}

static int count_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

static void clear_env(void) {
  static const char *const vars[] = {"TF_CONFIG",
                                     "SLURM_PROCID",
                                     "SLURM_STEP_NUM_TASKS",
                                     "SLURM_STEP_NODELIST",
                                     "SLURM_STEP_TASKS_PER_NODE",
                                     "PS_SLURM_JOBS",
                                     "PS_SLURM_PORT_BASE",
                                     "SLURM_DISTRIBUTION",
                                     "SLURM_STEP_RESV_PORTS",
                                     "SLURMD_NODENAME",
                                     "SLURM_GTIDS",
                                     "SLURM_HET_SIZE",
                                     "SLURM_PACK_SIZE",
                                     "SLURM_JOB_NODELIST_HET_GROUP_0",
                                     "SLURM_JOB_NODELIST_HET_GROUP_1",
                                     "SLURM_JOB_NODELIST_HET_GROUP_2",
                                     "SLURM_JOB_NODELIST_PACK_GROUP_0",
                                     "SLURM_JOB_NODELIST_PACK_GROUP_1"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    unsetenv(vars[i]);
}

static ps_cluster *parse(const char *json, ps_status *st) {
  return ps_cluster_parse(json, strlen(json), "/tmp/c.json", st);
}

/* @json must fail to parse with @code and a message holding @needle. */
static void parse_fails_code(const char *json, int code, const char *needle) {
  ps_status st = {0};
  ps_cluster *c = parse(json, &st);
  ck_assert_msg(c == NULL, "parsed: %s", json);
  PS_ASSERT_STATUS(st.code, st, code, needle);
}

static void parse_fails(const char *json, const char *needle) {
  parse_fails_code(json, PS_INVALID_ARGUMENT, needle);
}

static void tf_config_fails(const char *json, const char *needle) {
  ps_status st = {0};
  ps_task_id self;
  ps_cluster *c = ps_cluster_from_tf_config(json, &self, &st);
  ck_assert_msg(c == NULL, "accepted TF_CONFIG: %s", json);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, needle);
}

/* ---- parsing ------------------------------------------------------------ */

START_TEST(test_parse_dense) {
  ps_status st = {0};
  ps_cluster *c = parse("{\"worker\": [\"h3:2222\", \"h4:2222\"],\n"
                        " \"ps\": [\"h1:2222\", \"h2:2222\"],\n"
                        " \"chief\": [\"h0:2222\"]}",
                        &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(c->njobs, 3);
  /* sorted by name, as TF's ClusterDef */
  ck_assert_str_eq(c->jobs[0].name, "chief");
  ck_assert_str_eq(c->jobs[1].name, "ps");
  ck_assert_str_eq(c->jobs[2].name, "worker");
  ck_assert_int_eq(ps_cluster_num_tasks(c, "ps"), 2);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "worker"), 2);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "chief"), 1);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "evaluator"), 0);
  ck_assert_str_eq(ps_cluster_address(c, "ps", 1), "h2:2222");
  ck_assert_str_eq(ps_cluster_address(c, "worker", 0), "h3:2222");
  ck_assert_ptr_null(ps_cluster_address(c, "ps", 2));
  ck_assert_ptr_null(ps_cluster_address(c, "ps", -1));
  ck_assert_ptr_null(ps_cluster_address(c, "nope", 0));
  const ps_cluster_job *j = ps_cluster_find_job(c, "worker");
  ck_assert_ptr_nonnull(j);
  ck_assert_int_eq(j->ntasks, 2);
  ck_assert_ptr_null(ps_cluster_find_job(c, "pss"));
  ck_assert_ptr_null(ps_cluster_find_job(c, ""));
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_parse_sparse) {
  ps_status st = {0};
  ps_cluster *c = parse("{\"ps\": [\"a:1\"], \"worker\": {\"3\": \"w3:1\", \"0\": "
                        "\"w0:1\"}}",
                        &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "worker"), 4);
  ck_assert_int_eq(ps_cluster_num_listed(c, "worker"), 2); /* TF's num_tasks */
  ck_assert_int_eq(ps_cluster_num_listed(c, "nope"), 0);
  ck_assert_str_eq(ps_cluster_address(c, "worker", 0), "w0:1");
  ck_assert_ptr_null(ps_cluster_address(c, "worker", 1));
  ck_assert_ptr_null(ps_cluster_address(c, "worker", 2));
  ck_assert_str_eq(ps_cluster_address(c, "worker", 3), "w3:1");
  /* holes print as TF's as_dict() does: an object */
  char *json = ps_cluster_to_json(c);
  ck_assert_str_eq(json, "{ \"ps\": [ \"a:1\" ], \"worker\": { \"0\": "
                         "\"w0:1\", \"3\": \"w3:1\" } }");
  free(json);
  /* a dense object prints as a list */
  PS_ASSERT_OK(ps_cluster_set_address(c, "worker", 1, "w1:1", &st), st);
  PS_ASSERT_OK(ps_cluster_set_address(c, "worker", 2, "w2:1", &st), st);
  json = ps_cluster_to_json(c);
  ck_assert_str_eq(json, "{ \"ps\": [ \"a:1\" ], \"worker\": [ \"w0:1\", "
                         "\"w1:1\", \"w2:1\", \"w3:1\" ] }");
  free(json);
  ps_cluster_destroy(c);

  /* the largest index allowed */
  c = parse("{\"ps\": {\"65535\": \"a:1\"}}", &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "ps"), PS_CLUSTER_MAX_TASKS);
  ck_assert_str_eq(ps_cluster_address(c, "ps", 65535), "a:1");
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_round_trip) {
  static const char *const specs[] = {
      "{\"ps\": [\"127.0.0.1:0\", \"127.0.0.1:0\"], \"worker\": "
      "[\"[::1]:2222\", \"host-a.example.com:65535\"]}",
      "{\"chief\": {\"0\": \"c:1\"}, \"x_1\": {\"2\": \"x:2\", \"5\": "
      "\"y:3\"}}",
      "{\"w\": [\"[fe80::1%eth0]:80\"]}",
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    ps_status st = {0};
    ps_cluster *a = parse(specs[i], &st);
    ck_assert_msg(a != NULL, "%s: %s", specs[i], st.msg);
    char *j1 = ps_cluster_to_json(a);
    ck_assert_ptr_nonnull(j1);
    ps_cluster *b = ps_cluster_parse(j1, strlen(j1), "round trip", &st);
    ck_assert_msg(b != NULL, "%s: %s", j1, st.msg);
    char *j2 = ps_cluster_to_json(b);
    ck_assert_str_eq(j1, j2);
    ck_assert_int_eq(a->njobs, b->njobs);
    for (int k = 0; k < a->njobs; k++) {
      ck_assert_str_eq(a->jobs[k].name, b->jobs[k].name);
      ck_assert_int_eq(a->jobs[k].ntasks, b->jobs[k].ntasks);
    }
    free(j1);
    free(j2);
    ps_cluster_destroy(a);
    ps_cluster_destroy(b);
  }
}
END_TEST

START_TEST(test_parse_accepts) {
  ps_status st = {0};
  /* port 0 may repeat: the kernel picks distinct ports */
  ps_cluster *c = parse("{\"ps\": [\"127.0.0.1:0\", \"127.0.0.1:0\"], \"worker\": "
                        "[\"127.0.0.1:0\", \"[::1]:2222\", \"localhost:00080\"]}",
                        &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(ps_cluster_address(c, "worker", 1), "[::1]:2222");
  ps_cluster_destroy(c);
  /* not NUL-terminated: only @len bytes are read */
  const char text[] = "{\"ps\": [\"a:1\"]}GARBAGE";
  c = ps_cluster_parse(text, sizeof text - 1 - 7, NULL, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ps_cluster_destroy(c);
  /* surrounding whitespace is fine */
  c = parse("\n\n  {\"ps\": [\"a:1\"]}\n\n", &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_parse_errors) {
  parse_fails("{\n  \"ps\": [\"a:1\",\n   nope]\n}",
              "cluster spec /tmp/c.json: invalid JSON at line 3: ");
  parse_fails("", "cluster spec /tmp/c.json: invalid JSON at line 1: "
                  "unexpected end of data");
  parse_fails("{\"ps\": [\"a:1\"]", "invalid JSON at line 1");
  parse_fails("{\"ps\": [\"a:1\"]}\n\n}", "invalid JSON at line 3");
  parse_fails("{\"ps\": [\"a:1\",]}", "invalid JSON at line 1");
  parse_fails("{'ps': ['a:1']}", "invalid JSON at line 1");
  parse_fails("{\"ps\": [\"\xff:1\"]}", "invalid JSON");
  {
    const char nul[] = "{\"ps\":\n [\"a:1\"]\0}";
    ps_status st = {0};
    ck_assert_ptr_null(ps_cluster_parse(nul, sizeof nul - 1, "x", &st));
    PS_ASSERT_MSG_HAS(st, "cluster spec x: invalid JSON at line 2: NUL byte");
  }
  {
    char deep[200];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = '\0';
    parse_fails(deep, "invalid JSON at line 1");
  }
  parse_fails("[\"a:1\"]", "cluster spec /tmp/c.json: top level must be an "
                           "object of job names");
  parse_fails("42", "top level must be an object of job names");
  parse_fails("\"ps\"", "top level must be an object of job names");
  parse_fails("{}", "cluster spec /tmp/c.json: top level has no jobs");
  parse_fails("{\"ps\": \"a:1\"}",
              "cluster spec /tmp/c.json: job \"ps\" must be a list of "
              "\"host:port\" strings or an object");
  parse_fails("{\"ps\": 3}", "job \"ps\" must be a list");
  parse_fails("{\"ps\": null}", "job \"ps\" must be a list");
  parse_fails("{\"ps\": []}", "cluster spec /tmp/c.json: job \"ps\" has no "
                              "tasks");
  parse_fails("{\"ps\": {}}", "job \"ps\" has no tasks");
  parse_fails("{\"p-s\": [\"a:1\"]}", "bad job name \"p-s\"");
  parse_fails("{\"\": [\"a:1\"]}", "bad job name \"\"");
  parse_fails("{\"a\\\"b\": [\"a:1\"]}", "bad job name \"a?b\"");
  parse_fails("{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
              "a\": [\"a:1\"]}",
              "is too long (max 63 characters)");
  /* addresses */
  parse_fails("{\"ps\": [\"a:1\", \"localhost\"]}",
              "cluster spec /tmp/c.json: ps/1: address \"localhost\" is not "
              "host:port");
  parse_fails("{\"ps\": [\"h:abc\"]}",
              "ps/0: address \"h:abc\" has a bad port (must be a number from "
              "0 to 65535)");
  parse_fails("{\"ps\": [\"h:65536\"]}", "address \"h:65536\" has a bad port");
  parse_fails("{\"ps\": [\"h:-1\"]}", "address \"h:-1\" has a bad port");
  parse_fails("{\"ps\": [\"h:99999999999\"]}", "has a bad port");
  parse_fails("{\"ps\": [\"h:\"]}", "address \"h:\" is not host:port");
  parse_fails("{\"ps\": [\":2222\"]}", "address \":2222\" is not host:port");
  parse_fails("{\"ps\": [\"\"]}", "address \"\" is not host:port");
  parse_fails("{\"ps\": [\"a b:1\"]}", "address \"a b:1\" is not host:port");
  parse_fails("{\"ps\": [\"h/x:1\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"::1:2222\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"[::1]2222\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"[]:1\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"[::1\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"[zz]:1\"]}", "is not host:port");
  parse_fails("{\"ps\": [\"a\\u0000b:1\"]}", "address \"a?b:1\" is not "
                                             "host:port");
  parse_fails("{\"ps\": [\"a\\nb:1\"]}", "address \"a?b:1\" is not host:port");
  parse_fails("{\"ps\": [\"a:1\", 2222]}",
              "ps/1: address must be a \"host:port\" string, not int");
  parse_fails("{\"ps\": [null]}", "ps/0: address must be a \"host:port\" "
                                  "string, not null");
  parse_fails("{\"ps\": {\"0\": [\"a:1\"]}}", "not array");
  /* sparse indices */
  parse_fails("{\"ps\": {\"x\": \"a:1\"}}",
              "job \"ps\": bad task index \"x\" (must be a number from 0 to "
              "65535)");
  parse_fails("{\"ps\": {\"-1\": \"a:1\"}}", "bad task index \"-1\"");
  parse_fails("{\"ps\": {\"1.0\": \"a:1\"}}", "bad task index \"1.0\"");
  parse_fails("{\"ps\": {\"\": \"a:1\"}}", "bad task index \"\"");
  parse_fails("{\"ps\": {\" 1\": \"a:1\"}}", "bad task index \" 1\"");
  parse_fails("{\"ps\": {\"65536\": \"a:1\"}}", "bad task index \"65536\"");
  parse_fails("{\"ps\": {\"1\": \"a:1\", \"01\": \"b:1\"}}",
              "job \"ps\": task index 1 is given twice");
  parse_fails("{\"ps\": {\"3\": \"a\"}}", "ps/3: address \"a\" is not "
                                          "host:port");
  /* the same address twice */
  parse_fails("{\"worker\": [\"127.0.0.1:1\", \"127.0.0.1:2222\"], \"ps\": "
              "[\"127.0.0.1:2222\"]}",
              "cluster spec /tmp/c.json: address 127.0.0.1:2222 is used by "
              "both ps/0 and worker/1");
  parse_fails("{\"ps\": [\"h:1\", \"h:1\"]}",
              "address h:1 is used by both ps/0 and ps/1");
}
END_TEST

START_TEST(test_parse_error_origin) {
  ps_status st = {0};
  ck_assert_ptr_null(ps_cluster_parse("[]", 2, NULL, &st));
  PS_ASSERT_MSG_HAS(st, "cluster spec (string): top level must be");
  ck_assert_ptr_null(ps_cluster_parse(NULL, 0, "o", &st));
  PS_ASSERT_MSG_HAS(st, "cluster spec o: invalid JSON at line 1");
  /* a NULL status is allowed */
  ck_assert_ptr_null(ps_cluster_parse("[]", 2, "o", NULL));
  /* an enormous bad address is cut short in the message */
  char big[5000];
  strcpy(big, "{\"ps\": [\"");
  memset(big + 9, 'a', 4000);
  strcpy(big + 4009, "\"]}");
  ck_assert_ptr_null(parse(big, &st));
  PS_ASSERT_MSG_HAS(st, "...\" is not host:port");
  ck_assert_uint_lt(strlen(st.msg), 300);
}
END_TEST

START_TEST(test_destroy_null_and_lookups_on_null) {
  ps_cluster_destroy(NULL);
  ck_assert_ptr_null(ps_cluster_find_job(NULL, "ps"));
  ck_assert_int_eq(ps_cluster_num_tasks(NULL, "ps"), 0);
  ck_assert_ptr_null(ps_cluster_address(NULL, "ps", 0));
  ck_assert_ptr_null(ps_cluster_to_json(NULL));
  ps_task_id id;
  ck_assert_int_eq(ps_cluster_chief(NULL, &id), PS_NOT_FOUND);
}
END_TEST

/* ---- files ------------------------------------------------------------- */

START_TEST(test_load_file) {
  ps_status st = {0};
  const char *path = write_tmp("c.json", "{\"ps\": [\"localhost:2222\"],\n \"worker\": "
                                         "[\"localhost:2223\", \"localhost:2224\"]}\n");
  ps_cluster *c = ps_cluster_load_file(path, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "worker"), 2);
  ck_assert_str_eq(ps_cluster_address(c, "worker", 1), "localhost:2224");
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_load_file_errors) {
  ps_status st = {0};
  char want[700];
  const char *missing = tmp_path("missing.json");
  ck_assert_ptr_null(ps_cluster_load_file(missing, &st));
  PS_ASSERT_CODE(st.code, st, PS_NOT_FOUND);
  snprintf(want, sizeof want, "cluster spec %s: cannot open: No such file or directory",
           missing);
  ck_assert_str_eq(st.msg, want);

  ck_assert_ptr_null(ps_cluster_load_file(tmpdir, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  snprintf(want, sizeof want, "cluster spec %s: cannot read: Is a directory", tmpdir);
  ck_assert_str_eq(st.msg, want);

  const char *bad = write_tmp("bad.json", "{\n  \"ps\": [\n    \"a:1\"\n"
                                          "    \"b:2\"\n  ]\n}\n");
  ck_assert_ptr_null(ps_cluster_load_file(bad, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  snprintf(want, sizeof want, "cluster spec %s: invalid JSON at line 4: ", bad);
  PS_ASSERT_MSG_HAS(st, want);

  const char *nohost = write_tmp("nohost.json", "{\"ps\": [\"localhost\"]}");
  ck_assert_ptr_null(ps_cluster_load_file(nohost, &st));
  snprintf(want, sizeof want,
           "cluster spec %s: ps/0: address \"localhost\" is not host:port", nohost);
  ck_assert_str_eq(st.msg, want);

  const char *empty = write_tmp("empty.json", "");
  ck_assert_ptr_null(ps_cluster_load_file(empty, &st));
  PS_ASSERT_MSG_HAS(st, "invalid JSON at line 1: unexpected end of data");

  if (geteuid() != 0) { /* root reads anything */
    const char *locked = write_tmp("locked.json", "{\"ps\": [\"a:1\"]}");
    ck_assert_int_eq(chmod(locked, 0), 0);
    ck_assert_ptr_null(ps_cluster_load_file(locked, &st));
    PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED, "cannot open: Permission denied");
  }
}
END_TEST

START_TEST(test_write_file) {
  ps_status st = {0};
  ps_cluster *c = parse("{\"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"], "
                        "\"ps\": {\"1\": \"127.0.0.1:0\"}}",
                        &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  const char *path = tmp_path("out.json");
  PS_ASSERT_OK(ps_cluster_write_file(c, path, &st), st);
  ck_assert_int_eq(count_dir_entries(tmpdir), 1); /* no temporary left */
  ps_cluster *back = ps_cluster_load_file(path, &st);
  ck_assert_msg(back != NULL, "%s", st.msg);
  char *a = ps_cluster_to_json(c), *b = ps_cluster_to_json(back);
  ck_assert_str_eq(a, b);
  free(a);
  free(b);
  ps_cluster_destroy(back);

  /* overwrite with learned ports, as a test harness does */
  PS_ASSERT_OK(ps_cluster_set_address(c, "worker", 0, "127.0.0.1:4001", &st), st);
  PS_ASSERT_OK(ps_cluster_write_file(c, path, &st), st);
  ck_assert_int_eq(count_dir_entries(tmpdir), 1);
  back = ps_cluster_load_file(path, &st);
  ck_assert_msg(back != NULL, "%s", st.msg);
  ck_assert_str_eq(ps_cluster_address(back, "worker", 0), "127.0.0.1:4001");
  ck_assert_ptr_null(ps_cluster_address(back, "ps", 0));
  ps_cluster_destroy(back);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0644);

  /* a directory that does not exist */
  char want[700];
  const char *nodir = tmp_path("no/such/dir.json");
  PS_ASSERT_CODE(ps_cluster_write_file(c, nodir, &st), st, PS_NOT_FOUND);
  snprintf(want, sizeof want,
           "cluster spec %s: cannot create temporary file: No such file or "
           "directory",
           nodir);
  ck_assert_str_eq(st.msg, want);
  /* renaming over a directory fails, and the temporary is removed */
  ck_assert_int_eq(mkdir(tmp_path("sub"), 0755), 0);
  ck_assert_int_eq(mkdir(tmp_path("sub/x"), 0755), 0);
  ck_assert_int_eq(write_tmp("sub/x/f", "") != NULL, 1);
  ck_assert_int_ne(ps_cluster_write_file(c, tmp_path("sub/x"), &st), 0);
  PS_ASSERT_MSG_HAS(st, "cannot rename: ");
  ck_assert_int_eq(count_dir_entries(tmp_path("sub")), 1);
  ps_cluster_destroy(c);
}
END_TEST

/* JSON for one job "w" with @n tasks, all port 0 (so no duplicates). */
static char *big_spec(int n) {
  size_t cap = 32 + (size_t)n * 16;
  char *s = malloc(cap);
  ck_assert_ptr_nonnull(s);
  size_t o = (size_t)snprintf(s, cap, "{\"w\": [");
  for (int i = 0; i < n; i++)
    o += (size_t)snprintf(s + o, cap - o, "%s\"h%d:0\"", i ? "," : "", i);
  snprintf(s + o, cap - o, "]}");
  return s;
}

START_TEST(test_limits) {
  ps_status st = {0};
  /* the most tasks a job may have, read through a file (several reads) */
  char *s = big_spec(PS_CLUSTER_MAX_TASKS);
  const char *path = write_tmp("big.json", s);
  free(s);
  ps_cluster *c = ps_cluster_load_file(path, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_cluster_num_tasks(c, "w"), PS_CLUSTER_MAX_TASKS);
  ck_assert_str_eq(ps_cluster_address(c, "w", 65535), "h65535:0");
  ps_cluster_destroy(c);
  /* one more is refused */
  s = big_spec(PS_CLUSTER_MAX_TASKS + 1);
  parse_fails(s, "cluster spec /tmp/c.json: job \"w\" has too many tasks "
                 "(max 65536)");
  free(s);

  /* size cap, for strings and for files */
  size_t n = PS_CLUSTER_MAX_BYTES + 1;
  s = malloc(n);
  ck_assert_ptr_nonnull(s);
  memset(s, ' ', n);
  ck_assert_ptr_null(ps_cluster_parse(s, n, "huge", &st));
  PS_ASSERT_MSG_HAS(st, "cluster spec huge: too large (16777217 bytes, max "
                        "16777216)");
  free(s);
  const char *huge = tmp_path("huge.json");
  FILE *f = fopen(huge, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(ftruncate(fileno(f), (off_t)n), 0);
  fclose(f);
  ck_assert_ptr_null(ps_cluster_load_file(huge, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "too large (more than 16777216 bytes)");

  /* NULL arguments */
  ck_assert_ptr_null(ps_cluster_load_file(NULL, &st));
  ck_assert_str_eq(st.msg, "cluster spec (string): no path given");
  PS_ASSERT_STATUS(ps_cluster_write_file(NULL, tmp_path("x"), &st), st,
                   PS_INVALID_ARGUMENT, "nothing to write");
}
END_TEST

/* ---- set_address, chief ------------------------------------------------ */

START_TEST(test_set_address) {
  ps_status st = {0};
  ps_cluster *c = parse("{\"ps\": [\"127.0.0.1:0\", \"127.0.0.1:0\"], "
                        "\"worker\": {\"1\": \"127.0.0.1:5000\"}}",
                        &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_cluster_set_address(c, "ps", 0, "127.0.0.1:4000", &st), st);
  ck_assert_str_eq(ps_cluster_address(c, "ps", 0), "127.0.0.1:4000");
  /* the same address again on the same task is fine */
  PS_ASSERT_OK(ps_cluster_set_address(c, "ps", 0, "127.0.0.1:4000", &st), st);
  /* fills a hole */
  PS_ASSERT_OK(ps_cluster_set_address(c, "worker", 0, "127.0.0.1:5001", &st), st);
  ck_assert_str_eq(ps_cluster_address(c, "worker", 0), "127.0.0.1:5001");
  /* port 0 may repeat */
  PS_ASSERT_OK(ps_cluster_set_address(c, "worker", 0, "127.0.0.1:0", &st), st);

  PS_ASSERT_CODE(ps_cluster_set_address(c, "ps", 1, "127.0.0.1:4000", &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg, "cluster: ps/1: address 127.0.0.1:4000 is already "
                           "used by ps/0");
  PS_ASSERT_CODE(ps_cluster_set_address(c, "ps", 1, "nohost", &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg, "cluster: ps/1: address \"nohost\" is not "
                           "host:port");
  PS_ASSERT_STATUS(ps_cluster_set_address(c, "ps", 1, "h:70000", &st), st,
                   PS_INVALID_ARGUMENT, "has a bad port");
  PS_ASSERT_CODE(ps_cluster_set_address(c, "ps", 2, "h:1", &st), st, PS_NOT_FOUND);
  ck_assert_str_eq(st.msg, "cluster: no task ps/2 (job ps has 2 tasks)");
  PS_ASSERT_CODE(ps_cluster_set_address(c, "ps", -1, "h:1", &st), st, PS_NOT_FOUND);
  PS_ASSERT_CODE(ps_cluster_set_address(c, "chief", 0, "h:1", &st), st, PS_NOT_FOUND);
  ck_assert_str_eq(st.msg, "cluster: no task chief/0 (no job \"chief\"; "
                           "jobs: ps, worker)");
  PS_ASSERT_CODE(ps_cluster_set_address(NULL, "ps", 0, "h:1", &st), st,
                 PS_INVALID_ARGUMENT);
  /* failed calls changed nothing */
  ck_assert_str_eq(ps_cluster_address(c, "ps", 1), "127.0.0.1:0");
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_chief) {
  ps_status st = {0};
  ps_task_id id;
  ps_cluster *c = parse("{\"chief\": [\"c:1\"], \"worker\": [\"w:1\"]}", &st);
  ck_assert_int_eq(ps_cluster_chief(c, &id), 0);
  ck_assert_str_eq(id.job, "chief");
  ck_assert_int_eq(id.task, 0);
  ps_cluster_destroy(c);
  c = parse("{\"ps\": [\"p:1\"], \"worker\": [\"w:1\", \"w:2\"]}", &st);
  ck_assert_int_eq(ps_cluster_chief(c, &id), 0);
  ck_assert_str_eq(id.job, "worker");
  ck_assert_int_eq(id.task, 0);
  ps_cluster_destroy(c);
  c = parse("{\"ps\": [\"p:1\"]}", &st);
  ck_assert_int_eq(ps_cluster_chief(c, &id), PS_NOT_FOUND);
  ps_cluster_destroy(c);
  c = parse("{\"ps\": [\"p:1\"], \"worker\": {\"1\": \"w:1\"}}", &st);
  ck_assert_int_eq(ps_cluster_chief(c, &id), PS_NOT_FOUND);
  ps_cluster_destroy(c);
}
END_TEST

/* ---- TF_CONFIG --------------------------------------------------------- */

static const char *const tf_ok =
    "{\"cluster\": {\"chief\": [\"host0:2222\"], \"ps\": [\"host1:2222\", "
    "\"host2:2222\"],\n \"worker\": [\"host3:2222\", \"host4:2222\"]},\n"
    " \"task\": {\"type\": \"worker\", \"index\": 1},\n"
    " \"environment\": \"cloud\", \"rpc_layer\": \"grpc\"}";

START_TEST(test_tf_config) {
  ps_status st = {0};
  ps_task_id self;
  ps_cluster *c = ps_cluster_from_tf_config(tf_ok, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 1);
  ck_assert_int_eq(c->njobs, 3);
  ck_assert_str_eq(ps_cluster_address(c, "ps", 1), "host2:2222");
  ps_task_id chief;
  ck_assert_int_eq(ps_cluster_chief(c, &chief), 0);
  ck_assert_str_eq(chief.job, "chief");
  ps_cluster_destroy(c);

  /* no chief job is fine; @self may be NULL */
  c = ps_cluster_from_tf_config("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": "
                                "{\"index\": 0, \"type\": \"ps\"}}",
                                NULL, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_errors) {
  ps_status st = {0};
  ck_assert_ptr_null(ps_cluster_from_tf_config(NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "TF_CONFIG: not set");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]},\n\"task\": {",
                  "TF_CONFIG: invalid JSON at line 2");
  tf_config_fails("[]", "TF_CONFIG: top level must be an object");
  tf_config_fails("{\"task\": {\"type\": \"worker\", \"index\": 0}}",
                  "TF_CONFIG: no \"cluster\"");
  tf_config_fails("{\"cluster\": null, \"task\": {\"type\": \"worker\", "
                  "\"index\": 0}}",
                  "TF_CONFIG: no \"cluster\"");
  tf_config_fails("{\"cluster\": [\"a:1\"], \"task\": {}}",
                  "TF_CONFIG: \"cluster\" must be an object of job names");
  tf_config_fails("{\"cluster\": {}, \"task\": {}}",
                  "TF_CONFIG: \"cluster\" has no jobs");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\", \"localhost\"]}}",
                  "TF_CONFIG: ps/1: address \"localhost\" is not host:port");
  tf_config_fails("{\"cluster\": {\"ps\": \"a:1\"}}",
                  "TF_CONFIG: job \"ps\" must be a list of \"host:port\" "
                  "strings or an object");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"a:1\"]}}",
                  "TF_CONFIG: address a:1 is used by both ps/0 and worker/0");
  tf_config_fails("{\"cluster\": {\"chief\": [], \"ps\": [\"a:1\"]}, "
                  "\"task\": {\"type\": \"ps\", \"index\": 0}}",
                  "TF_CONFIG: If \"cluster\" is set in TF_CONFIG, it must "
                  "have one \"chief\" node.");
  tf_config_fails("{\"cluster\": {\"chief\": {}, \"ps\": [\"a:1\"]}}",
                  "it must have one \"chief\" node.");
  tf_config_fails("{\"cluster\": {\"chief\": [\"c:1\", \"c:2\"]}, \"task\": "
                  "{\"type\": \"chief\", \"index\": 0}}",
                  "TF_CONFIG: The \"cluster\" in TF_CONFIG must have only "
                  "one \"chief\" node.");
  tf_config_fails("{\"cluster\": {\"chief\": {\"1\": \"c:1\"}}}",
                  "must have only one \"chief\" node.");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}}",
                  "TF_CONFIG: \"task\" must be an object");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": 3}",
                  "TF_CONFIG: \"task\" must be an object");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"index\": "
                  "0}}",
                  "TF_CONFIG: \"task\" needs \"type\"");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": 1, "
                  "\"index\": 0}}",
                  "TF_CONFIG: \"task\" needs \"type\"");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"ps\"}}",
                  "TF_CONFIG: \"task\" needs \"index\", an integer >= 0");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"ps\", \"index\": -1}}",
                  "needs \"index\", an integer >= 0");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"ps\", \"index\": \"0\"}}",
                  "needs \"index\", an integer >= 0");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"ps\", \"index\": 0.5}}",
                  "needs \"index\", an integer >= 0");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"ps\", \"index\": 4294967296}}",
                  "needs \"index\", an integer >= 0");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\", \"b:1\"]}, \"task\": "
                  "{\"type\": \"ps\", \"index\": 3}}",
                  "TF_CONFIG: task ps/3 is not in the cluster (job ps has 2 "
                  "tasks)");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:1\"]}, "
                  "\"task\": {\"type\": \"chief\", \"index\": 0}}",
                  "TF_CONFIG: task chief/0 is not in the cluster (no job "
                  "\"chief\"; jobs: ps, worker)");
  /* an evaluator outside the cluster is TensorFlow's usual layout; one of
   * a spec that has an evaluator job must be in it */
  ps_task_id me;
  ps_status est = {0};
  ps_cluster *ec = ps_cluster_from_tf_config(
      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"b:1\"]}, \"task\": {\"type\": "
      "\"evaluator\", \"index\": 0}}",
      &me, &est);
  ck_assert_msg(ec != NULL, "%s", est.msg);
  ck_assert_str_eq(me.job, "evaluator");
  ps_cluster_destroy(ec);
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"], \"evaluator\": [\"e:1\"]}, "
                  "\"task\": {\"type\": \"evaluator\", \"index\": 1}}",
                  "TF_CONFIG: task evaluator/1 is not in the cluster");
  tf_config_fails("{\"cluster\": {\"ps\": {\"1\": \"a:1\"}}, \"task\": "
                  "{\"type\": \"ps\", \"index\": 0}}",
                  "TF_CONFIG: task ps/0 is not in the cluster (job ps has no "
                  "task 0)");
  tf_config_fails("{\"cluster\": {\"ps\": [\"a:1\"]}, \"task\": {\"type\": "
                  "\"p\\u0000s\", \"index\": 0}}",
                  "TF_CONFIG: task p?s/0 is not in the cluster");
}
END_TEST

/* ---- Slurm -------------------------------------------------------------- */

static void slurm_env(const char *procid, const char *ntasks, const char *nodelist,
                      const char *tpn) {
  clear_env();
  if (procid) setenv("SLURM_PROCID", procid, 1);
  if (ntasks) setenv("SLURM_STEP_NUM_TASKS", ntasks, 1);
  if (nodelist) setenv("SLURM_STEP_NODELIST", nodelist, 1);
  if (tpn) setenv("SLURM_STEP_TASKS_PER_NODE", tpn, 1);
}

static void slurm_fails(const char *jobs, int port_base, const char *needle) {
  ps_status st = {0};
  ps_task_id self;
  ck_assert_ptr_null(ps_cluster_from_slurm(jobs, port_base, &self, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, needle);
}

/* "a:1 b:2 ..." for job @job, to compare in one assertion. */
static const char *job_addrs(const ps_cluster *c, const char *job) {
  static char buf[2048];
  size_t o = 0;
  buf[0] = '\0';
  for (int t = 0; t < ps_cluster_num_tasks(c, job); t++) {
    const char *a = ps_cluster_address(c, job, t);
    o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", t ? " " : "", a ? a : "-");
  }
  return buf;
}

START_TEST(test_slurm_default_jobs) {
  ps_status st = {0};
  ps_task_id self;
  slurm_env("3", "4", "n[1-2]", "2(x2)");
  ps_cluster *c = ps_cluster_from_slurm(NULL, 8888, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(c->njobs, 1);
  ck_assert_str_eq(job_addrs(c, "worker"), "n1:8888 n1:8889 n2:8888 n2:8889");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 3);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_slurm_jobs_sorted) {
  ps_status st = {0};
  ps_task_id self;
  /* jobs sorted by name: ps takes ranks 0-1, worker 2-3 */
  slurm_env("2", NULL, "n[1-2]", "2(x2)");
  ps_cluster *c = ps_cluster_from_slurm("worker:2,ps:2", 2222, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n1:2222 n1:2223");
  ck_assert_str_eq(job_addrs(c, "worker"), "n2:2222 n2:2223");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);

  setenv("SLURM_PROCID", "1", 1);
  c = ps_cluster_from_slurm("worker:3,ps:1", 2222, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n1:2222");
  ck_assert_str_eq(job_addrs(c, "worker"), "n1:2223 n2:2222 n2:2223");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_slurm_hosts_in_slurm_order_and_padded) {
  ps_status st = {0};
  ps_task_id self;
  /* TF's docstring example, with zero padding kept, in the nodelist's order
   * (Slurm's, which is how it hands out ranks; TF sorts the names) */
  slurm_env("0", "9", "n[01-02],m5,o[3-4,6,7-9]", "1(x9)");
  ps_cluster *c = ps_cluster_from_slurm(NULL, 8888, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"),
                   "n01:8888 n02:8888 m5:8888 o3:8888 o4:8888 o6:8888 "
                   "o7:8888 o8:8888 o9:8888");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);

  /* each host with its own count; "3(x2),2,1" */
  slurm_env("8", "9", "d,c,b,a", "3(x2),2,1");
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"),
                   "d:100 d:101 d:102 c:100 c:101 c:102 b:100 b:101 a:100");
  ck_assert_int_eq(self.task, 8);
  ps_cluster_destroy(c);

  /* a host named twice cannot come from Slurm */
  slurm_env("0", "2", "a,a", "1,2");
  slurm_fails(NULL, 100, "SLURM_STEP_NODELIST names host a twice");

  /* zip(): the shorter list wins; n9 before n10, as Slurm orders them
   * (text order would put n10 first and give rank 0 the wrong host) */
  slurm_env("0", "3", "n[8-10],x", "1,1,1");
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "n8:100 n9:100 n10:100");
  ps_cluster_destroy(c);

  /* one host, the single-machine recipe */
  slurm_env("5", "6", "localhost", "6");
  c = ps_cluster_from_slurm("ps:2,worker:3,chief:1", 20000, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "chief"), "localhost:20000");
  ck_assert_str_eq(job_addrs(c, "ps"), "localhost:20001 localhost:20002");
  ck_assert_str_eq(job_addrs(c, "worker"),
                   "localhost:20003 localhost:20004 localhost:20005");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 2);
  ps_cluster_destroy(c);
}
END_TEST

/* Ranks on nodes n9, n10, n11 (text order differs): block and cyclic
 * distributions, ports Slurm reserved for the step (srun --resv-ports,
 * so two steps on one node never collide), and the check that this rank
 * runs on the host the layout gives it. */
START_TEST(test_slurm_layouts_ports_and_node_check) {
  ps_status st = {0};
  ps_task_id self;
  slurm_env("2", NULL, "n[9-11]", "2(x3)");
  setenv("SLURMD_NODENAME", "n10", 1);
  ps_cluster *c = ps_cluster_from_slurm("ps:2,worker:4", 23450, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n9:23450 n9:23451");
  ck_assert_str_eq(job_addrs(c, "worker"), "n10:23450 n10:23451 n11:23450 n11:23451");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);
  /* cyclic: one task per node in turn */
  setenv("SLURM_DISTRIBUTION", "cyclic", 1);
  setenv("SLURMD_NODENAME", "n11", 1);
  c = ps_cluster_from_slurm("ps:2,worker:4", 23450, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n9:23450 n10:23450");
  ck_assert_str_eq(job_addrs(c, "worker"), "n11:23450 n9:23451 n10:23451 n11:23451");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);
  /* the layout says n11 for rank 2, but this task runs on n9 */
  setenv("SLURMD_NODENAME", "n9", 1);
  slurm_fails("ps:2,worker:4", 23450,
              "Slurm: rank 2 runs on n9, but the step's layout puts it on n11 "
              "(SLURM_DISTRIBUTION cyclic)");
  setenv("SLURM_DISTRIBUTION", "plane=2", 1);
  slurm_fails("ps:2,worker:4", 23450,
              "Slurm: SLURM_DISTRIBUTION \"plane=2\" is not supported");
  unsetenv("SLURM_DISTRIBUTION");
  unsetenv("SLURMD_NODENAME");
  /* reserved ports */
  setenv("SLURM_STEP_RESV_PORTS", "12000-12001", 1);
  c = ps_cluster_from_slurm("ps:2,worker:4", 23450, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n9:12000 n9:12001");
  ck_assert_str_eq(job_addrs(c, "worker"), "n10:12000 n10:12001 n11:12000 n11:12001");
  ps_cluster_destroy(c);
  setenv("SLURM_STEP_RESV_PORTS", "12000", 1);
  slurm_fails("ps:2,worker:4", 23450,
              "Slurm: host n9 runs 2 tasks but SLURM_STEP_RESV_PORTS reserves 1 ports");
  setenv("SLURM_STEP_RESV_PORTS", "12000-x", 1);
  slurm_fails("ps:2,worker:4", 23450,
              "SLURM_STEP_RESV_PORTS \"12000-x\" is not a list of port ranges");
  clear_env();
}
END_TEST

/* One step across the components of a heterogeneous job (srun A : B),
 * with the environment Slurm 22.05 gives it: the components' tasks take
 * the ranks in component order, each laid out on its own nodes, whatever
 * SLURM_DISTRIBUTION says. */
START_TEST(test_slurm_heterogeneous_step) {
  ps_status st = {0};
  ps_task_id self;
  /* salloc -N1 -n2 : -N2 -n2, srun A : B: ranks 0-1 on n9, 2 on n10, 3 on
   * n11; Slurm says cyclic (which would put rank 3 on n9) */
  slurm_env("3", "4", "n[9-11]", "2,1(x2)");
  setenv("SLURM_DISTRIBUTION", "cyclic", 1);
  setenv("SLURM_HET_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n9", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n[10-11]", 1);
  setenv("SLURMD_NODENAME", "n11", 1);
  setenv("SLURM_GTIDS", "3", 1);
  ps_cluster *c = ps_cluster_from_slurm("ps:2,worker:2", 23001, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n9:23001 n9:23002");
  ck_assert_str_eq(job_addrs(c, "worker"), "n10:23001 n11:23001");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 1);
  ps_cluster_destroy(c);
  /* the same with Slurm's older names (SLURM_PACK_*) */
  unsetenv("SLURM_HET_SIZE");
  unsetenv("SLURM_JOB_NODELIST_HET_GROUP_0");
  unsetenv("SLURM_JOB_NODELIST_HET_GROUP_1");
  setenv("SLURM_PACK_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_PACK_GROUP_0", "n9", 1);
  setenv("SLURM_JOB_NODELIST_PACK_GROUP_1", "n[10-11]", 1);
  c = ps_cluster_from_slurm("ps:2,worker:2", 23001, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "n10:23001 n11:23001");
  ps_cluster_destroy(c);

  /* component 0 on the later nodes: the step lists nodes in node order,
   * the ranks follow the components */
  slurm_env("0", "4", "n[9-11]", "2,1(x2)");
  setenv("SLURM_HET_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n[10-11]", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n9", 1);
  setenv("SLURMD_NODENAME", "n10", 1);
  c = ps_cluster_from_slurm("ps:1,worker:3", 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n10:100");
  ck_assert_str_eq(job_addrs(c, "worker"), "n11:100 n9:100 n9:101");
  ck_assert_str_eq(self.job, "ps");
  ps_cluster_destroy(c);
  /* a rank on another node than that layout gives it */
  setenv("SLURMD_NODENAME", "n9", 1);
  slurm_fails("ps:1,worker:3", 100,
              "Slurm: rank 0 runs on n9, but the step's layout puts it on n10 (a "
              "heterogeneous step: each component's tasks in block order)");

  /* salloc -N2 -n3 : -N1 -n2, srun -m cyclic A : B: component 0 cyclic
   * (0 and 2 on n9), which the environment does not tell (it says block):
   * SLURM_GTIDS shows it, and the step is refused rather than misrouted */
  slurm_env("0", "5", "n[9-11]", "2,1,2");
  setenv("SLURM_DISTRIBUTION", "block", 1);
  setenv("SLURM_HET_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n[9-10]", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n11", 1);
  setenv("SLURMD_NODENAME", "n9", 1);
  setenv("SLURM_GTIDS", "0,2", 1);
  slurm_fails(
      "ps:2,worker:3", 100,
      "Slurm: the step's layout puts ranks 0,1 on n9, but SLURM_GTIDS says \"0,2\" "
      "run there (a heterogeneous step: each component's tasks in block order; run "
      "it without -m/--distribution)");
  setenv("SLURM_GTIDS", "1,0", 1); /* the default, block: in any order */
  c = ps_cluster_from_slurm("ps:2,worker:3", 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "n9:100 n9:101");
  ck_assert_str_eq(job_addrs(c, "worker"), "n10:100 n11:100 n11:101");
  ps_cluster_destroy(c);
  setenv("SLURM_GTIDS", "0,1,7", 1);
  slurm_fails("ps:2,worker:3", 100, "SLURM_GTIDS says \"0,1,7\" run there");
  setenv("SLURM_GTIDS", "0,x", 1);
  slurm_fails("ps:2,worker:3", 100, "SLURM_GTIDS says \"0,x\" run there");
  unsetenv("SLURM_GTIDS");

  /* a step within one component (srun --het-group=1): an ordinary step */
  slurm_env("1", "2", "n11", "2");
  setenv("SLURM_HET_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n[9-10]", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n11", 1);
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "n11:100 n11:101");
  ck_assert_int_eq(self.task, 1);
  ps_cluster_destroy(c);

  /* a step with a host in no component, or a component's nodes missing
   * (variables inherited from a heterogeneous job this one was submitted
   * from): an ordinary step */
  slurm_env("0", "4", "n[9-11]", "2,1(x2)");
  setenv("SLURM_HET_SIZE", "2", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n9", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n10", 1);
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "n9:100 n9:101 n10:100 n11:100");
  ps_cluster_destroy(c);
  unsetenv("SLURM_JOB_NODELIST_HET_GROUP_1");
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n[9-11]", 1);
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "n9:100 n9:101 n10:100 n11:100");
  ps_cluster_destroy(c);

  /* an environment no heterogeneous job has */
  setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n9", 1);
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n[10-11", 1);
  slurm_fails(NULL, 100,
              "SLURM_JOB_NODELIST_HET_GROUP_1: Invalid hostlist format \"n[10-11\"");
  setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n[9-10]", 1);
  slurm_fails(NULL, 100,
              "Slurm: host n9 is in heterogeneous job components 0 and 1: their tasks "
              "cannot be told apart");
  setenv("SLURM_HET_SIZE", "x", 1);
  slurm_fails(NULL, 100,
              "SLURM_HET_SIZE \"x\" is not a number of components from 1 to 128");
  setenv("SLURM_HET_SIZE", "129", 1);
  slurm_fails(NULL, 100, "SLURM_HET_SIZE \"129\" is not a number of components");
  clear_env();
}
END_TEST

/* SLURM_GTIDS in an ordinary step: the ranks on this node must be the
 * ones the layout puts there. */
START_TEST(test_slurm_gtids_check) {
  ps_status st = {0};
  ps_task_id self;
  slurm_env("2", "6", "n[9-11]", "2(x3)");
  setenv("SLURM_GTIDS", "2,3", 1);
  ps_cluster *c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ps_cluster_destroy(c);
  setenv("SLURM_GTIDS", "2,5", 1);
  slurm_fails(
      NULL, 100,
      "Slurm: the step's layout puts ranks 2,3 on n10, but SLURM_GTIDS says \"2,5\" "
      "run there (SLURM_DISTRIBUTION block)");
  setenv("SLURM_DISTRIBUTION", "cyclic", 1);
  c = ps_cluster_from_slurm(NULL, 100, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"),
                   "n9:100 n10:100 n11:100 n9:101 n10:101 n11:101");
  ps_cluster_destroy(c);
  clear_env();
}
END_TEST

START_TEST(test_slurm_errors) {
  slurm_env(NULL, "2", "n1", "2");
  slurm_fails(NULL, 8888,
              "SLURM_PROCID not found in environment. Not "
              "running inside a SLURM step?");
  slurm_env("0", NULL, "n1", "2");
  slurm_fails(NULL, 8888,
              "SLURM_STEP_NUM_TASKS not found in environment. "
              "Not running inside a SLURM step?");
  slurm_env("0", NULL, NULL, "2");
  slurm_fails("worker:2", 8888,
              "SLURM_STEP_NODELIST not found in "
              "environment. Not running inside a SLURM "
              "step?");
  slurm_env("0", NULL, "n1", NULL);
  slurm_fails("worker:2", 8888,
              "SLURM_STEP_TASKS_PER_NODE not found in "
              "environment. Not running inside a SLURM "
              "step?");

  slurm_env("x", "2", "n1", "2");
  slurm_fails(NULL, 8888, "SLURM_PROCID \"x\" is not a task rank");
  slurm_env("0", "zero", "n1", "2");
  slurm_fails(NULL, 8888, "SLURM_STEP_NUM_TASKS \"zero\" is not a number");
  slurm_env("2", "2", "n1", "2");
  slurm_fails(NULL, 8888,
              "SLURM_PROCID 2 is out of range: the step has 2 "
              "tasks");
  slurm_env("0", "5", "n[1-2]", "2(x2)");
  slurm_fails(NULL, 8888, "Requested 5 tasks but only 4 were assigned.");
  slurm_env("0", NULL, "n[1-2]", "2(x2)");
  slurm_fails("ps:1,worker:1", 8888,
              "Requested 2 tasks but only 4 were "
              "assigned.");

  slurm_env("0", "2", "n[1-2", "1,1");
  slurm_fails(NULL, 8888,
              "SLURM_STEP_NODELIST: Invalid hostlist format "
              "\"n[1-2\"");
  slurm_env("0", "2", "n1,,n2", "1,1");
  slurm_fails(NULL, 8888, "Invalid hostlist format \"n1,,n2\"");
  slurm_env("0", "2", "n[2-1]", "1,1");
  slurm_fails(NULL, 8888, "Invalid hostlist format \"n[2-1]\": Invalid range");
  slurm_env("0", "2", "n[1-2]x", "1,1");
  slurm_fails(NULL, 8888, "Invalid hostlist format \"n[1-2]x\"");
  slurm_env("0", "2", "n[[1]]", "1,1");
  slurm_fails(NULL, 8888, "Invalid hostlist format");
  slurm_env("0", "2", "n[a-b]", "1,1");
  slurm_fails(NULL, 8888, "Invalid hostlist format \"n[a-b]\"");
  slurm_env("0", "2", "", "2");
  slurm_fails(NULL, 8888, "Invalid hostlist format \"\": no hosts");
  slurm_env("0", "2", "n[0-99999999]", "2");
  slurm_fails(NULL, 8888, "too many hosts");
  slurm_env("0", "2", "n:1", "2");
  slurm_fails(NULL, 8888,
              "SLURM_STEP_NODELIST: worker/0: address "
              "\"n:1:8888\" is not host:port");

  slurm_env("0", "2", "n1", "2(x)");
  slurm_fails(NULL, 8888,
              "SLURM_STEP_TASKS_PER_NODE: Invalid tasks-per-node "
              "list format \"2(x)\"");
  slurm_env("0", "2", "n1", "");
  slurm_fails(NULL, 8888, "Invalid tasks-per-node list format \"\"");
  slurm_env("0", "2", "n1", "2,");
  slurm_fails(NULL, 8888, "Invalid tasks-per-node list format \"2,\"");
  slurm_env("0", "2", "n1", "2(y2)");
  slurm_fails(NULL, 8888, "Invalid tasks-per-node list format");

  slurm_env("0", NULL, "n1", "2");
  slurm_fails("ps2", 8888, "jobs \"ps2\": expected NAME:COUNT");
  slurm_fails("", 8888, "jobs \"\": expected NAME:COUNT");
  slurm_fails("ps:0,worker:2", 8888, "COUNT must be a number from 1");
  slurm_fails("ps:x", 8888, "COUNT must be a number from 1");
  slurm_fails("ps:1,ps:1", 8888, "jobs \"ps:1,ps:1\": a job is given twice");
  slurm_fails("p-s:2", 8888, "expected NAME:COUNT");
  slurm_fails("ps:1,", 8888, "expected NAME:COUNT");
  slurm_fails("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:1", 8888,
              "job name too long");
  {
    char spec[2048];
    size_t o = 0;
    for (int i = 0; i < 65; i++)
      o += (size_t)snprintf(spec + o, sizeof spec - o, "%sj%d:1", i ? "," : "", i);
    slurm_fails(spec, 8888, "too many jobs");
  }
  slurm_env("0", "2", "n1", "1(x65536),1");
  slurm_fails(NULL, 8888,
              "Invalid tasks-per-node list format "
              "\"1(x65536),1\": too many nodes");

  slurm_env("0", NULL, "n1", "2");

  slurm_fails("worker:2", 0, "port base 0 is not a port number");
  slurm_fails("worker:2", 65536, "port base 65536 is not a port number");
  slurm_fails("worker:2", 65535,
              "Slurm: host n1 has 2 tasks, so ports from "
              "65535 run past 65535");
}
END_TEST

/* ---- resolve ------------------------------------------------------------ */

START_TEST(test_resolve_file) {
  ps_status st = {0};
  ps_task_id self;
  char want[800];
  clear_env();
  setenv("TF_CONFIG", tf_ok, 1); /* the file wins over TF_CONFIG */
  const char *path =
      write_tmp("c.json", "{\"ps\": [\"h:1\", \"h:2\"], \"worker\": [\"h:3\"]}");
  ps_cluster *c = ps_cluster_resolve(path, "ps", 1, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(self.job, "ps");
  ck_assert_int_eq(self.task, 1);
  ck_assert_int_eq(c->njobs, 2);
  ps_cluster_destroy(c);

  ck_assert_ptr_null(ps_cluster_resolve(path, "ps", 5, &self, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  snprintf(want, sizeof want,
           "--job ps --task 5: not in cluster spec %s (job ps has 2 tasks)", path);
  ck_assert_str_eq(st.msg, want);
  ck_assert_ptr_null(ps_cluster_resolve(path, "foo", 0, &self, &st));
  snprintf(want, sizeof want,
           "--job foo --task 0: not in cluster spec %s (no job \"foo\"; "
           "jobs: ps, worker)",
           path);
  ck_assert_str_eq(st.msg, want);
  ck_assert_ptr_null(ps_cluster_resolve(path, NULL, 0, &self, &st));
  PS_ASSERT_MSG_HAS(st, "needs --job NAME and --task N");
  ck_assert_ptr_null(ps_cluster_resolve(path, "ps", -1, &self, &st));
  PS_ASSERT_MSG_HAS(st, "needs --job NAME and --task N");
  ck_assert_ptr_null(ps_cluster_resolve(tmp_path("none.json"), "ps", 0, &self, &st));
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "cannot open: No such file or directory");
}
END_TEST

START_TEST(test_resolve_tf_config) {
  ps_status st = {0};
  ps_task_id self;
  clear_env();
  setenv("SLURM_PROCID", "0", 1); /* TF_CONFIG wins over Slurm */
  setenv("TF_CONFIG", tf_ok, 1);
  ps_cluster *c = ps_cluster_resolve(NULL, NULL, -1, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 1);
  ps_cluster_destroy(c);

  /* --job/--task override TF_CONFIG's task */
  c = ps_cluster_resolve(NULL, "ps", 0, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(self.job, "ps");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);
  ck_assert_ptr_null(ps_cluster_resolve(NULL, "ps", 2, &self, &st));
  ck_assert_str_eq(st.msg, "--job ps --task 2: not in the cluster from "
                           "TF_CONFIG (job ps has 2 tasks)");

  setenv("TF_CONFIG", "{\"cluster\": {\"ps\": [\"a\"]}}", 1);
  ck_assert_ptr_null(ps_cluster_resolve(NULL, NULL, -1, &self, &st));
  ck_assert_str_eq(st.msg, "TF_CONFIG: ps/0: address \"a\" is not host:port");
}
END_TEST

START_TEST(test_resolve_slurm) {
  ps_status st = {0};
  ps_task_id self;
  slurm_env("1", "2", "node7", "2");
  setenv("TF_CONFIG", "", 1); /* empty counts as unset */
  ps_cluster *c = ps_cluster_resolve(NULL, NULL, -1, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "worker"), "node7:8888 node7:8889");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 1);
  ps_cluster_destroy(c);

  setenv("PS_SLURM_JOBS", "ps:1,worker:1", 1);
  setenv("PS_SLURM_PORT_BASE", "3000", 1);
  c = ps_cluster_resolve(NULL, NULL, -1, &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_str_eq(job_addrs(c, "ps"), "node7:3000");
  ck_assert_str_eq(job_addrs(c, "worker"), "node7:3001");
  ck_assert_str_eq(self.job, "worker");
  ck_assert_int_eq(self.task, 0);
  ps_cluster_destroy(c);

  ck_assert_ptr_null(ps_cluster_resolve(NULL, "worker", 1, &self, &st));
  ck_assert_str_eq(st.msg, "--job worker --task 1: not in the cluster from "
                           "the Slurm step (job worker has 1 task)");

  setenv("PS_SLURM_PORT_BASE", "http", 1);
  ck_assert_ptr_null(ps_cluster_resolve(NULL, NULL, -1, &self, &st));
  ck_assert_str_eq(st.msg, "PS_SLURM_PORT_BASE \"http\" is not a port number "
                           "(1-65535)");
  unsetenv("PS_SLURM_PORT_BASE");
  unsetenv("SLURM_STEP_NODELIST");
  ck_assert_ptr_null(ps_cluster_resolve(NULL, NULL, -1, &self, &st));
  PS_ASSERT_MSG_HAS(st, "SLURM_STEP_NODELIST not found in environment");
}
END_TEST

START_TEST(test_resolve_nothing) {
  ps_status st = {0};
  ps_task_id self;
  clear_env();
  ck_assert_ptr_null(ps_cluster_resolve(NULL, NULL, -1, &self, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg, "no cluster spec: pass --cluster FILE --job NAME "
                           "--task N or set TF_CONFIG");
}
END_TEST

static Suite *cluster_suite(void) {
  Suite *s = suite_create("cluster");
  TCase *tc = tcase_create("parse");
  tcase_add_test(tc, test_parse_dense);
  tcase_add_test(tc, test_parse_sparse);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_parse_accepts);
  tcase_add_test(tc, test_parse_errors);
  tcase_add_test(tc, test_parse_error_origin);
  tcase_add_test(tc, test_destroy_null_and_lookups_on_null);
  tcase_add_test(tc, test_set_address);
  tcase_add_test(tc, test_chief);
  suite_add_tcase(s, tc);

  tc = tcase_create("files");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_add_test(tc, test_load_file);
  tcase_add_test(tc, test_load_file_errors);
  tcase_add_test(tc, test_write_file);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_resolve_file);
  suite_add_tcase(s, tc);

  tc = tcase_create("environment");
  tcase_add_checked_fixture(tc, clear_env, clear_env);
  tcase_add_test(tc, test_tf_config);
  tcase_add_test(tc, test_tf_config_errors);
  tcase_add_test(tc, test_slurm_default_jobs);
  tcase_add_test(tc, test_slurm_jobs_sorted);
  tcase_add_test(tc, test_slurm_hosts_in_slurm_order_and_padded);
  tcase_add_test(tc, test_slurm_layouts_ports_and_node_check);
  tcase_add_test(tc, test_slurm_heterogeneous_step);
  tcase_add_test(tc, test_slurm_gtids_check);
  tcase_add_test(tc, test_slurm_errors);
  tcase_add_test(tc, test_resolve_tf_config);
  tcase_add_test(tc, test_resolve_slurm);
  tcase_add_test(tc, test_resolve_nothing);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(cluster_suite());
}
