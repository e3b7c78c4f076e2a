/* ps-server: one ps task.  Parses flags, resolves its address from the
 * cluster spec, serves the Ps service on gRPC threads, and runs a libuv
 * loop for signals: SIGTERM/SIGINT stop accepting calls, let in-flight calls
 * finish (up to --grace-secs, then cancel them and ask running checkpoint
 * jobs to stop at a safe point), wait for every call and checkpoint job,
 * and exit 0. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "ckpt.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/units.h"
#include "common/view.h"
#include "member.h"
#include "metrics.h"
#include "repl.h"
#include "service.h"
#include "store.h"

static const char usage[] =
    "usage: ps-server [--cluster FILE --job NAME --task N] [options]\n"
    "\n"
    "Runs one parameter-server task: it owns the variables placed on it and\n"
    "serves reads, updates, initialization, checkpoints and status over gRPC.\n"
    "Identity: --cluster/--job/--task, else TF_CONFIG, else Slurm's environment.\n"
    "When ready it prints one line to stdout: ps/0 ready on HOST:PORT\n"
    "\n"
    "options:\n"
    "  --cluster FILE           cluster spec JSON\n"
    "  --job NAME               job of this task (default ps)\n"
    "  --task N                 task index (default 0)\n"
    "  --bind HOST              listen on HOST only (default: every interface)\n"
    "  --threads N              RPC threads (default: one per two cores)\n"
    "  --poll-spin-us N         after each event an RPC thread polls for N us\n"
    "                           before it sleeps (default PS_POLL_SPIN_US, else\n"
    "                           1000; 0: never)\n"
    "  --recv-window N          fix each stream's HTTP/2 receive window and largest\n"
    "                           frame at N bytes, 64K to 1G: lower peak memory\n"
    "                           (default 0: gRPC's bandwidth-delay probing)\n"
    "  --grace-secs S           on SIGTERM, let calls finish for S s (default 10)\n"
    "  --drain-secs S           on SIGTERM, first serve on for S s (default 0)\n"
    "  --checkpoint-dir D       save and restore checkpoints under D\n"
    "  --metrics-port N         Prometheus metrics on port N (0: any; default none)\n"
    "  --metrics-bind HOST      serve the metrics on HOST (default: --bind's host)\n"
    "  --log-level L            debug, info, warn, error (default info)\n"
    "  --log-format F           text or json (default text)\n"
    "limits (sizes take a K, M, G or T suffix):\n"
    "  --max-tensor-bytes N     bytes of one tensor (default: physical memory)\n"
    "  --max-read-names N       items of one request (default 100000)\n"
    "  --max-gather-rows N      rows of one gather (default 1048576)\n"
    "  --max-hold-ms N          longest a snapshot holds updates (default 60000)\n"
    "  --max-message-bytes N    one request message (default 32M)\n"
    "  --stream-timeout-secs S  cancel a stalled stream (default 60; 0: never)\n"
    "  --max-connections N      connections at once (default 4096)\n"
    "  --max-checkpoint-bytes N quota of --checkpoint-dir (default 0: none)\n"
    "security (each also from the environment, else the spec):\n"
    "  --tls-cert FILE          serve TLS with this PEM certificate chain\n"
    "  --tls-key FILE           and its PEM private key\n"
    "  --tls-client-ca FILE     mutual TLS: the CA of the clients' certificates\n"
    "  --auth-token-file FILE   tokens, lines 'ROLE TOKEN' (worker or admin)\n"
    "  --require-auth           refuse to start without TLS and tokens\n"
    "replication (else the spec's \"replication\" section; DESIGN.md \"Replication\"):\n"
    "  --replicas R             copies of each shard, 1..3 (default 1: no etcd)\n"
    "  --etcd ENDPOINTS         etcd HOST:PORT[,HOST:PORT...] holding the view\n"
    "  --repl-job NAME          etcd key prefix /paramserver/NAME/ (default default)\n"
    "  --lease-ttl SECS         a dead ps is noticed within SECS (default 2)\n"
    "  --repl-link-port PORT    the replicas' updates come over a TCP link of\n"
    "                           their own, on PORT of --bind's host (default 0:\n"
    "                           one the kernel picks; never with TLS)\n"
    "  --no-repl-link           no link: they come as Replicate calls\n"
    "  --help                   this text\n"
    "  --version                print the version\n"
    "\n"
    "See ps-server(1) for every flag, its default and its errors.\n";

typedef struct daemon_state {
  uv_loop_t *loop;
  uv_signal_t sigterm, sigint, sighup;
  ps_auth *auth;
  uv_timer_t grace;
  uv_async_t done;
  uv_async_t shutdown; /* a Shutdown call */
  uv_timer_t tick;
  ps_store *store;
  ps_service *svc;
  ps_rpc_server *srv;
  int grace_ms;
  int stopping;
  /* --drain-secs: after SIGTERM, serve on for a final checkpoint */
  uv_timer_t drain;
  int drain_ms, draining;
  uint64_t drain_start_ms, idle_since_ms;
  unsigned long long last_started;
  /* replication: fenced -> exit 75 (EX_TEMPFAIL) after the grace */
  uv_async_t fence;
  ps_member *member;
  ps_repl *repl;
  struct ps_server_metrics *metrics;
  int exit_code;
} daemon_state;

static void on_server_done(void *arg) {
  daemon_state *d = arg;
  uv_async_send(&d->done); /* from a gRPC thread: only this is allowed */
}

/* SIGTERM and SIGINT, blocked in the calling thread (or unblocked). */
static void mask_stop_signals(int how) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(how, &set, NULL);
}

