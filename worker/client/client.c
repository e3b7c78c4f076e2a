/* The library's start and stop, and the client object: its options,
 * security files, channels to the ps tasks and their statistics, and the
 * notes added to a failed call's status (task, TLS hints, limits).  The
 * calls themselves are in the other client_*.c files (client_internal.h). */
#include "paramserver/client.h"

#include "client_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

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

int ps_library_set_poll_spin_us(int64_t us) {
  return ps_rpc_set_poll_spin_us(us);
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
  pthread_mutex_init(&c->tmemo.mu, NULL);
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
  /* replicated shards: the view from etcd (the option strings are the
   * caller's: not kept) */
  int vrc = ps_cl_view_start_(c, cluster, st);
  c->opt.etcd = c->opt.repl_job = NULL;
  if (vrc != 0) {
    ps_client_destroy(c);
    return NULL;
  }
  return c;
oom:
  ps_client_destroy(c);
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  return NULL;
}

void ps_client_destroy(ps_client *c) {
  if (c == NULL) return;
  ps_cl_view_stop_(c);
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
  ps_cl_keyset_fini_(&c->tmemo.ks);
  free(c->tmemo.keys);
  pthread_mutex_destroy(&c->tmemo.mu);
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

int ps_cl_check_task_(ps_client *c, int task, ps_status *st) {
  if (task < 0 || task >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ps task %d does not exist (the cluster has %d)", task, c->nps);
  return 0;
}

void ps_cl_sleep_ms_(int64_t ms) {
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
void ps_cl_annotate_(ps_client *c, int task, ps_status *st) {
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
