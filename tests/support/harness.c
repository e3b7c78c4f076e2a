/* Test harness: real ps-server processes on 127.0.0.1:0. */
#include "harness.h"

#include "common/rpc.h"
#include "paramserver/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *harness_prog(const char *env, const char *fallback) {
  const char *p = getenv(env);
  return p && *p ? p : fallback;
}

static int read_line(int fd, char *buf, size_t n, int timeout_ms) {
  size_t k = 0;
  while (k + 1 < n) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, timeout_ms);
    if (r <= 0) return -1;
    char ch;
    ssize_t got = read(fd, &ch, 1);
    if (got <= 0) return -1;
    if (ch == '\n') break;
    buf[k++] = ch;
  }
  buf[k] = '\0';
  return 0;
}

/* The guardian: sh reading "p PID STARTTIME" lines, then "d" (disarm) or
 * EOF (the test process is gone).  On EOF it SIGKILLs each recorded child
 * still alive with the same start time (a pid may have been reused), waits
 * for them to go, and removes the scratch directory.  It is exec'd at once
 * after fork: the test process has gRPC threads, so the child of fork may
 * only call async-signal-safe functions. */
static const char guardian_script[] =
    "trap '' INT TERM HUP PIPE\n"
    "pids=''\n"
    "while read -r kind a b; do\n"
    "  case $kind in p) pids=\"$pids $a:$b\";; d) exit 0;; esac\n"
    "done\n"
    "alive() { [ \"$(cut -d' ' -f22 /proc/$1/stat 2>/dev/null)\" = \"$2\" ]; }\n"
    "for x in $pids; do alive ${x%%:*} ${x#*:} && kill -KILL ${x%%:*} 2>/dev/null; done\n"
    "i=0\n"
    "for x in $pids; do\n"
    "  while alive ${x%%:*} ${x#*:} && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
    "done\n"
    "rm -rf \"$1\" 2>/dev/null || { sleep 0.2; rm -rf \"$1\"; }\n";

static int start_guardian(ps_harness *h) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    perror("harness: pipe");
    return -1;
  }
  const char *argv[] = {"/bin/sh", "-c", guardian_script, "ps-harness-guardian",
                        h->dir,    NULL};
  pid_t pid = fork();
  if (pid < 0) {
    perror("harness: fork");
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    setsid(); /* out of the test's process group: survives its killpg */
    dup2(p[0], 0);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    close_range(3, ~0u, 0); /* hold none of the test's sockets or pipes */
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(p[0]);
  h->guardian = pid;
  h->guard_fd = p[1];
  return 0;
}

/* Field 22 of /proc/PID/stat (start time in clock ticks), or 0. */
static unsigned long long start_time(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *q = strrchr(buf, ')'); /* comm may hold spaces */
  if (q == NULL) return 0;
  unsigned long long v = 0;
  /* after ") ": field 3 (state) ... field 22 */
  if (sscanf(q + 2,
             "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
             "%*d %*d %llu",
             &v) != 1)
    return 0;
  return v;
}

static void guard_tell(ps_harness *h, const char *line) {
  if (h->guard_fd < 0) return;
  size_t n = strlen(line);
  if (write(h->guard_fd, line, n) != (ssize_t)n)
    fprintf(stderr, "harness: cannot tell the guardian '%s'\n", line);
}

static void stop_guardian(ps_harness *h) {
  if (h->guardian <= 0) return; /* never started (a zeroed struct too) */
  if (h->guard_fd >= 0) {
    guard_tell(h, "d\n");
    close(h->guard_fd);
    h->guard_fd = -1;
  }
  if (h->guardian > 0) {
    waitpid(h->guardian, NULL, 0);
    h->guardian = 0;
  }
}

/* The environment of a child: the test's, plus @add ("NAME=VALUE", may be
 * NULL).  Built before fork (the child of a threaded process may not
 * allocate).  NULL after printing why. */
static char **child_env(const char *add) {
  extern char **environ;
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 2, sizeof *env);
  if (env == NULL) {
    perror("harness: calloc");
    return NULL;
  }
  size_t k = 0;
  if (add) env[k++] = (char *)add; /* first: it wins over the test's */
  for (size_t i = 0; i < n; i++)
    env[k++] = environ[i];
  env[k] = NULL;
  return env;
}