static void on_done(uv_async_t *h) {
  daemon_state *d = h->data;
  /* Closing the signal handles puts back the default action, which would
   * kill a daemon that is already stopping (a Shutdown call, then a
   * SIGTERM from its supervisor).  Every other thread was started with
   * these signals blocked (main), so blocking them here leaves them
   * pending for good; ignoring them covers the rest. */
  mask_stop_signals(SIG_BLOCK);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  uv_close((uv_handle_t *)&d->grace, NULL);
  uv_close((uv_handle_t *)&d->done, NULL);
  uv_close((uv_handle_t *)&d->shutdown, NULL);
  uv_close((uv_handle_t *)&d->tick, NULL);
  uv_close((uv_handle_t *)&d->drain, NULL);
  uv_close((uv_handle_t *)&d->fence, NULL);
}

/* Cancels running calls and asks checkpoint jobs to stop at a safe
 * point; parked calls are answered as their jobs stop. */
static void cancel_everything(daemon_state *d) {
  ps_ckpt_abort_all();
  ps_rpc_server_cancel_all(d->srv);
}

static void on_grace(uv_timer_t *t) {
  daemon_state *d = t->data;
  PS_WARN("calls still running after the grace period: cancelling them");
  cancel_everything(d);
}

/* Reopens a snapshot gate whose coordinator went away. */
static void on_tick(uv_timer_t *t) {
  daemon_state *d = t->data;
  ps_store_gate_tick(d->store);
}

/* Stops as SIGTERM does: no new calls, the grace period, then cancel. */
static void begin_shutdown(daemon_state *d) {
  d->stopping = 1;
  uv_timer_stop(&d->drain);
  /* replicated: hand the shards over first (the backups become primaries
   * now, not after the lease TTL), then stop */
  ps_member_leave(d->member);
  ps_rpc_server_shutdown(d->srv, on_server_done, d);
  /* calls parked for a synchronous step would never finish by themselves */
  ps_service_shutdown(d->svc);
  if (d->repl) { /* held updates fail UNAVAILABLE: their clients retry */
    ps_server_metrics_set_repl(d->metrics, NULL);
    ps_service_set_repl(d->svc, NULL); /* new requests: no data plane */
    ps_repl_destroy(d->repl);
    d->repl = NULL;
  }
  uv_timer_start(&d->grace, on_grace, (uint64_t)d->grace_ms, 0);
}

/* Draining (--drain-secs): the job got SIGTERM as a whole, and its chief
 * may be writing a final checkpoint.  Calls are served as before until
 * nothing has been in flight or started for DRAIN_IDLE_MS (the chief is
 * done, or there is none), a Shutdown call, another signal, or the drain
 * time ends; then the stop is SIGTERM's. */
#define DRAIN_IDLE_MS 3000

static void on_drain_tick(uv_timer_t *t) {
  daemon_state *d = t->data;
  uint64_t now = uv_now(d->loop);
  long in_flight;
  unsigned long long started;
  ps_rpc_server_activity(d->srv, &in_flight, &started);
  if (in_flight > 0 || started != d->last_started) {
    d->last_started = started;
    d->idle_since_ms = now;
  }
  if (now - d->drain_start_ms >= (uint64_t)d->drain_ms) {
    PS_WARN("still busy %d s after SIGTERM (--drain-secs): shutting down",
            d->drain_ms / 1000);
    begin_shutdown(d);
  } else if (now - d->idle_since_ms >= DRAIN_IDLE_MS) {
    PS_INFO("no calls for %d s after SIGTERM: shutting down", DRAIN_IDLE_MS / 1000);
    begin_shutdown(d);
  }
}

static void on_signal(uv_signal_t *h, int signum) {
  daemon_state *d = h->data;
  const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
  if (d->stopping) {
    PS_WARN("second signal: cancelling running calls");
    cancel_everything(d);
    return;
  }
  if (d->draining) {
    PS_INFO("received %s again: shutting down", name);
    begin_shutdown(d);
    return;
  }
  if (d->drain_ms > 0) {
    d->draining = 1;
    d->drain_start_ms = d->idle_since_ms = uv_now(d->loop);
    ps_rpc_server_activity(d->srv, &(long){0}, &d->last_started);
    PS_INFO("received %s: serving on for a final checkpoint (until no calls for %d s, "
            "a Shutdown call, or %d s)",
            name, DRAIN_IDLE_MS / 1000, d->drain_ms / 1000);
    uv_timer_start(&d->drain, on_drain_tick, 250, 250);
    return;
  }
  PS_INFO("received %s: shutting down", name);
  begin_shutdown(d);
}

/* SIGHUP: the TLS files and the token file are read again; what does not
 * load keeps the old one, and the log says why. */
static void on_sighup(uv_signal_t *h, int signum) {
  daemon_state *d = h->data;
  (void)signum;
  ps_status st;
  ps_status_clear(&st);
  if (ps_rpc_server_tls(d->srv)) {
    if (ps_rpc_server_reload_tls(d->srv, &st) == 0)
      PS_INFO("SIGHUP: TLS certificate reloaded (new connections get it)");
    else
      PS_ERROR("SIGHUP: kept the old TLS certificate: %s", st.msg);
  }
  ps_status_clear(&st);
  if (d->auth) {
    size_t admins, n;
    if (ps_auth_reload(d->auth, &st) == 0) {
      n = ps_auth_count(d->auth, &admins);
      PS_INFO("SIGHUP: %zu token(s) reloaded from %s (%zu admin)", n,
              ps_auth_path(d->auth), admins);
    } else {
      PS_ERROR("SIGHUP: kept the old tokens: %s", st.msg);
    }
  }
}

/* Fenced (ps/member.h): stop as SIGTERM does, and exit 75 so a
 * supervisor restarts this ps and it rejoins fresh. */
static void on_fence(uv_async_t *h) {
  daemon_state *d = h->data;
  d->exit_code = 75;
  if (d->stopping) return;
  begin_shutdown(d);
}

static void fenced_hook(void *arg) {
  daemon_state *d = arg;
  uv_async_send(&d->fence);
}

/* A Shutdown call (from a gRPC thread, through uv_async_send). */
static void on_shutdown_call(uv_async_t *h) {
  daemon_state *d = h->data;
  if (d->stopping) return;
  PS_INFO("shutting down (a Shutdown call)");
  begin_shutdown(d);
}

