/* libpsworker client over common/rpc.
 *
 * Each public call builds one ps_rpc_req per ps task it contacts and runs
 * them together, so calls to several ps overlap.  Safe calls are retried on
 * UNAVAILABLE with exponential backoff; updates are not (an assign_add that
 * reached the ps must not be applied twice). */
#include "paramserver/client.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/tensor.h"
#include "common/wire.h"
#include "dedup.h"
#include "ps.pb-c.h"

#define M_CREATE "/paramserver.Ps/Create"
#define M_INITIALIZE "/paramserver.Ps/Initialize"
#define M_IS_INIT "/paramserver.Ps/IsInitialized"
#define M_REPORT "/paramserver.Ps/ReportUninitialized"
#define M_UPDATE "/paramserver.Ps/Update"
#define M_READ "/paramserver.Ps/Read"
#define M_LIST "/paramserver.Ps/List"
#define M_STATUS "/paramserver.Ps/Status"
#define M_DELETE "/paramserver.Ps/Delete"
#define M_SHUTDOWN "/paramserver.Ps/Shutdown"

/* ---- library init ------------------------------------------------------ */

/* The RPC runtime is started by the first ps_library_init() and stopped by
 * the last ps_library_shutdown(); the count is guarded by one mutex so
 * libraries layered on this one can init and shut down in pairs. */
static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
static long lib_refs;

int ps_library_init(void) {
  pthread_mutex_lock(&lib_mu);
  if (lib_refs++ == 0) ps_rpc_global_init();
  pthread_mutex_unlock(&lib_mu);
  return 0;
}

void ps_library_shutdown(void) {
  pthread_mutex_lock(&lib_mu);
  if (lib_refs > 0 && --lib_refs == 0) ps_rpc_global_shutdown();
  pthread_mutex_unlock(&lib_mu);
}

const char *ps_library_version(void) {
  return PS_VERSION;
}

/* ---- client ------------------------------------------------------------ */

/* ps_update_op is sent as the proto's UpdateOp number. */
#define SAME_OP(a, b) _Static_assert((int)(a) == (int)(b), #a " is " #b " on the wire")
SAME_OP(PS_ASSIGN, PARAMSERVER__UPDATE_OP__ASSIGN);
SAME_OP(PS_ASSIGN_ADD, PARAMSERVER__UPDATE_OP__ASSIGN_ADD);
SAME_OP(PS_ASSIGN_SUB, PARAMSERVER__UPDATE_OP__ASSIGN_SUB);
SAME_OP(PS_SCATTER_UPDATE, PARAMSERVER__UPDATE_OP__SCATTER_UPDATE);
SAME_OP(PS_SCATTER_ADD, PARAMSERVER__UPDATE_OP__SCATTER_ADD);
SAME_OP(PS_SCATTER_SUB, PARAMSERVER__UPDATE_OP__SCATTER_SUB);
SAME_OP(PS_APPLY_GRADIENT_DESCENT, PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
SAME_OP(PS_APPLY_MOMENTUM, PARAMSERVER__UPDATE_OP__APPLY_MOMENTUM);
SAME_OP(PS_APPLY_ADAGRAD, PARAMSERVER__UPDATE_OP__APPLY_ADAGRAD);
SAME_OP(PS_APPLY_ADAM, PARAMSERVER__UPDATE_OP__APPLY_ADAM);
#undef SAME_OP

struct ps_client {
  ps_client_options opt;
  int nps;
  char **addrs;
  ps_rpc_channel **ch;
  /* per task: calls and the microseconds callers waited for them */
  atomic_ullong *calls, *wait_us;
  /* per task: since when (CLOCK_MONOTONIC ns) waiting calls heard nothing */
  atomic_llong *silent_since;
  ps_dedup_memo memo;    /* a gather's ids deduplicated, for the scatter after it */
  bool tls, client_cert; /* the channels' security, for hints in errors */
};

void ps_client_options_default(ps_client_options *o) {
  memset(o, 0, sizeof *o);
  o->control_timeout_ms = 0; /* 30 s, or the rpc timeout + 5 s (timeouts_resolve) */
  o->data_timeout_ms = 0;    /* 300 s, or the rpc timeout + 5 s */
  o->max_retries = 6;
  o->retry_initial_ms = 50;
  o->retry_max_ms = 2000;
  o->max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
}

/* The files of ps_client_options' security settings, read and checked. */
typedef struct client_security {
  ps_rpc_channel_security ch;
  char *ca, *cert, *key, *token;
} client_security;

static void security_free(client_security *s) {
  free(s->ca);
  free(s->cert);
  if (s->key) {
    ps_secure_zero(s->key, strlen(s->key));
    free(s->key);
  }
  if (s->token) {
    ps_secure_zero(s->token, strlen(s->token));
    free(s->token);
  }
  memset(s, 0, sizeof *s);
}

/* ps_client_options.rpc_timeout_ms: its own, else PS_RPC_TIMEOUT (seconds),
 * else the default. */
static int rpc_timeout_resolve(ps_client_options *o, ps_status *st) {
  if (o->rpc_timeout_ms < 0)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "rpc_timeout_ms must be >= 0 (0: PS_RPC_TIMEOUT, else %d s), got %lld",
        PS_DEFAULT_RPC_TIMEOUT_SECS, (long long)o->rpc_timeout_ms);
  if (o->rpc_timeout_ms > 0) return 0;
  o->rpc_timeout_ms = (int64_t)PS_DEFAULT_RPC_TIMEOUT_SECS * 1000;
  const char *e = getenv("PS_RPC_TIMEOUT");
  if (e == NULL || *e == '\0') return 0;
  char *end;
  double v = strtod(e, &end);
  /* at most a year: the milliseconds fit, and so do gRPC's deadlines */
  if (*end != '\0' || !(v >= 0.001 && v <= 31536000.0))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "PS_RPC_TIMEOUT must be a number of seconds from 0.001 to "
                         "31536000, got '%s'",
                         e);
  o->rpc_timeout_ms = (int64_t)(v * 1000 + 0.5);
  return 0;
}

/* ps_client_options' timeouts as the client runs with them: the rpc
 * timeout (above); the whole-call deadlines left at 0 never end a call
 * before the rpc timeout has had its say. */
static int timeouts_resolve(ps_client_options *o, ps_status *st) {
  if (rpc_timeout_resolve(o, st) != 0) return -1;
  int64_t floor_ms = o->rpc_timeout_ms + 5000;
  if (o->control_timeout_ms <= 0)
    o->control_timeout_ms = floor_ms > 30000 ? floor_ms : 30000;
  if (o->data_timeout_ms <= 0) o->data_timeout_ms = floor_ms > 300000 ? floor_ms : 300000;
  return 0;
}

static const char *opt_or_env(const char *v, const char *env) {
  return v ? v : ps_security_env(env);
}

/* @v, else the environment variable @env, else the spec's @spec. */
static const char *pick(const char *v, const char *env, const char *spec) {
  v = opt_or_env(v, env);
  return v ? v : spec;
}

static int security_load(ps_client_options *o, const ps_cluster_security *cs,
                         client_security *s, ps_status *st) {
  static const ps_cluster_security none = {0};
  if (cs == NULL) cs = &none;
  memset(s, 0, sizeof *s);
  o->tls_ca_file = pick(o->tls_ca_file, "PS_TLS_CA", cs->ca);
  o->tls_cert_file = pick(o->tls_cert_file, "PS_TLS_CERT", cs->client_cert);
  o->tls_key_file = pick(o->tls_key_file, "PS_TLS_KEY", cs->client_key);
  o->tls_server_name = opt_or_env(o->tls_server_name, "PS_TLS_SERVER_NAME");
  o->token_file = opt_or_env(o->token_file, "PS_TOKEN_FILE");
  if (o->token_file == NULL) o->token = opt_or_env(o->token, "PS_AUTH_TOKEN");
  if (o->token_file == NULL && o->token == NULL) o->token_file = cs->token_file;
  if ((o->tls_cert_file || o->tls_key_file) && o->tls_ca_file == NULL)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "a client certificate (--tls-cert, PS_TLS_CERT) needs the CA of the "
        "ps certificates too (--tls-ca, PS_TLS_CA)");
  if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "a client certificate needs both --tls-cert and --tls-key "
                         "(PS_TLS_CERT, PS_TLS_KEY)");
  if (o->tls_ca_file &&
      (s->ca = ps_pem_read(o->tls_ca_file, "--tls-ca (PS_TLS_CA)", false, st)) == NULL)
    goto fail;
  if (o->tls_cert_file &&
      ((s->cert = ps_pem_read(o->tls_cert_file, "--tls-cert (PS_TLS_CERT)", false, st)) ==
           NULL ||
       (s->key = ps_pem_read(o->tls_key_file, "--tls-key (PS_TLS_KEY)", true, st)) ==
           NULL ||
       ps_pem_check_pair(s->cert, s->key, o->tls_cert_file, o->tls_key_file, st) != 0))
    goto fail;
  if (o->token_file) {
    if ((s->token = ps_token_read_file(o->token_file, st)) == NULL) goto fail;
  } else if (o->token) {
    if (ps_token_check(o->token, "the token (PS_AUTH_TOKEN)", st) != 0) goto fail;
    if ((s->token = strdup(o->token)) == NULL) {
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      goto fail;
    }
  }
  if (s->token && s->ca == NULL)
    PS_WARN("sending a bearer token without TLS: anyone on the network path can read it "
            "and use it (give the ps certificates' CA: --tls-ca, PS_TLS_CA)");
  s->ch = (ps_rpc_channel_security){.ca_pem = s->ca,
                                    .cert_pem = s->cert,
                                    .key_pem = s->key,
                                    .server_name = o->tls_server_name,
                                    .token = s->token};
  /* the file names are the caller's (or the environment's): not kept */
  o->tls_ca_file = o->tls_cert_file = o->tls_key_file = o->tls_server_name = NULL;
  o->token_file = o->token = NULL;
  return 0;
fail:
  security_free(s);
  return st->code;
}

ps_client *ps_client_create(const ps_cluster *cluster, const char *ps_job,
                            const ps_client_options *opt, ps_status *st) {
  const char *job = ps_job ? ps_job : "ps";
  int n = ps_cluster_num_tasks(cluster, job);
  if (n <= 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "cluster spec has no \"%s\" job", job);
    return NULL;
  }
  ps_client *c = calloc(1, sizeof *c);
  if (c == NULL) goto oom;
  ps_dedup_memo_init(&c->memo);
  if (opt)
    c->opt = *opt;
  else
    ps_client_options_default(&c->opt);
  c->nps = n;
  c->addrs = calloc((size_t)n, sizeof *c->addrs);
  c->ch = calloc((size_t)n, sizeof *c->ch);
  c->calls = calloc((size_t)n, sizeof *c->calls);
  c->wait_us = calloc((size_t)n, sizeof *c->wait_us);
  c->silent_since = calloc((size_t)n, sizeof *c->silent_since);
  if (c->addrs == NULL || c->ch == NULL || c->calls == NULL || c->wait_us == NULL ||
      c->silent_since == NULL)
    goto oom;
  if (timeouts_resolve(&c->opt, st) != 0) {
    ps_client_destroy(c);
    return NULL;
  }
  client_security sec;
  if (security_load(&c->opt, cluster->security, &sec, st) != 0) {
    ps_client_destroy(c);
    return NULL;
  }
  /* a ps is input from outside: its answers are held to a size */
  if (c->opt.max_message_bytes <= 0)
    c->opt.max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  if (c->opt.max_message_bytes < PS_RPC_MIN_MESSAGE_BYTES)
    c->opt.max_message_bytes = PS_RPC_MIN_MESSAGE_BYTES;
  if (c->opt.max_message_bytes > INT_MAX) c->opt.max_message_bytes = INT_MAX;
  sec.ch.max_recv_bytes = c->opt.max_message_bytes;
  for (int i = 0; i < n; i++) {
    const char *a = ps_cluster_address(cluster, job, i);
    if (a == NULL) {
      ps_status_set(st, PS_INVALID_ARGUMENT, "cluster spec has no address for %s/%d", job,
                    i);
      security_free(&sec);
      ps_client_destroy(c);
      return NULL;
    }
    c->addrs[i] = strdup(a);
    c->ch[i] = ps_rpc_channel_create_secure(a, &sec.ch);
    if (c->addrs[i] == NULL || c->ch[i] == NULL) {
      security_free(&sec);
      goto oom;
    }
  }
  c->tls = sec.ch.ca_pem != NULL;
  c->client_cert = sec.ch.cert_pem != NULL;
  security_free(&sec);
  return c;