static pid_t spawn(ps_harness *h, const char *const *argv, int *stdout_fd,
                   const harness_opts *o) {
  int p[2] = {-1, -1};
  int err = -1;
  char **env = NULL;
  if (o && o->env && (env = child_env(o->env)) == NULL) return -1;
  if (o && o->stderr_path) {
    err = open(o->stderr_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (err < 0) {
      fprintf(stderr, "harness: cannot open %s: %s\n", o->stderr_path, strerror(errno));
      free(env);
      return -1;
    }
  }
  if (stdout_fd && pipe2(p, O_CLOEXEC) != 0) {
    perror("harness: pipe");
    if (err >= 0) close(err);
    free(env);
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    perror("harness: fork");
    if (stdout_fd) {
      close(p[0]);
      close(p[1]);
    }
    if (err >= 0) close(err);
    free(env);
    return -1;
  }
  if (pid == 0) {
    /* Dies with the thread that forked it.  If that thread is already gone
     * (a race before prctl), the parent changed: give up at once. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
    if (o && o->nofile != 0) {
      struct rlimit rl;
      if (getrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
      rl.rlim_cur = (rlim_t)(o->nofile > 0 ? o->nofile : -o->nofile);
      if (o->nofile > 0) rl.rlim_max = rl.rlim_cur;
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    }
    if (stdout_fd) dup2(p[1], 1); /* dup2 clears O_CLOEXEC on fd 1 */
    if (err >= 0) dup2(err, 2);
    if (env)
      execve(argv[0], (char *const *)argv, env);
    else
      execv(argv[0], (char *const *)argv);
    static const char msg[] = "harness: exec failed\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
    _exit(127);
  }
  if (err >= 0) close(err);
  free(env);
  if (stdout_fd) {
    close(p[1]);
    *stdout_fd = p[0];
  }
  char line[96];
  snprintf(line, sizeof line, "p %d %llu\n", (int)pid, start_time(pid));
  guard_tell(h, line);
  return pid;
}

pid_t harness_spawn(ps_harness *h, const char *const *argv, int *stdout_fd) {
  return spawn(h, argv, stdout_fd, NULL);
}

static int write_spec(const char *path, int nps, char (*addrs)[64]) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "harness: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  fprintf(f, "{\"ps\": [");
  for (int i = 0; i < nps; i++)
    fprintf(f, "%s\"%s\"", i ? ", " : "", addrs ? addrs[i] : "127.0.0.1:0");
  fprintf(f, "], \"worker\": [\"127.0.0.1:0\"]}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "harness: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

int harness_start(ps_harness *h, int nps, const char *const *extra) {
  return harness_start_opts(h, nps, extra, NULL);
}

static int free_port(void);

int harness_start_opts(ps_harness *h, int nps, const char *const *extra,
                       const harness_opts *o) {
  memset(h, 0, sizeof *h);
  h->guard_fd = -1;
  if (nps < 1 || nps > HARNESS_MAX_PS) {
    fprintf(stderr, "harness: %d ps tasks (1 to %d)\n", nps, HARNESS_MAX_PS);
    return -1;
  }
  h->nps = nps;
  snprintf(h->dir, sizeof h->dir, "/tmp/ps-test-XXXXXX");
  if (mkdtemp(h->dir) == NULL) {
    perror("mkdtemp");
    h->dir[0] = '\0';
    return -1;
  }
  if (start_guardian(h) != 0) {
    harness_stop(h);
    return -1;
  }
  char boot[300];
  snprintf(boot, sizeof boot, "%s/boot.json", h->dir);
  for (int i = 0; o && o->fixed_ports && i < nps; i++)
    snprintf(h->addrs[i], sizeof h->addrs[i], "127.0.0.1:%d", free_port());
  if (write_spec(boot, nps, o && o->fixed_ports ? h->addrs : NULL) != 0) {
    harness_stop(h);
    return -1;
  }
  if (o && o->stderr_path) {
    int fd = open(o->stderr_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      fprintf(stderr, "harness: cannot create %s: %s\n", o->stderr_path, strerror(errno));
      harness_stop(h);
      return -1;
    }
    close(fd);
  }
  const char *prog = harness_prog("PS_SERVER", "build/ps/ps-server");
  for (int i = 0; i < nps; i++) {
    char task[16];
    snprintf(task, sizeof task, "%d", i);
    const char *argv[32] = {prog, "--cluster", boot, "--job", "ps", "--task", task};
    int argc = 7;
    for (int k = 0; extra && extra[k] && argc < 31; k++)
      argv[argc++] = extra[k];
    argv[argc] = NULL;
    int out;
    pid_t pid = spawn(h, argv, &out, o);
    if (pid < 0) {
      harness_stop(h);
      return -1;
    }
    h->pids[i] = pid;
    char line[256];
    /* Sanitizer builds start slowly on a loaded machine: wait generously. */
    if (read_line(out, line, sizeof line, 60000) != 0) {
      fprintf(stderr, "harness: ps/%d did not report ready\n", i);
      close(out);
      harness_stop(h);
      return -1;
    }
    close(out);
    const char *a = strstr(line, "ready on ");
    if (a == NULL) {
      fprintf(stderr, "harness: unexpected readiness line '%s'\n", line);
      harness_stop(h);
      return -1;
    }
    snprintf(h->addrs[i], sizeof h->addrs[i], "%s", a + 9);
  }
  snprintf(h->spec, sizeof h->spec, "%s/cluster.json", h->dir);
  if (write_spec(h->spec, nps, h->addrs) != 0) {
    harness_stop(h);
    return -1;
  }
  ps_status st;
  h->cluster = ps_cluster_load_file(h->spec, &st);
  if (h->cluster == NULL) {
    fprintf(stderr, "harness: %s\n", st.msg);
    harness_stop(h);
    return -1;
  }
  return 0;
}

void harness_kill(ps_harness *h, int task) {
  if (h->pids[task] > 0) {
    kill(h->pids[task], SIGKILL);
    waitpid(h->pids[task], NULL, 0);
    h->pids[task] = 0;
  }
}

int harness_stop(ps_harness *h) {
  int bad = 0;
  for (int i = 0; i < h->nps; i++)
    if (h->pids[i] > 0) kill(h->pids[i], SIGTERM);
  for (int i = 0; i < h->nps; i++) {
    if (h->pids[i] <= 0) continue;
    int status = 0;
    /* Wait up to 60 s, then kill: a test never leaves a daemon behind. */
    for (int k = 0; k < 6000; k++) {
      pid_t r = waitpid(h->pids[i], &status, WNOHANG);
      if (r == h->pids[i]) break;
      if (k == 5999) {
        kill(h->pids[i], SIGKILL);
        waitpid(h->pids[i], &status, 0);
        fprintf(stderr, "harness: ps/%d did not stop on SIGTERM\n", i);
        bad = 1;
      }
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "harness: ps/%d exited with status 0x%x\n", i, status);
      bad = 1;
    }
    h->pids[i] = 0;
  }
  ps_cluster_destroy(h->cluster);
  h->cluster = NULL;
  if (h->dir[0]) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
    if (system(cmd) != 0) bad = 1;
    h->dir[0] = '\0';
  }
  stop_guardian(h);
  return bad ? -1 : 0;
}