static void request_shutdown(void *arg) {
  daemon_state *d = arg;
  uv_async_send(&d->shutdown);
}

/* Raises the soft open-file limit to the hard one; returns the soft limit. */
static long raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t want = rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > LONG_MAX ? LONG_MAX
                                                                : (long)rl.rlim_cur;
}

/* Descriptors kept for everything but connections: checkpoint files,
 * gRPC's epoll and wakeup fds, the libuv loop. */
#define FD_RESERVE(nofile) ((nofile) / 4 < 64 ? (nofile) / 4 : 64)

/* The command line, once parsed. */
typedef struct server_args {
  const char *cluster_file, *job, *ckpt_dir, *bind, *metrics_bind;
  const char *token_file;
  bool require_auth;
  int task, grace_secs, threads, metrics_port, drain_secs;
  ps_service_limits limits;
  ps_rpc_server_options ropt;
  int64_t max_conns; /* -1: as many as descriptors allow */
  int replicas;      /* -1: not given */
  const char *etcd, *repl_job;
  int64_t lease_ttl; /* -1: not given */
  bool no_repl_link;
  int repl_link_port;
} server_args;

static const struct option opts[] = {
    {"cluster", required_argument, NULL, 'c'},
    {"job", required_argument, NULL, 'j'},
    {"task", required_argument, NULL, 't'},
    {"threads", required_argument, NULL, 'n'},
    {"poll-spin-us", required_argument, NULL, 4000},
    {"recv-window", required_argument, NULL, 4001},
    {"grace-secs", required_argument, NULL, 'g'},
    {"checkpoint-dir", required_argument, NULL, 'C'},
    {"bind", required_argument, NULL, 'b'},
    {"metrics-port", required_argument, NULL, 'm'},
    {"metrics-bind", required_argument, NULL, 'M'},
    {"drain-secs", required_argument, NULL, 'D'},
    {"log-level", required_argument, NULL, 'l'},
    {"log-format", required_argument, NULL, 'L'},
    {"max-tensor-bytes", required_argument, NULL, 1000},
    {"max-read-names", required_argument, NULL, 1001},
    {"max-gather-rows", required_argument, NULL, 1002},
    {"max-hold-ms", required_argument, NULL, 1003},
    {"max-message-bytes", required_argument, NULL, 1004},
    {"stream-timeout-secs", required_argument, NULL, 1005},
    {"max-connections", required_argument, NULL, 1006},
    {"max-checkpoint-bytes", required_argument, NULL, 1007},
    {"tls-cert", required_argument, NULL, 2000},
    {"tls-key", required_argument, NULL, 2001},
    {"tls-client-ca", required_argument, NULL, 2002},
    {"auth-token-file", required_argument, NULL, 2003},
    {"require-auth", no_argument, NULL, 2004},
    {"replicas", required_argument, NULL, 3000},
    {"etcd", required_argument, NULL, 3001},
    {"repl-job", required_argument, NULL, 3002},
    {"lease-ttl", required_argument, NULL, 3003},
    {"no-repl-link", no_argument, NULL, 3004},
    {"repl-link-port", required_argument, NULL, 3005},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0}};

/* A limit option (codes 1000..1007, opts[li]); 0 or 2. */
static int limit_option(server_args *a, int o, int li) {
  const char *flag = opts[li].name;
  int64_t min = o == 1004 ? PS_RPC_MIN_MESSAGE_BYTES : o == 1005 || o == 1007 ? 0 : 1, v;
  if (ps_parse_size(optarg, min, INT64_MAX, &v) != 0 || (o == 1006 && v > INT32_MAX) ||
      (o == 1005 && v > INT64_MAX / 1000)) {
    if (o == 1004)
      fprintf(stderr,
              "ps-server: --%s must be a size of at least %lld bytes "
              "(16M+16: one data chunk and its framing), got '%s'\n",
              flag, (long long)PS_RPC_MIN_MESSAGE_BYTES, optarg);
    else
      fprintf(stderr, "ps-server: --%s must be %s integer%s, got '%s'\n", flag,
              min ? "a positive" : "a non-negative",
              o == 1000 || o == 1004 || o == 1007
                  ? " (optionally with a K, M or G suffix)"
                  : "",
              optarg);
    return 2;
  }
  switch (o) {
  case 1000:
    a->limits.max_tensor_bytes = v;
    break;
  case 1001:
    a->limits.max_read_names = v;
    break;
  case 1002:
    a->limits.max_gather_rows = v;
    break;
  case 1003:
    a->limits.max_hold_ms = v;
    break;
  case 1004:
    a->ropt.max_message_bytes = v;
    break;
  case 1005:
    a->ropt.stream_timeout_ms = v * 1000;
    break;
  case 1007:
    a->limits.max_checkpoint_bytes = v;
    break;
  default:
    a->max_conns = v;
    break;
  }
  return 0;
}

