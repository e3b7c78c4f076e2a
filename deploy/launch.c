/* ps-launch: starts every task of a cluster on this machine, copies their
 * output with a task prefix, and stops them together.
 *
 * Everything runs on one libuv loop: uv_spawn for the children, a pipe for
 * each child's stdout and stderr, signal handles for SIGINT/SIGTERM/SIGHUP and
 * timers for readiness, grace and restart backoff.  A single thread means
 * no locks, and output lines from different children can never interleave
 * inside a line: each complete line is written with one write(2).
 *
 * Bring-up follows deploy/local-cluster.sh: the ps tasks start first; each
 * prints one readiness line whose last word is its real address, which is
 * how a spec with port 0 ("--ps N", or a spec file that says 127.0.0.1:0)
 * learns the ports the kernel picked.  Once every ps is ready the effective
 * spec is written and the worker command starts once per non-ps task with
 * "--cluster SPEC --job JOB --task I" appended.
 *
 * Each child runs in its own session and process group
 * (UV_PROCESS_DETACHED), so a terminal's Ctrl-C or hang-up reaches only
 * ps-launch, which then stops the tasks in an orderly way, and a SIGTERM to
 * the group reaches what a worker script started too.  The price: a
 * SIGKILL to ps-launch itself leaves its children running.
 * A process's exit is handled only once its pipes are drained (or after a
 * short drain period, in case a grandchild holds them open), so a task's
 * last lines come before the launcher's message about its exit.
 *
 * A ps restarted with --restart keeps its address: it restarts with the
 * effective spec, which names the port it first got.  Only the chief's exit
 * or a ps's failure ends the job: a non-chief worker that fails is logged
 * and asynchronous training goes on without it (--restart-workers starts
 * it again, and it joins the running job), since the chief's end-of-job
 * wait sees it gone.  When every step waits for every worker (synchronous
 * replicas aggregating all of them) the user says so with --sync-workers:
 * then a failed worker stops the job unless it is restarted.  ps-launch
 * does not guess it from the worker command: a wrapper script hides its
 * flags, and --sync with --replicas-to-aggregate below the worker count
 * does not wait for every worker. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#include "common/cluster.h"
#include "common/log.h"
#include "common/status.h"

static const char usage[] =
    "usage: ps-launch --cluster FILE [options] [-- WORKER_CMD [ARGS...]]\n"
    "       ps-launch --ps N [--workers M] [options] [-- WORKER_CMD [ARGS...]]\n"
    "\n"
    "Starts every task of a cluster on this machine and stops them together.\n"
    "Each ps task runs\n"
    "    ps-server --cluster SPEC --job ps --task I [PS_ARGS...]\n"
    "and, once every ps task is ready, each task of every other job (worker,\n"
    "chief, ...) runs\n"
    "    WORKER_CMD [ARGS...] --cluster SPEC --job JOB --task I\n"
    "Every output line of a task is copied to ps-launch's stdout or stderr\n"
    "with the task as prefix (\"ps/0: ...\", \"worker/1: ...\").\n"
    "\n"
    "The chief is chief/0 if the spec has a \"chief\" job, else worker/0.  When\n"
    "it exits, ps-launch stops the other tasks and exits with its status.  A\n"
    "worker that exits 0 is done.  A non-chief worker that fails (non-zero\n"
    "status or killed by a signal) is logged and the others train on without\n"
    "it (asynchronous training), unless --restart-workers restarts it; with\n"
    "--sync-workers (every step waits for every worker) it stops every task\n"
    "instead, unless it can be restarted.  A ps that fails stops every task\n"
    "unless --restart restarts it.  Without WORKER_CMD the ps tasks run until\n"
    "Ctrl-C (the log line \"cluster ready: ... spec PATH\" names the spec to give\n"
    "psctl).  SIGINT, SIGTERM or SIGHUP sends SIGTERM to every task (to its\n"
    "process group), then SIGKILL after --grace-secs; a second signal kills at\n"
    "once.\n"
    "\n"
    "cluster:\n"
    "  --cluster FILE        cluster spec JSON ({\"ps\": [...], \"worker\": [...]});\n"
    "                        a ps address with port 0 gets the port the kernel\n"
    "                        picks, and workers get the completed spec\n"
    "  --ps N                N ps tasks on 127.0.0.1, ports picked by the kernel\n"
    "  --workers M           with --ps: M worker tasks (default 1); workers are\n"
    "                        clients, their addresses are 127.0.0.1:0\n"
    "  --write-cluster PATH  write the effective spec (real ports) to PATH;\n"
    "                        by default a temporary file, removed at exit\n"
    "\n"
    "options:\n"
    "  --ps-server PATH      the ps-server binary (default: the one built or\n"
    "                        installed beside ps-launch, else ps-server on PATH)\n"
    "  --ps-arg ARG          one more argument for every ps-server (repeatable),\n"
    "                        e.g. --ps-arg --checkpoint-dir=/shared/ckpt\n"
    "  --restart             restart a ps task that fails, with the same\n"
    "                        arguments and address, after a short backoff\n"
    "                        (for workers: --restart-workers)\n"
    "  --restart-workers     restart a non-chief worker that fails, with the\n"
    "                        same arguments, after a short backoff; it joins\n"
    "                        the running job again (the chief is not restarted:\n"
    "                        its exit ends the job)\n"
    "  --sync-workers        every step waits for every worker (ps-worker\n"
    "                        --sync aggregating all of them): a non-chief\n"
    "                        worker that fails and is not restarted stops\n"
    "                        every task (by default training goes on)\n"
    "  --max-restarts K      restarts per task (default 3)\n"
    "  --grace-secs S        after SIGTERM, wait S seconds before SIGKILL\n"
    "                        (default 10)\n"
    "  --ready-timeout S     fail if a ps task is not ready after S seconds\n"
    "                        (default 60)\n"
    "  --secure DIR          TLS, client certificates and tokens from DIR, as\n"
    "                        deploy/gen-certs.sh --tokens DIR makes it: every ps\n"
    "                        gets --tls-cert DIR/server.crt --tls-key\n"
    "                        DIR/server.key --tls-client-ca DIR/ca.crt\n"
    "                        --auth-token-file DIR/tokens; the chief runs with\n"
    "                        PS_TLS_CA=DIR/ca.crt, PS_TLS_CERT/PS_TLS_KEY of\n"
    "                        DIR/client-admin.crt/.key and PS_TOKEN_FILE=\n"
    "                        DIR/admin.token, every other task with the worker\n"
    "                        ones (README \"Security\")\n"
    "  --log-level L         debug, info, warn, error (default info; env\n"
    "                        PS_LOG_LEVEL); ps-launch logs to stderr\n"
    "  --help                this text\n"
    "  --version             print the version\n"
    "\n"
    "exit status: the chief's (128+N if signal N killed it), also after other\n"
    "workers failed; 1 if a ps failed, a task could not start, or a worker\n"
    "failed under --sync-workers; 2 for usage errors and bad specs; 128+N after\n"
    "signal N (130 for SIGINT, 143 for SIGTERM).\n";

/* A child's line longer than this is cut into pieces of this size. */
#define LINE_MAX_BYTES (64 * 1024)
/* How long a finished process's pipes may stay open (held by a grandchild)
 * before they are closed and its exit is handled. */
