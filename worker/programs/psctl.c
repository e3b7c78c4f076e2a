/* psctl: look at and control a running cluster from any machine that can
 * reach it.  Needs nothing but the cluster spec. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_flags.h"
#include "common/cluster.h"
#include "common/log.h"
#include "paramserver/checkpoint.h"
#include "paramserver/client.h"
#include "paramserver/embedding.h"
#include "psctl_internal.h"
#include "security_flags.h"

static const char usage[] =
    "usage: psctl --cluster FILE [options] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  status            one line per ps task: address, up/down, variables, bytes;\n"
    "                    replicated: each shard's replicas, roles, lag, view epoch\n"
    "  verify            compare every shard's replicas (Digest): identical or not\n"
    "  vars              every variable: name, dtype, shape, task, initialized\n"
    "  tables            every embedding table on every ps: rows, bytes, policies,\n"
    "                    rows evicted and expired, keys admission refused\n"
    "  read NAME         print the value of variable NAME\n"
    "  rm NAME...        delete variables, their parts and slots, on every ps\n"
    "  save [PREFIX]     save every variable of every ps, as of one moment\n"
    "  restore [PREFIX] [--create] [--only-missing] [--task N]\n"
    "                    restore every variable (default: the latest), all or none;\n"
    "                    fails, changing nothing, if some exist on no ps task\n"
    "  shutdown          stop every ps task as SIGTERM does\n"
    "  latest DIR        print the latest checkpoint of DIR (no cluster needed)\n"
    "  inspect PREFIX [--all]  list a checkpoint's tensors (--all: and values)\n"
    "\n"
    "options:\n"
    "  --cluster FILE    cluster spec JSON (or set TF_CONFIG)\n"
    "  --job NAME        the ps job's name (default ps)\n"
    "  --timeout-ms MS   deadline of each call (default 5000)\n"
    "  --rpc-timeout SECS  fail a call its ps has not answered for SECS\n"
    "                    (default: --timeout-ms)\n"
    "  --limit N         read: print at most N elements (default 1000, 0 = all)\n"
    "  --max-to-keep N   save: checkpoints kept (default 5, -1 = all)\n"
    "  --create          restore: create the variables that exist on no ps task\n"
    "  --only-missing    restore: only the created and uninitialized variables\n"
    "  --task N          restore: only ps task N's variables\n" PS_MAX_MESSAGE_HELP
        PS_REPL_HELP "  --help, --version\n" PS_SECURITY_HELP "\n"
    "exit status: 0 ok; 1 an RPC failed, a task is down, or (verify) replicas\n"
    "differ; 2 usage error\n"
    "See psctl(1) for every command, flag and default.\n";

static void print_value(const ps_tensor *t, int64_t limit) {
  int64_t n = ps_tensor_num_elements(t);
  const void *p = ps_tensor_data(t);
  int rank = t->shape.rank;
  if (rank == 0) {
    printf("%.9g\n", ps_elem_get(t->dtype, p, 0));
    return;
  }
  int64_t printed = 0;
  for (int64_t i = 0; i < n; i++) {
    /* open brackets for every dim whose index is 0 here */
    int64_t stride = 1, opens = 0;
    for (int d = rank - 1; d >= 0; d--) {
      if (i % (stride * t->shape.dim[d]) == 0)
        opens++;
      else
        break;
      stride *= t->shape.dim[d];
    }
    if (opens) {
      if (i) printf("\n%*s", (int)(rank - opens), "");
      for (int64_t k = 0; k < opens; k++)
        putchar('[');
    } else {
      printf(", ");
    }
    if (limit > 0 && printed >= limit) {
      printf("... (%lld more)", (long long)(n - printed));
      for (int k = 0; k < rank; k++)
        putchar(']');
      putchar('\n');
      return;
    }
    double v = ps_elem_get(t->dtype, p, i);
    if (t->dtype == PS_DT_BOOL)
      printf("%s", v != 0 ? "true" : "false");
    else
      printf("%.9g", v);
    printed++;
    stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
      stride *= t->shape.dim[d];
      if ((i + 1) % stride == 0)
        putchar(']');
      else
        break;
    }
  }
  if (n == 0) {
    for (int k = 0; k < rank; k++)
      putchar('[');
    for (int k = 0; k < rank; k++)
      putchar(']');
  }
  putchar('\n');
}

