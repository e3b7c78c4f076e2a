/* Unit tests for the cluster spec's "replication" section (common/cluster.c):
 * parsing, the public getter, the JSON written back, the settings a job
 * gets from it (ps_repl_conf_from_cluster), and every error by its text.
 * Part of the unit_cluster program (test_cluster.c adds these tests). */
#include "common/view.h"
#include "test_cluster_internal.h"

static ps_cluster *parse_repl(const char *json, ps_status *st) {
  return ps_cluster_parse(json, strlen(json), "/tmp/c.json", st);
}

/* A spec with two ps and @section as its "replication" value must fail
 * with a message holding @needle. */
static void section_fails(const char *section, const char *needle) {
  char json[4096];
  snprintf(json, sizeof json, "{\"ps\": [\"a:1\", \"b:1\"], \"replication\": %s}",
           section);
  ps_status st = {0};
  ps_cluster *c = parse_repl(json, &st);
  ck_assert_msg(c == NULL, "parsed: %s", json);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, needle);
}

START_TEST(test_repl_section) {
  ps_status st = {0};
  ps_cluster *c =
      parse_repl("{\"ps\": [\"a:1\", \"b:1\", \"c:1\"], \"worker\": [\"w:1\"], "
                 "\"replication\": {\"replicas\": 2, \"etcd\": "
                 "\"e1:2379,10.0.0.2:2379,[::1]:2379\", \"job\": \"mnist-2.a_b\", "
                 "\"lease_ttl\": 3}}",
                 &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  /* a section, not a job */
  ck_assert_int_eq(c->njobs, 2);
  ck_assert_ptr_null(ps_cluster_find_job(c, "replication"));
  const ps_cluster_replication *r = ps_cluster_get_replication(c);
  ck_assert_ptr_nonnull(r);
  ck_assert_ptr_eq(r, c->replication);
  ck_assert_int_eq(r->replicas, 2);
  ck_assert_str_eq(r->etcd, "e1:2379,10.0.0.2:2379,[::1]:2379");
  ck_assert_str_eq(r->job, "mnist-2.a_b");
  ck_assert_int_eq(r->lease_ttl_s, 3);
  ps_repl_conf conf;
  ps_repl_conf_from_cluster(c, &conf);
  ck_assert_int_eq(conf.replicas, 2);
  ck_assert_str_eq(conf.etcd, "e1:2379,10.0.0.2:2379,[::1]:2379");
  ck_assert_str_eq(conf.job, "mnist-2.a_b");
  ck_assert_int_eq(conf.lease_ttl_s, 3);

  /* written back, and it parses to the same */
  char *j = ps_cluster_to_json(c);
  ck_assert_ptr_nonnull(j);
  ck_assert_str_eq(j, "{ \"ps\": [ \"a:1\", \"b:1\", \"c:1\" ], \"worker\": [ \"w:1\" ], "
                      "\"replication\": { \"replicas\": 2, \"etcd\": "
                      "\"e1:2379,10.0.0.2:2379,[::1]:2379\", \"job\": \"mnist-2.a_b\", "
                      "\"lease_ttl\": 3 } }");
  ps_cluster *back = parse_repl(j, &st);
  ck_assert_msg(back != NULL, "%s", st.msg);
  char *j2 = ps_cluster_to_json(back);
  ck_assert_str_eq(j, j2);
  free(j);
  free(j2);
  ps_cluster_destroy(back);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_repl_defaults) {
  ps_status st = {0};
  ps_repl_conf conf;
  /* no section: no getter result, the defaults */
  ps_cluster *c = parse_repl("{\"ps\": [\"a:1\"]}", &st);
  ck_assert_ptr_nonnull(c);
  ck_assert_ptr_null(ps_cluster_get_replication(c));
  ck_assert_ptr_null(ps_cluster_get_replication(NULL));
  memset(&conf, 0x5a, sizeof conf);
  ps_repl_conf_from_cluster(c, &conf);
  ck_assert_int_eq(conf.replicas, 1);
  ck_assert_str_eq(conf.etcd, "");
  ck_assert_str_eq(conf.job, "default");
  ck_assert_int_eq(conf.lease_ttl_s, 2);
  char *j = ps_cluster_to_json(c);
  ck_assert_str_eq(j, "{ \"ps\": [ \"a:1\" ] }");
  free(j);
  ps_cluster_destroy(c);
  ps_repl_conf_from_cluster(NULL, &conf);
  ck_assert_int_eq(conf.replicas, 1);
  ck_assert_str_eq(conf.job, "default");

  /* a partial section: what it leaves out is 0 / NULL, and defaults */
  c = parse_repl("{\"ps\": [\"a:1\", \"b:1\"], \"replication\": {\"etcd\": \"e:2379\"}}",
                 &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  const ps_cluster_replication *r = ps_cluster_get_replication(c);
  ck_assert_int_eq(r->replicas, 0);
  ck_assert_str_eq(r->etcd, "e:2379");
  ck_assert_ptr_null(r->job);
  ck_assert_int_eq(r->lease_ttl_s, 0);
  ps_repl_conf_from_cluster(c, &conf);
  ck_assert_int_eq(conf.replicas, 1);
  ck_assert_str_eq(conf.etcd, "e:2379");
  ck_assert_str_eq(conf.job, "default");
  ck_assert_int_eq(conf.lease_ttl_s, 2);
  j = ps_cluster_to_json(c);
  ck_assert_str_eq(j, "{ \"ps\": [ \"a:1\", \"b:1\" ], \"replication\": { \"etcd\": "
                      "\"e:2379\" } }");
  free(j);
  ps_cluster_destroy(c);

  /* an empty section is allowed; a largest one fits ps_repl_conf */
  c = parse_repl("{\"ps\": [\"a:1\"], \"replication\": {}}", &st);
  ck_assert_ptr_nonnull(ps_cluster_get_replication(c));
  ps_cluster_destroy(c);
  /* 16 endpoints of 63 characters and 15 commas: 1023 characters */
  char json[2048], etcd[1024], job[101];
  size_t o = 0;
  for (int i = 0; i < 16; i++) {
    if (i) etcd[o++] = ',';
    memset(etcd + o, 'h', 61);
    memcpy(etcd + o + 61, ":1", 2);
    o += 63;
  }
  etcd[o] = '\0';
  ck_assert_int_eq(strlen(etcd), 1023);
  memset(job, 'j', 100);
  job[100] = '\0';
  snprintf(json, sizeof json,
           "{\"ps\": [\"a:1\"], \"replication\": {\"replicas\": 3, \"etcd\": \"%s\", "
           "\"job\": \"%s\", \"lease_ttl\": 3600}}",
           etcd, job);
  c = parse_repl(json, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ps_repl_conf_from_cluster(c, &conf);
  ck_assert_int_eq(conf.replicas, 3);
  ck_assert_str_eq(conf.etcd, etcd);
  ck_assert_str_eq(conf.job, job);
  ck_assert_int_eq(conf.lease_ttl_s, 3600);
  ps_cluster_destroy(c);

  /* TF_CONFIG's cluster takes the section too */
  ps_task_id self;
  c = ps_cluster_from_tf_config(
      "{\"cluster\": {\"ps\": [\"a:1\"], \"worker\": [\"w:1\"], "
      "\"replication\": {\"replicas\": 1}}, \"task\": "
      "{\"type\": \"worker\", \"index\": 0}}",
      &self, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_cluster_get_replication(c)->replicas, 1);
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(test_repl_errors) {
  const char *pre = "cluster spec /tmp/c.json: ";
  char want[512];
  section_fails("[2]",
                "cluster spec /tmp/c.json: \"replication\" must be an object like "
                "{\"replicas\": 2, \"etcd\": \"host:2379,...\", \"job\": \"name\", "
                "\"lease_ttl\": 2}");
  section_fails("null", "\"replication\" must be an object");
  section_fails("{\"replica\": 2}",
                "cluster spec /tmp/c.json: replication: unknown key \"replica\" (known: "
                "replicas, etcd, job, lease_ttl)");
  /* replicas */
  section_fails("{\"replicas\": 0}",
                "cluster spec /tmp/c.json: replication.replicas must be 1, 2 or 3");
  section_fails("{\"replicas\": 4}", "replication.replicas must be 1, 2 or 3");
  section_fails("{\"replicas\": \"2\"}", "replication.replicas must be 1, 2 or 3");
  section_fails("{\"replicas\": 2.0}", "replication.replicas must be 1, 2 or 3");
  section_fails("{\"replicas\": 99999999999999999999}",
                "replication.replicas must be 1, 2 or 3");
  /* lease_ttl */
  section_fails("{\"lease_ttl\": 0}", "cluster spec /tmp/c.json: replication.lease_ttl "
                                      "must be a whole number of seconds from 1 to 3600");
  section_fails("{\"lease_ttl\": 3601}", "replication.lease_ttl must be a whole number");
  section_fails("{\"lease_ttl\": -2}", "replication.lease_ttl must be a whole number");
  section_fails("{\"lease_ttl\": \"2s\"}",
                "replication.lease_ttl must be a whole number");
  /* etcd */
  section_fails("{\"etcd\": 2379}", "cluster spec /tmp/c.json: replication.etcd must be "
                                    "a string \"HOST:PORT[,HOST:PORT...]\"");
  section_fails("{\"etcd\": [\"a:1\"]}", "replication.etcd must be a string");
  section_fails("{\"etcd\": \"a:1\\u0000\"}", "replication.etcd must be a string");
  section_fails("{\"etcd\": \"\"}", "cluster spec /tmp/c.json: replication.etcd: no etcd "
                                    "endpoint given (HOST:PORT[,HOST:PORT...])");
  section_fails("{\"etcd\": \"a:1,,b:2\"}",
                "cluster spec /tmp/c.json: replication.etcd \"a:1,,b:2\" has an empty "
                "endpoint (HOST:PORT[,HOST:PORT...])");
  section_fails("{\"etcd\": \"a:1,\"}",
                "replication.etcd \"a:1,\" has an empty endpoint");
  section_fails(
      "{\"etcd\": \"http://a:2379\"}",
      "cluster spec /tmp/c.json: replication.etcd: endpoint \"http://a:2379\" is "
      "not HOST:PORT");
  section_fails("{\"etcd\": \"a:1, b:2\"}",
                "replication.etcd: endpoint \" b:2\" is not HOST:PORT");
  section_fails("{\"etcd\": \"a\"}", "replication.etcd: endpoint \"a\" is not HOST:PORT");
  section_fails("{\"etcd\": \"a:0\"}",
                "cluster spec /tmp/c.json: replication.etcd: endpoint \"a:0\" has a bad "
                "port (must be a number from 1 to 65535)");
  section_fails("{\"etcd\": \"a:1,b:65536\"}",
                "replication.etcd: endpoint \"b:65536\" has a bad port");
  {
    char many[512] = "", sec[600];
    size_t o = 0;
    for (int i = 0; i < 17; i++)
      o += (size_t)snprintf(many + o, sizeof many - o, "%sh%d:1", i ? "," : "", i);
    snprintf(sec, sizeof sec, "{\"etcd\": \"%s\"}", many);
    section_fails(sec, "cluster spec /tmp/c.json: replication.etcd lists more than 16 "
                       "etcd endpoints");
    char longer[1100], sec2[1200];
    memset(longer, 'h', 1022);
    memcpy(longer + 1022, ":1", 3); /* 1024 characters */
    snprintf(sec2, sizeof sec2, "{\"etcd\": \"%s\"}", longer);
    section_fails(sec2, "cluster spec /tmp/c.json: replication.etcd is too long (1024 "
                        "characters, max 1023)");
  }
  /* job */
  section_fails("{\"job\": 7}", "cluster spec /tmp/c.json: replication.job must be a "
                                "string");
  section_fails("{\"job\": \"\"}", "cluster spec /tmp/c.json: replication.job \"\" must "
                                   "be 1 to 100 characters of A-Z a-z 0-9 _ . -");
  section_fails(
      "{\"job\": \"a/b\"}",
      "replication.job \"a/b\" must be 1 to 100 characters of A-Z a-z 0-9 _ . -");
  section_fails("{\"job\": \"a b\"}", "replication.job \"a b\" must be 1 to 100");
  section_fails("{\"job\": \"\\u00e9t\\u00e9\"}",
                "replication.job \"??t??\" must be 1 to 100");
  {
    char job[120], sec[200];
    memset(job, 'j', 101);
    job[101] = '\0';
    snprintf(sec, sizeof sec, "{\"job\": \"%s\"}", job);
    section_fails(sec, "must be 1 to 100 characters");
  }
  /* the first bad key is named, and nothing leaks on the way out */
  section_fails("{\"replicas\": 2, \"etcd\": \"e:1\", \"job\": \"j\", \"lease_ttl\": 0}",
                "replication.lease_ttl must be");
  /* a spec of a section alone has no jobs */
  ps_status st = {0};
  ck_assert_ptr_null(parse_repl("{\"replication\": {\"replicas\": 2}}", &st));
  snprintf(want, sizeof want, "%stop level has no jobs", pre);
  PS_ASSERT_MSG_HAS(st, want);
}
END_TEST

START_TEST(test_repl_checks) {
  /* the same rules for flags, under the flag's name */
  ps_status st = {0};
  PS_ASSERT_OK(ps_repl_check_etcd("127.0.0.1:2379", "--etcd", &st), st);
  PS_ASSERT_OK(ps_repl_check_etcd("a:1,b:2,[::1]:3", "--etcd", &st), st);
  PS_ASSERT_STATUS(ps_repl_check_etcd("a:1;b:2", "--etcd", &st), st, PS_INVALID_ARGUMENT,
                   "--etcd: endpoint \"a:1;b:2\" is not HOST:PORT");
  PS_ASSERT_STATUS(ps_repl_check_etcd("", "--etcd", &st), st, PS_INVALID_ARGUMENT,
                   "--etcd: no etcd endpoint given");
  PS_ASSERT_OK(ps_repl_check_job("default", "--job", &st), st);
  PS_ASSERT_STATUS(ps_repl_check_job("x*", "--job", &st), st, PS_INVALID_ARGUMENT,
                   "--job \"x*\" must be 1 to 100 characters of A-Z a-z 0-9 _ . -");
}
END_TEST

START_TEST(test_repl_hosts) {
  ps_status st = {0};
  ps_cluster *c =
      parse_repl("{\"ps\": {\"0\": \"h1:2222\", \"1\": \"h1:2223\", \"3\": "
                 "\"[::1]:2222\", \"4\": \"10.0.0.2:1\"}, \"worker\": [\"w:1\"]}",
                 &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  char **hosts = NULL;
  int n = -1;
  PS_ASSERT_OK(ps_repl_hosts_from_cluster(c, &hosts, &n, &st), st);
  ck_assert_int_eq(n, 5);
  ck_assert_str_eq(hosts[0], "h1");
  ck_assert_str_eq(hosts[1], "h1");
  ck_assert_ptr_null(hosts[2]); /* a hole */
  ck_assert_str_eq(hosts[3], "[::1]");
  ck_assert_str_eq(hosts[4], "10.0.0.2");
  /* what the placement makes of them: ps/0's backup is not on h1 */
  int t[2];
  ck_assert_int_eq(ps_view_placement(n, 2, (const char *const *)hosts, 0, t), 2);
  ck_assert_int_eq(t[1], 2);
  ps_repl_hosts_free(hosts, n);
  ps_cluster_destroy(c);
  c = parse_repl("{\"worker\": [\"w:1\"]}", &st);
  PS_ASSERT_OK(ps_repl_hosts_from_cluster(c, &hosts, &n, &st), st);
  ck_assert_int_eq(n, 0);
  ck_assert_ptr_null(hosts);
  ps_repl_hosts_free(hosts, n);
  ps_cluster_destroy(c);
}
END_TEST

void cluster_repl_tests(TCase *tc) {
  tcase_add_test(tc, test_repl_hosts);
  tcase_add_test(tc, test_repl_section);
  tcase_add_test(tc, test_repl_defaults);
  tcase_add_test(tc, test_repl_errors);
  tcase_add_test(tc, test_repl_checks);
}
