/* ps-worker's flags: --help's text and the parsing of the command line
 * into the options, with each model's defaults. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_flags.h"
#include "common/log.h"
#include "paramserver/dataset.h"
#include "ps_worker_internal.h"
#include "security_flags.h"

static const char usage[] =
    "usage: ps-worker [--cluster FILE --job worker --task N] [options]\n"
    "       ps-worker --local [options]        (one process, in-memory variables)\n"
    "\n"
    "Trains a built-in model on the ps of a cluster.  The chief (task 0 of the\n"
    "'chief' job, else of 'worker') restores the latest checkpoint or\n"
    "initializes, saves, and prints the test metric; the others join and train.\n"
    "Identity: --cluster/--job/--task, else TF_CONFIG, else Slurm's environment.\n"
    "\n"
    "model and data:\n"
    "  --model NAME          linreg, softmax, mlp, wide_deep, ctr (default mlp)\n"
    "  --data-dir DIR        Fashion-MNIST IDX files\n"
    "                        (default /usr/share/datasets/fashion-mnist)\n"
    "  --hidden N            hidden units: mlp (default 128), ctr (default 16)\n"
    "  --vocab N             ids per field: wide_deep (default 10000), ctr's\n"
    "                        generated log at its end (default 300)\n"
    "  --embedding-parts N   wide_deep table parts (default: one per ps)\n"
    "  --data FILE           ctr: a click log in Criteo's TSV layout (default: a\n"
    "                        generated one, README \"A click-through model\")\n"
    "  --examples N          ctr: examples generated (default 100000; 80% train)\n"
    "  --table-max-rows N    ctr: rows per embedding table and ps (default 0: any)\n"
    "  --table-min-count N   ctr: lookups before a key gets a row (default 0)\n"
    "  --table-ttl-steps N   ctr: rows untouched for N steps go (default 0: never)\n"
    "  --placement NAME      round_robin or greedy (default round_robin)\n"
    "  --import-meta FILE    import the graph from a .meta instead\n"
    "training:\n"
    "  --steps N             train until global_step is N (default per model)\n"
    "  --batch N             examples per step and worker (default 100; ctr 200)\n"
    "  --optimizer NAME      sgd, momentum, adagrad, adam (default per model)\n"
    "  --learning-rate X     (default per model)\n"
    "  --gradient-dtype T    float or bfloat16: the dtype gradients go to the ps\n"
    "                        in (default float; bfloat16 halves their bytes, the\n"
    "                        ps sums in float32; built-in models only)\n"
    "  --seed N              data order and initializers (default 1)\n"
    "  --sync                synchronous training (SyncReplicas)\n"
    "  --replicas-to-aggregate N  gradients per --sync step (default: all)\n"
    "  --log-every N         progress line every N steps (default 100)\n"
    "checkpoints (the chief's):\n"
    "  --checkpoint-dir DIR  this worker's path to the ps checkpoint directory\n"
    "  --save-every-steps N  save every N global steps\n"
    "  --save-every-secs S   save every S seconds\n"
    "  --no-final-save       do not save when training ends\n"
    "  --restore PREFIX      restore this checkpoint instead of the latest\n"
    "  --no-restore          initialize even if a checkpoint exists\n"
    "  --max-to-keep N       checkpoints kept (default 5)\n"
    "other:\n"
    "  --ps-timeout SECS     give up waiting for the ps (default 0: never)\n"
    "  --rpc-timeout SECS    fail when a ps is silent for SECS (default 60)\n"
    "  --poll-spin-us N      poll N us for an answer before sleeping (default\n"
    "                        PS_POLL_SPIN_US, else 1000; 0: never)\n"
    "  --metrics-port N      Prometheus metrics on port N (0: any; default none)\n"
    "  --metrics-bind HOST   serve them on HOST (default: every interface)\n"
    "  --keep-ps             leave the ps running when the job is "
    "done\n" PS_MAX_MESSAGE_HELP
    "replicated ps shards (training goes on across a failover):\n" PS_REPL_HELP
    "  --log-level LEVEL     debug, info, warn, error (default info)\n"
    "  --log-format F        text or json (default text)\n"
    "  --help, --version\n" PS_SECURITY_HELP "\n"
    "Exit status: 0 done, 1 an error, 2 bad arguments, 69 a ps stopped\n"
    "answering, 143 (130) stopped by SIGTERM (SIGINT) before --steps.\n"
    "See ps-worker(1) for every flag and its default.\n";

static int parse_i64(const char *flag, const char *s, int64_t min, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*s == '\0' || *end || errno || v < min) {
    fprintf(stderr, "ps-worker: %s must be an integer >= %lld, got '%s'\n", flag,
            (long long)min, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_f64(const char *flag, const char *s, double min, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (*s == '\0' || *end || !(v >= min) || !isfinite(v)) {
    fprintf(stderr, "ps-worker: %s must be a number >= %g, got '%s'\n", flag, min, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* The option codes, in groups (apply_option). */
