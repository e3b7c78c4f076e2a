/* The client: channels (plaintext or TLS, a bearer token on every call)
 * and ps_rpc_run, which drives a batch of calls on one completion queue:
 * the request header and its data chunks out, the response header and
 * chunks in, with stall timeouts that probe a quiet call's server and
 * cancel a call that heard nothing for too long.  Above rpc_bytes.c. */
#include "rpc_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "security.h"

#define MAX_METHODS 32

struct ps_rpc_channel {
  grpc_channel *ch;
  char *target;
  char *auth; /* "Bearer TOKEN", sent on every call (NULL: none) */
  pthread_mutex_t mu;
  const char *methods[MAX_METHODS];
  void *handles[MAX_METHODS];
  int nmethods;
};

ps_rpc_channel *ps_rpc_channel_create(const char *target) {
  return ps_rpc_channel_create_secure(target, NULL);
}

ps_rpc_channel *ps_rpc_channel_create_secure(const char *target,
                                             const ps_rpc_channel_security *sec) {
  ps_rpc_channel *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  if (sec && sec->token) {
    size_t n = strlen(sec->token) + 8;
    if ((c->auth = malloc(n)) == NULL) {
      free(c);
      return NULL;
    }
    snprintf(c->auth, n, "Bearer %s", sec->token);
  }
  grpc_arg a[10]; /* 6, the window's 3, TLS's 1 */
  ps_rpc_unlimited_args_(a, 0);
  /* A restarted ps should be found again within ~1 s, not after gRPC's
   * default backoff of up to two minutes (nor its 20 s minimum connect
   * timeout, which also spaces out the attempts). */
  a[3] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                    .value.integer = 100};
  a[4] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                    .value.integer = 1000};
  a[5] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                    .value.integer = 1000};
  if (sec && sec->max_recv_bytes > 0)
    a[0].value.integer =
        sec->max_recv_bytes > INT_MAX ? INT_MAX : (int)sec->max_recv_bytes;
  grpc_channel_args args = {6, a};
  args.num_args += ps_rpc_window_args_(a + args.num_args, ps_rpc_client_recv_window());
  grpc_channel_credentials *cc;
  if (sec && sec->ca_pem) {
    grpc_ssl_pem_key_cert_pair kp = {sec->key_pem, sec->cert_pem};
    cc = grpc_ssl_credentials_create_ex(
        sec->ca_pem, sec->cert_pem && sec->key_pem ? &kp : NULL, NULL, NULL);
    if (sec->server_name)
      a[args.num_args++] = (grpc_arg){.type = GRPC_ARG_STRING,
                                      .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
                                      .value.string = (char *)sec->server_name};
  } else {
    cc = grpc_insecure_credentials_create();
  }
  c->ch = grpc_channel_create(target, cc, &args);
  grpc_channel_credentials_release(cc);
  c->target = strdup(target);
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

void ps_rpc_channel_destroy(ps_rpc_channel *c) {
  if (c == NULL) return;
  grpc_channel_destroy(c->ch);
  pthread_mutex_destroy(&c->mu);
  if (c->auth) {
    ps_secure_zero(c->auth, strlen(c->auth));
    free(c->auth);
  }
  free(c->target);
  free(c);
}

const char *ps_rpc_channel_target(const ps_rpc_channel *c) {
  return c->target;
}

/* Registered call handles, one per method string (which must be static). */
static void *channel_method(ps_rpc_channel *c, const char *method) {
  void *h = NULL;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->nmethods; i++)
    if (c->methods[i] == method || !strcmp(c->methods[i], method)) {
      h = c->handles[i];
      break;
    }
  if (h == NULL && c->nmethods < MAX_METHODS) {
    h = grpc_channel_register_call(c->ch, method, NULL, NULL);
    c->methods[c->nmethods] = method;
    c->handles[c->nmethods++] = h;
  }
  pthread_mutex_unlock(&c->mu);
  return h;
}

/* Completion queues are reused across ps_rpc_run calls. */
static pthread_mutex_t cq_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static grpc_completion_queue *cq_pool[64];
static int cq_pool_n;

