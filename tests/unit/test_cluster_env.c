/* Unit tests of the cluster spec from the environment (part of the
 * unit_cluster test): TF_CONFIG, and Slurm's variables (job layouts, host
 * lists, ports, heterogeneous steps), with every error by its text. */
#include "test_cluster_internal.h"

/* ---- TF_CONFIG --------------------------------------------------------- */

const char *const tf_ok =
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

void slurm_env(const char *procid, const char *ntasks, const char *nodelist,
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
const char *job_addrs(const ps_cluster *c, const char *job) {
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

/* Adds this file's tests to the suite's test cases. */
void cluster_env_tests(TCase *tc) {
  tcase_add_test(tc, test_tf_config);
  tcase_add_test(tc, test_tf_config_errors);
  tcase_add_test(tc, test_slurm_default_jobs);
  tcase_add_test(tc, test_slurm_jobs_sorted);
  tcase_add_test(tc, test_slurm_hosts_in_slurm_order_and_padded);
  tcase_add_test(tc, test_slurm_layouts_ports_and_node_check);
  tcase_add_test(tc, test_slurm_heterogeneous_step);
  tcase_add_test(tc, test_slurm_gtids_check);
  tcase_add_test(tc, test_slurm_errors);
}