/* Any other option; 0, or the exit status (--help, --version: 0). */
static int other_option(server_args *a, int o, bool *exit_now) {
  char *end;
  switch (o) {
  case 'c':
    a->cluster_file = optarg;
    break;
  case 'j':
    a->job = optarg;
    break;
  case 't':
    a->task = (int)strtol(optarg, &end, 10);
    if (*end || a->task < 0) {
      fprintf(stderr, "ps-server: --task must be a non-negative integer, got '%s'\n",
              optarg);
      return 2;
    }
    break;
  case 'n':
    a->threads = (int)strtol(optarg, &end, 10);
    if (*end || a->threads < 1 || a->threads > 256) {
      fprintf(stderr, "ps-server: --threads must be 1..256, got '%s'\n", optarg);
      return 2;
    }
    break;
  case 4000:
    if (ps_rpc_parse_poll_spin_us(optarg, &a->ropt.poll_spin_us) != 0) {
      fprintf(stderr,
              "ps-server: --poll-spin-us must be an integer from 0 to %d (microseconds), "
              "got '%s'\n",
              PS_RPC_MAX_POLL_SPIN_US, optarg);
      return 2;
    }
    break;
  case 4001:
    if (ps_rpc_parse_recv_window(optarg, &a->ropt.recv_window_bytes) != 0) {
      fprintf(stderr,
              "ps-server: --recv-window must be 0 (gRPC's probing) or a size from 64K to "
              "1G, got '%s'\n",
              optarg);
      return 2;
    }
    break;
  case 'g':
    a->grace_secs = (int)strtol(optarg, &end, 10);
    if (*end || a->grace_secs < 0) {
      fprintf(stderr, "ps-server: --grace-secs must be >= 0, got '%s'\n", optarg);
      return 2;
    }
    break;
  case 'C':
    a->ckpt_dir = optarg;
    break;
  case 'D':
    a->drain_secs = (int)strtol(optarg, &end, 10);
    if (*end || optarg[0] == '\0' || a->drain_secs < 0 || a->drain_secs > 86400) {
      fprintf(stderr, "ps-server: --drain-secs must be 0..86400, got '%s'\n", optarg);
      return 2;
    }
    break;
  case 'm':
    a->metrics_port = (int)strtol(optarg, &end, 10);
    if (*end || optarg[0] == '\0' || a->metrics_port < 0 || a->metrics_port > 65535) {
      fprintf(stderr,
              "ps-server: --metrics-port must be a port number 0..65535, got '%s'\n",
              optarg);
      return 2;
    }
    break;
  case 'b':
  case 'M':
    if (optarg[0] == '\0' || strlen(optarg) > 255 || strchr(optarg, ' ')) {
      fprintf(stderr, "ps-server: --%s must be a host name or address, got '%s'\n",
              o == 'b' ? "bind" : "metrics-bind", optarg);
      return 2;
    }
    *(o == 'b' ? &a->bind : &a->metrics_bind) = optarg;
    break;
  case 2000:
    a->ropt.tls_cert_file = optarg;
    break;
  case 2001:
    a->ropt.tls_key_file = optarg;
    break;
  case 2002:
    a->ropt.tls_client_ca_file = optarg;
    break;
  case 2003:
    a->token_file = optarg;
    break;
  case 2004:
    a->require_auth = true;
    break;
  case 3000:
    a->replicas = (int)strtol(optarg, &end, 10);
    if (*end || optarg[0] == '\0' || a->replicas < 1 || a->replicas > 3) {
      fprintf(stderr, "ps-server: --replicas must be 1, 2 or 3, got '%s'\n", optarg);
      return 2;
    }
    break;
  case 3001:
    a->etcd = optarg;
    break;
  case 3002:
    a->repl_job = optarg;
    break;
  case 3003:
    a->lease_ttl = strtoll(optarg, &end, 10);
    if (*end || optarg[0] == '\0' || a->lease_ttl < 1 ||
        a->lease_ttl > PS_REPL_MAX_LEASE_TTL_S) {
      fprintf(stderr, "ps-server: --lease-ttl must be 1..%d seconds, got '%s'\n",
              PS_REPL_MAX_LEASE_TTL_S, optarg);
      return 2;
    }
    break;
  case 3004:
    a->no_repl_link = true;
    break;
  case 3005:
    a->repl_link_port = (int)strtol(optarg, &end, 10);
    if (*end || optarg[0] == '\0' || a->repl_link_port < 0 || a->repl_link_port > 65535) {
      fprintf(stderr, "ps-server: --repl-link-port must be 0..65535, got '%s'\n", optarg);
      return 2;
    }
    break;
  case 'l':
    if (ps_log_level_option("ps-server", optarg) != 0) return 2;
    break;
  case 'L':
    if (ps_log_format_option("ps-server", optarg) != 0) return 2;
    break;
  case 'h':
    fputs(usage, stdout);
    *exit_now = true;
    return 0;
  case 'V':
    printf("ps-server %s\n", PS_VERSION);
    *exit_now = true;
    return 0;
  default:
    fputs(usage, stderr);
    return 2;
  }
  return 0;
}

/* -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, server_args *a) {
  /* One completion-queue thread per two cores: on 2 cores a second poller
   * only adds futex and epoll hand-offs to every call (see tests/bench). */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  a->threads = ncpu >= 4 ? (int)(ncpu / 2 > 8 ? 8 : ncpu / 2) : 1;
  a->task = -1;
  a->metrics_port = -1;
  a->grace_secs = 10;
  a->max_conns = -1;
  a->replicas = -1;
  a->lease_ttl = -1;
  ps_service_limits_default(&a->limits);
  ps_rpc_server_options_default(&a->ropt);
  a->ropt.poll_spin_us = -1; /* not given: PS_POLL_SPIN_US, else the default */
  int o, li = 0, rc;
  bool exit_now = false;
  /* the environment first: flags override it */
  /* not PS_TLS_CERT/PS_TLS_KEY, a client's own certificate: an
   * environment every task of a job shares must not give the workers the
   * ps's key as their identity */
  a->ropt.tls_cert_file = ps_security_env("PS_SERVER_TLS_CERT");
  a->ropt.tls_key_file = ps_security_env("PS_SERVER_TLS_KEY");
  a->ropt.tls_client_ca_file = ps_security_env("PS_TLS_CLIENT_CA");
  a->token_file = ps_security_env("PS_AUTH_TOKEN_FILE");
  const char *ra = ps_security_env("PS_REQUIRE_AUTH");
  a->require_auth = ra && strcmp(ra, "0") != 0 && strcasecmp(ra, "false") != 0;
  const char *mcb = ps_security_env("PS_MAX_CHECKPOINT_BYTES");
  if (mcb && ps_parse_size(mcb, 0, INT64_MAX, &a->limits.max_checkpoint_bytes) != 0) {
    fprintf(stderr,
            "ps-server: PS_MAX_CHECKPOINT_BYTES must be a non-negative integer "
            "(optionally with a K, M or G suffix), got '%s'\n",
            mcb);
    return 2;
  }
  while ((o = getopt_long(argc, argv, "", opts, &li)) != -1) {
    rc = o >= 1000 && o <= 1007 ? limit_option(a, o, li) : other_option(a, o, &exit_now);
    if (rc != 0 || exit_now) return rc;
  }
  if (optind < argc) {
    fprintf(stderr, "ps-server: unexpected argument '%s'\n%s", argv[optind], usage);
    return 2;
  }
  if (a->metrics_bind && a->metrics_port < 0) {
    fprintf(stderr, "ps-server: --metrics-bind needs --metrics-port\n");
    return 2;
  }
  return -1;
}