static grpc_completion_queue *cq_get(void) {
  grpc_completion_queue *cq = NULL;
  pthread_mutex_lock(&cq_pool_mu);
  if (cq_pool_n > 0) cq = cq_pool[--cq_pool_n];
  pthread_mutex_unlock(&cq_pool_mu);
  return cq ? cq : grpc_completion_queue_create_for_next(NULL);
}

static void cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

static void cq_put(grpc_completion_queue *cq) {
  pthread_mutex_lock(&cq_pool_mu);
  if (cq_pool_n < 64) {
    cq_pool[cq_pool_n++] = cq;
    cq = NULL;
  }
  pthread_mutex_unlock(&cq_pool_mu);
  if (cq) cq_destroy(cq);
}

typedef struct ctag {
  int kind;
  struct ccall *cc;
} ctag;

typedef struct ccall {
  ctag send_tag, recv_tag;
  ps_rpc_req *req;
  grpc_call *call;
  grpc_metadata_array init_md, trail_md;
  grpc_byte_buffer *send_bb, *recv_bb, *hdr_bb;
  grpc_status_code status;
  grpc_slice details;
  int recv_state; /* 0 header, 1 chunks, 2 status */
  int send_done, recv_done, got_status;
  cursor cur;
  ps_rpc_segs sink;
  size_t received;
  ps_status err; /* local error; wins over the transport status */
} ccall;

static int ccall_start_status(ccall *cc) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &cc->trail_md;
  op.data.recv_status_on_client.status = &cc->status;
  op.data.recv_status_on_client.status_details = &cc->details;
  cc->recv_state = 2;
  return grpc_call_start_batch(cc->call, &op, 1, &cc->recv_tag, NULL) == GRPC_CALL_OK;
}

static int ccall_start_recv(ccall *cc) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &cc->recv_bb;
  cc->recv_state = 1;
  return grpc_call_start_batch(cc->call, &op, 1, &cc->recv_tag, NULL) == GRPC_CALL_OK;
}

static void ccall_local_error(ccall *cc) {
  grpc_call_cancel_with_status(cc->call, GRPC_STATUS_CANCELLED, "client error", NULL);
}