enum {
  O_CLUSTER = 1000,
  O_JOB,
  O_TASK,
  O_LOCAL,
  O_MODEL,
  O_DATA,
  O_CTR_DATA,
  O_EXAMPLES,
  O_TABLE_MAX_ROWS,
  O_TABLE_MIN_COUNT,
  O_TABLE_TTL_STEPS,
  O_HIDDEN,
  O_VOCAB,
  O_PARTS,
  O_STEPS,
  O_BATCH,
  O_OPT,
  O_LR,
  O_GRAD_DTYPE,
  O_POLL_SPIN,
  O_SEED,
  O_SYNC,
  O_REPL,
  O_LOG_EVERY,
  O_CKPT,
  O_SAVE_STEPS,
  O_SAVE_SECS,
  O_NO_FINAL,
  O_KEEP_PS,
  O_METRICS_PORT,
  O_METRICS_BIND,
  O_RESTORE,
  O_NO_RESTORE,
  O_KEEP,
  O_PS_TIMEOUT,
  O_RPC_TIMEOUT,
  O_LOG_LEVEL,
  O_LOG_FORMAT,
  O_PLACEMENT,
  O_META,
  O_HELP,
  O_VERSION,
  O_MAX_MESSAGE
};

/* Where the task is: --cluster, --job, --task, --local. */
static int cluster_option(int c, options *o) {
  int64_t v;
  switch (c) {
  case O_CLUSTER:
    o->cluster_file = optarg;
    break;
  case O_JOB:
    o->job = optarg;
    break;
  case O_TASK:
    if (parse_i64("--task", optarg, 0, &v)) return 2;
    o->task = (int)v;
    break;
  case O_LOCAL:
    o->local = true;
    break;
  }
  return 0;
}