#define DRAIN_MS 500
/* Restart backoff: RESTART_BASE_MS doubled per restart, at most this. */
#define RESTART_BASE_MS 500
#define RESTART_MAX_MS 8000

/* --secure DIR: the files deploy/gen-certs.sh --tokens writes there. */
enum {
  SEC_CA,
  SEC_CERT,
  SEC_KEY,
  SEC_TOKENS,
  SEC_ADMIN_CERT,
  SEC_ADMIN_KEY,
  SEC_ADMIN_TOKEN,
  SEC_WORKER_CERT,
  SEC_WORKER_KEY,
  SEC_WORKER_TOKEN,
  SEC_NFILES
};
static const char *const sec_files[SEC_NFILES] = {
    "ca.crt",      "server.crt",        "server.key",
    "tokens",      "client-admin.crt",  "client-admin.key",
    "admin.token", "client-worker.crt", "client-worker.key",
    "worker.token"};

typedef struct launcher launcher;
typedef struct task task;

/* Text not yet ending in a newline, after the task's prefix. */
typedef struct linebuf {
  char *buf; /* prefix, then pending bytes */
  size_t len, cap, prefix_len;
  int fd; /* where lines go: 1 or 2 */
} linebuf;

/* One process of a task.  Freed when all four of its handles are closed,
 * which may be after the task has moved on to a new run. */
typedef struct run {
  task *t;
  uv_process_t proc;
  uv_pipe_t pipe[2]; /* the child's stdout, stderr */
  uv_timer_t drain;
  linebuf lb[2];
  int open_handles;
  int pipes_open;
  int exited;   /* exit callback seen: the pid is reaped */
  int finished; /* run_finish done */
  int ready;    /* ps: readiness line seen */
  int64_t status;
  int signum;
} run;

struct task {
  launcher *L;
  char job[PS_CLUSTER_MAX_JOB_NAME + 1];
  int index;
  char name[PS_CLUSTER_MAX_JOB_NAME + 16]; /* "ps/0" */
  int is_ps, is_chief;
  run *cur;   /* the running process, NULL if none */
  char *addr; /* ps: address from its first readiness line */
  int restarts;
  int restart_pending;
  uv_timer_t restart_timer;
};

