/* ps-launch's replication set-up (--replicas R): the "replication"
 * section it adds to the cluster spec every task starts with, and the
 * local etcd it starts when no --etcd endpoint is given.
 *
 * The local etcd is Debian's `etcd` binary (or --etcd-bin), one member on
 * 127.0.0.1 with its data under ps-launch's temporary directory.  Its
 * client and peer ports are picked free here (bind port 0, read the port,
 * close): etcd's JSON gateway breaks on port 0 (ETCD_NOTES.md), so etcd
 * gets real numbers, and when another process takes one in between etcd
 * exits with "address already in use" and it is started again on new
 * ports, up to 5 times.  It is ready when GET /health answers
 * {"health":"true"}.  It runs in its own process group with
 * PR_SET_PDEATHSIG, so neither a Ctrl-C on the terminal nor a SIGKILL of
 * ps-launch leaves it behind; ps-launch stops it last, after every task,
 * with SIGTERM (SIGKILL after the grace period), and removes its data. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "launch_internal.h"

#define ETCD_TRIES 5
#define ETCD_POLL_MS 20

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* A port that was free a moment ago on 127.0.0.1, or -1. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &n) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* GET /health on 127.0.0.1:@port: 1 when it says {"health":"true"}. */
static int etcd_healthy(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  char buf[2048];
  size_t got = 0;
  int ok = 0;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) goto out;
  static const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) goto out;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 1000) <= 0) break;
    ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
    if (r <= 0) break;
    got += (size_t)r;
    if (got == sizeof buf - 1) break;
  }
  buf[got] = '\0';
  ok = strstr(buf, "\"health\":\"true\"") != NULL;
out:
  close(fd);
  return ok;
}

/* The last lines of the etcd log to stderr, and whether a port was taken. */
static int log_tail(const char *path, int print) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[1024], keep[5][1024];
  int n = 0, taken = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "address already in use")) taken = 1;
    snprintf(keep[n % 5], sizeof keep[0], "%s", line);
    n++;
  }
  fclose(f);
  for (int i = n > 5 ? n - 5 : 0; print && i < n; i++)
    fprintf(stderr, "ps-launch: etcd: %s", keep[i % 5]);
  return taken;
}

