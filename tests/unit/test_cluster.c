/* Unit tests for common/cluster.c: the cluster spec from JSON files,
 * TF_CONFIG and Slurm, and every error a user can reach, by its text.
 * Files go to a fresh mkdtemp() directory per test, removed afterwards;
 * TF_CONFIG and the Slurm variables are set with setenv in each test (and
 * cleared first, so the tests also pass with CK_FORK=no).
 *
 * TF_CONFIG and Slurm are tested in test_cluster_env.c (one program:
 * unit_cluster).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cluster.h"
#include "test_cluster_internal.h"
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

void clear_env(void) {
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

void tf_config_fails(const char *json, const char *needle) {
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
  cluster_repl_tests(tc);
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
  cluster_env_tests(tc);
  tcase_add_test(tc, test_resolve_tf_config);
  tcase_add_test(tc, test_resolve_slurm);
  tcase_add_test(tc, test_resolve_nothing);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(cluster_suite());
}