struct launcher {
  uv_loop_t loop;
  uv_signal_t sigint, sigterm, sighup;
  uv_timer_t grace, ready;
  /* options */
  const char *cluster_file, *write_cluster, *ps_server_opt;
  char *ps_server;
  const char **ps_args;
  int nps_args;
  const char *secure_dir;
  char *sec_paths[SEC_NFILES]; /* --secure: DIR/<sec_files[i]> */
  char **cmd;
  int ncmd;
  int restart, restart_workers, max_restarts, grace_secs, ready_secs;
  int sync; /* --sync-workers: a missing worker stalls the job */
  /* cluster */
  ps_cluster *spec;
  char *spec_path; /* what the ps tasks start with */
  char *eff_path;  /* what workers and restarted ps tasks get */
  char *tmpdir;
  task *tasks;
  int ntasks, nps, nready;
  /* state */
  int workers_started, stopping, closing;
  int exit_set, exit_code;
  char readbuf[64 * 1024];
};

/* ---- small helpers ------------------------------------------------------ */

/* Small allocations that cannot fail in practice end the launcher if they
 * do (the children are then left running, as after a SIGKILL). */
static void *xcheck(void *p) {
  if (p == NULL) {
    fputs("ps-launch: out of memory\n", stderr);
    exit(1);
  }
  return p;
}

static char *xstrdup(const char *s) {
  return xcheck(strdup(s));
}

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = xcheck(malloc(n));
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static void describe(char *buf, size_t n, int64_t status, int signum) {
  if (signum)
    snprintf(buf, n, "killed by signal %d (%s)", signum, strsignal(signum));
  else
    snprintf(buf, n, "exited with status %lld", (long long)status);
}

/* Writes all of @p; a reader that went away is ignored (SIGPIPE is). */
static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 1000);
      continue;
    }
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

