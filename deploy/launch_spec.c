/* ps-launch's set-up: --help's text, the options, the cluster spec (a
 * file, or one generated for --ps N), the tasks it lists, the ps-server
 * program and the --secure files. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "launch_internal.h"

static const char usage[] =
    "usage: ps-launch --cluster FILE [options] [-- WORKER_CMD [ARGS...]]\n"
    "       ps-launch --ps N [--workers M] [options] [-- WORKER_CMD [ARGS...]]\n"
    "\n"
    "Starts every task of a cluster on this machine and stops them together:\n"
    "each ps task as ps-server --cluster SPEC --job ps --task I, then, once all\n"
    "are ready, WORKER_CMD [ARGS...] --cluster SPEC --job JOB --task I for each\n"
    "task of every other job.  Output lines are prefixed by task (\"ps/0: \").\n"
    "The job ends with the chief; without WORKER_CMD, at Ctrl-C.\n"
    "\n"
    "cluster:\n"
    "  --cluster FILE        cluster spec JSON (port 0: the kernel picks one)\n"
    "  --ps N                N ps tasks on 127.0.0.1\n"
    "  --workers M           with --ps: M worker tasks (default 1)\n"
    "  --write-cluster PATH  write the effective spec to PATH (default: a temp file)\n"
    "options:\n"
    "  --ps-server PATH      the ps-server binary (default: the one beside ps-launch)\n"
    "  --ps-arg ARG          one more argument for every ps-server (repeatable)\n"
    "  --restart             restart a ps task that fails\n"
    "  --restart-workers     restart a non-chief worker that fails\n"
    "  --sync-workers        every step waits for every worker (a failure stops all)\n"
    "  --max-restarts K      restarts per task (default 3)\n"
    "  --grace-secs S        SIGKILL S seconds after SIGTERM (default 10)\n"
    "  --ready-timeout S     fail if a ps task is not ready in S s (default 60)\n"
    "  --secure DIR          TLS and tokens from DIR (deploy/gen-certs.sh --tokens)\n"
    "replication (the spec's \"replication\" section every task gets):\n"
    "  --replicas R          copies of each ps shard, 1..3 (2 or 3: --restart is on)\n"
    "  --etcd ENDPOINTS      etcd HOST:PORT[,...] (default: start a local etcd)\n"
    "  --job NAME            the job's etcd keys /paramserver/NAME/ (default "
    "\"default\")\n"
    "  --lease-ttl S         a ps is declared gone S s after it stops (default 2)\n"
    "  --etcd-bin PATH       the local etcd's binary (default: etcd on PATH)\n"
    "  --etcd-heartbeat-ms N local etcd's raft heartbeat (default 10)\n"
    "  --etcd-election-ms N  local etcd's election timeout, >= 5 x heartbeat (default "
    "100)\n"
    "  --log-level L         debug, info, warn, error (default info)\n"
    "  --help                this text\n"
    "  --version             print the version\n"
    "\n"
    "exit status: the chief's; 1 if a ps failed, a task could not start, or a\n"
    "worker failed under --sync-workers; 2 usage; 128+N after signal N.\n"
    "See ps-launch(1) for every flag and its default.\n";

static const char *const sec_files[SEC_NFILES] = {
    "ca.crt",      "server.crt",        "server.key",
    "tokens",      "client-admin.crt",  "client-admin.key",
    "admin.token", "client-worker.crt", "client-worker.key",
    "worker.token"};

/* --secure DIR: its files are there (0), else 2 after saying which is not;
 * every ps gets the server side of them. */
int ps_launch_secure_setup_(launcher *L) {
  if (L->secure_dir == NULL) return 0;
  for (int i = 0; i < SEC_NFILES; i++) {
    L->sec_paths[i] = ps_launch_path_join_(L->secure_dir, sec_files[i]);
    if (access(L->sec_paths[i], R_OK) != 0) {
      fprintf(stderr,
              "ps-launch: --secure %s: %s: %s (deploy/gen-certs.sh --tokens %s makes "
              "it)\n",
              L->secure_dir, L->sec_paths[i], strerror(errno), L->secure_dir);
      return 2;
    }
  }
  static const char *const flags[] = {"--tls-cert", "--tls-key", "--tls-client-ca",
                                      "--auth-token-file"};
  const int files[] = {SEC_CERT, SEC_KEY, SEC_CA, SEC_TOKENS};
  for (int i = 0; i < 4; i++) {
    L->ps_args[L->nps_args++] = flags[i];
    L->ps_args[L->nps_args++] = L->sec_paths[files[i]];
  }
  return 0;
}

static int executable_file(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && access(p, X_OK) == 0;
}

static char *search_path(const char *name) {
  const char *path = getenv("PATH");
  if (path == NULL) return NULL;
  char *copy = ps_launch_xstrdup_(path), *save = NULL, *found = NULL;
  for (char *d = strtok_r(copy, ":", &save); d && !found;
       d = strtok_r(NULL, ":", &save)) {
    char *p = ps_launch_path_join_(*d ? d : ".", name);
    if (executable_file(p))
      found = p;
    else
      free(p);
  }
  free(copy);
  return found;
}