oom:
  ps_client_destroy(c);
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  return NULL;
}

void ps_client_destroy(ps_client *c) {
  if (c == NULL) return;
  for (int i = 0; i < c->nps; i++) {
    if (c->ch) ps_rpc_channel_destroy(c->ch[i]);
    if (c->addrs) free(c->addrs[i]);
  }
  free(c->ch);
  free(c->addrs);
  free(c->calls);
  free(c->wait_us);
  free(c->silent_since);
  ps_dedup_memo_fini(&c->memo);
  free(c);
}

void ps_client_task_stats(const ps_client *c, int task, unsigned long long *calls,
                          double *wait_secs) {
  *calls = 0;
  *wait_secs = 0;
  if (c == NULL || task < 0 || task >= c->nps) return;
  *calls = atomic_load_explicit(&c->calls[task], memory_order_relaxed);
  *wait_secs =
      (double)atomic_load_explicit(&c->wait_us[task], memory_order_relaxed) / 1e6;
}

double ps_client_task_unanswered_secs(const ps_client *c, int task) {
  if (c == NULL || task < 0 || task >= c->nps) return 0;
  long long since = atomic_load(&c->silent_since[task]);
  if (since == 0) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long now = (long long)ts.tv_sec * 1000000000 + ts.tv_nsec;
  return now > since ? (double)(now - since) / 1e9 : 0;
}

bool ps_client_stalled(const ps_status *st) {
  return st && st->code == PS_DEADLINE_EXCEEDED && strstr(st->msg, " (--rpc-timeout)");
}

int64_t ps_client_rpc_timeout_ms(const ps_client *c) {
  return c ? c->opt.rpc_timeout_ms : 0;
}

int ps_client_num_ps(const ps_client *c) {
  return c->nps;
}
const char *ps_client_address(const ps_client *c, int task) {
  return task >= 0 && task < c->nps ? c->addrs[task] : NULL;
}

static int check_task(ps_client *c, int task, ps_status *st) {
  if (task < 0 || task >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ps task %d does not exist (the cluster has %d)", task, c->nps);
  return 0;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* A failed connection whose cause is a TLS setting on one side names it
 * (gRPC's text says only what OpenSSL saw). */
static void tls_hint(ps_client *c, ps_status *st) {
  const char *hint = NULL;
  if (strstr(st->msg, "wrong version number"))
    hint = "the ps does not serve TLS: drop --tls-ca (PS_TLS_CA), or start the ps with "
           "--tls-cert and --tls-key";
  else if (strstr(st->msg, "certificate verify failed"))
    hint =
        "the ps certificate is not signed by --tls-ca (PS_TLS_CA), or does not name the "
        "host dialled (--tls-server-name)";
  else if (strstr(st->msg, "Socket closed") && !c->tls)
    hint = "if the ps serves TLS, give --tls-ca (PS_TLS_CA); if it asks for client "
           "certificates, --tls-cert and --tls-key too";
  else if ((strstr(st->msg, "Socket closed") || strstr(st->msg, "Connection reset")) &&
           c->tls && !c->client_cert)
    hint =
        "if the ps asks for client certificates (--tls-client-ca), give --tls-cert and "
        "--tls-key (PS_TLS_CERT, PS_TLS_KEY)";
  if (hint == NULL) return;
  size_t n = strlen(st->msg);
  snprintf(st->msg + n, sizeof st->msg - n, " (%s)", hint);
}

/* Whether RESOURCE_EXHAUSTED text @msg is this client's gRPC refusing an
 * answer over max_message_bytes.  gRPC's wording varies between versions
 * ("Received message larger than max (N vs. M)", "grpc: received message
 * larger than max ..."): any "larger than max" that is not about a sent
 * message, not a ps's own limit text, and names no other limit than ours. */
static bool over_recv_limit(const ps_client *c, const char *msg) {
  const char *at = strcasestr(msg, "larger than max");
  if (at == NULL || strcasestr(msg, "sent message") || strstr(msg, "--max-message-bytes"))
    return false;
  const char *vs = strstr(at, " vs. ");
  if (vs == NULL) return true;
  char *end;
  long long lim = strtoll(vs + 5, &end, 10);
  return end == vs + 5 || lim == (long long)c->opt.max_message_bytes;
}

/* Transport errors get the task's name and address; errors the ps sent
 * (TensorFlow's texts) pass through unchanged. */
static void annotate(ps_client *c, int task, ps_status *st) {
  switch (st->code) {
  case PS_UNAVAILABLE:
  case PS_DEADLINE_EXCEEDED:
  case PS_CANCELLED:
  case PS_UNKNOWN:
  case PS_INTERNAL:
    ps_status_prefix(st, "ps/%d at %s", task, c->addrs[task]);
    tls_hint(c, st);
    break;
  case PS_RESOURCE_EXHAUSTED:
    if (over_recv_limit(c, st->msg)) {
      ps_status_prefix(st, "ps/%d at %s", task, c->addrs[task]);
      size_t n = strlen(st->msg);
      snprintf(st->msg + n, sizeof st->msg - n,
               ": an answer over the limit of %lld bytes (--max-message-bytes)",
               (long long)c->opt.max_message_bytes);
    }
    break;
  default:
    break;
  }
}

/* ---- answers ----
 *
 * A ps is input from outside: every answer is checked against its request
 * (counts, names, dtypes, shapes, byte sizes) before anything is used or
 * allocated, and a call answered OK without its header message fails.
 * Each decoder runs through on_answer, which notes that the header came. */

typedef int (*parse_fn)(void *, const uint8_t *, size_t, ps_rpc_segs *, ps_status *);

typedef struct answer {
  parse_fn parse;
  void *user;
  const char *about; /* a variable the call is about, for errors (or NULL) */
  bool seen;         /* the header arrived */
  const char *method;
  int64_t max_message_bytes; /* the client's receive limit */
  int task;
  const char *addr;
} answer;

static int wire_next(const uint8_t **q, const uint8_t *end, uint64_t *field,
                     const uint8_t **val, size_t *len);
static const char *method_name(const char *method);
static int parse_list(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st);

/* The most top-level entries an answer may have: each unpacked entry (a
 * name's pointer and its smallest allocation) takes some 40 bytes, so at
 * most 4 times the receive limit.  A 32 MiB answer of 16 million empty
 * names took 640 MiB in protobuf-c's unpack before any check. */
static size_t answer_max_entries(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  return (size_t)max_message_bytes * 4 / 40;
}

static int on_answer(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                     ps_status *st) {
  answer *a = user;
  a->seen = true;
  const uint8_t *q = p, *end = p + n, *val;
  uint64_t field;
  size_t len, count = 0, most = answer_max_entries(a->max_message_bytes);
  while (wire_next(&q, end, &field, &val, &len) > 0)
    count++;
  if (count > most && a->parse != parse_list) /* List's own cap is lower */
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d at %s: %s: %zu entries, more than the %zu a client "
                         "holds with a limit of %lld bytes (--max-message-bytes)",
                         a->task, a->addr, method_name(a->method), count, most,
                         (long long)a->max_message_bytes);
  return a->parse(a->user, p, n, sink, st);
}

/* "Read" of "/paramserver.Ps/Read". */
static const char *method_name(const char *method) {
  const char *s = strrchr(method, '/');
  return s ? s + 1 : method;
}

/* INTERNAL: the ps broke the protocol ("Read: ..."); the task is added by
 * annotate(). */
static int bad_answer(ps_status *st, const char *method, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad_answer(ps_status *st, const char *method, const char *fmt, ...) {
  char m[PS_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return ps_status_set(st, PS_INTERNAL, "%s: %s", method_name(method), m);
}

static void answer_init(const ps_client *c, int task, ps_rpc_req *r, answer *a,
                        parse_fn parse, void *user, const char *about) {
  *a = (answer){.parse = parse,
                .user = user,
                .about = about,
                .method = r->method,
                .max_message_bytes = c->opt.max_message_bytes,
                .task = task,
                .addr = c->addrs[task]};
  if (parse == NULL) return;
  r->on_header = on_answer;
  r->user = a;
}

/* An OK call whose header never came fails. */
static void answer_check(ps_rpc_req *r) {
  if (r->on_header != on_answer || r->st.code != PS_OK) return;
  const answer *a = r->user;
  if (a->seen) return;
  if (a->about)
    bad_answer(&r->st, r->method, "the answer has no header (variable %s)", a->about);
  else
    bad_answer(&r->st, r->method, "the answer has no header");
}

/* Runs @reqs (one per task in @tasks); retries UNAVAILABLE ones if @safe. */
/* Counts each call's wait against its task. */
static void count_waits(ps_client *c, const ps_rpc_req *reqs, const int *tasks,
                        size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (tasks[i] < 0 || tasks[i] >= c->nps) continue;
    atomic_fetch_add_explicit(&c->calls[tasks[i]], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->wait_us[tasks[i]],
                              (unsigned long long)(reqs[i].elapsed_secs * 1e6),
                              memory_order_relaxed);
  }
}

/* A connection the ps accepted but never answered on (the kernel takes it
 * for a stopped process): the call never reached the ps, so it may be
 * tried again whatever it is, until the rpc timeout. */
static bool no_handshake(const ps_status *st) {
  return st->code == PS_UNAVAILABLE && strstr(st->msg, "before receiving SETTINGS frame");
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether call @r is tried again: UNAVAILABLE ones of @safe calls up to
 * max_retries times, and ones that found no answering ps (no_handshake)
 * until the rpc timeout has passed since @t0. */
static bool try_again(const ps_client *c, const ps_rpc_req *r, bool safe, int attempt,
                      int64_t t0) {
  if (no_handshake(&r->st)) return mono_ms() - t0 < r->stall_timeout_ms;
  return safe && attempt < c->opt.max_retries && r->st.code == PS_UNAVAILABLE;
}

static void run_reqs(ps_client *c, ps_rpc_req *reqs, const int *tasks, size_t n,
                     bool safe) {
  int64_t t0 = mono_ms();
  ps_rpc_run(reqs, n);
  count_waits(c, reqs, tasks, n);
  int64_t backoff = c->opt.retry_initial_ms;
  for (int attempt = 0;; attempt++) {
    size_t nretry = 0;
    for (size_t i = 0; i < n; i++)
      nretry += try_again(c, &reqs[i], safe, attempt, t0);
    if (nretry == 0) break;
    PS_DEBUG("retrying %zu call(s) after UNAVAILABLE in %lld ms", nretry,
             (long long)backoff);
    sleep_ms(backoff);
    backoff = backoff * 2 > c->opt.retry_max_ms ? c->opt.retry_max_ms : backoff * 2;
    ps_rpc_req *again = malloc(nretry * sizeof *again);
    size_t *which = malloc(nretry * sizeof *which);
    if (again == NULL || which == NULL) {
      free(again);
      free(which);
      break;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (try_again(c, &reqs[i], safe, attempt, t0) && k < nretry) {
        which[k] = i;
        again[k] = reqs[i];
        again[k].priv_ = NULL;
        ps_status_clear(&again[k].st);
        if (again[k].on_header == on_answer) ((answer *)again[k].user)->seen = false;
        k++;
      }
    ps_rpc_run(again, k);
    for (size_t j = 0; j < k; j++) {
      reqs[which[j]].st = again[j].st;
      int t = tasks[which[j]];
      count_waits(c, &again[j], &t, 1);
    }
    free(again);
    free(which);
  }
  for (size_t i = 0; i < n; i++) {
    if (no_handshake(&reqs[i].st)) { /* as a call on an open connection says it */
      const char *m = strrchr(reqs[i].method, '/');
      ps_status_set(&reqs[i].st, PS_DEADLINE_EXCEEDED,
                    "%s: no answer for %g s (--rpc-timeout)", m ? m + 1 : reqs[i].method,
                    (double)reqs[i].stall_timeout_ms / 1000);
    }
    answer_check(&reqs[i]);
    annotate(c, tasks[i], &reqs[i].st);
  }
}

static void req_init(ps_client *c, ps_rpc_req *r, int task, const char *method,
                     const ProtobufCMessage *msg, bool unary, bool data) {
  memset(r, 0, sizeof *r);
  r->ch = c->ch[task];
  r->method = method;
  r->request = msg;
  r->unary_response = unary;
  r->timeout_ms = data ? c->opt.data_timeout_ms : c->opt.control_timeout_ms;
  /* a ps that stops answering: ps_client_options.rpc_timeout_ms */
  r->stall_timeout_ms = c->opt.rpc_timeout_ms;
  r->probe_method = M_STATUS;
  r->silent_since_ns = &c->silent_since[task];
}

/* One control call with a unary response parsed by @parse. */
static int control_call(ps_client *c, int task, const char *method,
                        const ProtobufCMessage *msg, bool safe, parse_fn parse,
                        void *user, ps_status *st) {
  if (check_task(c, task, st)) return st->code;
  ps_rpc_req r;
  answer a;
  req_init(c, &r, task, method, msg, true, false);
  answer_init(c, task, &r, &a, parse, user, NULL);
  run_reqs(c, &r, &task, 1, safe);
  if (st) *st = r.st;
  return r.st.code;
}

static void init_to_proto(const ps_init_spec *in, Paramserver__Initializer *p) {
  paramserver__initializer__init(p);
  p->type = (char *)ps_init_type_name(in->type);
  p->value = in->value;
  p->values = (double *)in->values;
  p->n_values = in->nvalues;
  p->minval = in->minval;
  p->maxval = in->maxval;
  p->mean = in->mean;
  p->stddev = in->stddev;
  p->scale = in->scale;
  static const char *const modes[] = {"fan_in", "fan_out", "fan_avg"};
  static const char *const dists[] = {"truncated_normal", "untruncated_normal",
                                      "uniform"};
  p->mode = (char *)modes[in->mode % 3];
  p->distribution = (char *)dists[in->distribution % 3];
  p->seed = in->seed;
}

/* ---- checks of answers ---- */

/* Strings of an answer with control characters, or over the limit of a
 * name, are refused before anything is unpacked (a name printed by psctl
 * must not carry terminal escapes). */
static int wire_ok(const ProtobufCMessageDescriptor *d, const char *method,
                   const uint8_t *p, size_t n, ps_status *st) {
  ps_status w;
  ps_status_clear(&w);
  if (ps_wire_check_strings(d, p, n, "answer", &w) == 0) return 0;
  return bad_answer(st, method, "%s", w.msg);
}

/* The bytes of the biggest tensor an answer may announce: this machine's
 * memory.  Checked before the allocator is asked. */
static size_t tensor_limit(void) {
  static _Atomic size_t lim;
  size_t l = atomic_load(&lim);
  if (l == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0 || ps_size_mul((size_t)pages, (size_t)psz, &l) != 0)
      l = PS_SIZE_MAX;
    atomic_store(&lim, l);
  }
  return l;
}

/* Reads a varint at *@q (before @end); -1 if malformed. */
static int wire_varint(const uint8_t **q, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*q >= end) return -1;
    uint8_t b = *(*q)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The next top-level field at *@q: its number, and for a length-delimited
 * one its bytes (@val, @len; else @val NULL).  1: a field, 0: the end,
 * -1: malformed. */
static int wire_next(const uint8_t **q, const uint8_t *end, uint64_t *field,
                     const uint8_t **val, size_t *len) {
  if (*q >= end) return 0;
  uint64_t key, v;
  if (wire_varint(q, end, &key) != 0) return -1;
  *field = key >> 3;
  *val = NULL;
  *len = 0;
  switch (key & 7) {
  case 0:
    return wire_varint(q, end, &v) == 0 ? 1 : -1;
  case 1:
  case 5: {
    size_t w = (key & 7) == 1 ? 8 : 4;
    if ((size_t)(end - *q) < w) return -1;
    *q += w;
    return 1;
  }
  case 2:
    if (wire_varint(q, end, &v) != 0 || v > (uint64_t)(end - *q)) return -1;
    *val = *q;
    *len = (size_t)v;
    *q += v;
    return 1;
  default:
    return -1;
  }
}

/* A shape and dtype of an answer: a dtype with a size, a rank of at most
 * PS_MAX_RANK, dims >= 0, a byte size that fits and that this machine
 * could hold (*@bytes). */
static int answer_shape(int task, const char *method, const char *name, int dtype,
                        const int64_t *dims, size_t rank, ps_shape *out, size_t *bytes,
                        ps_status *st) {
  if (ps_dtype_size(dtype) == 0)
    return bad_answer(st, method, "variable %s has dtype %d, not a dtype", name, dtype);
  if (rank > PS_MAX_RANK)
    return bad_answer(st, method, "variable %s has rank %zu, above the maximum of %d",
                      name, rank, PS_MAX_RANK);
  for (size_t i = 0; i < rank; i++)
    if (dims[i] < 0)
      return bad_answer(st, method, "variable %s has a negative dimension (%lld)", name,
                        (long long)dims[i]);
  ps_shape_set(out, dims, rank, NULL);
  size_t b;
  char sh[256];
  if (ps_size_bytes(dtype, out, &b) != 0)
    return bad_answer(st, method, "variable %s: %s of shape %s has too many bytes", name,
                      ps_dtype_name(dtype), ps_shape_format(out, sh, sizeof sh));
  if (b > tensor_limit())
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d: %s: variable %s: %s of shape %s is %zu bytes, more "
                         "than this machine's memory (%zu bytes)",
                         task, method_name(method), name, ps_dtype_name(dtype),
                         ps_shape_format(out, sh, sizeof sh), b, tensor_limit());
  *bytes = b;
  return 0;
}

/* Every string of an answer's list is a name: not empty. */
static int names_ok(const char *method, const char *what, char **v, size_t n,
                    ps_status *st) {
  for (size_t i = 0; i < n; i++)
    if (v[i] == NULL || v[i][0] == '\0')
      return bad_answer(st, method, "%s %zu is empty", what, i);
  return 0;
}

/* ---- the checkpoint key space across tasks ---- */

static const char *spec_full(const ps_var_spec *s) {
  return s->full_name && strcmp(s->full_name, s->name) != 0 ? s->full_name : NULL;
}

static const char *info_key(const ps_var_info *v) {
  return v->full_name ? v->full_name : v->name;
}

static int cmp_info_name(const void *a, const void *b) {
  return strcmp((*(ps_var_info *const *)a)->name, (*(ps_var_info *const *)b)->name);
}

static int cmp_info_key(const void *a, const void *b) {
  return strcmp(info_key(*(ps_var_info *const *)a), info_key(*(ps_var_info *const *)b));
}

/* The first of @by (sorted by @cmp) equal to @probe, or -1. */
static ptrdiff_t lower_bound(ps_var_info **by, size_t n, ps_var_info *probe,
                             int (*cmp)(const void *, const void *)) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp(&by[mid], &probe) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && cmp(&by[lo], &probe) == 0 ? (ptrdiff_t)lo : -1;
}

/* Would @s, created on ps @task, share a checkpoint key with one of
 * @vars of another task in a way no checkpoint can hold? */
static int key_conflict(int task, const ps_var_spec *s, ps_var_info **by_name,
                        ps_var_info **by_key, size_t nv, ps_status *st) {
  char a[256], b[256];
  const char *full = spec_full(s), *key = full ? full : s->name;
  ps_var_info probe = {.name = (char *)s->name};
  ptrdiff_t i = lower_bound(by_name, nv, &probe, cmp_info_name);
  if (i >= 0)
    return ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s: a variable of that name is on ps/%d; creating "
                         "it on ps/%d too would put it twice in every checkpoint",
                         s->name, by_name[i]->task, task);
  probe.name = (char *)key;
  i = lower_bound(by_key, nv, &probe, cmp_info_key);
  for (; i >= 0 && (size_t)i < nv && !strcmp(info_key(by_key[i]), key); i++) {
    const ps_var_info *v = by_key[i];
    if (full == NULL)
      return ps_status_set(st, PS_ALREADY_EXISTS,
                           "variable %s: %s is the full name of the partitioned "
                           "variable whose part %s is on ps/%d; a checkpoint cannot "
                           "hold both under one name",
                           s->name, s->name, v->name, v->task);
    if (v->full_name == NULL)
      return ps_status_set(st, PS_ALREADY_EXISTS,
                           "variable %s: its full name %s is a variable on ps/%d; a "
                           "checkpoint cannot hold both under one name",
                           s->name, full, v->task);
    const ps_shape *fs = s->full_shape ? s->full_shape : &s->shape;
    if (v->dtype != s->dtype || !ps_shape_equal(&v->full_shape, fs))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: part of %s with dtype %s and full shape %s, "
                           "but its part %s on ps/%d has dtype %s and full shape %s",
                           s->name, full, ps_dtype_name(s->dtype),
                           ps_shape_format(fs, a, sizeof a), v->name, v->task,
                           ps_dtype_name(v->dtype),
                           ps_shape_format(&v->full_shape, b, sizeof b));
    int64_t n = ps_shape_num_elements(&s->shape), pn = ps_shape_num_elements(&v->shape);
    int64_t po = v->offset, o = s->offset;
    if (n > 0 && pn > 0 && o < po + pn && po < o + n)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: its elements [%lld, %lld) of %s overlap "
                           "those of part %s [%lld, %lld) on ps/%d",
                           s->name, (long long)o, (long long)(o + n), full, v->name,
                           (long long)po, (long long)(po + pn), v->task);
  }
  return 0;
}