static int ccall_send_next(ccall *cc) {
  ps_rpc_segs *s = cc->req->send;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  cc->send_bb = ps_rpc_build_chunk_(s, &cc->cur);
  if (cc->send_bb == NULL) {
    ps_status_set(&cc->err, PS_RESOURCE_EXHAUSTED,
                  "out of memory building a request chunk");
    ccall_local_error(cc); /* the call ends; the server sees it cancelled */
    return 0;
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = cc->send_bb;
  if (cc->cur.off == s->total && !cc->req->keep_open)
    ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  return grpc_call_start_batch(cc->call, ops, n, &cc->send_tag, NULL) == GRPC_CALL_OK;
}

/* Parses the response header; returns 0 or sets cc->err. */
static int ccall_header(ccall *cc, grpc_byte_buffer *bb) {
  grpc_slice sl = ps_rpc_read_all_(bb);
  int rc = cc->req->on_header
               ? cc->req->on_header(cc->req->user, GRPC_SLICE_START_PTR(sl),
                                    GRPC_SLICE_LENGTH(sl), &cc->sink, &cc->err)
               : 0;
  grpc_slice_unref(sl);
  return rc;
}

static void ccall_send_event(ccall *cc, int ok) {
  if (cc->send_bb) {
    grpc_byte_buffer_destroy(cc->send_bb);
    cc->send_bb = NULL;
  }
  ps_rpc_segs *s = cc->req->send;
  if (!ok || s == NULL || cc->cur.off == s->total || !ccall_send_next(cc))
    cc->send_done = 1;
}

static void ccall_recv_event(ccall *cc, int ok) {
  ps_rpc_req *r = cc->req;
  if (cc->recv_state == 2) { /* status (possibly with header, unary) */
    cc->got_status = 1;
    if (cc->hdr_bb) {
      if (cc->status == GRPC_STATUS_OK && cc->err.code == PS_OK)
        ccall_header(cc, cc->hdr_bb);
      grpc_byte_buffer_destroy(cc->hdr_bb);
      cc->hdr_bb = NULL;
    }
    cc->recv_done = 1;
    return;
  }
  if (cc->recv_state == 0) {
    grpc_byte_buffer *bb = cc->recv_bb;
    cc->recv_bb = NULL;
    if (ok && bb != NULL) {
      if (ccall_header(cc, bb) != 0) ccall_local_error(cc);
      grpc_byte_buffer_destroy(bb);
    } else if (bb) {
      grpc_byte_buffer_destroy(bb);
    }
    /* read on to the end of the stream: data past what the header announced
     * is the server's error, seen at once, not a wait for the deadline */
    if (ok && bb != NULL && cc->err.code == PS_OK) {
      if (!ccall_start_recv(cc)) cc->recv_done = 1;
    } else if (!ccall_start_status(cc)) {
      cc->recv_done = 1;
    }
    (void)r;
    return;
  }
  /* chunks */
  grpc_byte_buffer *bb = cc->recv_bb;
  cc->recv_bb = NULL;
  if (ok && bb != NULL) {
    /* past the announced bytes, or empty: the server broke the protocol */
    if (ps_rpc_consume_chunk_(bb, &cc->sink, &cc->received, r->method, &cc->err) != 0) {
      cc->err.code = PS_INTERNAL; /* the server broke the protocol */
      ccall_local_error(cc);
    }
    grpc_byte_buffer_destroy(bb);
    if (cc->err.code == PS_OK) {
      if (!ccall_start_recv(cc)) cc->recv_done = 1;
      return;
    }
  } else {
    if (bb) grpc_byte_buffer_destroy(bb);
    if (cc->err.code == PS_OK && cc->received < cc->sink.total)
      cc->received = (size_t)-1; /* mark truncation; checked at the end */
  }
  if (!ccall_start_status(cc)) cc->recv_done = 1;
}

static void ccall_start(ccall *cc, grpc_completion_queue *cq) {
  ps_rpc_req *r = cc->req;
  gpr_timespec deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_millis(r->timeout_ms > 0 ? r->timeout_ms : 30000, GPR_TIMESPAN));
  void *h = channel_method(r->ch, r->method);
  cc->call = h ? grpc_channel_create_registered_call(
                     r->ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, h, deadline, NULL)
               : NULL;
  if (cc->call == NULL) {
    ps_status_set(&cc->err, PS_INTERNAL, "cannot create call %s", r->method);
    cc->send_done = cc->recv_done = 1;
    return;
  }
  cc->hdr_bb = NULL;
  grpc_byte_buffer *hdr;
  if (r->request) {
    hdr = ps_rpc_pack_message_(r->request);
  } else {
    grpc_slice sl = grpc_slice_from_copied_buffer(r->raw_request, r->raw_len);
    hdr = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
  }
  int has_data = r->send && r->send->total > 0;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  grpc_metadata md;
  if (r->ch->auth) {
    md.key = grpc_slice_from_static_string("authorization");
    md.value = grpc_slice_from_static_string(r->ch->auth);
    ops[n].data.send_initial_metadata.count = 1;
    ops[n].data.send_initial_metadata.metadata = &md;
  }
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = hdr;
  if (!has_data && !r->keep_open) ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (!has_data && r->unary_response) {
    /* One batch for the whole call: the lowest latency path. */
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &cc->init_md;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &cc->hdr_bb;
    ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[n].data.recv_status_on_client.trailing_metadata = &cc->trail_md;
    ops[n].data.recv_status_on_client.status = &cc->status;
    ops[n++].data.recv_status_on_client.status_details = &cc->details;
    cc->recv_state = 2;
    cc->send_done = 1;
    cc->send_bb = hdr;
    if (grpc_call_start_batch(cc->call, ops, n, &cc->recv_tag, NULL) != GRPC_CALL_OK) {
      ps_status_set(&cc->err, PS_INTERNAL, "cannot start call %s", r->method);
      cc->recv_done = 1;
    }
    return;
  }
  cc->send_bb = hdr;
  if (grpc_call_start_batch(cc->call, ops, n, &cc->send_tag, NULL) != GRPC_CALL_OK) {
    ps_status_set(&cc->err, PS_INTERNAL, "cannot start call %s", r->method);
    cc->send_done = cc->recv_done = 1;
    return;
  }
  memset(ops, 0, sizeof ops);
  n = 0;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &cc->init_md;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  if (r->unary_response) {
    ops[n++].data.recv_message.recv_message = &cc->hdr_bb;
    ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[n].data.recv_status_on_client.trailing_metadata = &cc->trail_md;
    ops[n].data.recv_status_on_client.status = &cc->status;
    ops[n++].data.recv_status_on_client.status_details = &cc->details;
    cc->recv_state = 2;
  } else {
    ops[n++].data.recv_message.recv_message = &cc->recv_bb;
    cc->recv_state = 0;
  }
  if (grpc_call_start_batch(cc->call, ops, n, &cc->recv_tag, NULL) != GRPC_CALL_OK) {
    ps_status_set(&cc->err, PS_INTERNAL, "cannot start call %s", r->method);
    grpc_call_cancel(cc->call, NULL);
    cc->recv_done = 1;
  }
}