/* What is trained and how: --model ... --seed. */
static int model_option(int c, options *o) {
  int64_t v;
  switch (c) {
  case O_MODEL:
    if (!strcmp(optarg, "linreg"))
      o->model = M_LINREG;
    else if (!strcmp(optarg, "softmax"))
      o->model = M_SOFTMAX;
    else if (!strcmp(optarg, "mlp"))
      o->model = M_MLP;
    else if (!strcmp(optarg, "wide_deep") || !strcmp(optarg, "wide-deep"))
      o->model = M_WIDE_DEEP;
    else if (!strcmp(optarg, "ctr"))
      o->model = M_CTR;
    else {
      fprintf(stderr,
              "ps-worker: unknown --model '%s' (linreg, softmax, mlp, wide_deep, ctr)\n",
              optarg);
      return 2;
    }
    break;
  case O_DATA:
    o->data_dir = optarg;
    break;
  case O_CTR_DATA:
    o->ctr_data = optarg;
    break;
  case O_EXAMPLES:
    if (parse_i64("--examples", optarg, 10, &o->examples)) return 2;
    break;
  case O_TABLE_MAX_ROWS:
    if (parse_i64("--table-max-rows", optarg, 0, &o->table_max_rows)) return 2;
    break;
  case O_TABLE_MIN_COUNT:
    if (parse_i64("--table-min-count", optarg, 0, &o->table_min_count)) return 2;
    break;
  case O_TABLE_TTL_STEPS:
    if (parse_i64("--table-ttl-steps", optarg, 0, &o->table_ttl_steps)) return 2;
    break;
  case O_HIDDEN:
    if (parse_i64("--hidden", optarg, 1, &v)) return 2;
    o->hidden = (int)v;
    break;
  case O_VOCAB:
    if (parse_i64("--vocab", optarg, 2, &o->vocab)) return 2;
    break;
  case O_PARTS:
    if (parse_i64("--embedding-parts", optarg, 1, &v)) return 2;
    o->parts = (int)v;
    break;
  case O_STEPS:
    if (parse_i64("--steps", optarg, 0, &o->steps)) return 2;
    break;
  case O_BATCH:
    if (parse_i64("--batch", optarg, 1, &o->batch)) return 2;
    break;
  case O_OPT:
    o->optimizer = optarg;
    break;
  case O_LR:
    if (parse_f64("--learning-rate", optarg, 0, &o->lr)) return 2;
    break;
  case O_GRAD_DTYPE:
    if (strcmp(optarg, "float") && strcmp(optarg, "bfloat16")) {
      fprintf(stderr, "ps-worker: unknown --gradient-dtype '%s' (float, bfloat16)\n",
              optarg);
      return 2;
    }
    o->bf16_gradients = !strcmp(optarg, "bfloat16");
    break;
  case O_POLL_SPIN:
    if (ps_rpc_parse_poll_spin_us(optarg, &v) != 0) {
      fprintf(stderr,
              "ps-worker: --poll-spin-us must be an integer from 0 to %d (microseconds), "
              "got '%s'\n",
              PS_RPC_MAX_POLL_SPIN_US, optarg);
      return 2;
    }
    ps_library_set_poll_spin_us(v);
    break;
  case O_SEED:
    if (parse_i64("--seed", optarg, 0, &v)) return 2;
    o->seed = (uint64_t)v;
    break;
  }
  return 0;
}

/* How the job runs: --sync ... --import-meta. */
static int run_option(int c, options *o) {
  int64_t v;
  double d;
  switch (c) {
  case O_SYNC:
    o->sync = true;
    break;
  case O_REPL:
    if (parse_i64("--replicas-to-aggregate", optarg, 1, &v)) return 2;
    o->replicas = (int)v;
    break;
  case O_LOG_EVERY:
    if (parse_i64("--log-every", optarg, 1, &o->log_every)) return 2;
    break;
  case O_CKPT:
    o->ckpt_dir = optarg;
    break;
  case O_SAVE_STEPS:
    if (parse_i64("--save-every-steps", optarg, 1, &o->save_every_steps)) return 2;
    break;
  case O_SAVE_SECS:
    if (parse_f64("--save-every-secs", optarg, 0.001, &o->save_every_secs)) return 2;
    break;
  case O_NO_FINAL:
    o->final_save = false;
    break;
  case O_KEEP_PS:
    o->keep_ps = true;
    break;
  case O_METRICS_PORT:
    if (parse_i64("--metrics-port", optarg, 0, &v)) return 2;
    if (v > 65535) {
      fprintf(stderr,
              "ps-worker: --metrics-port must be a port number 0..65535, got '%s'\n",
              optarg);
      return 2;
    }
    o->metrics_port = (int)v;
    break;
  case O_METRICS_BIND:
    o->metrics_bind = optarg;
    break;
  case O_RESTORE:
    o->restore = optarg;
    break;
  case O_NO_RESTORE:
    o->no_restore = true;
    break;
  case O_KEEP:
    if (parse_i64("--max-to-keep", optarg, -1, &v)) return 2;
    o->max_to_keep = (int)v;
    break;
  case O_PS_TIMEOUT:
    if (parse_f64("--ps-timeout", optarg, 0, &d)) return 2;
    o->ps_timeout = d;
    break;
  case O_RPC_TIMEOUT:
    if (parse_f64("--rpc-timeout", optarg, 0.001, &d)) return 2;
    if (d > 31536000) {
      fprintf(stderr, "ps-worker: --rpc-timeout must be at most 31536000 s, got '%s'\n",
              optarg);
      return 2;
    }
    o->sec.rpc_timeout_ms = (int64_t)(d * 1000 + 0.5);
    break;
  case O_LOG_LEVEL:
    if (ps_log_level_option("ps-worker", optarg) != 0) return 2;
    break;
  case O_LOG_FORMAT:
    if (ps_log_format_option("ps-worker", optarg) != 0) return 2;
    break;
  case O_META:
    o->meta = optarg;
    break;
  case O_PLACEMENT:
    if (strcmp(optarg, "round_robin") && strcmp(optarg, "greedy")) {
      fprintf(stderr, "ps-worker: unknown --placement '%s' (round_robin, greedy)\n",
              optarg);
      return 2;
    }
    o->greedy = !strcmp(optarg, "greedy");
    break;
  }
  return 0;
}