/* The security settings once the cluster is known: a flag or environment
 * variable, else the spec's "security" section; then checked together.
 * 0, or 2 after saying what is wrong. */
static int security_settings(server_args *a, const ps_cluster *cluster) {
  const ps_cluster_security *sec = cluster->security;
  if (sec) {
    if (a->ropt.tls_cert_file == NULL) a->ropt.tls_cert_file = sec->server_cert;
    if (a->ropt.tls_key_file == NULL) a->ropt.tls_key_file = sec->server_key;
    if (a->ropt.tls_client_ca_file == NULL) a->ropt.tls_client_ca_file = sec->client_ca;
    if (a->token_file == NULL) a->token_file = sec->auth_token_file;
    a->require_auth |= sec->require_auth != 0;
  }
  if (a->ropt.tls_client_ca_file && !a->ropt.tls_cert_file) {
    fprintf(stderr, "ps-server: --tls-client-ca needs --tls-cert and --tls-key\n");
    return 2;
  }
  if ((a->ropt.tls_cert_file == NULL) != (a->ropt.tls_key_file == NULL)) {
    fprintf(stderr, "ps-server: TLS needs both --tls-cert and --tls-key (got only %s)\n",
            a->ropt.tls_cert_file ? "--tls-cert" : "--tls-key");
    return 2;
  }
  if (a->require_auth && (a->ropt.tls_cert_file == NULL || a->token_file == NULL)) {
    fprintf(stderr,
            "ps-server: --require-auth: refusing to start without %s "
            "(common/SECURITY.md; deploy/gen-certs.sh makes them)\n",
            a->ropt.tls_cert_file == NULL && a->token_file == NULL
                ? "TLS (--tls-cert, --tls-key) and tokens (--auth-token-file)"
            : a->token_file == NULL ? "tokens (--auth-token-file)"
                                    : "TLS (--tls-cert, --tls-key)");
    return 2;
  }
  return 0;
}

/* The replication settings: the spec's "replication" section, then the
 * flags.  0, or 2 after saying what is wrong. */
static int replication_settings(const server_args *a, const ps_cluster *cluster,
                                ps_repl_conf *conf) {
  ps_status st;
  ps_status_clear(&st);
  ps_repl_conf_from_cluster(cluster, conf);
  if (a->replicas > 0) conf->replicas = a->replicas;
  if (a->etcd) {
    if (ps_repl_check_etcd(a->etcd, "--etcd", &st) != 0) goto bad;
    snprintf(conf->etcd, sizeof conf->etcd, "%s", a->etcd);
  }
  if (a->repl_job) {
    if (ps_repl_check_job(a->repl_job, "--repl-job", &st) != 0) goto bad;
    snprintf(conf->job, sizeof conf->job, "%s", a->repl_job);
  }
  if (a->lease_ttl > 0) conf->lease_ttl_s = a->lease_ttl;
  if (conf->replicas >= 2 && conf->etcd[0] == '\0') {
    fprintf(stderr,
            "ps-server: --replicas %d needs the etcd endpoints that hold the view "
            "(--etcd HOST:PORT[,HOST:PORT...], or \"etcd\" in the cluster spec's "
            "\"replication\" section)\n",
            conf->replicas);
    return 2;
  }
  if (conf->replicas >= 2 && ps_cluster_num_tasks(cluster, "ps") < conf->replicas) {
    fprintf(stderr,
            "ps-server: --replicas %d needs at least %d ps tasks, the spec has %d\n",
            conf->replicas, conf->replicas, ps_cluster_num_tasks(cluster, "ps"));
    return 2;
  }
  /* the tasks reach each other at the spec's addresses: port 0 ("any
   * free port") is no address a peer can call */
  for (int t = 0; conf->replicas >= 2 && t < ps_cluster_num_tasks(cluster, "ps"); t++) {
    const char *addr = ps_cluster_address(cluster, "ps", t);
    size_t n = addr ? strlen(addr) : 0;
    if (n >= 2 && strcmp(addr + n - 2, ":0") == 0) {
      fprintf(stderr,
              "ps-server: --replicas %d: the cluster spec gives ps/%d the address %s; "
              "replicated ps tasks call each other at the spec's addresses, so each "
              "needs a real port\n",
              conf->replicas, t, addr);
      return 2;
    }
  }
  return 0;
bad:
  fprintf(stderr, "ps-server: %s\n", st.msg);
  return 2;
}

/* How a replicated ps calls the others: with TLS, the CA of their
 * certificates (PS_TLS_CA, else the spec's "ca") and, under mutual TLS,
 * its own certificate; with tokens, the "replica" token of its own token
 * file (else an "admin" one).  The strings are malloc'd into @sec.  0, or
 * 2 after saying what is missing. */
typedef struct repl_sec {
  ps_rpc_channel_security sec;
  char *ca, *cert, *key, *token;
} repl_sec;

static void repl_sec_free(repl_sec *r) {
  free(r->ca);
  free(r->cert);
  if (r->key) ps_secure_zero(r->key, strlen(r->key));
  free(r->key);
  if (r->token) ps_secure_zero(r->token, strlen(r->token));
  free(r->token);
}