/* The key-space rules of ps_client_create_vars() against every other task. */
static int check_key_space(ps_client *c, int task, const ps_var_spec *specs, size_t n,
                           ps_status *st) {
  int rc = 0;
  for (int u = 0; u < c->nps && rc == 0; u++) {
    if (u == task) continue;
    ps_var_info *v = NULL;
    size_t nv = 0;
    ps_status lst;
    if (ps_client_list(c, u, &v, &nv, &lst) != 0) {
      PS_WARN("creating variables on ps/%d: ps/%d not checked for checkpoint key "
              "conflicts: %s",
              task, u, lst.msg);
      continue;
    }
    ps_var_info **by_name = calloc(nv + 1, sizeof *by_name);
    ps_var_info **by_key = calloc(nv + 1, sizeof *by_key);
    if (by_name == NULL || by_key == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      for (size_t i = 0; i < nv; i++)
        by_name[i] = by_key[i] = &v[i];
      qsort(by_name, nv, sizeof *by_name, cmp_info_name);
      qsort(by_key, nv, sizeof *by_key, cmp_info_key);
      for (size_t i = 0; i < n && rc == 0; i++)
        rc = key_conflict(task, &specs[i], by_name, by_key, nv, st);
    }
    free(by_name);
    free(by_key);
    ps_client_free_var_info(v, nv);
  }
  return rc;
}

int ps_client_create_vars(ps_client *c, int task, const ps_var_spec *specs, size_t n,
                          ps_status *st) {
  if (check_task(c, task, st)) return st->code;
  for (size_t i = 0; i < n; i++)
    if (specs[i].name == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "Create: variable %zu has no name",
                           i);
  /* the coordinator's own names (heartbeats, marks: "_coordinator/...")
   * never go into a checkpoint: no List of every other ps for each */
  bool own = n > 0;
  for (size_t i = 0; i < n && own; i++)
    own = strncmp(specs[i].name, "_coordinator/", 13) == 0;
  if (c->nps > 1 && !own) {
    int rc = check_key_space(c, task, specs, n, st);
    if (rc != 0) return rc;
  }
  Paramserver__VariableSpec *vs = calloc(n + 1, sizeof *vs);
  Paramserver__VariableSpec **vp = calloc(n + 1, sizeof *vp);
  Paramserver__Initializer *inits = calloc(n + 1, sizeof *inits);
  if (!vs || !vp || !inits) {
    free(vs);
    free(vp);
    free(inits);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    paramserver__variable_spec__init(&vs[i]);
    vs[i].name = (char *)specs[i].name;
    vs[i].dtype = specs[i].dtype;
    vs[i].shape = (int64_t *)specs[i].shape.dim;
    vs[i].n_shape = (size_t)specs[i].shape.rank;
    if (specs[i].init) {
      init_to_proto(specs[i].init, &inits[i]);
      if (specs[i].full_name) inits[i].full_name = (char *)specs[i].full_name;
      if (specs[i].full_shape) {
        inits[i].full_shape = (int64_t *)specs[i].full_shape->dim;
        inits[i].n_full_shape = (size_t)specs[i].full_shape->rank;
      }
      inits[i].offset = specs[i].offset;
      vs[i].initializer = &inits[i];
    }
    vp[i] = &vs[i];
  }
  Paramserver__CreateRequest req = PARAMSERVER__CREATE_REQUEST__INIT;
  req.vars = vp;
  req.n_vars = n;
  int rc = control_call(c, task, M_CREATE, &req.base, true, NULL, NULL, st);
  free(vs);
  free(vp);
  free(inits);
  return rc;
}