static void ccall_finish(ccall *cc) {
  ps_rpc_req *r = cc->req;
  if (cc->err.code != PS_OK) {
    r->st = cc->err;
  } else if (cc->got_status && cc->status != GRPC_STATUS_OK) {
    r->st.code = (int)cc->status;
    snprintf(r->st.msg, sizeof r->st.msg, "%.*s", (int)GRPC_SLICE_LENGTH(cc->details),
             (const char *)GRPC_SLICE_START_PTR(cc->details));
    /* This client never cancels a call it has not set an error for, and
     * the ps cancels with a text: a bare CANCELLED (gRPC's own text) is gRPC dropping a
     * call that reached the server as it began shutting down, before any handler saw it.
     * The call did nothing; UNAVAILABLE lets a safe call retry and a worker wait for the
     * ps to come back. */
    if (r->st.code == PS_CANCELLED &&
        (r->st.msg[0] == '\0' || !strcmp(r->st.msg, "CANCELLED")))
      ps_status_set(&r->st, PS_UNAVAILABLE,
                    "%s: the server dropped the call unserved (shutting down)",
                    r->method);
    if (r->st.msg[0] == '\0')
      snprintf(r->st.msg, sizeof r->st.msg, "%s", ps_status_code_name(r->st.code));
  } else if (!cc->got_status) {
    ps_status_set(&r->st, PS_INTERNAL, "%s: call ended without status", r->method);
  } else if (cc->received == (size_t)-1 || cc->received < cc->sink.total) {
    ps_status_set(&r->st, PS_DATA_LOSS, "%s: response data truncated", r->method);
  } else {
    ps_status_clear(&r->st);
  }
  if (cc->send_bb) grpc_byte_buffer_destroy(cc->send_bb);
  if (cc->recv_bb) grpc_byte_buffer_destroy(cc->recv_bb);
  if (cc->hdr_bb) grpc_byte_buffer_destroy(cc->hdr_bb);
  grpc_slice_unref(cc->details);
  grpc_metadata_array_destroy(&cc->init_md);
  grpc_metadata_array_destroy(&cc->trail_md);
  ps_rpc_segs_fini(&cc->sink);
  if (cc->call) grpc_call_unref(cc->call);
}

/* A call still running after this long is logged, and again every so often. */
#define PS_RPC_SLOW_WARN_NS ((int64_t)5000000000)

/* What ps_rpc_run knows of each call with a stall timeout: when it last
 * heard from its server, and the probe call that asks whether the server
 * is still there. */
typedef struct cwatch {
  int64_t heard;  /* last progress of the call or answer to a probe */
  int64_t probed; /* when its last probe started (0: never) */
  bool probing;   /* its probe is in flight */
  bool stalled;   /* cancelled for want of an answer */
  ps_rpc_req probe;
} cwatch;