/* --ps-server, else ../ps/ps-server (build tree) or ps-server beside our
 * own executable (installed), else PATH. */
char *ps_launch_find_ps_server_(const char *opt) {
  if (opt) {
    if (strchr(opt, '/')) return executable_file(opt) ? ps_launch_xstrdup_(opt) : NULL;
    return search_path(opt);
  }
  char self[PATH_MAX];
  size_t n = sizeof self;
  if (uv_exepath(self, &n) == 0) {
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      static const char *const rel[] = {"../ps/ps-server", "ps-server"};
      for (size_t i = 0; i < 2; i++) {
        char *p = ps_launch_path_join_(self, rel[i]);
        char *real = executable_file(p) ? realpath(p, NULL) : NULL;
        free(p);
        if (real) return real;
      }
    }
  }
  return search_path("ps-server");
}

/* The --ps N --workers M spec, all on 127.0.0.1 port 0. */
static ps_cluster *generated_spec(int nps, int nworkers, ps_status *st) {
  size_t cap = 64 + (size_t)(nps + nworkers) * 20;
  char *json = malloc(cap);
  if (json == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  size_t o = (size_t)snprintf(json, cap, "{\"ps\": [");
  for (int i = 0; i < nps; i++)
    o += (size_t)snprintf(json + o, cap - o, "%s\"127.0.0.1:0\"", i ? ", " : "");
  o += (size_t)snprintf(json + o, cap - o, "]");
  if (nworkers > 0) {
    o += (size_t)snprintf(json + o, cap - o, ", \"worker\": [");
    for (int i = 0; i < nworkers; i++)
      o += (size_t)snprintf(json + o, cap - o, "%s\"127.0.0.1:0\"", i ? ", " : "");
    o += (size_t)snprintf(json + o, cap - o, "]");
  }
  o += (size_t)snprintf(json + o, cap - o, "}");
  ps_cluster *c = ps_cluster_parse(json, o, "(generated)", st);
  free(json);
  return c;
}

/* One task per address of the spec: ps tasks first, then every other job. */
int ps_launch_make_tasks_(launcher *L) {
  int total = 0;
  for (int j = 0; j < L->spec->njobs; j++)
    total += L->spec->jobs[j].ntasks;
  L->tasks = calloc((size_t)total, sizeof *L->tasks);
  if (L->tasks == NULL) return -1;
  ps_task_id chief;
  int have_chief = ps_cluster_chief(L->spec, &chief) == 0;
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < L->spec->njobs; j++) {
      const ps_cluster_job *job = &L->spec->jobs[j];
      int is_ps = strcmp(job->name, "ps") == 0;
      if (is_ps != (pass == 0)) continue;
      for (int i = 0; i < job->ntasks; i++) {
        if (job->addrs[i] == NULL) continue; /* a hole of a sparse job */
        task *t = &L->tasks[L->ntasks++];
        t->L = L;
        snprintf(t->job, sizeof t->job, "%s", job->name);
        t->index = i;
        snprintf(t->name, sizeof t->name, "%s/%d", job->name, i);
        t->is_ps = is_ps;
        t->is_chief = have_chief && i == chief.task && strcmp(job->name, chief.job) == 0;
        if (is_ps) L->nps++;
        uv_timer_init(&L->loop, &t->restart_timer);
        t->restart_timer.data = t;
      }
    }
  return 0;
}

void ps_launch_cleanup_files_(launcher *L) {
  if (L->tmpdir == NULL) return;
  static const char *const names[] = {"boot.json", "cluster.json"};
  for (size_t i = 0; i < 2; i++) {
    char *p = ps_launch_path_join_(L->tmpdir, names[i]);
    unlink(p);
    free(p);
  }
  rmdir(L->tmpdir);
}

/* Options before the command into @L, *@nps and *@nworkers; -1 to go on,
 * else the exit status (0 for --help and --version, 2 for a usage error). */