int harness_run(const char *cmd, char **out) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  if (p == NULL) return -1;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 1024) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
  }
  buf[n] = '\0';
  int status = pclose(p);
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

long long harness_rss(pid_t pid, long long *peak) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long long rss = -1;
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmRSS:", 6)) rss = atoll(line + 6) * 1024;
    if (peak && !strncmp(line, "VmHWM:", 6)) *peak = atoll(line + 6) * 1024;
  }
  fclose(f);
  return rss;
}

ps_client *harness_start_client(ps_harness *h, int nps, const char *const *extra) {
  if (harness_start(h, nps, extra) != 0) return NULL;
  ps_rpc_global_init();
  ps_status st;
  ps_client *c = ps_client_create(h->cluster, "ps", NULL, &st);
  if (c == NULL) fprintf(stderr, "harness: %s\n", st.msg);
  return c;
}

int harness_stop_client(ps_harness *h, ps_client *c) {
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  return harness_stop(h);
}

void harness_scratch_base(char *base, size_t n, const char *tag) {
  snprintf(base, n, "/tmp/ps-%s-XXXXXX", tag);
  if (mkdtemp(base) == NULL) abort();
}

int harness_scratch_dir(char *dir, size_t n, const char *base) {
  snprintf(dir, n, "%s/t-XXXXXX", base);
  return mkdtemp(dir) ? 0 : -1;
}