static bool ccall_done(const ccall *cc) {
  return cc->send_done && cc->recv_done;
}

static void ccall_init(ccall *cc, ps_rpc_req *r) {
  memset(cc, 0, sizeof *cc);
  cc->req = r;
  cc->send_tag = (ctag){TAG_CSEND, cc};
  cc->recv_tag = (ctag){TAG_CRECV, cc};
  cc->details = grpc_empty_slice();
  grpc_metadata_array_init(&cc->init_md);
  grpc_metadata_array_init(&cc->trail_md);
}

/* "/paramserver.Ps/Update" -> "Update" */
static const char *method_short(const char *m) {
  const char *s = strrchr(m, '/');
  return s ? s + 1 : m;
}

/* The silence after which a quiet call's server is probed: a quarter of
 * its stall timeout, at most a second. */
static int64_t probe_after_ns(const ps_rpc_req *r) {
  int64_t q = r->stall_timeout_ms * 250000;
  return q < 1000000000 ? q : 1000000000;
}

/* Stall timeouts (ps_rpc_req.stall_timeout_ms): probes the servers of
 * quiet calls and cancels the calls that heard nothing for too long.
 * cs[n + k] is call k's probe.  Returns how many probes it started. */
static size_t watch_calls(ccall *cs, cwatch *w, size_t n, grpc_completion_queue *cq,
                          int64_t now) {
  size_t started = 0;
  for (size_t i = 0; i < n; i++) {
    ps_rpc_req *r = cs[i].req;
    if (r->stall_timeout_ms <= 0 || ccall_done(&cs[i]) || w[i].stalled) continue;
    int64_t silent = now - w[i].heard, limit = r->stall_timeout_ms * 1000000;
    if (r->silent_since_ns && silent >= 1000000000)
      atomic_store(r->silent_since_ns, (long long)w[i].heard);
    if (silent >= limit) {
      w[i].stalled = true;
      ps_status_set(&cs[i].err, PS_DEADLINE_EXCEEDED,
                    "%s: no answer for %g s (--rpc-timeout)", method_short(r->method),
                    (double)r->stall_timeout_ms / 1000);
      grpc_call_cancel_with_status(cs[i].call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                   "no answer (--rpc-timeout)", NULL);
      continue;
    }
    int64_t every = probe_after_ns(r);
    if (r->probe_method == NULL || silent < every || w[i].probing ||
        (w[i].probed && now - w[i].probed < every))
      continue;
    bool busy = false; /* one probe per channel at a time */
    for (size_t k = 0; k < n && !busy; k++)
      busy = w[k].probing && cs[k].req->ch == r->ch;
    if (busy) continue;
    ps_rpc_req *p = &w[i].probe;
    memset(p, 0, sizeof *p);
    p->ch = r->ch;
    p->method = r->probe_method;
    p->raw_request = "";
    p->unary_response = true;
    p->timeout_ms = r->stall_timeout_ms;
    ccall *pc = &cs[n + i];
    ccall_init(pc, p);
    ccall_start(pc, cq);
    w[i].probed = now;
    if (ccall_done(pc)) {
      ccall_finish(pc);
    } else {
      w[i].probing = true;
      started++;
    }
  }
  return started;
}

/* The call's silence is over (it ended or heard from its server). */
static void silence_over(ps_rpc_req *r, int64_t since) {
  if (r->silent_since_ns == NULL) return;
  long long expect = (long long)since;
  atomic_compare_exchange_strong(r->silent_since_ns, &expect, 0);
}