/* The token of the first line "ROLE TOKEN" of @path with @role. */
static char *token_of_role(const char *path, const char *role) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return NULL;
  char line[4096], *tok = NULL;
  size_t rl = strlen(role);
  while (tok == NULL && fgets(line, sizeof line, f)) {
    if (strncmp(line, role, rl) != 0 || (line[rl] != ' ' && line[rl] != '\t')) continue;
    char *p = line + rl;
    while (*p == ' ' || *p == '\t')
      p++;
    size_t n = strcspn(p, " \t\r\n");
    if (n > 0) tok = strndup(p, n);
  }
  ps_secure_zero(line, sizeof line);
  fclose(f);
  return tok;
}

static int repl_security(const server_args *a, const ps_cluster *c, repl_sec *r) {
  ps_status st;
  ps_status_clear(&st);
  memset(r, 0, sizeof *r);
  if (a->token_file) {
    if ((r->token = token_of_role(a->token_file, "replica")) == NULL &&
        (r->token = token_of_role(a->token_file, "admin")) == NULL) {
      fprintf(stderr,
              "ps-server: --replicas with --auth-token-file %s: the file has no "
              "'replica TOKEN' line (nor an admin one): the ps tasks call each other "
              "with it\n",
              a->token_file);
      return 2;
    }
    r->sec.token = r->token;
  }
  if (a->ropt.tls_cert_file) {
    const char *ca = ps_security_env("PS_TLS_CA");
    if (ca == NULL && c->security) ca = c->security->ca;
    if (ca == NULL) {
      fprintf(stderr, "ps-server: --replicas with TLS needs the CA of the ps "
                      "certificates to call the other ps: PS_TLS_CA or the spec's "
                      "security \"ca\"\n");
      return 2;
    }
    if ((r->ca = ps_pem_read(ca, "PS_TLS_CA", false, &st)) == NULL) goto bad;
    r->sec.ca_pem = r->ca;
    if (a->ropt.tls_client_ca_file) { /* mutual TLS: its own certificate */
      if ((r->cert = ps_pem_read(a->ropt.tls_cert_file, "--tls-cert", false, &st)) ==
              NULL ||
          (r->key = ps_pem_read(a->ropt.tls_key_file, "--tls-key", true, &st)) == NULL)
        goto bad;
      r->sec.cert_pem = r->cert;
      r->sec.key_pem = r->key;
    }
  }
  return 0;
bad:
  fprintf(stderr, "ps-server: %s\n", st.msg);
  return 2;
}

/* Replicated (R >= 2): the member and the data plane, wired to the
 * service before the server starts.  0, or -1 after logging why. */