static pid_t etcd_spawn(launcher *L, int cport, int pport, int try) {
  char curl[64], purl[64], cluster[96], token[64], hb[16], el[16];
  snprintf(curl, sizeof curl, "http://127.0.0.1:%d", cport);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pport);
  snprintf(cluster, sizeof cluster, "launch=%s", purl);
  snprintf(token, sizeof token, "ps-launch-%d-%d", (int)getpid(), try);
  snprintf(hb, sizeof hb, "%d", L->etcd_heartbeat_ms);
  snprintf(el, sizeof el, "%d", L->etcd_election_ms);
  char *argv[] = {(char *)L->etcd_bin,
                  "--name",
                  "launch",
                  "--data-dir",
                  L->etcd_data,
                  "--listen-client-urls",
                  curl,
                  "--advertise-client-urls",
                  curl,
                  "--listen-peer-urls",
                  purl,
                  "--initial-advertise-peer-urls",
                  purl,
                  "--initial-cluster",
                  cluster,
                  "--initial-cluster-state",
                  "new",
                  "--initial-cluster-token",
                  token,
                  "--heartbeat-interval",
                  hb,
                  "--election-timeout",
                  el,
                  "--logger",
                  "zap",
                  "--log-outputs",
                  "stderr",
                  "--log-level",
                  "warn",
                  NULL};
  int logfd = open(L->etcd_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (logfd < 0) {
    PS_ERROR("cannot create %s: %s", L->etcd_log, strerror(errno));
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    PS_ERROR("cannot start etcd: fork: %s", strerror(errno));
    close(logfd);
    return -1;
  }
  if (pid == 0) {
    /* own group (a terminal's Ctrl-C reaches only ps-launch), and gone
     * with ps-launch even after a SIGKILL of it */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
    }
    dup2(logfd, 2);
    execvp(argv[0], argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(logfd);
  return pid;
}

/* Reaps etcd if it has exited: 1 (its status in *@how), else 0. */
static int etcd_exited(pid_t pid, char *how, size_t n) {
  int ws;
  if (waitpid(pid, &ws, WNOHANG) != pid) return 0;
  ps_launch_describe_(how, n, WIFEXITED(ws) ? WEXITSTATUS(ws) : 0,
                      WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
  return 1;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
  (void)sb;
  (void)flag;
  (void)f;
  remove(p);
  return 0;
}

/* Starts the local etcd; 0, or 1 after saying why (nothing left running). */
static int etcd_start(launcher *L) {
  if (ps_launch_tmpdir_get_(L) != 0) return 1;
  L->etcd_data = ps_launch_path_join_(L->tmpdir, "etcd.data");
  L->etcd_log = ps_launch_path_join_(L->tmpdir, "etcd.log");
  for (int try = 0; try < ETCD_TRIES; try++) {
    int cport = free_port(), pport = free_port();
    while (pport == cport && pport > 0)
      pport = free_port();
    if (cport < 0 || pport < 0) {
      PS_ERROR("cannot pick ports for etcd: %s", strerror(errno));
      return 1;
    }
    nftw(L->etcd_data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    pid_t pid = etcd_spawn(L, cport, pport, try);
    if (pid < 0) return 1;
    double t0 = now_s(), end = t0 + L->ready_secs;
    char how[128];
    int exited = 0;
    while (now_s() < end) {
      if ((exited = etcd_exited(pid, how, sizeof how))) break;
      if (etcd_healthy(cport)) {
        L->etcd_pid = pid;
        snprintf(L->etcd_endpoint, sizeof L->etcd_endpoint, "127.0.0.1:%d", cport);
        PS_INFO("started etcd (pid %d) on %s (peer port %d, heartbeat %d ms, election "
                "%d ms, data %s): healthy after %.2f s",
                (int)pid, L->etcd_endpoint, pport, L->etcd_heartbeat_ms,
                L->etcd_election_ms, L->etcd_data, now_s() - t0);
        return 0;
      }
      sleep_ms(ETCD_POLL_MS);
    }
    if (!exited) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      PS_ERROR("etcd (%s) was not healthy on 127.0.0.1:%d after %d s (--ready-timeout); "
               "its log:",
               L->etcd_bin, cport, L->ready_secs);
      log_tail(L->etcd_log, 1);
      return 1;
    }
    if (log_tail(L->etcd_log, 0)) {
      PS_WARN("etcd %s: a port was taken before etcd bound it: new ports (try %d of %d)",
              how, try + 2, ETCD_TRIES);
      continue;
    }
    PS_ERROR("etcd (%s) %s before it was healthy; its log:", L->etcd_bin, how);
    log_tail(L->etcd_log, 1);
    return 1;
  }
  PS_ERROR("etcd: no free ports after %d tries", ETCD_TRIES);
  return 1;
}

void ps_launch_etcd_stop_(launcher *L) {
  if (L->etcd_pid > 0) {
    pid_t pid = L->etcd_pid;
    char how[128];
    L->etcd_pid = 0;
    kill(pid, SIGTERM);
    double end = now_s() + L->grace_secs;
    int done = 0;
    while (!(done = etcd_exited(pid, how, sizeof how)) && now_s() < end)
      sleep_ms(ETCD_POLL_MS);
    if (!done) {
      PS_WARN("etcd (pid %d) still running %d s after SIGTERM: sending SIGKILL", (int)pid,
              L->grace_secs);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      snprintf(how, sizeof how, "killed by signal %d", SIGKILL);
    }
    PS_INFO("etcd (pid %d) stopped (%s)", (int)pid, how);
  }
  if (L->etcd_data) nftw(L->etcd_data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (L->etcd_log) unlink(L->etcd_log);
  free(L->etcd_data);
  free(L->etcd_log);
  L->etcd_data = L->etcd_log = NULL;
}

/* The flags into L->spec's replication section (over what it had): main
 * then writes it to boot.json, and every ps and worker reads the section
 * from the spec it starts with (ps-server and ps-worker name their flags
 * differently, and a worker command may be a script). */
static int add_section(launcher *L) {
  ps_cluster_replication *r = L->spec->replication;
  if (r == NULL && (r = L->spec->replication = calloc(1, sizeof *r)) == NULL) goto oom;
  if (L->replicas > 0) r->replicas = L->replicas;
  if (L->lease_ttl > 0) r->lease_ttl_s = L->lease_ttl;
  const char *etcd = L->etcd_opt           ? L->etcd_opt
                     : L->etcd_endpoint[0] ? L->etcd_endpoint
                                           : NULL;
  char **fields[] = {&r->etcd, &r->job};
  const char *vals[] = {etcd, L->repl_job};
  for (int i = 0; i < 2; i++) {
    if (vals[i] == NULL) continue;
    char *v = strdup(vals[i]);
    if (v == NULL) goto oom;
    free(*fields[i]);
    *fields[i] = v;
  }
  free(L->spec_path); /* a --cluster file stays as it is: boot.json instead */
  L->spec_path = NULL;
  return 0;
oom:
  PS_ERROR("out of memory");
  return 1;
}

/* Replicated, every ps must know every other's address from the spec it
 * starts with (a primary dials its backups by it), so a ps on
 * 127.0.0.1:0 gets a port picked here, all picked at once (each socket
 * held until the last is bound, so they differ).  A port taken before
 * its ps binds it makes that ps fail at start: it is restarted as any
 * other. */
static int fix_ps_ports(launcher *L) {
  const ps_cluster_job *job = ps_cluster_find_job(L->spec, "ps");
  if (job == NULL) return 0;
  int n = job->ntasks, rc = 0;
  int *fds = calloc((size_t)n, sizeof *fds);
  if (fds == NULL) {
    PS_ERROR("out of memory");
    return 1;
  }
  for (int i = 0; i < n; i++)
    fds[i] = -1;
  for (int i = 0; i < n && rc == 0; i++) {
    const char *a = job->addrs[i];
    if (a == NULL || strcmp(a, "127.0.0.1:0") != 0) continue;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fds[i], (struct sockaddr *)&sa, &len) != 0) {
      PS_ERROR("cannot pick a port for ps/%d: %s", i, strerror(errno));
      rc = 1;
      break;
    }
    char addr[32];
    ps_status st;
    ps_status_clear(&st);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    if (ps_cluster_set_address(L->spec, "ps", i, addr, &st) != 0) {
      PS_ERROR("%s", st.msg);
      rc = 1;
    }
  }
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  return rc;
}

int ps_launch_replication_setup_(launcher *L) {
  if (L->replicas == 0 && L->etcd_opt == NULL && L->repl_job == NULL && L->lease_ttl == 0)
    return 0;
  ps_status st;
  ps_status_clear(&st);
  if ((L->etcd_opt && ps_repl_check_etcd(L->etcd_opt, "--etcd", &st) != 0) ||
      (L->repl_job && ps_repl_check_job(L->repl_job, "--job", &st) != 0)) {
    fprintf(stderr, "ps-launch: %s\n", st.msg);
    return 2;
  }
  if (L->etcd_election_ms < 5 * L->etcd_heartbeat_ms) {
    fprintf(stderr,
            "ps-launch: --etcd-election-ms (%d) must be at least 5 times "
            "--etcd-heartbeat-ms (%d) (etcd's rule)\n",
            L->etcd_election_ms, L->etcd_heartbeat_ms);
    return 2;
  }
  const ps_cluster_replication *have = ps_cluster_get_replication(L->spec);
  int replicas = L->replicas ? L->replicas : have && have->replicas ? have->replicas : 1;
  if (replicas >= 2) {
    if (!L->restart)
      PS_INFO("replicated (%d replicas per shard): a ps that fails or is fenced is "
              "restarted (at most %d times) and rejoins as a backup",
              replicas, L->max_restarts);
    L->restart = 1;
    L->replicated = 1;
  }
  if (replicas >= 2 && fix_ps_ports(L) != 0) return 1;
  if (replicas >= 2 && L->etcd_opt == NULL && !(have && have->etcd)) {
    if (etcd_start(L) != 0) return 1;
  } else if (replicas >= 2) {
    PS_INFO("replicated (%d replicas per shard) with the etcd at %s", replicas,
            L->etcd_opt ? L->etcd_opt : have->etcd);
  }
  return add_section(L);
}
