/* Test harness: real ps-server processes on 127.0.0.1:0. */
#include "harness.h"

#include "common/rpc.h"
#include "paramserver/client.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int harness_start(ps_harness *h, int nps, const char *const *extra) {
  memset(h, 0, sizeof *h);
  h->nps = nps;
  snprintf(h->dir, sizeof h->dir, "/tmp/ps-test-XXXXXX");
  if (mkdtemp(h->dir) == NULL) {
    perror("mkdtemp");
    return -1;
  }
  char boot[300];
  snprintf(boot, sizeof boot, "%s/boot.json", h->dir);
  FILE *f = fopen(boot, "w");
  fprintf(f, "{\"ps\": [");
  for (int i = 0; i < nps; i++) fprintf(f, "%s\"127.0.0.1:0\"", i ? ", " : "");
  fprintf(f, "], \"worker\": [\"127.0.0.1:0\"]}\n");
  fclose(f);
  const char *prog = harness_prog("PS_SERVER", "build/ps/ps-server");
  for (int i = 0; i < nps; i++) {
    int p[2];
    if (pipe(p) != 0) return -1;
    char task[16];
    snprintf(task, sizeof task, "%d", i);
    const char *argv[32] = {prog, "--cluster", boot, "--job", "ps", "--task", task};
    int argc = 7;
    for (int k = 0; extra && extra[k] && argc < 30; k++) argv[argc++] = extra[k];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      close(p[0]);
      close(p[1]);
      execv(prog, (char *const *)argv);
      fprintf(stderr, "exec %s: %s\n", prog, strerror(errno));
      _exit(127);
    }
    close(p[1]);
    h->pids[i] = pid;
    char line[256];
    /* Sanitizer builds start slowly on a loaded machine: wait generously. */
    if (read_line(p[0], line, sizeof line, 60000) != 0) {
      fprintf(stderr, "harness: ps/%d did not report ready\n", i);
      close(p[0]);
      harness_stop(h);
      return -1;
    }
    close(p[0]);
    const char *a = strstr(line, "ready on ");
    if (a == NULL) {
      fprintf(stderr, "harness: unexpected readiness line '%s'\n", line);
      harness_stop(h);
      return -1;
    }
    snprintf(h->addrs[i], sizeof h->addrs[i], "%s", a + 9);
  }
  snprintf(h->spec, sizeof h->spec, "%s/cluster.json", h->dir);
  f = fopen(h->spec, "w");
  fprintf(f, "{\"ps\": [");
  for (int i = 0; i < nps; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", h->addrs[i]);
  fprintf(f, "], \"worker\": [\"127.0.0.1:0\"]}\n");
  fclose(f);
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