/* restore's --create ('C'), --only-missing ('O') and --task N ('T'). */
static int restore_option(int o, const char *arg, ps_restore_options *r) {
  if (o == 'C') {
    r->create = true;
  } else if (o == 'O') {
    r->only_missing = true;
  } else {
    char *end;
    long v = arg ? strtol(arg, &end, 10) : -1;
    if (arg == NULL || *arg == '\0' || *end != '\0' || v < 0 || v > 1000000) {
      fprintf(stderr, "psctl: --task must be a ps task number (0, 1, ...), got '%s'\n",
              arg ? arg : "");
      return 2;
    }
    if (r->one_task) {
      fprintf(stderr, "psctl: --task given twice (%d and %s): one task only\n", r->task,
              arg);
      return 2;
    }
    r->one_task = true;
    r->task = (int)v;
  }
  return 0;
}

/* Options before the command; -1 to go on, else the exit status. */
static int parse_options(int argc, char **argv, psctl_args *a) {
  static const struct option opts[] = {
      {"cluster", required_argument, NULL, 'c'},
      {"job", required_argument, NULL, 'j'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"rpc-timeout", required_argument, NULL, 'R'},
      {"limit", required_argument, NULL, 'L'},
      {"max-to-keep", required_argument, NULL, 'k'},
      {"all", no_argument, NULL, 'A'},
      {"create", no_argument, NULL, 'C'},
      {"only-missing", no_argument, NULL, 'O'},
      {"task", required_argument, NULL, 'T'},
      {"max-message-bytes", required_argument, NULL, 'M'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      PS_REPL_OPTIONS,
      PS_SECURITY_OPTIONS,
      {NULL, 0, NULL, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    if (ps_security_option(o, optarg, &a->sec)) continue;
    int rr = ps_repl_option("psctl", o, optarg, &a->sec);
    if (rr == 2) return 2;
    if (rr == 1) continue;
    switch (o) {
    case 'c':
      a->cluster_file = optarg;
      break;
    case 'j':
      a->job = optarg;
      break;
    case 't':
      a->timeout_ms = atoll(optarg);
      break;
    case 'R': {
      char *end;
      double v = strtod(optarg, &end);
      if (*optarg == '\0' || *end != '\0' || !(v >= 0.001 && v <= 31536000.0)) {
        fprintf(stderr,
                "psctl: --rpc-timeout must be a number of seconds from 0.001 to "
                "31536000, got '%s'\n",
                optarg);
        return 2;
      }
      a->rpc_timeout_ms = (int64_t)(v * 1000 + 0.5);
      break;
    }
    case 'L':
      a->limit = atoll(optarg);
      break;
    case 'k':
      a->max_to_keep = atoi(optarg);
      break;
    case 'A':
      a->all_values = true;
      break;
    case 'C':
    case 'O':
    case 'T':
      if (restore_option(o, optarg, &a->restore) != 0) return 2;
      break;
    case 'M':
      if (ps_max_message_bytes_option("psctl", optarg, &a->sec.max_message_bytes) != 0)
        return 2;
      break;
    case 'h':
      fputs(usage, stdout);
      return 0;
    case 'V':
      printf("psctl %s\n", PS_VERSION);
      return 0;
    default:
      fputs(usage, stderr);
      return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "psctl: no command given\n%s", usage);
    return 2;
  }
  a->cmd = argv[optind++];
  a->rest = &argv[optind];
  a->nrest = argc - optind;
  return -1;
}

/* latest and inspect: commands on checkpoint files, no cluster needed. */
static int run_offline(psctl_args *a) {
  for (int i = 0; i < a->nrest; i++)
    if (!strcmp(a->rest[i], "--all")) {
      a->all_values = true;
      memmove(&a->rest[i], &a->rest[i + 1], (size_t)(a->nrest - i - 1) * sizeof *a->rest);
      a->nrest--;
      i--;
    }
  if (a->nrest < 1) {
    fprintf(stderr, "psctl: %s needs a %s\n", a->cmd,
            !strcmp(a->cmd, "latest") ? "directory" : "checkpoint prefix");
    return 2;
  }
  ps_status fst;
  ps_status_clear(&fst);
  if (!strcmp(a->cmd, "latest")) {
    char *prefix = NULL;
    if (ps_latest_checkpoint(a->rest[0], &prefix, &fst) != 0) {
      fprintf(stderr, "psctl: latest: %s\n", fst.msg);
      return 1;
    }
    printf("%s\n", prefix);
    free(prefix);
    return 0;
  }
  if (ps_ckpt_inspect(stdout, a->rest[0], a->all_values, &fst) != 0) {
    fprintf(stderr, "psctl: inspect: %s\n", fst.msg);
    return 1;
  }
  return 0;
}

/* "psctl: ps/1: MSG", unless MSG names the task already. */
void psctl_task_error(const psctl_args *a, int task, const ps_status *st) {
  char t[128];
  snprintf(t, sizeof t, "%s/%d ", a->job, task);
  if (strncmp(st->msg, t, strlen(t)) == 0)
    fprintf(stderr, "psctl: %s\n", st->msg);
  else
    fprintf(stderr, "psctl: %s/%d: %s\n", a->job, task, st->msg);
}

static int cmd_status(const psctl_args *a, ps_client *c, ps_status *st) {
  int rc = 0;
  for (int i = 0; i < ps_client_num_ps(c); i++) {
    ps_task_status ts;
    if (ps_client_status(c, i, &ts, st) == 0) {
      printf("%s/%d %s up vars=%lld bytes=%lld uptime=%.0fs rpcs=%lld pid=%lld\n", a->job,
             i, ps_client_address(c, i), (long long)ts.num_vars, (long long)ts.bytes,
             ts.uptime_secs, (long long)ts.rpcs, (long long)ts.pid);
    } else {
      printf("%s/%d %s %s (%s: %s)\n", a->job, i, ps_client_address(c, i),
             ps_client_stalled(st) ? "not answering" : "down",
             ps_status_code_name(st->code), st->msg);
      rc = 1;
    }
  }
  if (ps_client_replicas(c) >= 2 && psctl_status_shards(a, c, st) != 0) rc = 1;
  return rc;
}

/* Every ps task stops, as on SIGTERM; a task that is already down is
 * reported and counts as a failure. */
static int cmd_shutdown(const psctl_args *a, ps_client *c, ps_status *st) {
  int rc = 0;
  for (int i = 0; i < ps_client_num_ps(c); i++) {
    if (ps_client_shutdown(c, i, "psctl shutdown", st) == 0) {
      printf("%s/%d %s shutting down\n", a->job, i, ps_client_address(c, i));
    } else {
      printf("%s/%d %s not shut down (%s: %s)\n", a->job, i, ps_client_address(c, i),
             ps_status_code_name(st->code), st->msg);
      rc = 1;
    }
  }
  return rc;
}

static int cmd_vars(const psctl_args *a, ps_client *c, ps_status *st) {
  int rc = 0;
  printf("%-40s %-10s %-16s %-6s %s\n", "NAME", "DTYPE", "SHAPE", "TASK", "INITIALIZED");
  for (int i = 0; i < ps_client_num_ps(c); i++) {
    ps_var_info *v;
    size_t n;
    if (ps_client_list(c, i, &v, &n, st) != 0) {
      psctl_task_error(a, i, st);
      rc = 1;
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      char sh[256], task[32];
      snprintf(task, sizeof task, "%s/%d", a->job, i);
      printf("%-40s %-10s %-16s %-6s %s\n", v[k].name, ps_dtype_name(v[k].dtype),
             ps_shape_format(&v[k].shape, sh, sizeof sh), task,
             v[k].initialized ? "yes" : "no");
    }
    ps_client_free_var_info(v, n);
  }
  return rc;
}

static int cmd_tables(const psctl_args *a, ps_client *c, ps_status *st) {
  int rc = 0;
  printf("%-32s %-6s %-5s %-8s %12s %14s %10s %10s %10s  %s\n", "TABLE", "TASK", "DIM",
         "SLOTS", "ROWS", "BYTES", "EVICTED", "EXPIRED", "REFUSED", "POLICY");
  for (int i = 0; i < ps_client_num_ps(c); i++) {
    ps_table_info *v;
    size_t n;
    if (ps_client_table_list(c, i, &v, &n, st) != 0) {
      psctl_task_error(a, i, st);
      rc = 1;
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      char task[32];
      snprintf(task, sizeof task, "%s/%d", a->job, i);
      const ps_table_policy *p = &v[k].policy;
      printf("%-32s %-6s %-5lld %-8s %12lld %14lld %10lld %10lld %10lld  min_count=%lld "
             "ttl_steps=%lld ttl_seconds=%lld max_rows=%lld evict=%s\n",
             v[k].name, task, (long long)v[k].dim, v[k].optimizer, (long long)v[k].rows,
             (long long)v[k].bytes, (long long)v[k].evicted, (long long)v[k].expired,
             (long long)v[k].refused, (long long)p->min_count, (long long)p->ttl_steps,
             (long long)p->ttl_seconds, (long long)p->max_rows,
             p->evict == PS_TABLE_EVICT_LFU ? "lfu" : "lru");
    }
    ps_client_free_table_info(v, n);
  }
  return rc;
}

static int cmd_save(const psctl_args *a, ps_client *c, ps_status *st) {
  int nps = ps_client_num_ps(c);
  char prefix[1024];
  if (a->nrest > 0) {
    snprintf(prefix, sizeof prefix, "%s", a->rest[0]);
  } else {
    snprintf(prefix, sizeof prefix, "model.ckpt");
    for (int i = 0; i < nps; i++) {
      ps_read r = {.name = "global_step"};
      if (ps_client_read(c, i, &r, 1, st) == 0) {
        /* a scalar, as a global step is; else no step in the name */
        bool scalar = ps_tensor_num_elements(r.out) == 1;
        if (scalar)
          snprintf(prefix, sizeof prefix, "model.ckpt-%lld",
                   (long long)ps_elem_get(r.out->dtype, ps_tensor_data(r.out), 0));
        ps_tensor_destroy(r.out);
        if (scalar) break;
      }
    }
  }
  ps_save_options so = {.max_to_keep = a->max_to_keep};
  char *written = NULL;
  int64_t bytes = 0;
  int rc = 0;
  if (ps_client_save(c, prefix, &so, &written, &bytes, st) != 0) {
    fprintf(stderr, "psctl: save: %s: %s\n", ps_status_code_name(st->code), st->msg);
    rc = 1;
  } else {
    /* replicated: one part per distinct primary */
    int parts = nps;
    if (ps_client_replicas(c) >= 2) {
      bool *seen = calloc((size_t)nps, sizeof *seen);
      parts = 0;
      for (int s = 0; seen && s < nps; s++) {
        ps_shard_replicas r;
        if (ps_client_shard_replicas(c, s, &r, st) == 0 && r.n > 0 && !seen[r.task[0]]) {
          seen[r.task[0]] = true;
          parts++;
        }
      }
      free(seen);
    }
    printf("saved %s (%lld bytes from %d ps)\n", written, (long long)bytes, parts);
  }
  free(written);
  return rc;
}

static int cmd_rm(const psctl_args *a, ps_client *c, ps_status *st) {
  int nps = ps_client_num_ps(c), rc = 0;
  const char *const *names = (const char *const *)a->rest;
  size_t nn = (size_t)a->nrest;
  size_t *misses = calloc(nn, sizeof *misses);
  int ok_tasks = 0;
  for (int i = 0; misses && i < nps; i++) {
    ps_delete_result dr;
    if (ps_client_delete(c, i, names, nn, PS_DELETE_SLOTS | PS_DELETE_MISSING_OK, &dr,
                         st) != 0) {
      fprintf(stderr, "psctl: rm: %s/%d: %s: %s\n", a->job, i,
              ps_status_code_name(st->code), st->msg);
      rc = 1;
      continue;
    }
    ok_tasks++;
    for (size_t k = 0; k < dr.ndeleted; k++)
      printf("deleted %s on %s/%d\n", dr.deleted[k], a->job, i);
    for (size_t k = 0; k < dr.nmissing; k++)
      for (size_t j = 0; j < nn; j++)
        if (!strcmp(dr.missing[k], names[j])) misses[j]++;
    ps_delete_result_free(&dr);
  }
  for (size_t j = 0; misses && ok_tasks > 0 && j < nn; j++)
    if (misses[j] == (size_t)ok_tasks) {
      fprintf(stderr, "psctl: rm: variable %s not found on any %s task%s\n", names[j],
              a->job, ok_tasks < nps ? " that is up" : "");
      rc = 1;
    }
  if (misses == NULL) {
    fprintf(stderr, "psctl: out of memory\n");
    rc = 1;
  }
  free(misses);
  return rc;
}

/* restore [PREFIX] [--create] [--only-missing] [--task N]: the flags
 * may also come before the command. */
static int cmd_restore(const psctl_args *a, ps_client *c, ps_status *st) {
  ps_restore_options o = a->restore;
  const char *prefix = NULL;
  bool options = true; /* until "--": a PREFIX may then start with '-' */
  for (int i = 0; i < a->nrest; i++) {
    const char *s = a->rest[i];
    int rc = 0;
    if (options && !strcmp(s, "--")) {
      options = false;
    } else if (!options) {
      if (prefix != NULL) {
        fprintf(stderr, "psctl: restore: one PREFIX only, got '%s' too\n", s);
        rc = 2;
      }
      prefix = s;
    } else if (!strcmp(s, "--create")) {
      rc = restore_option('C', NULL, &o);
    } else if (!strcmp(s, "--only-missing")) {
      rc = restore_option('O', NULL, &o);
    } else if (!strcmp(s, "--task")) {
      rc = restore_option('T', i + 1 < a->nrest ? a->rest[++i] : NULL, &o);
    } else if (!strncmp(s, "--task=", 7)) {
      rc = restore_option('T', s + 7, &o);
    } else if (s[0] == '-') {
      fprintf(stderr, "psctl: restore: unknown option '%s'\n", s);
      rc = 2;
    } else if (prefix != NULL) {
      fprintf(stderr, "psctl: restore: one PREFIX only, got '%s' too\n", s);
      rc = 2;
    } else {
      prefix = s;
    }
    if (rc != 0) return 2;
  }
  ps_restore_result r;
  if (ps_client_restore_opts(c, prefix, &o, &r, st) != 0) {
    fprintf(stderr, "psctl: restore: %s: %s\n", ps_status_code_name(st->code), st->msg);
    ps_restore_result_fini(&r);
    return 1;
  }
  printf("restored %zu of %zu variables from %s", r.restored, r.total, r.prefix);
  if (r.created) printf("; created %zu that existed on no ps task", r.created);
  if (r.skipped)
    printf("; skipped %zu tensors of dtypes no ps holds (not ps variables)", r.skipped);
  if (o.one_task) printf("; only %s/%d", a->job, o.task);
  if (o.only_missing) printf("; only the missing ones, the others left as they were");
  printf("\n");
  ps_restore_result_fini(&r);
  return 0;
}

static int cmd_read(const psctl_args *a, ps_client *c, ps_status *st) {
  const char *name = a->rest[0];
  int found = -1, down = 0;
  for (int i = 0; i < ps_client_num_ps(c) && found < 0; i++) {
    bool init;
    const char *names[1] = {name};
    int r = ps_client_is_initialized(c, i, names, 1, &init, st);
    if (r == 0) {
      found = i;
    } else if (r != PS_NOT_FOUND) {
      psctl_task_error(a, i, st);
      down++;
    }
  }
  if (found < 0) {
    fprintf(stderr, "psctl: variable %s not found on any %s task%s\n", name, a->job,
            down ? " that is up" : "");
    return 1;
  }
  ps_read r = {.name = name};
  int rc = 0;
  if (ps_client_read(c, found, &r, 1, st) != 0) {
    fprintf(stderr, "psctl: %s: %s\n", ps_status_code_name(st->code), st->msg);
    rc = 1;
  } else {
    char sh[256];
    printf("%s (%s) %s on %s/%d\n", name, ps_dtype_enum_name(r.out->dtype),
           ps_shape_format(&r.out->shape, sh, sizeof sh), a->job, found);
    print_value(r.out, a->limit);
  }
  ps_tensor_destroy(r.out);
  return rc;
}

/* The commands that talk to the cluster. */
static const struct {
  const char *name;
  int (*run)(const psctl_args *a, ps_client *c, ps_status *st);
  const char *needs; /* the error when no argument is given, else NULL */
} commands[] = {
    {"status", cmd_status, NULL},
    {"vars", cmd_vars, NULL},
    {"tables", cmd_tables, NULL},
    {"read", cmd_read, "psctl: read needs a variable name\n"},
    {"save", cmd_save, NULL},
    {"restore", cmd_restore, NULL},
    {"rm", cmd_rm, "psctl: rm needs at least one variable name\n"},
    {"shutdown", cmd_shutdown, NULL},
    {"verify", psctl_verify, NULL},
};

/* The cluster from --cluster or TF_CONFIG; NULL after saying why. */
static ps_cluster *load_cluster(const psctl_args *a, ps_status *st) {
  ps_cluster *cluster;
  if (a->cluster_file) {
    cluster = ps_cluster_load_file(a->cluster_file, st);
  } else {
    ps_task_id self;
    cluster = ps_cluster_resolve(NULL, NULL, 0, &self, st);
  }
  if (cluster == NULL) fprintf(stderr, "psctl: %s\n", st->msg);
  return cluster;
}

int main(int argc, char **argv) {
  psctl_args a = {.job = "ps", .timeout_ms = 5000, .limit = 1000};
  ps_client_options_default(&a.sec);
  int rc = parse_options(argc, argv, &a);
  if (rc >= 0) return rc;
  if (!strcmp(a.cmd, "latest") || !strcmp(a.cmd, "inspect")) return run_offline(&a);
  size_t k = 0;
  while (k < sizeof commands / sizeof commands[0] && strcmp(a.cmd, commands[k].name))
    k++;
  if (k == sizeof commands / sizeof commands[0]) {
    fprintf(stderr, "psctl: unknown command '%s'\n%s", a.cmd, usage);
    return 2;
  }
  if (commands[k].needs && a.nrest < 1) {
    fputs(commands[k].needs, stderr);
    return 2;
  }
  if ((a.restore.create || a.restore.only_missing || a.restore.one_task) &&
      strcmp(a.cmd, "restore") != 0) {
    fprintf(stderr,
            "psctl: --create, --only-missing and --task are options of restore\n");
    return 2;
  }
  ps_log_set_task("psctl");
  ps_status st;
  ps_status_clear(&st);
  ps_cluster *cluster = load_cluster(&a, &st);
  if (cluster == NULL) return 2;
  a.cluster = cluster;
  ps_library_init();
  ps_client_options opt = a.sec; /* the defaults and the security flags */
  ps_security_admin_token(&opt, cluster);
  opt.control_timeout_ms = opt.data_timeout_ms = a.timeout_ms;
  if (!strcmp(a.cmd, "save") || !strcmp(a.cmd, "restore"))
    opt.data_timeout_ms = a.timeout_ms > 600000 ? a.timeout_ms : 600000;
  opt.max_retries = 0;
  /* a ps that does not answer: --rpc-timeout, else PS_RPC_TIMEOUT (the
   * client reads it), else --timeout-ms; a call's own deadline then ends
   * no sooner than a second after it, so the silence is what is reported */
  if (a.rpc_timeout_ms > 0)
    opt.rpc_timeout_ms = a.rpc_timeout_ms;
  else if ((getenv("PS_RPC_TIMEOUT") == NULL || !*getenv("PS_RPC_TIMEOUT")) &&
           a.timeout_ms > 0)
    opt.rpc_timeout_ms = a.timeout_ms;
  if (opt.rpc_timeout_ms > 0) {
    if (opt.control_timeout_ms < opt.rpc_timeout_ms + 1000)
      opt.control_timeout_ms = opt.rpc_timeout_ms + 1000;
    if (opt.data_timeout_ms < opt.rpc_timeout_ms + 1000)
      opt.data_timeout_ms = opt.rpc_timeout_ms + 1000;
  }
  ps_client *c = ps_client_create(cluster, a.job, &opt, &st);
  if (c == NULL) {
    fprintf(stderr, "psctl: %s\n", st.msg);
    rc = 2;
  } else {
    rc = commands[k].run(&a, c, &st);
  }
  ps_client_destroy(c);
  ps_cluster_destroy(cluster);
  ps_library_shutdown();
  return rc;
}