int ps_rpc_run(ps_rpc_req *reqs, size_t n) {
  if (n == 0) return 0;
  /* cs[0, n): the calls; cs[n, 2n): their probes */
  ccall *cs = n <= SIZE_MAX / 2 / sizeof(ccall) ? calloc(2 * n, sizeof *cs) : NULL;
  cwatch *w = calloc(n, sizeof *w);
  if (cs == NULL || w == NULL) {
    free(cs);
    free(w);
    for (size_t i = 0; i < n; i++)
      ps_status_set(&reqs[i].st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return (int)n;
  }
  grpc_completion_queue *cq = cq_get();
  size_t live = 0, nprobe = 0;
  bool watching = false, probes_cancelled = false;
  int64_t t0 = mono_ns(), next_warn = t0 + PS_RPC_SLOW_WARN_NS, last_turn = t0;
  int64_t spin_ns = ps_rpc_poll_spin_us() * 1000;
  for (size_t i = 0; i < n; i++) {
    ccall *cc = &cs[i];
    ccall_init(cc, &reqs[i]);
    reqs[i].elapsed_secs = 0;
    w[i].heard = t0;
    watching |= reqs[i].stall_timeout_ms > 0;
    ccall_start(cc, cq);
    if (!ccall_done(cc)) live++;
  }
  while (live > 0 || nprobe > 0) {
    int64_t now = mono_ns();
    if (watching && now - last_turn > 1000000000) {
      /* this process was not running (SIGSTOP, a frozen VM): the silence
       * was its own, not the servers' */
      for (size_t i = 0; i < n; i++) {
        silence_over(&reqs[i], w[i].heard);
        w[i].heard = now;
      }
    }
    last_turn = now;
    /* after the events that came in: an answer on time is not a stall */
    if (live > 0 && watching) nprobe += watch_calls(cs, w, n, cq, now);
    if (live == 0 && !probes_cancelled) { /* every call ended: no more asking */
      for (size_t k = 0; k < n; k++)
        if (w[k].probing) grpc_call_cancel(cs[n + k].call, NULL);
      probes_cancelled = true;
    }
    grpc_event ev = ps_rpc_cq_wait_(
        cq, spin_ns,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(watching ? 100 : 500, GPR_TIMESPAN)));
    now = mono_ns();
    if (live > 0 && now >= next_warn) { /* a dead link or a stuck ps shows in the log */
      for (size_t i = 0; i < n; i++)
        if (!ccall_done(&cs[i])) {
          char quiet[96] = "";
          if (reqs[i].stall_timeout_ms > 0)
            snprintf(quiet, sizeof quiet, "; no answer for %.0f s, --rpc-timeout %g s",
                     (double)(now - w[i].heard) / 1e9,
                     (double)reqs[i].stall_timeout_ms / 1000);
          PS_WARN("still waiting after %.0f s for %s on %s (%zu call(s) outstanding%s)",
                  (double)(now - t0) / 1e9, reqs[i].method, reqs[i].ch->target, live,
                  quiet);
          break;
        }
      next_warn += PS_RPC_SLOW_WARN_NS;
    }
    if (ev.type != GRPC_OP_COMPLETE) continue;
    ctag *t = ev.tag;
    ccall *cc = t->cc;
    size_t i = (size_t)(cc - cs);
    int was_done = ccall_done(cc);
    if (t->kind == TAG_CSEND)
      ccall_send_event(cc, ev.success);
    else
      ccall_recv_event(cc, ev.success);
    if (i >= n) { /* a probe */
      if (was_done || !ccall_done(cc)) continue;
      size_t k = i - n;
      ccall_finish(cc);
      w[k].probing = false;
      nprobe--;
      if (w[k].probe.st.code != PS_OK) continue;
      now = mono_ns(); /* the server answered: it is there */
      for (size_t j = 0; j < n; j++)
        if (!ccall_done(&cs[j]) && reqs[j].ch == w[k].probe.ch) {
          silence_over(&reqs[j], w[j].heard);
          w[j].heard = now;
        }
      continue;
    }
    silence_over(cc->req, w[i].heard);
    w[i].heard = mono_ns();
    if (!was_done && ccall_done(cc)) {
      live--;
      cc->req->elapsed_secs = (double)(mono_ns() - t0) / 1e9;
    }
  }
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    ccall_finish(&cs[i]);
    if (reqs[i].st.code != PS_OK) failed++;
  }
  cq_put(cq);
  free(cs);
  free(w);
  return failed;
}