typedef struct init_out {
  size_t n;
  size_t asked; /* names in the request (0: every variable) */
} init_out;

static int parse_initialize(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                            ps_status *st) {
  init_out *o = user;
  if (wire_ok(&paramserver__initialize_response__descriptor, M_INITIALIZE, p, n, st))
    return st->code;
  Paramserver__InitializeResponse *r =
      paramserver__initialize_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_INITIALIZE, "the answer does not parse");
  int rc =
      names_ok(M_INITIALIZE, "initialized name", r->initialized, r->n_initialized, st);
  if (rc == 0 && o->asked > 0 && r->n_initialized > o->asked)
    rc = bad_answer(st, M_INITIALIZE, "%zu variables initialized for %zu names",
                    r->n_initialized, o->asked);
  if (rc == 0) o->n = r->n_initialized;
  paramserver__initialize_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_initialize(ps_client *c, int task, const char *const *names, size_t n,
                         bool only_uninitialized, size_t *ninit, ps_status *st) {
  Paramserver__InitializeRequest req = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  req.only_uninitialized = only_uninitialized;
  init_out out = {0, n};
  int rc = control_call(c, task, M_INITIALIZE, &req.base, only_uninitialized,
                        parse_initialize, &out, st);
  if (ninit) *ninit = out.n;
  return rc;
}

typedef struct bools_out {
  bool *out;
  size_t n;
  const char *first; /* the first name asked, for errors */
} bools_out;

static int parse_is_init(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st) {
  bools_out *o = user;
  Paramserver__IsInitializedResponse *r =
      paramserver__is_initialized_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_IS_INIT, "the answer does not parse");
  int rc = 0;
  if (o->n > 0 && r->n_initialized != o->n)
    rc = bad_answer(st, M_IS_INIT, "%zu answers for %zu names (%s%s)", r->n_initialized,
                    o->n, o->first, o->n > 1 ? ", ..." : "");
  for (size_t i = 0; rc == 0 && i < o->n; i++)
    o->out[i] = r->initialized[i];
  paramserver__is_initialized_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_is_initialized(ps_client *c, int task, const char *const *names, size_t n,
                             bool *out, ps_status *st) {
  Paramserver__NamesRequest req = PARAMSERVER__NAMES_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  bools_out o = {out, n, n ? names[0] : ""};
  return control_call(c, task, M_IS_INIT, &req.base, true, parse_is_init, &o, st);
}

typedef struct names_out {
  char **names;
  size_t n;
  size_t asked; /* names in the request (0: every variable) */
} names_out;

static int parse_report(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  names_out *o = user;
  if (wire_ok(&paramserver__report_uninitialized_response__descriptor, M_REPORT, p, n,
              st))
    return st->code;
  Paramserver__ReportUninitializedResponse *r =
      paramserver__report_uninitialized_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_REPORT, "the answer does not parse");
  ps_client_free_names(o->names, o->n);
  o->names = NULL;
  o->n = 0;
  int rc = names_ok(M_REPORT, "name", r->names, r->n_names, st);
  if (rc == 0 && o->asked > 0 && r->n_names > o->asked)
    rc = bad_answer(st, M_REPORT, "%zu uninitialized variables for %zu names", r->n_names,
                    o->asked);
  if (rc == 0 && (o->names = calloc(r->n_names + 1, sizeof *o->names)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_names; i++) {
    if ((o->names[i] = strdup(r->names[i])) == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    else
      o->n++;
  }
  paramserver__report_uninitialized_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_report_uninitialized(ps_client *c, int task, const char *const *names,
                                   size_t n, char ***out, size_t *nout, ps_status *st) {
  Paramserver__NamesRequest req = PARAMSERVER__NAMES_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  names_out o = {NULL, 0, n};
  int rc = control_call(c, task, M_REPORT, &req.base, true, parse_report, &o, st);
  if (rc != 0) {
    ps_client_free_names(o.names, o.n);
    o.names = NULL;
    o.n = 0;
  }
  *out = o.names;
  *nout = o.n;
  return rc;
}

static int copy_names(char **in, size_t n, char ***out, size_t *nout, ps_status *st) {
  *out = calloc(n + 1, sizeof **out);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (((*out)[i] = strdup(in[i])) == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    (*nout)++;
  }
  return 0;
}

typedef struct delete_out {
  ps_delete_result *out;
  size_t asked;
} delete_out;

static int parse_delete(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  delete_out *d = user;
  ps_delete_result *o = d->out;
  ps_delete_result_free(o); /* a header parsed again */
  if (wire_ok(&paramserver__delete_response__descriptor, M_DELETE, p, n, st))
    return st->code;
  Paramserver__DeleteResponse *r = paramserver__delete_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_DELETE, "the answer does not parse");
  int rc = names_ok(M_DELETE, "deleted name", r->deleted, r->n_deleted, st);
  if (rc == 0) rc = names_ok(M_DELETE, "missing name", r->missing, r->n_missing, st);
  if (rc == 0 && r->n_missing > d->asked)
    rc = bad_answer(st, M_DELETE, "%zu names missing of %zu asked", r->n_missing,
                    d->asked);
  if (rc == 0) rc = copy_names(r->deleted, r->n_deleted, &o->deleted, &o->ndeleted, st);
  if (rc == 0) rc = copy_names(r->missing, r->n_missing, &o->missing, &o->nmissing, st);
  paramserver__delete_response__free_unpacked(r, NULL);
  return rc;
}

void ps_delete_result_free(ps_delete_result *r) {
  if (r == NULL) return;
  ps_client_free_names(r->deleted, r->ndeleted);
  ps_client_free_names(r->missing, r->nmissing);
  memset(r, 0, sizeof *r);
}

int ps_client_delete(ps_client *c, int task, const char *const *names, size_t n,
                     int flags, ps_delete_result *out, ps_status *st) {
  Paramserver__DeleteRequest req = PARAMSERVER__DELETE_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  req.with_slots = (flags & PS_DELETE_SLOTS) != 0;
  req.missing_ok = (flags & PS_DELETE_MISSING_OK) != 0;
  ps_delete_result o = {0};
  delete_out d = {&o, n};
  int rc = control_call(c, task, M_DELETE, &req.base, false, parse_delete, &d, st);
  if (rc != 0 || out == NULL) ps_delete_result_free(&o);
  if (out) *out = o;
  return rc;
}

static int parse_shutdown(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                          ps_status *st) {
  (void)user;
  Paramserver__ShutdownResponse *r = paramserver__shutdown_response__unpack(NULL, n, p);
  if (r == NULL)
    return ps_status_set(st, PS_INTERNAL, "Shutdown: response does not parse");
  paramserver__shutdown_response__free_unpacked(r, NULL);
  return 0;
}

int ps_client_shutdown(ps_client *c, int task, const char *reason, ps_status *st) {
  Paramserver__ShutdownRequest req = PARAMSERVER__SHUTDOWN_REQUEST__INIT;
  req.reason = (char *)(reason ? reason : "");
  return control_call(c, task, M_SHUTDOWN, &req.base, false, parse_shutdown, NULL, st);
}

void ps_client_free_names(char **names, size_t n) {
  if (names == NULL) return;
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* ---- updates ---- */

typedef struct upd_build {
  answer ans;
  Paramserver__UpdateRequest req;
  Paramserver__Update *us;
  Paramserver__Update **up;
  ps_rpc_segs segs;
  uint8_t *inline_buf;
  /* asynchronous scatter-adds whose ids repeat go with one summed row
   * per distinct id (@combine): the ids, the sums */
  ps_gather_dedup *dd;
  ps_tensor **sums;
  Paramserver__Initializer *fills; /* per update with a fill */
  size_t n;
  bool combined;
  ps_dedup_memo *memo;
} upd_build;

/* Sums the rows of repeated ids of scatter-add/sub update @u into @b's
 * slot @i; the ids and rows to send then are those of b->dd[i], b->sums[i]. */
static int upd_combine(upd_build *b, size_t i, const ps_update *u, ps_status *st) {
  if ((u->op != PS_SCATTER_ADD && u->op != PS_SCATTER_SUB) || u->replicas_to_aggregate)
    return 0; /* a synchronous accumulator keeps every row as today */
  int r = ps_gather_dedup_init_memo(b->memo, &b->dd[i], u->indices);
  if (r < 0) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (r > 0 && (b->sums[i] = ps_dedup_sum_rows(&b->dd[i], u->value)) == NULL)
    ps_gather_dedup_fini(&b->dd[i]); /* not a shape to sum: sent as it is */
  b->combined |= b->sums[i] != NULL;
  return 0;
}

static int upd_build_init(upd_build *b, ps_dedup_memo *memo, const ps_update *u, size_t n,
                          bool combine, ps_status *st) {
  memset(b, 0, sizeof *b);
  b->memo = memo;
  paramserver__update_request__init(&b->req);
  b->us = calloc(n + 1, sizeof *b->us);
  b->up = calloc(n + 1, sizeof *b->up);
  b->dd = calloc(n + 1, sizeof *b->dd);
  b->sums = calloc(n + 1, sizeof *b->sums);
  b->fills = calloc(n + 1, sizeof *b->fills);
  b->n = n;
  if (!b->us || !b->up || !b->dd || !b->sums || !b->fills)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    Paramserver__Update *p = &b->us[i];
    paramserver__update__init(p);
    const ps_update_fill *f = u[i].fill;
    if ((u[i].value == NULL && f == NULL) || u[i].name == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "update %zu has no %s", i,
                           u[i].name ? "value" : "name");
    if (f && (u[i].value || u[i].op != PS_ASSIGN || f->init == NULL))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "update of %s: a fill is an assign of an initializer, "
                           "without a value",
                           u[i].name);
    p->name = (char *)u[i].name;
    p->op = (Paramserver__UpdateOp)u[i].op;
    p->dtype = f ? f->dtype : u[i].value->dtype;
    p->shape = (int64_t *)(f ? f->shape.dim : u[i].value->shape.dim);
    p->n_shape = (size_t)(f ? f->shape.rank : u[i].value->shape.rank);
    if (f) {
      init_to_proto(f->init, &b->fills[i]);
      if (f->full_name) b->fills[i].full_name = (char *)f->full_name;
      if (f->full_shape) {
        b->fills[i].full_shape = (int64_t *)f->full_shape->dim;
        b->fills[i].n_full_shape = (size_t)f->full_shape->rank;
      }
      b->fills[i].offset = f->offset;
      p->fill = &b->fills[i];
      p->fill_seed = f->seed;
      p->fill_draw = f->draw;
    }
    p->no_validate_shape = u[i].no_validate_shape;
    if ((u[i].nslots && u[i].slots == NULL) || (u[i].nhparams && u[i].hparams == NULL))
      return ps_status_set(st, PS_INVALID_ARGUMENT, "update of %s: %s is NULL", u[i].name,
                           u[i].nslots && !u[i].slots ? "slots" : "hparams");
    for (size_t k = 0; k < u[i].nslots; k++)
      if (u[i].slots[k] == NULL)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "update of %s: slot %zu has no name", u[i].name, k);
    p->slots = (char **)u[i].slots;
    p->n_slots = u[i].nslots;
    p->hparams = (double *)u[i].hparams;
    p->n_hparams = u[i].nhparams;
    p->use_nesterov = u[i].use_nesterov;
    p->replicas_to_aggregate = u[i].replicas_to_aggregate;
    p->sync_local_step = u[i].sync_local_step;
    bool scatter = u[i].op >= PS_SCATTER_UPDATE && u[i].op <= PS_SCATTER_SUB;
    if (scatter || (u[i].op >= PS_APPLY_GRADIENT_DESCENT && u[i].indices)) {
      const ps_tensor *ix = u[i].indices;
      if (ix == NULL || ix->shape.rank != 1 ||
          (ix->dtype != PS_DT_INT32 && ix->dtype != PS_DT_INT64))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s %s: indices must be a 1-D int32 or int64 tensor",
                             scatter ? "scatter on" : "sparse gradient of", u[i].name);
      p->index_dtype = ix->dtype;
      p->num_indices = ix->shape.dim[0];
      if (combine && upd_combine(b, i, &u[i], st) != 0) return st->code;
      if (b->sums[i]) {
        ix = b->dd[i].uix;
        p->num_indices = b->dd[i].nu;
        p->shape = (int64_t *)b->sums[i]->shape.dim;
      }
      ps_rpc_segs_add(&b->segs, ps_tensor_data(ix), ps_tensor_nbytes(ix), ix->buf);
    }
    const ps_tensor *val = b->sums[i] ? b->sums[i] : u[i].value;
    if (val)
      ps_rpc_segs_add(&b->segs, ps_tensor_data(val), ps_tensor_nbytes(val), val->buf);
    b->up[i] = p;
  }
  b->req.updates = b->up;
  b->req.n_updates = n;
  if (b->segs.total > 0 && b->segs.total <= PS_RPC_INLINE_MAX) {
    /* Small updates: the bytes ride in the header, one message per call. */
    b->inline_buf = malloc(b->segs.total);
    if (b->inline_buf == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    size_t off = 0;
    for (size_t i = 0; i < b->segs.n; i++) {
      memcpy(b->inline_buf + off, b->segs.v[i].ptr, b->segs.v[i].len);
      off += b->segs.v[i].len;
    }
    b->req.inline_data.data = b->inline_buf;
    b->req.inline_data.len = off;
    ps_rpc_segs_fini(&b->segs);
  }
  return 0;
}