/* 0, 1 (--help or --version: exit 0) or 2 (a usage error). */
static int apply_option(int c, options *o) {
  if (c >= O_CLUSTER && c < O_MODEL) return cluster_option(c, o);
  if (c >= O_MODEL && c < O_SYNC) return model_option(c, o);
  if (c >= O_SYNC && c < O_HELP) return run_option(c, o);
  if (c == O_HELP) {
    fputs(usage, stdout);
    return 1;
  }
  if (c == O_VERSION) {
    printf("ps-worker %s\n", PS_VERSION);
    return 1;
  }
  fputs(usage, stderr);
  return 2;
}

int ps_worker_parse_args_(int argc, char **argv, options *o) {
  static const struct option opts[] = {
      {"cluster", required_argument, NULL, O_CLUSTER},
      {"job", required_argument, NULL, O_JOB},
      {"task", required_argument, NULL, O_TASK},
      {"local", no_argument, NULL, O_LOCAL},
      {"model", required_argument, NULL, O_MODEL},
      {"data-dir", required_argument, NULL, O_DATA},
      {"hidden", required_argument, NULL, O_HIDDEN},
      {"data", required_argument, NULL, O_CTR_DATA},
      {"examples", required_argument, NULL, O_EXAMPLES},
      {"table-max-rows", required_argument, NULL, O_TABLE_MAX_ROWS},
      {"table-min-count", required_argument, NULL, O_TABLE_MIN_COUNT},
      {"table-ttl-steps", required_argument, NULL, O_TABLE_TTL_STEPS},
      {"vocab", required_argument, NULL, O_VOCAB},
      {"embedding-parts", required_argument, NULL, O_PARTS},
      {"steps", required_argument, NULL, O_STEPS},
      {"batch", required_argument, NULL, O_BATCH},
      {"optimizer", required_argument, NULL, O_OPT},
      {"learning-rate", required_argument, NULL, O_LR},
      {"gradient-dtype", required_argument, NULL, O_GRAD_DTYPE},
      {"poll-spin-us", required_argument, NULL, O_POLL_SPIN},
      {"seed", required_argument, NULL, O_SEED},
      {"sync", no_argument, NULL, O_SYNC},
      {"replicas-to-aggregate", required_argument, NULL, O_REPL},
      {"log-every", required_argument, NULL, O_LOG_EVERY},
      {"checkpoint-dir", required_argument, NULL, O_CKPT},
      {"save-every-steps", required_argument, NULL, O_SAVE_STEPS},
      {"save-every-secs", required_argument, NULL, O_SAVE_SECS},
      {"no-final-save", no_argument, NULL, O_NO_FINAL},
      {"keep-ps", no_argument, NULL, O_KEEP_PS},
      {"metrics-port", required_argument, NULL, O_METRICS_PORT},
      {"metrics-bind", required_argument, NULL, O_METRICS_BIND},
      {"restore", required_argument, NULL, O_RESTORE},
      {"no-restore", no_argument, NULL, O_NO_RESTORE},
      {"max-to-keep", required_argument, NULL, O_KEEP},
      {"ps-timeout", required_argument, NULL, O_PS_TIMEOUT},
      {"rpc-timeout", required_argument, NULL, O_RPC_TIMEOUT},
      {"log-level", required_argument, NULL, O_LOG_LEVEL},
      {"log-format", required_argument, NULL, O_LOG_FORMAT},
      {"placement", required_argument, NULL, O_PLACEMENT},
      {"import-meta", required_argument, NULL, O_META},
      {"help", no_argument, NULL, O_HELP},
      {"version", no_argument, NULL, O_VERSION},
      {"max-message-bytes", required_argument, NULL, O_MAX_MESSAGE},
      PS_REPL_OPTIONS,
      PS_SECURITY_OPTIONS,
      {NULL, 0, NULL, 0}};
  ps_client_options_default(&o->sec);
  o->task = -1;
  o->model = M_MLP;
  o->steps = -1;
  o->batch = -1;
  o->log_every = 100;
  o->hidden = -1;
  o->vocab = -1;
  o->examples = 100000;
  o->seed = 1;
  o->final_save = true;
  o->lr = -1;
  o->max_to_keep = 5;
  o->metrics_port = -1;
  int c, rc;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
    if ((rc = ps_repl_option("ps-worker", c, optarg, &o->sec)) != 0) {
      if (rc == 2) return 2;
    } else if (c == O_MAX_MESSAGE) {
      if ((rc = ps_max_message_bytes_option("ps-worker", optarg,
                                            &o->sec.max_message_bytes)) != 0)
        return rc;
    } else if (!ps_security_option(c, optarg, &o->sec) &&
               (rc = apply_option(c, o)) != 0) {
      return rc;
    }
  if (optind < argc) {
    fprintf(stderr, "ps-worker: unexpected argument '%s'\n%s", argv[optind], usage);
    return 2;
  }
  if (o->bf16_gradients && o->meta) {
    fprintf(stderr, "ps-worker: --gradient-dtype bfloat16 applies to the built-in "
                    "models' optimizers, not to an --import-meta graph (its train op "
                    "is the chief's)\n");
    return 2;
  }
  if ((o->ctr_data || o->table_max_rows || o->table_min_count || o->table_ttl_steps) &&
      o->model != M_CTR) {
    fprintf(stderr, "ps-worker: --data and --table-* apply to --model ctr\n");
    return 2;
  }
  if (o->metrics_bind && o->metrics_port < 0) {
    fprintf(stderr, "ps-worker: --metrics-bind needs --metrics-port\n");
    return 2;
  }
  static const struct {
    int64_t steps;
    const char *opt;
    double lr;
  } defaults[] = {{1000, "sgd", 0.1},
                  {1500, "adam", 0.001},
                  {2000, "adam", 0.001},
                  {2000, "adagrad", 0.1},
                  {4000, "adagrad", 0.05}};
  if (o->steps < 0) o->steps = defaults[o->model].steps;
  if (o->vocab < 0) o->vocab = o->model == M_CTR ? 300 : 10000;
  if (o->batch < 0) o->batch = o->model == M_CTR ? 200 : 100;
  if (o->hidden < 0) o->hidden = o->model == M_CTR ? 16 : 128;
  if (o->optimizer == NULL) o->optimizer = defaults[o->model].opt;
  if (o->lr < 0) o->lr = defaults[o->model].lr;
  return 0;
}