static int parse_int(const char *flag, const char *s, int min, int max, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || errno || v < min || v > max) {
    fprintf(stderr, "ps-launch: %s must be an integer in %d..%d, got '%s'\n", flag, min,
            max, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static void set_exit(launcher *L, int code) {
  if (L->exit_set) return;
  L->exit_set = 1;
  L->exit_code = code;
}

static int tmpdir_get(launcher *L) {
  if (L->tmpdir) return 0;
  const char *base = getenv("TMPDIR");
  if (base == NULL || *base == '\0') base = "/tmp";
  char *t = path_join(base, "ps-launch-XXXXXX");
  if (mkdtemp(t) == NULL) {
    PS_ERROR("cannot create a temporary directory under %s: %s", base, strerror(errno));
    free(t);
    return -1;
  }
  L->tmpdir = t;
  return 0;
}

/* ---- output ------------------------------------------------------------- */

static void linebuf_init(linebuf *lb, const char *taskname, int fd) {
  lb->prefix_len = strlen(taskname) + 2;
  lb->cap = lb->prefix_len + 256;
  lb->buf = xcheck(malloc(lb->cap));
  snprintf(lb->buf, lb->cap, "%s: ", taskname);
  lb->len = lb->prefix_len;
  lb->fd = fd;
}

static int linebuf_append(linebuf *lb, const char *p, size_t n) {
  if (lb->len + n + 1 > lb->cap) {
    size_t cap = lb->cap;
    while (lb->len + n + 1 > cap)
      cap *= 2;
    char *b = realloc(lb->buf, cap);
    if (b == NULL) return -1;
    lb->buf = b;
    lb->cap = cap;
  }
  memcpy(lb->buf + lb->len, p, n);
  lb->len += n;
  return 0;
}

static void on_ps_line(run *r, const char *line, size_t n);

/* Writes the pending line (prefix + text + newline) and resets it. */
static void linebuf_flush(run *r, linebuf *lb) {
  if (lb == &r->lb[0] && r->t->is_ps)
    on_ps_line(r, lb->buf + lb->prefix_len, lb->len - lb->prefix_len);
  lb->buf[lb->len] = '\n';
  write_all(lb->fd, lb->buf, lb->len + 1);
  lb->len = lb->prefix_len;
}

static void linebuf_feed(run *r, linebuf *lb, const char *p, size_t n) {
  while (n > 0) {
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) : n;
    size_t room = LINE_MAX_BYTES - (lb->len - lb->prefix_len);
    int cut = take > room;
    if (cut) take = room;
    if (linebuf_append(lb, p, take) != 0) {
      PS_WARN("%s: out of memory: output line dropped", r->t->name);
      lb->len = lb->prefix_len;
      return;
    }
    p += take;
    n -= take;
    if (nl && !cut) {
      p++;
      n--;
      linebuf_flush(r, lb);
    } else if (cut) {
      linebuf_flush(r, lb);
    }
  }
}

/* ---- processes ---------------------------------------------------------- */

static void task_ended(task *t, run *r);
static void maybe_finish(launcher *L);
static void on_all_ready(launcher *L);

static void on_run_closed(uv_handle_t *h) {
  run *r = h->data;
  if (--r->open_handles > 0) return;
  free(r->lb[0].buf);
  free(r->lb[1].buf);
  free(r);
}

static void run_close_pipe(run *r, int i) {
  uv_pipe_t *p = &r->pipe[i];
  if (uv_is_closing((uv_handle_t *)p)) return;
  if (r->lb[i].len > r->lb[i].prefix_len) linebuf_flush(r, &r->lb[i]); /* no newline */
  uv_close((uv_handle_t *)p, on_run_closed);
  r->pipes_open--;
}

/* The process is reaped and its output drained: hand it to its task. */
static void run_finish(run *r) {
  if (r->finished) return;
  r->finished = 1;
  run_close_pipe(r, 0);
  run_close_pipe(r, 1);
  uv_close((uv_handle_t *)&r->proc, on_run_closed);
  uv_close((uv_handle_t *)&r->drain, on_run_closed);
  task *t = r->t;
  t->cur = NULL;
  task_ended(t, r);
}

static void on_drain(uv_timer_t *h) {
  run *r = h->data;
  PS_DEBUG("%s: output still open %d ms after exit: closing it", r->t->name, DRAIN_MS);
  run_finish(r);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int signum) {
  run *r = p->data;
  r->exited = 1;
  r->status = status;
  r->signum = signum;
  if (r->pipes_open == 0)
    run_finish(r);
  else
    uv_timer_start(&r->drain, on_drain, DRAIN_MS, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  run *r = h->data;
  launcher *L = r->t->L;
  buf->base = L->readbuf;
  buf->len = sizeof L->readbuf;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  run *r = s->data;
  int i = s == (uv_stream_t *)&r->pipe[0] ? 0 : 1;
  if (n > 0) {
    linebuf_feed(r, &r->lb[i], buf->base, (size_t)n);
    return;
  }
  if (n == 0) return; /* EAGAIN */
  run_close_pipe(r, i);
  if (r->exited && r->pipes_open == 0) run_finish(r);
}

static void log_cmdline(const char *name, int pid, char **argv) {
  char line[1024];
  size_t o = 0;
  for (int i = 0; argv[i] && o + 1 < sizeof line; i++) {
    int w = snprintf(line + o, sizeof line - o, "%s%s", i ? " " : "", argv[i]);
    if (w < 0) break;
    o += (size_t)w;
  }
  PS_INFO("started %s (pid %d): %s", name, pid, line);
}

/* --secure: a worker task's environment, this one's with the client
 * settings of its role (the chief's: admin) in place of any it had. */
static char **secure_env(launcher *L, int chief) {
  static const char *const names[] = {
      "PS_TLS_CA=", "PS_TLS_CERT=", "PS_TLS_KEY=", "PS_TOKEN_FILE="};
  /* the caller's own credentials never reach a task (an operator's admin
   * token in PS_AUTH_TOKEN would otherwise sit in every worker's environ) */
  static const char *const dropped[] = {
      "PS_AUTH_TOKEN=", "PS_AUTH_TOKEN_FILE=", "PS_TLS_SERVER_NAME="};
  const char *vals[4] = {L->sec_paths[SEC_CA],
                         L->sec_paths[chief ? SEC_ADMIN_CERT : SEC_WORKER_CERT],
                         L->sec_paths[chief ? SEC_ADMIN_KEY : SEC_WORKER_KEY],
                         L->sec_paths[chief ? SEC_ADMIN_TOKEN : SEC_WORKER_TOKEN]};
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 5, sizeof *env);
  if (env == NULL) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int ours = 0;
    for (int j = 0; j < 4; j++)
      ours |= !strncmp(environ[i], names[j], strlen(names[j]));
    for (int j = 0; j < 3; j++)
      ours |= !strncmp(environ[i], dropped[j], strlen(dropped[j]));
    if (!ours && (env[k++] = strdup(environ[i])) == NULL) goto oom;
  }
  for (int j = 0; j < 4; j++) {
    size_t len = strlen(names[j]) + strlen(vals[j]) + 1;
    if ((env[k] = malloc(len)) == NULL) goto oom;
    snprintf(env[k++], len, "%s%s", names[j], vals[j]);
  }
  return env;
oom:
  for (size_t i = 0; env[i]; i++)
    free(env[i]);
  free(env);
  return NULL;
}

static void secure_env_free(char **env) {
  for (size_t i = 0; env && env[i]; i++)
    free(env[i]);
  free(env);
}

/* --secure DIR: its files are there (0), else 2 after saying which is not;
 * every ps gets the server side of them. */