static int replication_create(daemon_state *d, const ps_repl_conf *conf,
                              const ps_cluster *cluster, int self, const char *addr,
                              const ps_rpc_channel_security *sec, const char *bind,
                              bool link, int link_port) {
  ps_status st;
  ps_status_clear(&st);
  char **hosts = NULL;
  int n = 0, rc = -1;
  if (ps_repl_hosts_from_cluster(cluster, &hosts, &n, &st) != 0) {
    PS_ERROR("%s", st.msg);
    return -1;
  }
  const char **addrs = calloc((size_t)n, sizeof *addrs);
  if (addrs == NULL) {
    PS_ERROR("out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++)
    addrs[i] = ps_cluster_address(cluster, "ps", i);
  d->member = ps_member_create(conf, self, n, (const char *const *)hosts, addr,
                               fenced_hook, d, &st);
  if (d->member == NULL) {
    PS_ERROR("%s", st.msg);
    goto out;
  }
  ps_repl_callbacks cb;
  ps_member_callbacks(d->member, &cb);
  d->repl = ps_repl_create(d->svc, self, n, addrs, sec, &cb, &st);
  if (d->repl == NULL) {
    PS_ERROR("%s", st.msg);
    goto out;
  }
  if (link && ps_repl_link_start(d->repl, bind, link_port, &st) != 0) {
    PS_ERROR("%s (--repl-link-port picks another, --no-repl-link goes without)", st.msg);
    ps_repl_destroy(d->repl); /* (not the service's yet: freed here) */
    d->repl = NULL;
    goto out;
  }
  ps_service_set_repl(d->svc, d->repl);
  rc = 0;
out:
  free(addrs);
  ps_repl_hosts_free(hosts, n);
  return rc;
}

/* Each connection costs a descriptor: take all the system allows, and
 * serve no more connections than fit beside the reserve. */
/* With TLS, half of them stay free: a connection costs gRPC more during
 * its handshake, and where gRPC's own listener accepts (another gRPC than
 * 1.51, or PS_TLS_GRPC_LISTENER=1: common/rpc_internal.h, "Listener") it
 * stops for good on its first accept4 error, so connections over the limit (shut by
 * the monitor a moment later) must never exhaust the descriptors. */
static int connection_limit(int64_t max_conns, bool tls) {
  long nofile = raise_fd_limit();
  long room = nofile > 0 ? nofile - FD_RESERVE(nofile) : 0;
  if (tls) room /= 2;
  if (max_conns < 0) {
    max_conns = PS_RPC_DEFAULT_MAX_CONNECTIONS;
    if (nofile > 0 && room < max_conns) max_conns = room > 1 ? room : 1;
  } else if (nofile > 0 && room < max_conns) {
    PS_WARN("--max-connections %lld: the open-file limit is %ld, so accepting "
            "may %s when descriptors run out",
            (long long)max_conns, nofile, tls ? "stop (TLS)" : "pause");
  }
  return (int)max_conns;
}

/* The daemon's loop: signals, the grace timer and the status tick.  The
 * handlers are installed before the readiness line is printed (a SIGTERM
 * right after it must find them); then the loop runs until the server has
 * drained. */
static void loop_init(daemon_state *d, ps_rpc_server *srv, ps_store *store,
                      ps_service *svc, int grace_secs, int drain_secs) {
  d->loop = uv_default_loop();
  d->srv = srv;
  d->grace_ms = grace_secs * 1000;
  d->drain_ms = drain_secs * 1000;
  uv_timer_init(d->loop, &d->drain);
  d->drain.data = d;
  uv_signal_init(d->loop, &d->sigterm);
  uv_signal_init(d->loop, &d->sigint);
  uv_timer_init(d->loop, &d->grace);
  uv_async_init(d->loop, &d->done, on_done);
  uv_async_init(d->loop, &d->shutdown, on_shutdown_call);
  uv_async_init(d->loop, &d->fence, on_fence);
  d->fence.data = d;
  d->store = store;
  d->svc = svc;
  uv_timer_init(d->loop, &d->tick);
  d->sigterm.data = d->sigint.data = d->grace.data = d->done.data = d->tick.data = d;
  d->shutdown.data = d;
  ps_service_set_shutdown_hook(svc, request_shutdown, d);
  uv_timer_start(&d->tick, on_tick, 1000, 1000);
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  uv_signal_init(d->loop, &d->sighup);
  d->sighup.data = d;
  uv_signal_start(&d->sighup, on_sighup, SIGHUP);
  mask_stop_signals(SIG_UNBLOCK);
}

/* --checkpoint-dir, resolved; the temp directories of saves that crashed
 * are swept.  0, or -1 after logging why. */
static int set_checkpoint_dir(ps_service *svc, const char *ckpt_dir) {
  char real[4096];
  if (realpath(ckpt_dir, real) == NULL) {
    PS_ERROR("--checkpoint-dir %s: %s", ckpt_dir, strerror(errno));
    return -1;
  }
  ps_service_set_checkpoint_dir(svc, real);
  /* temp directories of saves that crashed (never a live one) */
  ps_status st;
  ps_status_clear(&st);
  if (ps_ckpt_sweep(real, &st) != 0) PS_WARN("%s", st.msg);
  return 0;
}

int main(int argc, char **argv) {
  server_args a = {0};
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  ps_status st;
  ps_status_clear(&st);
  ps_task_id self;
  /* With a spec file, the job defaults to ps and the task to 0; with
   * TF_CONFIG or Slurm, the identity comes from there unless given. */
  if (a.cluster_file && a.job == NULL) a.job = "ps";
  if (a.cluster_file && a.task < 0) a.task = 0;
  if (a.job != NULL && a.task < 0) a.task = 0;
  ps_cluster *cluster = ps_cluster_resolve(a.cluster_file, a.job, a.task, &self, &st);
  if (cluster == NULL) {
    fprintf(stderr, "ps-server: %s\n", st.msg);
    return 2;
  }
  ps_repl_conf rconf;
  repl_sec rsec = {0};
  if (security_settings(&a, cluster) != 0 ||
      replication_settings(&a, cluster, &rconf) != 0 ||
      (rconf.replicas >= 2 && repl_security(&a, cluster, &rsec) != 0)) {
    repl_sec_free(&rsec);
    ps_cluster_destroy(cluster);
    return 2;
  }
  if (strcmp(self.job, "ps") != 0) {
    fprintf(stderr,
            "ps-server: this task is %s/%d in the cluster spec, but ps-server runs ps "
            "tasks (a chief or worker runs ps-worker)\n",
            self.job, self.task);
    ps_cluster_destroy(cluster);
    return 2;
  }
  char taskname[96];
  snprintf(taskname, sizeof taskname, "%s/%d", self.job, self.task);
  ps_log_set_task(taskname);
  /* Listen at the spec's port on every interface (0.0.0.0 and [::]), or on
   * --bind's host: the spec's host name is how others reach this task, and
   * need not resolve here (a StatefulSet pod's own DNS name does not until
   * the pod is Ready). */
  const char *addr = ps_cluster_address(cluster, self.job, self.task);
  const char *colon = strrchr(addr, ':');
  char host[256], listen_addr[300];
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  const char *bind_host = a.bind ? a.bind : "0.0.0.0";
  snprintf(listen_addr, sizeof listen_addr, "%s%s%s:%s",
           strchr(bind_host, ':') ? "[" : "", bind_host,
           strchr(bind_host, ':') ? "]" : "", colon + 1);
  a.ropt.max_connections = connection_limit(a.max_conns, a.ropt.tls_cert_file != NULL);
  a.ropt.nthreads = a.threads;

  /* Threads started from here on (gRPC's, checkpoint jobs) never take
   * SIGTERM or SIGINT: the main thread's loop does (loop_init). */
  mask_stop_signals(SIG_BLOCK);
  ps_rpc_global_init_server();
  if (a.ropt.poll_spin_us < 0)
    a.ropt.poll_spin_us = ps_rpc_poll_spin_us();
  else /* its own calls to other ps tasks poll alike (etcd's do not) */
    ps_rpc_set_poll_spin_us(a.ropt.poll_spin_us);
  ps_store *store = ps_store_create(taskname);
  ps_service *svc = ps_service_create(store, taskname);
  ps_server_metrics metrics = {
      .store = store, .svc = svc, .repl_mu = PTHREAD_MUTEX_INITIALIZER};
  ps_rpc_server *srv = NULL;
  ps_auth *auth = NULL;
  daemon_state d = {.svc = svc};
  ps_service_set_limits(svc, &a.limits);
  rc = 2;
  if (a.ckpt_dir && set_checkpoint_dir(svc, a.ckpt_dir) != 0) goto out;
  /* the metrics port first: a port that cannot be had stops the start.
   * Its page has no authentication: it listens where the RPC port does
   * (--bind) unless --metrics-bind says otherwise. */
  if (a.metrics_bind == NULL) a.metrics_bind = a.bind;
  if (a.metrics_port >= 0 &&
      ps_server_metrics_start(&metrics, a.metrics_bind, a.metrics_port, &st) != 0) {
    PS_ERROR("--metrics-port %d: %s", a.metrics_port, st.msg);
    rc = 1;
    goto out;
  }
  if (a.token_file) {
    if ((auth = ps_auth_load(a.token_file, &st)) == NULL) {
      PS_ERROR("%s", st.msg);
      rc = 2;
      goto out;
    }
    a.ropt.auth = auth;
  }
  size_t nh;
  const ps_rpc_handler *h = ps_service_handlers(&nh);
  rc = 1;
  if ((srv = ps_rpc_server_create(listen_addr, h, nh, &a.ropt, svc, &st)) == NULL) {
    PS_ERROR("%s (this task is %s in the cluster spec%s)", st.msg, addr,
             a.bind ? "" : "; --bind HOST listens on one address only");
    goto out;
  }
  char real_addr[300];
  snprintf(real_addr, sizeof real_addr, "%s:%d", host, ps_rpc_server_port(srv));
  ps_service_set_address(svc, real_addr);
  if (a.ropt.tls_cert_file == NULL && auth == NULL)
    PS_WARN("no TLS and no tokens: anyone who can reach port %d can read, change, "
            "restore, save over and delete every variable and checkpoint of this ps "
            "(common/SECURITY.md: --tls-cert/--tls-key, --auth-token-file, "
            "--require-auth)",
            ps_rpc_server_port(srv));
  else if (a.ropt.tls_cert_file == NULL)
    PS_WARN("tokens without TLS: they and every value cross the network in the clear "
            "(--tls-cert/--tls-key)");
  else if (auth == NULL)
    PS_WARN("TLS without tokens%s: every client %s may do everything, admin calls "
            "included (--auth-token-file)",
            a.ropt.tls_client_ca_file ? "" : " or client certificates",
            a.ropt.tls_client_ca_file ? "with a certificate of --tls-client-ca"
                                      : "that can reach the port");
  atomic_store(&metrics.srv, srv);
  if (rconf.replicas >= 2 &&
      replication_create(&d, &rconf, cluster, self.task, addr, &rsec.sec, a.bind,
                         !a.no_repl_link, a.repl_link_port) != 0)
    goto out;
  ps_server_metrics_set_repl(&metrics, d.repl);
  d.metrics = &metrics;
  ps_rpc_server_start(srv);
  d.auth = auth;
  loop_init(&d, srv, store, svc, a.grace_secs, a.drain_secs);
  if (d.member) {
    int n = ps_cluster_num_tasks(cluster, "ps");
    const char *av[PS_VIEW_MAX_TASKS];
    for (int i = 0; i < n && i < PS_VIEW_MAX_TASKS; i++)
      av[i] = ps_cluster_address(cluster, "ps", i);
    PS_INFO("replication: %d replicas per shard, view in etcd at %s (job %s, lease TTL "
            "%lld s)",
            rconf.replicas, rconf.etcd, rconf.job, (long long)rconf.lease_ttl_s);
    if (ps_member_start(d.member, d.repl, av, &rsec.sec, &st) != 0) {
      PS_ERROR("replication: %s", st.msg);
      d.exit_code = 1;
      begin_shutdown(&d);
      goto run;
    }
  }
  size_t nadmin = 0, ntok = auth ? ps_auth_count(auth, &nadmin) : 0;
  char sec[160];
  snprintf(sec, sizeof sec, "%s%s, %s", a.ropt.tls_cert_file ? "TLS" : "plaintext",
           a.ropt.tls_client_ca_file ? " with client certificates" : "",
           auth ? "" : "no tokens");
  if (auth)
    snprintf(sec + strlen(sec), sizeof sec - strlen(sec), "%zu token(s), %zu admin", ntok,
             nadmin);
  PS_INFO(
      "serving on %s with %d threads polling %lld us (pid %d, at most %d connections; "
      "%s)",
      real_addr, a.threads, (long long)(a.threads == 1 ? a.ropt.poll_spin_us : 0),
      (int)getpid(), a.ropt.max_connections, sec);
  if (a.ropt.recv_window_bytes == 0)
    PS_INFO("HTTP/2 receive windows grow with gRPC's bandwidth-delay probing (the "
            "default; --recv-window N fixes them)");
  else
    PS_INFO("HTTP/2 receive windows fixed at %lld bytes, no probing (--recv-window)",
            (long long)a.ropt.recv_window_bytes);
  printf("%s ready on %s\n", taskname, real_addr);
  fflush(stdout);
run:
  uv_run(d.loop, UV_RUN_DEFAULT);
  uv_loop_close(d.loop);
  /* Every call is gone, but a checkpoint job may still be unwinding after
   * answering its call: it must be done before anything is freed. */
  ps_ckpt_wait_all();
  ps_server_metrics_stop(&metrics);
  /* the data plane's threads may call the member's callbacks until it is
   * destroyed: stop the member, destroy the data plane, free the member */
  ps_member_stop(d.member);
  ps_server_metrics_set_repl(&metrics, NULL);
  if (d.repl) ps_repl_destroy(d.repl);
  d.repl = NULL;
  ps_member_destroy(d.member);
  d.member = NULL;
  ps_rpc_server_destroy(srv);
  srv = NULL;
  int64_t nvars, bytes;
  ps_store_totals(store, &nvars, &bytes);
  PS_INFO("stopped (%lld variables, %lld bytes released)", (long long)nvars,
          (long long)bytes);
  rc = d.exit_code;
  if (rc == 75) PS_WARN("exiting 75 (fenced): a supervisor restarts it and it rejoins");
out:
  ps_server_metrics_stop(&metrics);
  ps_member_stop(d.member);
  if (d.repl) {
    ps_server_metrics_set_repl(&metrics, NULL);
    ps_service_set_repl(svc, NULL);
    ps_repl_destroy(d.repl);
  }
  ps_member_destroy(d.member);
  ps_rpc_server_destroy(srv); /* made but never started (a failed replication) */
  repl_sec_free(&rsec);
  ps_auth_destroy(auth);
  ps_service_destroy(svc);
  ps_store_destroy(store);
  ps_cluster_destroy(cluster);
  ps_rpc_global_shutdown();
  return rc;
}