static void upd_build_fini(upd_build *b) {
  for (size_t i = 0; i < b->n && b->dd && b->sums; i++) {
    ps_gather_dedup_fini(&b->dd[i]);
    ps_tensor_destroy(b->sums[i]);
  }
  free(b->dd);
  free(b->sums);
  free(b->fills);
  free(b->us);
  free(b->up);
  free(b->inline_buf);
  ps_rpc_segs_fini(&b->segs);
}

/* Fills the updates' results (synchronous ones: stale or applied). */
static int parse_update(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  ps_task_updates *t = user;
  Paramserver__UpdateResponse *r = paramserver__update_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_UPDATE, "the answer does not parse");
  int rc = 0;
  if (r->n_versions != t->n || (r->n_stale != 0 && r->n_stale != t->n) ||
      (r->n_sync_steps != 0 && r->n_sync_steps != t->n))
    rc = bad_answer(st, M_UPDATE,
                    "%zu versions, %zu stale flags and %zu steps for %zu updates (%s%s)",
                    r->n_versions, r->n_stale, r->n_sync_steps, t->n,
                    t->n ? t->updates[0].name : "", t->n > 1 ? ", ..." : "");
  for (size_t i = 0; rc == 0 && i < t->n; i++) {
    ps_update_result *res = t->updates[i].result;
    if (res == NULL) continue;
    res->version = r->versions[i];
    res->stale = i < r->n_stale && r->stale[i];
    res->sync_step = i < r->n_sync_steps ? r->sync_steps[i] : 0;
  }
  paramserver__update_response__free_unpacked(r, NULL);
  return rc;
}

/* Builds task @t's Update request into @b and @r; @combine: repeated ids
 * of asynchronous scatters go summed (upd_combine). */
static int upd_request(ps_client *c, ps_task_updates *t, upd_build *b, ps_rpc_req *r,
                       bool combine, ps_status *st) {
  int rc = upd_build_init(b, &c->memo, t->updates, t->n, combine, st);
  if (rc != 0) return rc;
  req_init(c, r, t->task, M_UPDATE, &b->req.base, true, true);
  r->send = &b->segs;
  answer_init(c, t->task, r, &b->ans, parse_update, t, t->n ? t->updates[0].name : NULL);
  return 0;
}

int ps_client_update_many(ps_client *c, ps_task_updates *t, size_t n, ps_status *st) {
  upd_build *bs = calloc(n + 1, sizeof *bs);
  ps_rpc_req *reqs = calloc(n + 1, sizeof *reqs);
  int *tasks = calloc(n + 1, sizeof *tasks);
  int rc = 0;
  if (!bs || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ps_status_clear(&t[i].st);
    if ((rc = check_task(c, t[i].task, st)) != 0) goto out;
    if ((rc = upd_request(c, &t[i], &bs[i], &reqs[i], true, st)) != 0) goto out;
    tasks[i] = t[i].task;
  }
  run_reqs(c, reqs, tasks, n, false);
  /* A task that refused a summed request with INVALID_ARGUMENT applied
   * nothing (its updates are atomic): send it again as the caller gave it,
   * so that the error names the caller's positions and shapes. */
  for (size_t i = 0; i < n; i++) {
    if (reqs[i].st.code != PS_INVALID_ARGUMENT || !bs[i].combined) continue;
    upd_build_fini(&bs[i]);
    if ((rc = upd_request(c, &t[i], &bs[i], &reqs[i], false, st)) != 0) goto out;
    run_reqs(c, &reqs[i], &tasks[i], 1, false);
  }
  for (size_t i = 0; i < n; i++) {
    t[i].st = reqs[i].st;
    if (rc == 0 && reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      if (st) *st = reqs[i].st;
    }
  }
out:
  if (bs)
    for (size_t i = 0; i < n; i++)
      upd_build_fini(&bs[i]);
  free(bs);
  free(reqs);
  free(tasks);
  return rc;
}

int ps_client_update(ps_client *c, int task, const ps_update *u, size_t n,
                     ps_status *st) {
  ps_task_updates t = {.task = task, .updates = u, .n = n};
  return ps_client_update_many(c, &t, 1, st);
}

/* ---- reads ---- */

typedef struct read_build {
  answer ans;
  bool *allocated; /* outputs this call allocated (freed again on failure) */
  Paramserver__ReadRequest req;
  Paramserver__ReadItem *items;
  Paramserver__ReadItem **ip;
  ps_rpc_segs segs;
  ps_task_reads *t;
  /* gathers sent deduplicated: the ids, and the distinct rows received */
  ps_gather_dedup *dd;
  void **rows;
  size_t *row_bytes;
} read_build;

static int parse_read(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  read_build *b = user;
  /* A retried call parses a header again: what the last one gave goes. */
  for (size_t k = 0; k < b->t->n; k++) {
    free(b->rows[k]);
    b->rows[k] = NULL;
    b->row_bytes[k] = 0;
    if (b->allocated[k]) {
      ps_tensor_destroy(b->t->reads[k].out);
      b->t->reads[k].out = NULL;
      b->allocated[k] = false;
    }
  }
  /* counted on the wire: a flood of empty entries is never unpacked */
  size_t nt = ps_wire_count_field(p, n, 1);
  if (nt != b->t->n)
    return bad_answer(st, M_READ, "%zu tensors for %zu variables (%s%s)", nt, b->t->n,
                      b->t->n ? b->t->reads[0].name : "", b->t->n > 1 ? ", ..." : "");
  if (wire_ok(&paramserver__read_response__descriptor, M_READ, p, n, st)) return st->code;
  Paramserver__ReadResponse *r = paramserver__read_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_READ, "the answer does not parse");
  int rc = 0;
  if (r->n_tensors != b->t->n)
    rc = bad_answer(st, M_READ, "%zu tensors for %zu variables", r->n_tensors, b->t->n);
  for (size_t i = 0; i < r->n_tensors && rc == 0; i++) {
    Paramserver__TensorMeta *m = r->tensors[i];
    ps_read *rd = &b->t->reads[i];
    if (strcmp(m->name, rd->name) != 0) {
      rc = bad_answer(st, M_READ, "tensor %zu is %s, the variable asked for is %s", i,
                      m->name, rd->name);
      break;
    }
    ps_shape shape;
    size_t need;
    if ((rc = answer_shape(b->t->task, M_READ, rd->name, m->dtype, m->shape, m->n_shape,
                           &shape, &need, st)) != 0)
      break;
    const ps_gather_dedup *dd = &b->dd[i];
    if (rd->indices && dd->uix == NULL &&
        (shape.rank < 1 || shape.dim[0] != rd->indices->shape.dim[0])) {
      rc = bad_answer(st, M_READ, "variable %s: %lld rows for %lld ids", rd->name,
                      (long long)(shape.rank ? shape.dim[0] : 0),
                      (long long)rd->indices->shape.dim[0]);
      break;
    }
    if (dd->uix) { /* nu distinct rows come; the caller gets all n */
      if (shape.rank < 1 || shape.dim[0] != dd->nu || dd->nu <= 0) {
        rc = bad_answer(st, M_READ, "variable %s: %lld rows for %lld ids", rd->name,
                        (long long)(shape.rank ? shape.dim[0] : 0), (long long)dd->nu);
        break;
      }
      b->row_bytes[i] = need / (size_t)dd->nu;
      size_t all;
      if (ps_size_mul(b->row_bytes[i], (size_t)dd->n, &all) != 0 ||
          all > tensor_limit()) {
        rc = ps_status_set(
            st, PS_RESOURCE_EXHAUSTED,
            "ps/%d: Read: variable %s: %lld rows of %zu bytes are more than "
            "this machine's memory",
            b->t->task, rd->name, (long long)dd->n, b->row_bytes[i]);
        break;
      }
      b->rows[i] = malloc(need ? need : 1);
      if (b->rows[i] == NULL || ps_rpc_segs_add(sink, b->rows[i], need, NULL) != 0) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "read %s: cannot allocate %zu bytes", rd->name, need);
        break;
      }
      shape.dim[0] = dd->n;
      need = all;
    }
    if (rd->out &&
        (rd->out->dtype != (ps_dtype)m->dtype || ps_tensor_nbytes(rd->out) != need)) {
      char a[128], bb[128];
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "read %s: destination is %s %s, the variable is %s %s", rd->name,
                         ps_dtype_name(rd->out->dtype),
                         ps_shape_format(&rd->out->shape, a, sizeof a),
                         ps_dtype_name(m->dtype), ps_shape_format(&shape, bb, sizeof bb));
      break;
    }
    if (rd->out == NULL) {
      rd->out = ps_tensor_create((ps_dtype)m->dtype, &shape, false);
      if (rd->out == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "read %s: cannot allocate %zu bytes", rd->name, need);
        break;
      }
      b->allocated[i] = true;
    }
    rd->out->shape = shape;
    if (dd->uix == NULL &&
        ps_rpc_segs_add(sink, ps_tensor_data(rd->out), need, NULL) != 0)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  paramserver__read_response__free_unpacked(r, NULL);
  return rc;
}

static int read_build_init(read_build *b, ps_task_reads *t, ps_dedup_memo *dedup,
                           ps_status *st) {
  memset(b, 0, sizeof *b);
  paramserver__read_request__init(&b->req);
  b->t = t;
  b->items = calloc(t->n + 1, sizeof *b->items);
  b->ip = calloc(t->n + 1, sizeof *b->ip);
  b->allocated = calloc(t->n + 1, sizeof *b->allocated);
  b->dd = calloc(t->n + 1, sizeof *b->dd);
  b->rows = calloc(t->n + 1, sizeof *b->rows);
  b->row_bytes = calloc(t->n + 1, sizeof *b->row_bytes);
  if (!b->items || !b->ip || !b->allocated || !b->dd || !b->rows || !b->row_bytes)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < t->n; i++) {
    Paramserver__ReadItem *it = &b->items[i];
    paramserver__read_item__init(it);
    it->name = (char *)t->reads[i].name;
    const ps_tensor *ix = t->reads[i].indices;
    if (ix) {
      if (ix->shape.rank != 1 || (ix->dtype != PS_DT_INT32 && ix->dtype != PS_DT_INT64))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "gather from %s: indices must be a 1-D int32 or "
                             "int64 tensor",
                             t->reads[i].name);
      it->gather = true;
      it->index_dtype = ix->dtype;
      it->num_indices = ix->shape.dim[0];
      int r = dedup ? ps_gather_dedup_init_memo(dedup, &b->dd[i], ix) : 0;
      if (r < 0) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      if (r > 0) {
        ix = b->dd[i].uix;
        it->num_indices = b->dd[i].nu;
      }
      ps_rpc_segs_add(&b->segs, ps_tensor_data(ix), ps_tensor_nbytes(ix), ix->buf);
    }
    b->ip[i] = it;
  }
  b->req.items = b->ip;
  b->req.n_items = t->n;
  return 0;
}