int harness_scratch_remove(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "cannot remove %s\n", path);
  return rc == 0 ? 0 : -1;
}

/* ---- etcd (harness.h) ---- */

/* A port of 127.0.0.1 free at this moment (0 on error). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  int port = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &n) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* GET /health of member @m: 1 if it says {"health":"true"}, else 0. */
static int etcd_healthy(ps_harness_etcd *e, int m) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)e->client_port[m]),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct timeval tv = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char buf[2048];
  size_t k = 0;
  int ok = 0;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    static const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
      ssize_t r;
      while (k + 1 < sizeof buf && (r = read(fd, buf + k, sizeof buf - 1 - k)) > 0)
        k += (size_t)r;
      buf[k] = '\0';
      ok = strstr(buf, "\"health\":\"true\"") != NULL;
    }
  }
  close(fd);
  return ok;
}

static void etcd_log_path(ps_harness_etcd *e, int m, char *p, size_t n) {
  snprintf(p, n, "%s/m%d.log", e->h.dir, m);
}

/* Forks member @m (not waiting for it). */
static int etcd_spawn(ps_harness_etcd *e, int m) {
  char name[16], data[300], curl[64], purl[64], log[300];
  snprintf(name, sizeof name, "m%d", m);
  snprintf(data, sizeof data, "%s/m%d.etcd", e->h.dir, m);
  snprintf(curl, sizeof curl, "http://127.0.0.1:%d", e->client_port[m]);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", e->peer_port[m]);
  etcd_log_path(e, m, log, sizeof log);
  const char *prog = harness_prog("ETCD", "/usr/bin/etcd");
  const char *argv[] = {prog,       "--name",
                        name,       "--data-dir",
                        data,       "--listen-client-urls",
                        curl,       "--advertise-client-urls",
                        curl,       "--listen-peer-urls",
                        purl,       "--initial-advertise-peer-urls",
                        purl,       "--initial-cluster",
                        e->cluster, "--initial-cluster-state",
                        "new",      "--initial-cluster-token",
                        e->h.dir,   "--heartbeat-interval",
                        "10",       "--election-timeout",
                        "100",      "--logger",
                        "zap",      "--log-outputs",
                        "stderr",   "--log-level",
                        "warn",     NULL};
  harness_opts o = {.stderr_path = log};
  pid_t pid = spawn(&e->h, argv, NULL, &o);
  if (pid < 0) return -1;
  e->pids[m] = pid;
  return 0;
}