int ps_launch_parse_options_(launcher *L, int argc, char **argv, int *nps,
                             int *nworkers) {
  static const struct option opts[] = {
      {"cluster", required_argument, NULL, 'c'},
      {"ps", required_argument, NULL, 'p'},
      {"workers", required_argument, NULL, 'w'},
      {"write-cluster", required_argument, NULL, 'W'},
      {"ps-server", required_argument, NULL, 'S'},
      {"ps-arg", required_argument, NULL, 'a'},
      {"restart", no_argument, NULL, 'r'},
      {"restart-workers", no_argument, NULL, 'T'},
      {"sync-workers", no_argument, NULL, 'Y'},
      {"max-restarts", required_argument, NULL, 'm'},
      {"grace-secs", required_argument, NULL, 'g'},
      {"ready-timeout", required_argument, NULL, 'R'},
      {"log-level", required_argument, NULL, 'l'},
      {"secure", required_argument, NULL, 's'},
      {"replicas", required_argument, NULL, 1000},
      {"etcd", required_argument, NULL, 1001},
      {"job", required_argument, NULL, 1002},
      {"repl-job", required_argument, NULL, 1002},
      {"lease-ttl", required_argument, NULL, 1003},
      {"etcd-bin", required_argument, NULL, 1004},
      {"etcd-heartbeat-ms", required_argument, NULL, 1005},
      {"etcd-election-ms", required_argument, NULL, 1006},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  int o;
  /* "+": options end at the first non-option, which starts the command. */
  while ((o = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (o) {
    case 'c':
      L->cluster_file = optarg;
      break;
    case 'p':
      if (ps_launch_parse_int_("--ps", optarg, 1, 10000, nps) != 0) return 2;
      break;
    case 'w':
      if (ps_launch_parse_int_("--workers", optarg, 0, 10000, nworkers) != 0) return 2;
      break;
    case 'W':
      L->write_cluster = optarg;
      break;
    case 'S':
      L->ps_server_opt = optarg;
      break;
    case 'a':
      L->ps_args[L->nps_args++] = optarg;
      break;
    case 'r':
      L->restart = 1;
      break;
    case 'T':
      L->restart_workers = 1;
      break;
    case 'Y':
      L->sync = 1;
      break;
    case 'm':
      if (ps_launch_parse_int_("--max-restarts", optarg, 0, 1000000, &L->max_restarts) !=
          0)
        return 2;
      break;
    case 'g':
      if (ps_launch_parse_int_("--grace-secs", optarg, 0, 86400, &L->grace_secs) != 0)
        return 2;
      break;
    case 'R':
      if (ps_launch_parse_int_("--ready-timeout", optarg, 1, 86400, &L->ready_secs) != 0)
        return 2;
      break;
    case 'l':
      if (ps_log_level_option("ps-launch", optarg) != 0) return 2;
      break;
    case 's':
      L->secure_dir = optarg;
      break;
    case 1000:
      if (ps_launch_parse_int_("--replicas", optarg, 1, 3, &L->replicas) != 0) return 2;
      break;
    case 1001:
      L->etcd_opt = optarg;
      break;
    case 1002:
      L->repl_job = optarg;
      break;
    case 1003:
      if (ps_launch_parse_int_("--lease-ttl", optarg, 1, 3600, &L->lease_ttl) != 0)
        return 2;
      break;
    case 1004:
      L->etcd_bin = optarg;
      break;
    case 1005:
      if (ps_launch_parse_int_("--etcd-heartbeat-ms", optarg, 1, 10000,
                               &L->etcd_heartbeat_ms) != 0)
        return 2;
      break;
    case 1006:
      if (ps_launch_parse_int_("--etcd-election-ms", optarg, 5, 50000,
                               &L->etcd_election_ms) != 0)
        return 2;
      break;
    case 'h':
      fputs(usage, stdout);
      return 0;
    case 'V':
      printf("ps-launch %s\n", PS_VERSION);
      return 0;
    default:
      fputs(usage, stderr);
      return 2;
    }
  }
  L->cmd = argv + optind;
  L->ncmd = argc - optind;
  return -1;
}

/* The cluster: --cluster FILE checked for what the launch needs, or one
 * generated from --ps and --workers; 0, or 2 after saying why. */
int ps_launch_load_spec_(launcher *L, int nps, int nworkers) {
  if ((L->cluster_file != NULL) == (nps >= 0)) {
    fprintf(stderr, "ps-launch: give either --cluster FILE or --ps N\n%s", usage);
    return 2;
  }
  if (L->cluster_file && nworkers >= 0) {
    fprintf(stderr, "ps-launch: --workers goes with --ps, not with --cluster\n");
    return 2;
  }
  if (nps >= 0 && nworkers < 0) nworkers = 1;
  if (nps >= 0 && nworkers == 0 && L->ncmd > 0) {
    fprintf(stderr, "ps-launch: --workers 0 leaves no task to run %s\n", L->cmd[0]);
    return 2;
  }
  ps_status st;
  ps_status_clear(&st);
  if (L->cluster_file == NULL) {
    if ((L->spec = generated_spec(nps, nworkers, &st)) == NULL) {
      fprintf(stderr, "ps-launch: %s\n", st.msg);
      return 2;
    }
    return 0;
  }
  if ((L->spec = ps_cluster_load_file(L->cluster_file, &st)) == NULL) {
    fprintf(stderr, "ps-launch: %s\n", st.msg);
    return 2;
  }
  if (ps_cluster_find_job(L->spec, "ps") == NULL) {
    fprintf(stderr, "ps-launch: cluster spec %s: no \"ps\" job\n", L->cluster_file);
    return 2;
  }
  if (L->ncmd > 0 && ps_cluster_chief(L->spec, NULL) != 0) {
    fprintf(stderr,
            "ps-launch: cluster spec %s: no \"worker\" or \"chief\" job (task 0) to "
            "run %s\n",
            L->cluster_file, L->cmd[0]);
    return 2;
  }
  L->spec_path = ps_launch_xstrdup_(L->cluster_file);
  return 0;
}
