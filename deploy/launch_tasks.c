/* ps-launch's tasks: each process started (uv_spawn, in its own
 * session), its output copied line by line with the task's prefix, its
 * exit handled once its pipes are drained, restarts with backoff, and the
 * bring-up (the ps readiness lines, then the effective spec and the
 * workers).  The opening comment of launch.c tells the whole story. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#include "common/log.h"
#include "launch_internal.h"

/* A child's line longer than this is cut into pieces of this size. */
#define LINE_MAX_BYTES (64 * 1024)
/* How long a finished process's pipes may stay open (held by a grandchild)
 * before they are closed and its exit is handled. */
#define DRAIN_MS 500
/* Restart backoff: RESTART_BASE_MS doubled per restart, at most this. */
#define RESTART_BASE_MS 500
#define RESTART_MAX_MS 8000

/* ---- output ------------------------------------------------------------- */

static void linebuf_init(linebuf *lb, const char *taskname, int fd) {
  lb->prefix_len = strlen(taskname) + 2;
  lb->cap = lb->prefix_len + 256;
  lb->buf = ps_launch_xcheck_(malloc(lb->cap));
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
  ps_launch_write_all_(lb->fd, lb->buf, lb->len + 1);
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

/* Starts one process of @t.  On failure logs why and returns -1; the task
 * then has no run. */
int ps_launch_task_spawn_(task *t) {
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

/* ---- task life ---------------------------------------------------------- */

static void on_restart_timer(uv_timer_t *h) {
  task *t = h->data;
  launcher *L = t->L;
  t->restart_pending = 0;
  if (L->stopping) {
    ps_launch_maybe_finish_(L);
    return;
  }
  if (ps_launch_task_spawn_(t) != 0) {
    if (!t->is_ps && !L->sync) {
      PS_WARN("%s could not be restarted: training goes on without it", t->name);
      ps_launch_maybe_finish_(L);
      return;
    }
    PS_ERROR("%s could not be restarted: stopping every task", t->name);
    ps_launch_fail_(L);
  }
}

static void task_ended(task *t, run *r) {
  launcher *L = t->L;
  char how[128];
  ps_launch_describe_(how, sizeof how, r->status, r->signum);
  if (t->is_ps && r->signum == 0 && r->status == 75)
    snprintf(how, sizeof how, "was fenced (exit 75)"); /* replicated: see below */
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
    ps_launch_maybe_finish_(L);
    return;
  }
  if (t->is_chief) {
    PS_INFO("chief %s %s: stopping the other tasks", t->name, how);
    ps_launch_set_exit_(L, r->signum ? 128 + r->signum : (int)(r->status & 0xff));
    ps_launch_begin_stop_(L);
    return;
  }
  if (t->is_ps && !r->ready && !failed) {
    PS_ERROR("%s %s before it was ready: stopping every task", t->name, how);
    ps_launch_fail_(L);
    return;
  }
  if (!failed) {
    if (t->is_ps)
      PS_WARN("%s %s; it is not restarted", t->name, how);
    else
      PS_INFO("%s %s", t->name, how);
    ps_launch_maybe_finish_(L);
    return;
  }
  int may_restart = t->is_ps ? L->restart : L->restart_workers;
  if (may_restart && t->restarts < L->max_restarts) {
    t->restarts++;
    int shift = t->restarts - 1 < 5 ? t->restarts - 1 : 5;
    uint64_t ms = (uint64_t)RESTART_BASE_MS << shift;
    if (ms > RESTART_MAX_MS) ms = RESTART_MAX_MS;
    if (t->is_ps && L->replicated && t->addr && L->eff_path)
      PS_WARN("%s %s: restarting it on %s in %.1f s to rejoin as a backup (restart %d "
              "of %d)",
              t->name, how, t->addr, (double)ms / 1000.0, t->restarts, L->max_restarts);
    else if (t->addr && L->eff_path)
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
    ps_launch_maybe_finish_(L);
    return;
  }
  if (!t->is_ps)
    PS_ERROR("%s failed: %s%s: a --sync-workers job cannot go on without it (every "
             "step waits for every worker): stopping every task",
             t->name, how, why);
  else
    PS_ERROR("%s failed: %s%s: stopping every task", t->name, how, why);
  ps_launch_fail_(L);
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
    t->addr = ps_launch_xstrdup_(addr);
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
    t->addr = ps_launch_xstrdup_(addr);
  }
  PS_INFO("%s restarted (restart %d): ready again on %s", t->name, t->restarts, addr);
}

void ps_launch_on_ready_timeout_(uv_timer_t *h) {
  launcher *L = h->data;
  for (int i = 0; i < L->ntasks; i++)
    if (L->tasks[i].is_ps && L->tasks[i].addr == NULL)
      PS_ERROR("%s is not ready after %d s", L->tasks[i].name, L->ready_secs);
  ps_launch_fail_(L);
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
      ps_launch_fail_(L);
      return;
    }
    changed = 1;
  }
  if (changed || L->write_cluster) {
    char *path;
    if (L->write_cluster) {
      path = ps_launch_xstrdup_(L->write_cluster);
    } else {
      if (ps_launch_tmpdir_get_(L) != 0) {
        ps_launch_fail_(L);
        return;
      }
      path = ps_launch_path_join_(L->tmpdir, "cluster.json");
    }
    if (ps_cluster_write_file(L->spec, path, &st) != 0) {
      PS_ERROR("%s", st.msg);
      free(path);
      ps_launch_fail_(L);
      return;
    }
    L->eff_path = path;
  } else {
    L->eff_path = ps_launch_xstrdup_(L->spec_path);
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
    if (ps_launch_task_spawn_(t) != 0) {
      PS_ERROR("%s could not start: stopping every task", t->name);
      ps_launch_fail_(L);
    }
  }
}