static void read_build_fini(read_build *b) {
  for (size_t k = 0; b->t && k < b->t->n; k++) {
    if (b->dd) ps_gather_dedup_fini(&b->dd[k]);
    if (b->rows) free(b->rows[k]);
  }
  free(b->allocated);
  free(b->items);
  free(b->ip);
  free(b->dd);
  free(b->rows);
  free(b->row_bytes);
  ps_rpc_segs_fini(&b->segs);
}

/* Gathers with repeated ids go deduplicated (@dedup): each distinct row
 * comes once and is copied to every position that asked for it.
 * *@refused_dedup: a deduplicated request was refused INVALID_ARGUMENT. */
static int read_many(ps_client *c, ps_task_reads *t, size_t n, bool dedup,
                     bool *refused_dedup, ps_status *st) {
  read_build *bs = calloc(n + 1, sizeof *bs);
  ps_rpc_req *reqs = calloc(n + 1, sizeof *reqs);
  int *tasks = calloc(n + 1, sizeof *tasks);
  int rc = 0;
  if (!bs || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ps_status_clear(&t[i].st);
    if ((rc = check_task(c, t[i].task, st)) != 0) goto out;
    if ((rc = read_build_init(&bs[i], &t[i], dedup ? &c->memo : NULL, st)) != 0) goto out;
    req_init(c, &reqs[i], t[i].task, M_READ, &bs[i].req.base, false, true);
    reqs[i].send = &bs[i].segs;
    answer_init(c, t[i].task, &reqs[i], &bs[i].ans, parse_read, &bs[i],
                t[i].n ? t[i].reads[0].name : NULL);
    tasks[i] = t[i].task;
  }
  run_reqs(c, reqs, tasks, n, true);
  for (size_t i = 0; i < n; i++) {
    t[i].st = reqs[i].st;
    if (reqs[i].st.code == PS_OK)
      for (size_t k = 0; k < t[i].n; k++)
        if (bs[i].dd[k].uix && bs[i].rows[k])
          ps_gather_dedup_expand(&bs[i].dd[k], bs[i].rows[k], bs[i].row_bytes[k],
                                 ps_tensor_data(t[i].reads[k].out));
    if (reqs[i].st.code != PS_OK)
      for (size_t k = 0; k < t[i].n; k++)
        if (bs[i].allocated[k]) {
          ps_tensor_destroy(t[i].reads[k].out);
          t[i].reads[k].out = NULL;
        }
    if (reqs[i].st.code == PS_INVALID_ARGUMENT)
      for (size_t k = 0; k < t[i].n; k++)
        *refused_dedup |= bs[i].dd[k].uix != NULL;
    if (rc == 0 && reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      if (st) *st = reqs[i].st;
    }
  }
out:
  if (bs)
    for (size_t i = 0; i < n; i++)
      read_build_fini(&bs[i]);
  free(bs);
  free(reqs);
  free(tasks);
  return rc;
}

int ps_client_read_many(ps_client *c, ps_task_reads *t, size_t n, ps_status *st) {
  bool refused = false;
  int rc = read_many(c, t, n, true, &refused, st);
  /* An id out of range is named by its position: ask again as the caller
   * asked, so that the error is TensorFlow's "indices[i] = ..." for the
   * caller's i.  A read changes nothing, so asking again is safe. */
  if (rc == PS_INVALID_ARGUMENT && refused) rc = read_many(c, t, n, false, &refused, st);
  return rc;
}

int ps_client_read(ps_client *c, int task, ps_read *r, size_t n, ps_status *st) {
  ps_task_reads t = {.task = task, .reads = r, .n = n};
  return ps_client_read_many(c, &t, 1, st);
}

/* ---- list / status ---- */

typedef struct list_out {
  ps_var_info *v;
  size_t n;
  int task;
  int64_t max_message_bytes; /* the client's receive limit */
  const char *addr;          /* the ps's address, for errors */
} list_out;

/* The most entries a List answer may have: their ps_var_infos take at most
 * PS_CLIENT_LIST_MEMORY_FACTOR times the receive limit (a 9-byte entry on
 * the wire becomes a ps_var_info of some 340 bytes). */
#define PS_CLIENT_LIST_MEMORY_FACTOR 4
static size_t list_max_entries(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  return (size_t)max_message_bytes * PS_CLIENT_LIST_MEMORY_FACTOR / sizeof(ps_var_info);
}

static int cmp_name_ptr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A variable listed twice: a ps holds one variable per name. */
static int list_unique(const list_out *o, ps_status *st) {
  if (o->n < 2) return 0;
  char **names = malloc(o->n * sizeof *names);
  if (names == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < o->n; i++)
    names[i] = o->v[i].name;
  qsort(names, o->n, sizeof *names, cmp_name_ptr);
  int rc = 0;
  for (size_t i = 1; i < o->n && rc == 0; i++)
    if (strcmp(names[i - 1], names[i]) == 0)
      rc = bad_answer(st, M_LIST, "variable %s is listed twice", names[i]);
  free(names);
  return rc;
}

/* One entry of a List answer, checked, appended to @o. */
static int list_add(list_out *o, size_t *cap, size_t i, const Paramserver__VarInfo *vi,
                    ps_status *st) {
  if (vi->name[0] == '\0') return bad_answer(st, M_LIST, "entry %zu has no name", i);
  ps_var_info v = {.dtype = (ps_dtype)vi->dtype,
                   .bytes = vi->bytes,
                   .initialized = vi->initialized,
                   .version = vi->version,
                   .task = o->task,
                   .offset = vi->offset};
  size_t bytes;
  if (answer_shape(o->task, M_LIST, vi->name, vi->dtype, vi->shape, vi->n_shape, &v.shape,
                   &bytes, st) != 0)
    return st->code;
  if (vi->bytes < 0 || (size_t)vi->bytes != bytes)
    return bad_answer(st, M_LIST, "variable %s has %lld bytes, its shape %zu", vi->name,
                      (long long)vi->bytes, bytes);
  bool part = vi->full_name && vi->full_name[0];
  if (part) {
    size_t fb;
    int64_t n = ps_shape_num_elements(&v.shape);
    if (answer_shape(o->task, M_LIST, vi->full_name, vi->dtype, vi->full_shape,
                     vi->n_full_shape, &v.full_shape, &fb, st) != 0)
      return st->code;
    if (vi->offset < 0 || vi->offset > ps_shape_num_elements(&v.full_shape) - n)
      return bad_answer(st, M_LIST, "variable %s: offset %lld is outside %s", vi->name,
                        (long long)vi->offset, vi->full_name);
  } else {
    v.offset = 0;
  }
  if (o->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    ps_var_info *nv = realloc(o->v, (nc + 1) * sizeof *nv);
    if (nv == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    o->v = nv;
    *cap = nc;
  }
  v.name = strdup(vi->name);
  v.full_name = part ? strdup(vi->full_name) : NULL;
  if (v.name == NULL || (part && v.full_name == NULL)) {
    free(v.name);
    free(v.full_name);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  o->v[o->n++] = v;
  return 0;
}

/* The entries are unpacked one at a time and checked as they come, so a
 * flood of empty or bad ones stops at the first. */
static int parse_list(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  list_out *o = user;
  ps_client_free_var_info(o->v, o->n);
  o->v = NULL;
  o->n = 0;
  if (wire_ok(&paramserver__list_response__descriptor, M_LIST, p, n, st)) return st->code;
  /* counted on the wire before anything is allocated for them */
  size_t count = ps_wire_count_field(p, n, 1),
         most = list_max_entries(o->max_message_bytes);
  if (count > most)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d at %s: List: %zu variables, more than the %zu a "
                         "client holds with a limit of %lld bytes (--max-message-bytes)",
                         o->task, o->addr, count, most, (long long)o->max_message_bytes);
  const uint8_t *q = p, *end = p + n, *val;
  uint64_t field;
  size_t len, cap = 0, i = 0;
  int w, rc = 0;
  while (rc == 0 && (w = wire_next(&q, end, &field, &val, &len)) > 0) {
    if (field != 1) continue;
    Paramserver__VarInfo *vi = val ? paramserver__var_info__unpack(NULL, len, val) : NULL;
    if (vi == NULL) {
      rc = bad_answer(st, M_LIST, "entry %zu does not parse", i);
      break;
    }
    rc = list_add(o, &cap, i++, vi, st);
    paramserver__var_info__free_unpacked(vi, NULL);
  }
  if (rc == 0 && w < 0) rc = bad_answer(st, M_LIST, "the answer does not parse");
  if (rc == 0) rc = list_unique(o, st);
  if (rc == 0 && o->v == NULL && (o->v = calloc(1, sizeof *o->v)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  return rc;
}

int ps_client_list(ps_client *c, int task, ps_var_info **out, size_t *n, ps_status *st) {
  Paramserver__ListRequest req = PARAMSERVER__LIST_REQUEST__INIT;
  list_out o = {NULL, 0, task, c->opt.max_message_bytes, NULL};
  if (task >= 0 && task < c->nps) o.addr = c->addrs[task];
  int rc = control_call(c, task, M_LIST, &req.base, true, parse_list, &o, st);
  if (rc != 0) {
    ps_client_free_var_info(o.v, o.n);
    o.v = NULL;
    o.n = 0;
  }
  *out = o.v;
  *n = o.n;
  return rc;
}

void ps_client_free_var_info(ps_var_info *v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].full_name);
  }
  free(v);
}

static int parse_status(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  ps_task_status *o = user;
  if (wire_ok(&paramserver__status_response__descriptor, M_STATUS, p, n, st))
    return st->code;
  Paramserver__StatusResponse *r = paramserver__status_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_STATUS, "the answer does not parse");
  int rc = 0;
  if (r->num_vars < 0 || r->bytes < 0 || r->rpcs < 0 || r->pid < 0 ||
      !(r->uptime_secs >= 0))
    rc = bad_answer(st, M_STATUS,
                    "a negative count (vars %lld, bytes %lld, rpcs %lld, "
                    "pid %lld, uptime %g)",
                    (long long)r->num_vars, (long long)r->bytes, (long long)r->rpcs,
                    (long long)r->pid, r->uptime_secs);
  if (rc == 0) {
    snprintf(o->task, sizeof o->task, "%s", r->task);
    snprintf(o->address, sizeof o->address, "%s", r->address);
    snprintf(o->version, sizeof o->version, "%s", r->version);
    o->num_vars = r->num_vars;
    o->bytes = r->bytes;
    o->pid = r->pid;
    o->rpcs = r->rpcs;
    o->uptime_secs = r->uptime_secs;
  }
  paramserver__status_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_status(ps_client *c, int task, ps_task_status *out, ps_status *st) {
  Paramserver__StatusRequest req = PARAMSERVER__STATUS_REQUEST__INIT;
  memset(out, 0, sizeof *out);
  return control_call(c, task, M_STATUS, &req.base, true, parse_status, out, st);
}

int ps_client_probe(ps_client *c, int task, ps_status *st) {
  return ps_client_probe_within(c, task, 0, st);
}

int ps_client_probe_within(ps_client *c, int task, int64_t within_ms, ps_status *st) {
  if (check_task(c, task, st)) return st->code;
  Paramserver__StatusRequest req = PARAMSERVER__STATUS_REQUEST__INIT;
  ps_task_status out;
  memset(&out, 0, sizeof out);
  ps_rpc_req r;
  answer a;
  req_init(c, &r, task, M_STATUS, &req.base, true, false);
  if (within_ms > 0 && within_ms < r.stall_timeout_ms) {
    r.stall_timeout_ms = within_ms;
    if (r.timeout_ms > within_ms + 1000) r.timeout_ms = within_ms + 1000;
  }
  answer_init(c, task, &r, &a, parse_status, &out, NULL);
  run_reqs(c, &r, &task, 1, false);
  if (st) *st = r.st;
  return r.st.code;
}

/* ---- checkpoints ---- */

#define M_SNAPSHOT "/paramserver.Ps/Snapshot"
#define M_RELEASE "/paramserver.Ps/Release"
#define M_SAVE "/paramserver.Ps/Save"
#define M_MERGE "/paramserver.Ps/Merge"
#define M_RESTORE "/paramserver.Ps/Restore"

typedef struct save_out {
  int64_t bytes;
  char *prefix;
  size_t n;
  size_t asked;        /* Restore: the variables asked for (0: all) */
  ps_ckpt_list listed; /* Merge: the state file's list afterwards */
  bool checked;        /* Restore: the ps answered a check_only as one */
} save_out;