int ps_harness_etcd_wait_healthy(ps_harness_etcd *e, int m, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (e->pids[m] <= 0 || waitpid(e->pids[m], NULL, WNOHANG) == e->pids[m]) {
      e->pids[m] = 0;
      return -1; /* it exited */
    }
    if (etcd_healthy(e, m)) return 0;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

static void etcd_kill_all(ps_harness_etcd *e) {
  for (int m = 0; m < e->n; m++)
    ps_harness_etcd_kill(e, m);
}

/* 1 if member @m's log says a port was taken. */
static int etcd_port_taken(ps_harness_etcd *e, int m) {
  char log[300], cmd[400];
  etcd_log_path(e, m, log, sizeof log);
  snprintf(cmd, sizeof cmd, "grep -q 'address already in use' '%s'", log);
  return system(cmd) == 0;
}

int ps_harness_etcd_start(ps_harness_etcd *e, int members) {
  memset(e, 0, sizeof *e);
  e->h.guard_fd = -1;
  if (members != 1 && members != HARNESS_ETCD_MAX) {
    fprintf(stderr, "harness: etcd with %d members (1 or 3)\n", members);
    return -1;
  }
  snprintf(e->h.dir, sizeof e->h.dir, "/tmp/ps-etcd-XXXXXX");
  if (mkdtemp(e->h.dir) == NULL) {
    perror("harness: mkdtemp");
    e->h.dir[0] = '\0';
    return -1;
  }
  if (start_guardian(&e->h) != 0) {
    ps_harness_etcd_stop(e);
    return -1;
  }
  e->n = members;
  for (int attempt = 0; attempt < 5; attempt++) {
    size_t off = 0, eoff = 0;
    for (int m = 0; m < members; m++) {
      e->client_port[m] = free_port();
      e->peer_port[m] = free_port();
      snprintf(e->client[m], sizeof e->client[m], "127.0.0.1:%d", e->client_port[m]);
      off +=
          (size_t)snprintf(e->cluster + off, sizeof e->cluster - off,
                           "%sm%d=http://127.0.0.1:%d", m ? "," : "", m, e->peer_port[m]);
      eoff += (size_t)snprintf(e->endpoints + eoff, sizeof e->endpoints - eoff, "%s%s",
                               m ? "," : "", e->client[m]);
    }
    int bad = 0, taken = 0;
    for (int m = 0; m < members && !bad; m++) {
      char data[300];
      snprintf(data, sizeof data, "rm -rf '%s/m%d.etcd' '%s/m%d.log'", e->h.dir, m,
               e->h.dir, m);
      if (system(data) != 0 || etcd_spawn(e, m) != 0) bad = 1;
    }
    for (int m = 0; m < members && !bad; m++)
      if (ps_harness_etcd_wait_healthy(e, m, 30000) != 0) {
        bad = 1;
        for (int k = 0; k < members; k++)
          taken |= etcd_port_taken(e, k);
        if (!taken) {
          char log[300], cmd[400];
          etcd_log_path(e, m, log, sizeof log);
          fprintf(stderr, "harness: etcd member m%d never became healthy (log: %s):\n", m,
                  log);
          snprintf(cmd, sizeof cmd, "tail -n 20 '%s' >&2", log);
          if (system(cmd) != 0) fprintf(stderr, "harness: no log\n");
        }
      }
    if (!bad) return 0;
    etcd_kill_all(e);
    /* a port taken by another process between our probe and etcd's bind:
     * new ports; an unhealthy cluster (its log is above): one more try on
     * new ports, not more */
    if (!taken && attempt >= 1) break;
    fprintf(stderr, "harness: %s; new ports\n",
            taken ? "an etcd port was taken before etcd bound it"
                  : "etcd did not become healthy");
  }
  if (getenv("KEEP_DIR") == NULL) ps_harness_etcd_stop(e);
  return -1;
}

void ps_harness_etcd_kill(ps_harness_etcd *e, int m) {
  if (m < 0 || m >= e->n || e->pids[m] <= 0) return;
  kill(e->pids[m], SIGKILL);
  waitpid(e->pids[m], NULL, 0);
  e->pids[m] = 0;
}

int ps_harness_etcd_restart(ps_harness_etcd *e, int m) {
  if (m < 0 || m >= e->n || e->pids[m] > 0) {
    fprintf(stderr, "harness: etcd member %d is not a stopped member\n", m);
    return -1;
  }
  if (etcd_spawn(e, m) != 0) return -1;
  if (ps_harness_etcd_wait_healthy(e, m, 15000) != 0) {
    fprintf(stderr, "harness: etcd member m%d did not come back healthy\n", m);
    return -1;
  }
  return 0;
}

int ps_harness_etcd_stop(ps_harness_etcd *e) {
  int bad = 0;
  for (int m = 0; m < e->n; m++)
    if (e->pids[m] > 0) kill(e->pids[m], SIGTERM);
  for (int m = 0; m < e->n; m++) {
    if (e->pids[m] <= 0) continue;
    int status = 0;
    for (int k = 0;; k++) {
      if (waitpid(e->pids[m], &status, WNOHANG) == e->pids[m]) break;
      if (k == 1000) { /* 10 s */
        kill(e->pids[m], SIGKILL);
        waitpid(e->pids[m], &status, 0);
        fprintf(stderr, "harness: etcd member m%d did not stop on SIGTERM\n", m);
        bad = 1;
        break;
      }
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    e->pids[m] = 0;
  }
  if (e->h.dir[0]) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->h.dir);
    if (system(cmd) != 0) bad = 1;
    e->h.dir[0] = '\0';
  }
  stop_guardian(&e->h);
  e->n = 0;
  return bad ? -1 : 0;
}