static int secure_setup(launcher *L) {
  if (L->secure_dir == NULL) return 0;
  for (int i = 0; i < SEC_NFILES; i++) {
    L->sec_paths[i] = path_join(L->secure_dir, sec_files[i]);
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

/* Starts one process of @t.  On failure logs why and returns -1; the task
 * then has no run. */
static int task_spawn(task *t) {
  launcher *L = t->L;
  const char *spec = L->eff_path ? L->eff_path : L->spec_path;
  char taskarg[16];
  snprintf(taskarg, sizeof taskarg, "%d", t->index);
  int nargs = (t->is_ps ? 1 + L->nps_args : L->ncmd) + 6 + 1;
  char **argv = calloc((size_t)nargs, sizeof *argv);
  run *r = calloc(1, sizeof *r);
  if (argv == NULL || r == NULL) {
    free(argv);
    free(r);
    PS_ERROR("cannot start %s: out of memory", t->name);
    return -1;
  }
  int k = 0;
  if (t->is_ps) {
    argv[k++] = L->ps_server;
  } else {
    for (int i = 0; i < L->ncmd; i++)
      argv[k++] = L->cmd[i];
  }
  argv[k++] = "--cluster";
  argv[k++] = (char *)spec;
  argv[k++] = "--job";
  argv[k++] = t->job;
  argv[k++] = "--task";
  argv[k++] = taskarg;
  if (t->is_ps)
    for (int i = 0; i < L->nps_args; i++)
      argv[k++] = (char *)L->ps_args[i];
  argv[k] = NULL;

  r->t = t;
  linebuf_init(&r->lb[0], t->name, STDOUT_FILENO);
  linebuf_init(&r->lb[1], t->name, STDERR_FILENO);
  uv_pipe_init(&L->loop, &r->pipe[0], 0);
  uv_pipe_init(&L->loop, &r->pipe[1], 0);
  uv_timer_init(&L->loop, &r->drain);
  r->proc.data = r->pipe[0].data = r->pipe[1].data = r->drain.data = r;
  r->open_handles = 4;

  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&r->pipe[0];
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&r->pipe[1];
  uv_process_options_t opt = {0};
  char **env = NULL;
  if (L->secure_dir && !t->is_ps && (env = secure_env(L, t->is_chief)) == NULL) {
    PS_ERROR("cannot start %s: out of memory", t->name);
    free(argv);
    free(r);
    return -1;
  }
  opt.env = env;
  opt.file = argv[0];
  opt.args = argv;
  opt.exit_cb = on_exit_cb;
  opt.flags = UV_PROCESS_DETACHED; /* own session and group: see the top */
  opt.stdio_count = 3;
  opt.stdio = stdio;
  int rc = uv_spawn(&L->loop, &r->proc, &opt);
  secure_env_free(env);
  if (rc != 0) {
    PS_ERROR("cannot start %s: %s: %s", t->name, argv[0], uv_strerror(rc));
    free(argv);
    r->finished = 1;
    uv_close((uv_handle_t *)&r->pipe[0], on_run_closed);
    uv_close((uv_handle_t *)&r->pipe[1], on_run_closed);
    uv_close((uv_handle_t *)&r->drain, on_run_closed);
    uv_close((uv_handle_t *)&r->proc, on_run_closed);
    return -1;
  }
  log_cmdline(t->name, r->proc.pid, argv);
  free(argv);
  r->pipes_open = 2;
  uv_read_start((uv_stream_t *)&r->pipe[0], on_alloc, on_read);
  uv_read_start((uv_stream_t *)&r->pipe[1], on_alloc, on_read);
  t->cur = r;
  return 0;
}

/* Signals the task's process group while its leader is not reaped (after
 * that the group id may belong to someone else). */
static void task_signal(task *t, int signum) {
  run *r = t->cur;
  if (r == NULL || r->exited) return;
  if (kill(-r->proc.pid, signum) != 0) kill(r->proc.pid, signum);
}

/* ---- stopping ----------------------------------------------------------- */

static void on_grace(uv_timer_t *h) {
  launcher *L = h->data;
  for (int i = 0; i < L->ntasks; i++) {
    task *t = &L->tasks[i];
    if (t->cur == NULL || t->cur->exited) continue;
    PS_WARN("%s still running %d s after SIGTERM: sending SIGKILL", t->name,
            L->grace_secs);
    task_signal(t, SIGKILL);
  }
}

/* Stops every task: SIGTERM now, SIGKILL after the grace period. */
static void begin_stop(launcher *L) {
  if (L->stopping) return;
  L->stopping = 1;
  uv_timer_stop(&L->ready);
  int running = 0;
  for (int i = 0; i < L->ntasks; i++) {
    task *t = &L->tasks[i];
    if (t->restart_pending) {
      uv_timer_stop(&t->restart_timer);
      t->restart_pending = 0;
    }
    if (t->cur && !t->cur->exited) {
      task_signal(t, SIGTERM);
      running++;
    }
  }
  if (running) {
    PS_INFO("stopping %d task%s (SIGTERM, SIGKILL after %d s)", running,
            running == 1 ? "" : "s", L->grace_secs);
    uv_timer_start(&L->grace, on_grace, (uint64_t)L->grace_secs * 1000, 0);
  }
  maybe_finish(L);
}

static void fail(launcher *L) {
  set_exit(L, 1);
  begin_stop(L);
}

/* When no task runs or waits for a restart, close the launcher's own
 * handles so that uv_run returns. */
static void maybe_finish(launcher *L) {
  if (L->closing) return;
  for (int i = 0; i < L->ntasks; i++)
    if (L->tasks[i].cur || L->tasks[i].restart_pending) return;
  L->closing = 1;
  uv_close((uv_handle_t *)&L->sigint, NULL);
  uv_close((uv_handle_t *)&L->sigterm, NULL);
  uv_close((uv_handle_t *)&L->sighup, NULL);
  uv_close((uv_handle_t *)&L->grace, NULL);
  uv_close((uv_handle_t *)&L->ready, NULL);
  for (int i = 0; i < L->ntasks; i++)
    uv_close((uv_handle_t *)&L->tasks[i].restart_timer, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  launcher *L = h->data;
  const char *name = signum == SIGINT    ? "SIGINT"
                     : signum == SIGTERM ? "SIGTERM"
                                         : "SIGHUP";
  if (L->stopping) {
    PS_WARN("received %s while stopping: killing every task", name);
    for (int i = 0; i < L->ntasks; i++)
      task_signal(&L->tasks[i], SIGKILL);
    set_exit(L, 128 + signum);
    return;
  }
  PS_INFO("received %s: stopping every task", name);
  set_exit(L, 128 + signum);
  begin_stop(L);
}

/* ---- task life ---------------------------------------------------------- */

static void on_restart_timer(uv_timer_t *h) {
  task *t = h->data;
  launcher *L = t->L;
  t->restart_pending = 0;
  if (L->stopping) {
    maybe_finish(L);
    return;
  }
  if (task_spawn(t) != 0) {
    if (!t->is_ps && !L->sync) {
      PS_WARN("%s could not be restarted: training goes on without it", t->name);
      maybe_finish(L);
      return;
    }
    PS_ERROR("%s could not be restarted: stopping every task", t->name);
    fail(L);
  }
}

static void task_ended(task *t, run *r) {
  launcher *L = t->L;
  char how[128];
  describe(how, sizeof how, r->status, r->signum);
  int failed = r->signum != 0 || r->status != 0;
  if (t->is_ps && t->addr && L->eff_path == NULL) {
    /* Not all ps were ready yet, so no one has its address: a restart may
     * get another port (port 0) and must be ready again before workers
     * start. */
    free(t->addr);
    t->addr = NULL;
    L->nready--;
  }
  if (L->stopping) {
    if (t->is_ps && failed && r->signum != SIGKILL)
      PS_WARN("%s %s while stopping", t->name, how);
    else
      PS_INFO("%s stopped (%s)", t->name, how);
    maybe_finish(L);
    return;
  }
  if (t->is_chief) {
    PS_INFO("chief %s %s: stopping the other tasks", t->name, how);
    set_exit(L, r->signum ? 128 + r->signum : (int)(r->status & 0xff));
    begin_stop(L);
    return;
  }
  if (t->is_ps && !r->ready && !failed) {
    PS_ERROR("%s %s before it was ready: stopping every task", t->name, how);
    fail(L);
    return;
  }
  if (!failed) {
    if (t->is_ps)
      PS_WARN("%s %s; it is not restarted", t->name, how);
    else
      PS_INFO("%s %s", t->name, how);
    maybe_finish(L);
    return;
  }
  int may_restart = t->is_ps ? L->restart : L->restart_workers;
  if (may_restart && t->restarts < L->max_restarts) {
    t->restarts++;
    int shift = t->restarts - 1 < 5 ? t->restarts - 1 : 5;
    uint64_t ms = (uint64_t)RESTART_BASE_MS << shift;
    if (ms > RESTART_MAX_MS) ms = RESTART_MAX_MS;
    if (t->addr && L->eff_path)
      PS_WARN("%s %s: restarting it on %s in %.1f s (restart %d of %d)", t->name, how,
              t->addr, (double)ms / 1000.0, t->restarts, L->max_restarts);
    else
      PS_WARN("%s %s: restarting it in %.1f s (restart %d of %d)", t->name, how,
              (double)ms / 1000.0, t->restarts, L->max_restarts);
    t->restart_pending = 1;
    uv_timer_start(&t->restart_timer, on_restart_timer, ms, 0);
    return;
  }
  const char *why = "";
  if (may_restart)
    why = " (no restarts left)";
  else if (!t->is_ps)
    why = " (--restart-workers restarts it)";
  if (!t->is_ps && !L->sync) {
    /* Asynchronous training does not need it: the others train on, and the
     * chief's end-of-job wait sees that it is gone. */
    PS_WARN("%s failed: %s%s: training goes on without it (--sync-workers stops the job "
            "instead)",
            t->name, how, why);
    maybe_finish(L);
    return;
  }
  if (!t->is_ps)
    PS_ERROR("%s failed: %s%s: a --sync-workers job cannot go on without it (every "
             "step waits for every worker): stopping every task",
             t->name, how, why);
  else
    PS_ERROR("%s failed: %s%s: stopping every task", t->name, how, why);
  fail(L);
}

/* A ps task's stdout line: its first "ps/N ready on HOST:PORT" tells the
 * real address. */
static void on_ps_line(run *r, const char *line, size_t n) {
  task *t = r->t;
  launcher *L = t->L;
  if (r->ready || L->stopping) return;
  static const char marker[] = " ready on ";
  char text[512];
  if (n >= sizeof text) return;
  memcpy(text, line, n);
  text[n] = '\0';
  while (n > 0 && (text[n - 1] == '\r' || text[n - 1] == ' '))
    text[--n] = '\0';
  if (strstr(text, marker) == NULL) return;
  const char *addr = strrchr(text, ' ') + 1;
  if (strchr(addr, ':') == NULL) return;
  r->ready = 1;
  if (t->addr == NULL) {
    t->addr = xstrdup(addr);
    L->nready++;
    if (t->restarts > 0)
      PS_INFO("%s restarted (restart %d): ready on %s", t->name, t->restarts, addr);
    else
      PS_DEBUG("%s ready on %s (%d of %d)", t->name, addr, L->nready, L->nps);
    if (L->nready == L->nps) on_all_ready(L);
    return;
  }
  if (strcmp(t->addr, addr) != 0) {
    if (L->workers_started)
      PS_WARN("%s restarted on %s, not on %s as before", t->name, addr, t->addr);
    free(t->addr);
    t->addr = xstrdup(addr);
  }
  PS_INFO("%s restarted (restart %d): ready again on %s", t->name, t->restarts, addr);
}

static void on_ready_timeout(uv_timer_t *h) {
  launcher *L = h->data;
  for (int i = 0; i < L->ntasks; i++)
    if (L->tasks[i].is_ps && L->tasks[i].addr == NULL)
      PS_ERROR("%s is not ready after %d s", L->tasks[i].name, L->ready_secs);
  fail(L);
}

/* Every ps has told its address: write the effective spec, start workers. */
static void on_all_ready(launcher *L) {
  uv_timer_stop(&L->ready);
  ps_status st;
  ps_status_clear(&st);
  int changed = 0;
  for (int i = 0; i < L->ntasks; i++) {
    task *t = &L->tasks[i];
    if (!t->is_ps) continue;
    const char *a = ps_cluster_address(L->spec, "ps", t->index);
    if (a && strcmp(a, t->addr) == 0) continue;
    if (ps_cluster_set_address(L->spec, "ps", t->index, t->addr, &st) != 0) {
      PS_ERROR("%s", st.msg);
      fail(L);
      return;
    }
    changed = 1;
  }
  if (changed || L->write_cluster) {
    char *path;
    if (L->write_cluster) {
      path = xstrdup(L->write_cluster);
    } else {
      if (tmpdir_get(L) != 0) {
        fail(L);
        return;
      }
      path = path_join(L->tmpdir, "cluster.json");
    }
    if (ps_cluster_write_file(L->spec, path, &st) != 0) {
      PS_ERROR("%s", st.msg);
      free(path);
      fail(L);
      return;
    }
    L->eff_path = path;
  } else {
    L->eff_path = xstrdup(L->spec_path);
  }
  PS_INFO("cluster ready: %d ps task%s, spec %s", L->nps, L->nps == 1 ? "" : "s",
          L->eff_path);
  if (L->ncmd == 0) {
    PS_INFO("no worker command: the ps tasks run until SIGINT or SIGTERM");
    return;
  }
  L->workers_started = 1;
  for (int i = 0; i < L->ntasks && !L->stopping; i++) {
    task *t = &L->tasks[i];
    if (t->is_ps) continue;
    if (task_spawn(t) != 0) {
      PS_ERROR("%s could not start: stopping every task", t->name);
      fail(L);
    }
  }
}

/* ---- set-up ------------------------------------------------------------- */

static int executable_file(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && access(p, X_OK) == 0;
}

static char *search_path(const char *name) {
  const char *path = getenv("PATH");
  if (path == NULL) return NULL;
  char *copy = xstrdup(path), *save = NULL, *found = NULL;
  for (char *d = strtok_r(copy, ":", &save); d && !found;
       d = strtok_r(NULL, ":", &save)) {
    char *p = path_join(*d ? d : ".", name);
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
static char *find_ps_server(const char *opt) {
  if (opt) {
    if (strchr(opt, '/')) return executable_file(opt) ? xstrdup(opt) : NULL;
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
        char *p = path_join(self, rel[i]);
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
static int make_tasks(launcher *L) {
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

static void cleanup_files(launcher *L) {
  if (L->tmpdir == NULL) return;
  static const char *const names[] = {"boot.json", "cluster.json"};
  for (size_t i = 0; i < 2; i++) {
    char *p = path_join(L->tmpdir, names[i]);
    unlink(p);
    free(p);
  }
  rmdir(L->tmpdir);
}

/* Options before the command into @L, *@nps and *@nworkers; -1 to go on,
 * else the exit status (0 for --help and --version, 2 for a usage error). */
static int parse_options(launcher *L, int argc, char **argv, int *nps, int *nworkers) {
  static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
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
      if (parse_int("--ps", optarg, 1, 10000, nps) != 0) return 2;
      break;
    case 'w':
      if (parse_int("--workers", optarg, 0, 10000, nworkers) != 0) return 2;
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
      if (parse_int("--max-restarts", optarg, 0, 1000000, &L->max_restarts) != 0)
        return 2;
      break;
    case 'g':
      if (parse_int("--grace-secs", optarg, 0, 86400, &L->grace_secs) != 0) return 2;
      break;
    case 'R':
      if (parse_int("--ready-timeout", optarg, 1, 86400, &L->ready_secs) != 0) return 2;
      break;
    case 'l':
      if (ps_log_level_option("ps-launch", optarg) != 0) return 2;
      break;
    case 's':
      L->secure_dir = optarg;
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
static int load_spec(launcher *L, int nps, int nworkers) {
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
  L->spec_path = xstrdup(L->cluster_file);
  return 0;
}

/* The event loop: every ps task is started, the workers follow when the
 * ps tasks are ready (on_ready...), until every task has ended.  Returns
 * the launch's exit status. */
static int run_tasks(launcher *L) {
  signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill us; children
                               get default dispositions from uv_spawn */
  if (uv_loop_init(&L->loop) != 0) return 1;
  uv_signal_init(&L->loop, &L->sigint);
  uv_signal_init(&L->loop, &L->sigterm);
  uv_signal_init(&L->loop, &L->sighup);
  uv_timer_init(&L->loop, &L->grace);
  uv_timer_init(&L->loop, &L->ready);
  L->sigint.data = L->sigterm.data = L->sighup.data = L->grace.data = L->ready.data = L;
  if (make_tasks(L) != 0) {
    PS_ERROR("out of memory");
    maybe_finish(L);
    uv_run(&L->loop, UV_RUN_DEFAULT);
    uv_loop_close(&L->loop);
    return 1;
  }
  uv_signal_start(&L->sigint, on_signal, SIGINT);
  uv_signal_start(&L->sigterm, on_signal, SIGTERM);
  /* The children have no terminal (own sessions): a hang-up must stop them
   * through us. */
  uv_signal_start(&L->sighup, on_signal, SIGHUP);
  PS_DEBUG("ps-server: %s", L->ps_server);
  uv_timer_start(&L->ready, on_ready_timeout, (uint64_t)L->ready_secs * 1000, 0);
  for (int i = 0; i < L->ntasks && !L->stopping; i++) {
    if (!L->tasks[i].is_ps) continue;
    if (task_spawn(&L->tasks[i]) != 0) {
      PS_ERROR("%s could not start: stopping every task", L->tasks[i].name);
      fail(L);
    }
  }
  maybe_finish(L);
  uv_run(&L->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&L->loop) != 0) PS_WARN("event loop still busy at exit");
  if (L->exit_code != 0) PS_INFO("exit status %d", L->exit_code);
  return L->exit_code;
}

static void launcher_free(launcher *L) {
  cleanup_files(L);
  for (int i = 0; i < L->ntasks; i++)
    free(L->tasks[i].addr);
  free(L->tasks);
  ps_cluster_destroy(L->spec);
  free(L->ps_server);
  free(L->spec_path);
  free(L->eff_path);
  free(L->tmpdir);
  free(L->ps_args);
  for (int i = 0; i < SEC_NFILES; i++)
    free(L->sec_paths[i]);
}

int main(int argc, char **argv) {
  static launcher launch; /* big read buffer: not on the stack */
  launcher *L = &launch;
  int nps = -1, nworkers = -1, rc;
  L->max_restarts = 3;
  L->grace_secs = 10;
  L->ready_secs = 60;
  ps_log_set_task("launch");
  L->ps_args = calloc((size_t)argc + 8, sizeof *L->ps_args); /* + secure_setup's */
  if (L->ps_args == NULL) return 1;
  if ((rc = parse_options(L, argc, argv, &nps, &nworkers)) >= 0 ||
      (rc = load_spec(L, nps, nworkers)) != 0 || (rc = secure_setup(L)) != 0)
    goto out;
  rc = 2;
  L->ps_server = find_ps_server(L->ps_server_opt);
  if (L->ps_server == NULL) {
    if (L->ps_server_opt)
      fprintf(stderr, "ps-launch: --ps-server %s: not an executable file\n",
              L->ps_server_opt);
    else
      fprintf(stderr, "ps-launch: cannot find ps-server beside ps-launch or on PATH; "
                      "pass --ps-server PATH\n");
    goto out;
  }
  if (L->spec_path == NULL) {
    ps_status st;
    ps_status_clear(&st);
    rc = 1;
    if (tmpdir_get(L) != 0) goto out;
    L->spec_path = path_join(L->tmpdir, "boot.json");
    if (ps_cluster_write_file(L->spec, L->spec_path, &st) != 0) {
      PS_ERROR("%s", st.msg);
      goto out;
    }
  }
  rc = run_tasks(L);
out:
  launcher_free(L);
  return rc;
}