void ps_ckpt_list_fini(ps_ckpt_list *l) {
  if (l == NULL) return;
  for (size_t i = 0; i < l->n; i++)
    free(l->paths[i]);
  free(l->paths);
  l->paths = NULL;
  l->n = 0;
}

static int parse_save(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  Paramserver__SaveResponse *r = paramserver__save_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_SAVE, "the answer does not parse");
  int rc = 0;
  if (r->bytes < 0 || r->tensors < 0)
    rc = bad_answer(st, M_SAVE, "%lld tensors, %lld bytes written", (long long)r->tensors,
                    (long long)r->bytes);
  else
    ((save_out *)user)->bytes = r->bytes;
  paramserver__save_response__free_unpacked(r, NULL);
  return rc;
}

static int parse_merge(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st) {
  if (wire_ok(&paramserver__merge_response__descriptor, M_MERGE, p, n, st))
    return st->code;
  Paramserver__MergeResponse *r = paramserver__merge_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_MERGE, "the answer does not parse");
  save_out *o = user;
  free(o->prefix);
  o->prefix = NULL;
  ps_ckpt_list_fini(&o->listed);
  int rc = 0;
  if (r->prefix[0] == '\0')
    rc = bad_answer(st, M_MERGE, "the answer names no checkpoint");
  else
    rc = names_ok(M_MERGE, "listed checkpoint", r->listed, r->n_listed, st);
  if (rc == 0 && (o->prefix = strdup(r->prefix)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  if (rc == 0 && (o->listed.paths = calloc(r->n_listed + 1, sizeof(char *))) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_listed; i++)
    if ((o->listed.paths[o->listed.n++] = strdup(r->listed[i])) == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  paramserver__merge_response__free_unpacked(r, NULL);
  return rc;
}

static int parse_restore(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st) {
  save_out *o = user;
  if (wire_ok(&paramserver__restore_response__descriptor, M_RESTORE, p, n, st))
    return st->code;
  Paramserver__RestoreResponse *r = paramserver__restore_response__unpack(NULL, n, p);
  if (r == NULL) return bad_answer(st, M_RESTORE, "the answer does not parse");
  int rc = names_ok(M_RESTORE, "restored name", r->restored, r->n_restored, st);
  if (rc == 0 && o->asked > 0 && r->n_restored > o->asked)
    rc = bad_answer(st, M_RESTORE, "%zu variables restored for %zu asked", r->n_restored,
                    o->asked);
  if (rc == 0) {
    o->n = r->n_restored;
    o->checked = r->checked;
    free(o->prefix); /* the checkpoint the ps resolved */
    o->prefix = r->prefix && r->prefix[0] ? strdup(r->prefix) : NULL;
    if (r->prefix && r->prefix[0] && o->prefix == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  paramserver__restore_response__free_unpacked(r, NULL);
  return rc;
}

/* The same unary call to every ps at once; the first failure wins. */
static int all_ps(ps_client *c, const char *method, const ProtobufCMessage *const *msgs,
                  parse_fn parse, save_out *outs, int64_t timeout_ms, ps_status *st) {
  ps_rpc_req *reqs = calloc((size_t)c->nps, sizeof *reqs);
  int *tasks = calloc((size_t)c->nps, sizeof *tasks);
  answer *as = calloc((size_t)c->nps, sizeof *as);
  if (reqs == NULL || tasks == NULL || as == NULL) {
    free(reqs);
    free(tasks);
    free(as);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int t = 0; t < c->nps; t++) {
    req_init(c, &reqs[t], t, method, msgs[t], true, false);
    reqs[t].timeout_ms = timeout_ms;
    answer_init(c, t, &reqs[t], &as[t], parse, outs ? &outs[t] : NULL, NULL);
    tasks[t] = t;
  }
  run_reqs(c, reqs, tasks, (size_t)c->nps, false);
  int rc = 0;
  for (int t = 0; t < c->nps && rc == 0; t++)
    if (reqs[t].st.code != PS_OK) {
      rc = reqs[t].st.code;
      if (st) *st = reqs[t].st;
    }
  free(reqs);
  free(tasks);
  free(as);
  return rc;
}

/* ps_client_save's step: a scalar integer variable read between Snapshot
 * and Release, so its value is the one the checkpoint holds. */
static int snapshot_step(ps_client *c, const ps_save_options *o, int64_t *step,
                         ps_status *st) {
  if (o->step_task < 0 || o->step_task >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "save: step variable %s is on ps task %d, which does not exist "
                         "(the cluster has %d)",
                         o->step_name, o->step_task, c->nps);
  ps_read r = {.name = o->step_name};
  if (ps_client_read(c, o->step_task, &r, 1, st) != 0) return st->code;
  int64_t v = -1;
  if (ps_tensor_num_elements(r.out) == 1 && r.out->dtype == PS_DT_INT64)
    memcpy(&v, ps_tensor_data(r.out), sizeof v);
  else if (ps_tensor_num_elements(r.out) == 1 && r.out->dtype == PS_DT_INT32) {
    int32_t v32;
    memcpy(&v32, ps_tensor_data(r.out), sizeof v32);
    v = v32;
  }
  ps_tensor_destroy(r.out);
  if (v < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "save: step variable %s is not a non-negative integer scalar",
                         o->step_name);
  *step = v;
  return 0;
}

int ps_client_save(ps_client *c, const char *prefix, const ps_save_options *o,
                   char **written, int64_t *bytes, ps_status *st) {
  ps_save_options def = {0};
  if (o == NULL) o = &def;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t id = ((int64_t)now.tv_sec << 20) ^ (now.tv_nsec & 0xfffff) ^ (int64_t)getpid();
  if (id == 0 || id == -1) id = 7;
  int n = c->nps, rc;
  Paramserver__SnapshotRequest *snaps = calloc((size_t)n + 1, sizeof *snaps);
  Paramserver__SnapshotItem *sitems = calloc(o->nitems + 1, sizeof *sitems);
  Paramserver__SnapshotItem **sptr = calloc(o->nitems + 1, sizeof *sptr);
  if (snaps == NULL || sitems == NULL || sptr == NULL) {
    free(snaps);
    free(sitems);
    free(sptr);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* each ps gets its own items, grouped by task */
  size_t k = 0;
  for (int t = 0; t < n; t++) {
    paramserver__snapshot_request__init(&snaps[t]);
    snaps[t].id = id;
    snaps[t].hold_ms = o->hold_ms > 0 ? o->hold_ms : 10000;
    snaps[t].skip_uninitialized = o->skip_uninitialized;
    snaps[t].select = o->select;
    snaps[t].items = &sptr[k];
    for (size_t i = 0; o->select && i < o->nitems; i++) {
      if (o->items[i].task != t) continue;
      paramserver__snapshot_item__init(&sitems[k]);
      sitems[k].name = (char *)o->items[i].name;
      sitems[k].key = (char *)(o->items[i].key ? o->items[i].key : "");
      sptr[k] = &sitems[k];
      k++;
      snaps[t].n_items++;
    }
  }
  for (size_t i = 0; o->select && i < o->nitems; i++)
    if (o->items[i].task < 0 || o->items[i].task >= n) {
      free(snaps);
      free(sitems);
      free(sptr);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "save: %s is on ps task %d, which does not exist (the cluster "
                           "has %d)",
                           o->items[i].name ? o->items[i].name : "(null)",
                           o->items[i].task, n);
    }
  Paramserver__ReleaseRequest rel = PARAMSERVER__RELEASE_REQUEST__INIT;
  rel.id = id;
  const ProtobufCMessage **msgs = calloc((size_t)n, sizeof *msgs);
  Paramserver__SaveRequest *saves = calloc((size_t)n, sizeof *saves);
  save_out *outs = calloc((size_t)n, sizeof *outs);
  if (msgs == NULL || saves == NULL || outs == NULL) {
    free(msgs);
    free(saves);
    free(outs);
    free(snaps);
    free(sitems);
    free(sptr);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* 1. every ps closes its gate and captures its variables */
  for (int t = 0; t < n; t++)
    msgs[t] = &snaps[t].base;
  rc = all_ps(c, M_SNAPSHOT, msgs, NULL, NULL, c->opt.control_timeout_ms, st);
  /* the step as the snapshot has it: no update passes a closed gate */
  char named[1100];
  int64_t step = -1;
  if (rc == 0 && o->step_name) rc = snapshot_step(c, o, &step, st);
  /* 2. every gate reopens, whatever happened */
  ps_status rst;
  for (int t = 0; t < n; t++)
    msgs[t] = &rel.base;
  all_ps(c, M_RELEASE, msgs, NULL, NULL, c->opt.control_timeout_ms, &rst);
  if (rc) goto out;
  if (o->step_name) {
    if (snprintf(named, sizeof named, "%s-%lld", prefix, (long long)step) >=
        (int)sizeof named) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "save: prefix %s is too long", prefix);
      goto out;
    }
    prefix = named;
    if (o->step) *o->step = step;
  }
  if (o->on_name && (rc = o->on_name(o->on_name_arg, prefix, st)) != 0) goto out;
  /* 3. every ps writes its shard */
  for (int t = 0; t < n; t++) {
    paramserver__save_request__init(&saves[t]);
    saves[t].snapshot_id = id;
    saves[t].prefix = (char *)prefix;
    saves[t].shard = t;
    saves[t].num_shards = n;
    msgs[t] = &saves[t].base;
  }
  rc = all_ps(c, M_SAVE, msgs, parse_save, outs, c->opt.data_timeout_ms, st);
  if (rc) goto out;
  int64_t total = 0;
  for (int t = 0; t < n; t++)
    total = outs[t].bytes > INT64_MAX - total ? INT64_MAX : total + outs[t].bytes;
  if (bytes) *bytes = total;
  /* 4. the last ps merges them and replaces the state file */
  Paramserver__MergeRequest mr = PARAMSERVER__MERGE_REQUEST__INIT;
  mr.prefix = (char *)prefix;
  mr.num_shards = n;
  mr.max_to_keep = o->max_to_keep;
  mr.keep_every_n_hours = o->keep_every_n_hours;
  if (o->own) {
    mr.own_list = true;
    mr.own_paths = o->own->paths;
    mr.n_own_paths = o->own->n;
  }
  if (o->meta_graph) {
    mr.meta_graph.data = (uint8_t *)o->meta_graph;
    mr.meta_graph.len = o->meta_graph_len;
  }
  rc = control_call(c, n - 1, M_MERGE, &mr.base, false, parse_merge, &outs[0], st);
  if (rc == 0 && written) {
    *written = outs[0].prefix;
    outs[0].prefix = NULL;
  }
  if (rc == 0 && o->own) {
    ps_ckpt_list_fini(o->own);
    *o->own = outs[0].listed;
    outs[0].listed = (ps_ckpt_list){0};
  }
out:
  free(snaps);
  free(sitems);
  free(sptr);
  ps_ckpt_list_fini(&outs[0].listed);
  free(outs[0].prefix);
  free(outs);
  free(saves);
  free(msgs);
  return rc;
}

/* Checks the answers of a check_only Restore sent to @tasks[0..@n): each
 * ps must have answered it as a check (an older ps-server ignores
 * check_only and restores instead), and all must name one checkpoint,
 * which *@resolved receives (to free). */
static int checked_answers(ps_client *c, const ps_rpc_req *reqs, const int *tasks,
                           size_t n, const save_out *outs, char **resolved,
                           ps_status *st) {
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++)
    if (reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      *st = reqs[i].st;
    }
  for (size_t i = 0; i < n && rc == 0; i++)
    if (!outs[i].checked)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Restore: /job:ps/task:%d (%s) did not answer the check before "
                         "the restore as a check: an older ps-server, which ignores "
                         "check_only and restores at once; its variables may have "
                         "changed. Upgrade every ps-server to restore across several ps",
                         tasks[i], c->addrs[tasks[i]]);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (outs[i].prefix == NULL || strcmp(outs[i].prefix, outs[0].prefix) != 0)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Restore: the ps disagree on the checkpoint: /job:ps/task:%d "
                         "checked %s, /job:ps/task:%d checked %s (a save in between, or "
                         "ps with different checkpoint directories); nothing restored",
                         tasks[0], outs[0].prefix ? outs[0].prefix : "(none)", tasks[i],
                         outs[i].prefix ? outs[i].prefix : "(none)");
  if (rc == 0 && n > 0 && (*resolved = strdup(outs[0].prefix)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  return rc;
}

int ps_client_check_restore_all(ps_client *c, const char *prefix,
                                const char *const *const *names,
                                const char *const *const *keys, const size_t *n,
                                char **resolved, ps_status *st) {
  int nps = c->nps;
  *resolved = NULL;
  size_t total = 0;
  for (int t = 0; names && t < nps; t++)
    total += n[t];
  Paramserver__RestoreRequest *rq = calloc((size_t)nps, sizeof *rq);
  Paramserver__RestoreItem *items = calloc(total + 1, sizeof *items);
  Paramserver__RestoreItem **ip = calloc(total + 1, sizeof *ip);
  ps_rpc_req *reqs = calloc((size_t)nps, sizeof *reqs);
  int *tasks = calloc((size_t)nps, sizeof *tasks);
  save_out *outs = calloc((size_t)nps, sizeof *outs);
  int rc = 0;
  if (rq == NULL || items == NULL || ip == NULL || reqs == NULL || tasks == NULL ||
      outs == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    goto out;
  }
  size_t k = 0, nr = 0;
  for (int t = 0; t < nps; t++) {
    if (names && n[t] == 0) continue;
    paramserver__restore_request__init(&rq[t]);
    rq[t].prefix = (char *)(prefix ? prefix : "");
    rq[t].check_only = true;
    if (names) {
      rq[t].items = &ip[k];
      rq[t].n_items = n[t];
      for (size_t i = 0; i < n[t]; i++, k++) {
        paramserver__restore_item__init(&items[k]);
        items[k].name = (char *)names[t][i];
        items[k].key = (char *)(keys && keys[t] && keys[t][i] ? keys[t][i] : "");
        ip[k] = &items[k];
      }
    }
    req_init(c, &reqs[nr], t, M_RESTORE, &rq[t].base, true, false);
    reqs[nr].timeout_ms = c->opt.data_timeout_ms;
    reqs[nr].on_header = parse_restore;
    reqs[nr].user = &outs[nr];
    tasks[nr++] = t;
  }
  run_reqs(c, reqs, tasks, nr, false);
  rc = checked_answers(c, reqs, tasks, nr, outs, resolved, st);
out:
  for (int t = 0; outs && t < nps; t++)
    free(outs[t].prefix);
  free(outs);
  free(tasks);
  free(reqs);
  free(ip);
  free(items);
  free(rq);
  return rc;
}

int ps_client_restore(ps_client *c, const char *prefix, size_t *nrestored,
                      ps_status *st) {
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = (char *)(prefix ? prefix : "");
  const ProtobufCMessage **msgs = calloc((size_t)c->nps, sizeof *msgs);
  save_out *outs = calloc((size_t)c->nps, sizeof *outs);
  if (msgs == NULL || outs == NULL) {
    free(msgs);
    free(outs);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  for (int t = 0; t < c->nps; t++)
    msgs[t] = &rq.base;
  int rc = 0;
  /* all or nothing across the ps: every ps checks first (all at once),
   * none changes anything unless every one would succeed; then every ps
   * restores the checkpoint they checked, by its path ("the latest" is
   * resolved once: not one a save made since) */
  char *checked = NULL;
  if (c->nps > 1) {
    rc = ps_client_check_restore_all(c, prefix, NULL, NULL, NULL, &checked, st);
    if (rc == 0) rq.prefix = checked;
  }
  if (rc == 0)
    rc = all_ps(c, M_RESTORE, msgs, parse_restore, outs, c->opt.data_timeout_ms, st);
  if (nrestored) {
    *nrestored = 0;
    for (int t = 0; t < c->nps; t++)
      *nrestored += outs[t].n;
  }
  for (int t = 0; t < c->nps; t++)
    free(outs[t].prefix);
  free(checked);
  free(msgs);
  free(outs);
  return rc;
}

static int restore_vars(ps_client *c, int task, const char *prefix,
                        const char *const *names, const char *const *keys, size_t n,
                        bool check_only, ps_status *st) {
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = (char *)(prefix ? prefix : "");
  rq.check_only = check_only;
  Paramserver__RestoreItem *items = calloc(n + 1, sizeof *items);
  Paramserver__RestoreItem **ip = calloc(n + 1, sizeof *ip);
  if (items == NULL || ip == NULL) {
    free(items);
    free(ip);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    paramserver__restore_item__init(&items[i]);
    items[i].name = (char *)names[i];
    items[i].key = (char *)(keys && keys[i] ? keys[i] : "");
    ip[i] = &items[i];
  }
  rq.items = ip;
  rq.n_items = n;
  save_out out = {.asked = n};
  int rc = control_call(c, task, M_RESTORE, &rq.base, false, parse_restore, &out, st);
  if (rc == 0 && check_only && !out.checked)
    rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                       "Restore: /job:ps/task:%d (%s) did not answer the check before "
                       "the restore as a check: an older ps-server, which ignores "
                       "check_only and restores at once; its variables may have "
                       "changed. Upgrade every ps-server to restore across several ps",
                       task, c->addrs[task]);
  free(out.prefix);
  free(items);
  free(ip);
  return rc;
}

int ps_client_restore_vars(ps_client *c, int task, const char *prefix,
                           const char *const *names, const char *const *keys, size_t n,
                           ps_status *st) {
  return restore_vars(c, task, prefix, names, keys, n, false, st);
}

int ps_client_check_restore_vars(ps_client *c, int task, const char *prefix,
                                 const char *const *names, const char *const *keys,
                                 size_t n, ps_status *st) {
  return restore_vars(c, task, prefix, names, keys, n, true, st);
}

/* ---- the answer decoders, for the fuzz target ---- */

/* tests/fuzz/fuzz_client.c: decodes @p (@n bytes) as the answer header of
 * @method ("Read", "List", "IsInitialized", "Initialize",
 * "ReportUninitialized", "Delete", "Update", "Status", "Save", "Merge",
 * "Restore", "Shutdown") to a typical request of this client, fills the
 * bulk ranges it names from @data as the transport would (more or fewer
 * bytes fail as there), and frees everything.  0, or a code with @st set;
 * INVALID_ARGUMENT for an unknown @method.  Not public API: without the
 * ps_ prefix, libpsworker.so does not export it. */
int fuzz_client_answer(const char *method, const uint8_t *p, size_t n,
                       const uint8_t *data, size_t ndata, ps_status *st);

/* Read: a plain read, one into a given tensor, a deduplicated gather (80
 * ids, 20 distinct) and a plain one (2 ids). */
static int fuzz_read(const uint8_t *p, size_t n, const uint8_t *data, size_t ndata,
                     ps_status *st) {
  ps_shape s2 = {.rank = 1, .dim = {2}}, s80 = {.rank = 1, .dim = {80}};
  ps_tensor *given = ps_tensor_create(PS_DT_FLOAT, &s2, true);
  ps_tensor *ix = ps_tensor_create(PS_DT_INT64, &s80, true);
  ps_tensor *ix2 = ps_tensor_create(PS_DT_INT32, &s2, true);
  ps_read reads[4] = {
      {.name = "w"}, {.name = "b", .out = given}, {.name = "emb"}, {.name = "tab"}};
  ps_task_reads t = {.task = 0, .reads = reads, .n = 4};
  read_build b;
  ps_rpc_segs sink = {0};
  ps_dedup_memo memo;
  ps_dedup_memo_init(&memo);
  int rc;
  if (given == NULL || ix == NULL || ix2 == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    memset(&b, 0, sizeof b);
    goto out;
  }
  for (int64_t i = 0; i < 80; i++)
    ((int64_t *)ps_tensor_data(ix))[i] = i % 20;
  ((int32_t *)ps_tensor_data(ix2))[0] = 3;
  ((int32_t *)ps_tensor_data(ix2))[1] = 1;
  reads[2].indices = ix;
  reads[3].indices = ix2;
  if ((rc = read_build_init(&b, &t, &memo, st)) != 0) goto out;
  /* a retried call (run_reqs) parses its header a second time */
  ps_rpc_segs first = {0};
  ps_status st1;
  parse_read(&b, p, n, &first, &st1);
  ps_rpc_segs_fini(&first);
  rc = parse_read(&b, p, n, &sink, st);
  if (rc == 0 && ndata != sink.total)
    rc = ps_status_set(st, ndata > sink.total ? PS_INTERNAL : PS_DATA_LOSS,
                       "Read: %zu bytes of data for %zu announced", ndata, sink.total);
  if (rc == 0) {
    ps_rpc_segs_fill(&sink, 0, data, ndata);
    for (size_t k = 0; k < t.n; k++)
      if (b.dd[k].uix && b.rows[k])
        ps_gather_dedup_expand(&b.dd[k], b.rows[k], b.row_bytes[k],
                               ps_tensor_data(reads[k].out));
  }
out:
  for (size_t k = 0; k < t.n; k++)
    if (reads[k].out != given) ps_tensor_destroy(reads[k].out);
  read_build_fini(&b);
  ps_rpc_segs_fini(&sink);
  ps_dedup_memo_fini(&memo);
  ps_tensor_destroy(given);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(ix2);
  return rc;
}

/* Each header is parsed twice into the same outputs, as a call retried
 * after UNAVAILABLE does (run_reqs): nothing of the first may leak. */
#define TWICE(call)                                                                      \
  do {                                                                                   \
    (void)(call);                                                                        \
    ps_rpc_segs_fini(&sink);                                                             \
    ps_status_clear(st);                                                                 \
    rc = (call);                                                                         \
  } while (0)

int fuzz_client_answer(const char *method, const uint8_t *p, size_t n,
                       const uint8_t *data, size_t ndata, ps_status *st) {
  ps_status_clear(st);
  ps_rpc_segs sink = {0};
  int rc;
  if (!strcmp(method, "Read")) return fuzz_read(p, n, data, ndata, st);
  if (!strcmp(method, "List")) {
    list_out o = {NULL, 0, 0, PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES, "fuzz"};
    TWICE(parse_list(&o, p, n, &sink, st));
    ps_client_free_var_info(o.v, o.n);
  } else if (!strcmp(method, "IsInitialized")) {
    bool out[2];
    const char *names[2] = {"w", "b"};
    bools_out o = {out, 2, names[0]};
    TWICE(parse_is_init(&o, p, n, &sink, st));
  } else if (!strcmp(method, "Initialize")) {
    init_out o = {0, 2};
    TWICE(parse_initialize(&o, p, n, &sink, st));
  } else if (!strcmp(method, "ReportUninitialized")) {
    names_out o = {NULL, 0, 2};
    TWICE(parse_report(&o, p, n, &sink, st));
    ps_client_free_names(o.names, o.n);
  } else if (!strcmp(method, "Delete")) {
    ps_delete_result r = {0};
    delete_out o = {&r, 2};
    TWICE(parse_delete(&o, p, n, &sink, st));
    ps_delete_result_free(&r);
  } else if (!strcmp(method, "Update")) {
    ps_update_result res[2];
    ps_update u[2] = {{.name = "w", .result = &res[0]}, {.name = "b", .result = &res[1]}};
    ps_task_updates t = {.task = 0, .updates = u, .n = 2};
    TWICE(parse_update(&t, p, n, &sink, st));
  } else if (!strcmp(method, "Status")) {
    ps_task_status o;
    TWICE(parse_status(&o, p, n, &sink, st));
  } else if (!strcmp(method, "Save") || !strcmp(method, "Merge") ||
             !strcmp(method, "Restore")) {
    save_out o = {.asked = 2};
    parse_fn parse = method[1] == 'a'   ? parse_save
                     : method[0] == 'M' ? parse_merge
                                        : parse_restore;
    TWICE(parse(&o, p, n, &sink, st));
    free(o.prefix);
    ps_ckpt_list_fini(&o.listed);
  } else if (!strcmp(method, "Shutdown")) {
    TWICE(parse_shutdown(NULL, p, n, &sink, st));
  } else {
    return ps_status_set(st, PS_INVALID_ARGUMENT, "no decoder for %s", method);
  }
  /* a unary answer names no bulk bytes; any that come are an error */
  if (rc == 0 && (sink.total != 0 || ndata != 0))
    rc = ps_status_set(st, PS_INTERNAL, "%s: more data than announced (%zu bytes)",
                       method, sink.total);
  ps_rpc_segs_fini(&sink);
  return rc;
}
#undef TWICE
