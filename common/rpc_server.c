/* The server: its life (create, start, shutdown, cancel, destroy) and its
 * event loop, where each completion-queue event drives a call: the
 * request checks (size, token), the handler's on_header and on_data, then
 * the reply (rpc_call.c) or a response stream (rpc_stream.c).  Unknown
 * methods are answered UNIMPLEMENTED.  The top of the server side: it
 * uses every other server file, and none of them calls it. */
#include "rpc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define REQS_PER_METHOD 4 /* outstanding server requests */

typedef struct generic_call {
  tag t;
  ps_rpc_server *srv;
  int state;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array md;
  int cancelled;
} generic_call;

void ps_rpc_server_options_default(ps_rpc_server_options *o) {
  memset(o, 0, sizeof *o);
  o->nthreads = 1;
  o->max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE_BYTES;
  o->stream_timeout_ms = (int64_t)PS_RPC_DEFAULT_STREAM_TIMEOUT_SECS * 1000;
  o->max_connections = PS_RPC_DEFAULT_MAX_CONNECTIONS;
  o->poll_spin_us = PS_RPC_DEFAULT_POLL_SPIN_US;
}

static void post_request(ps_rpc_server *s, size_t hi) {
  ps_rpc_call *c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->t.kind = TAG_SCALL;
  c->srv = s;
  c->hi = hi;
  grpc_metadata_array_init(&c->md);
  atomic_fetch_add(&s->live, 1);
  grpc_call_error e = grpc_server_request_registered_call(
      s->srv, s->reg[hi], &c->call, &c->deadline, &c->md,
      s->header_later ? NULL : &c->payload, s->cq, s->cq, c);
  if (e != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->md);
    free(c);
    ps_rpc_server_unref_(s);
  }
}

static void post_generic(ps_rpc_server *s) {
  generic_call *g = calloc(1, sizeof *g);
  if (g == NULL) return;
  g->t.kind = TAG_GENERIC;
  g->srv = s;
  grpc_call_details_init(&g->details);
  grpc_metadata_array_init(&g->md);
  atomic_fetch_add(&s->live, 1);
  if (grpc_server_request_call(s->srv, &g->call, &g->details, &g->md, s->cq, s->cq, g) !=
      GRPC_CALL_OK) {
    grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->md);
    free(g);
    ps_rpc_server_unref_(s);
  }
}

static void scall_complete(ps_rpc_call *c) {
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  c->state = S_PARKED;
  int rc = h->on_data(c, &c->st);
  if (c->after && (rc != 0 || c->reply == NULL || c->out.total != 0)) {
    /* not a plain answer (ps_rpc_call_after_reply's contract): the work
     * runs now, before anything is sent, so that it never stays undone */
    ps_rpc_after_fn fn = c->after;
    c->after = NULL;
    PS_ERROR("%s: after-reply work with no plain reply; run first", h->method);
    fn(c);
  }
  if (rc == PS_RPC_PENDING) return; /* ps_rpc_call_resume() finishes it */
  if (rc == PS_RPC_STREAM && c->reply) {
    ps_rpc_stream_start_(c);
    return;
  }
  if (rc != 0) {
    ps_rpc_scall_fail_(c);
    return;
  }
  if (c->reply == NULL) {
    ps_status_set(&c->st, PS_INTERNAL, "handler sent no reply");
    ps_rpc_scall_fail_(c);
    return;
  }
  if (c->after)
    ps_rpc_scall_reply_then_after_(c);
  else
    ps_rpc_scall_send_next_(c, 1);
}

/* RESOURCE_EXHAUSTED if @bb is over the message limit (--max-message-bytes).
 * A request's first message (@header) has the same limit and no lower one:
 * the other limits accept --max-read-names items (100,000) of names up to
 * 4096 bytes (common/wire.h), and a Create's constant initializer lists
 * values without bound, so any lower header cap would refuse a request
 * every other limit accepts.  What a header may make the ps allocate is
 * held down before unpacking instead (items counted on the wire,
 * ps_svc_check_items_), and the heap a refused message took is given back
 * (heap_trim). */
static int check_size(ps_rpc_call *c, grpc_byte_buffer *bb, bool header) {
  size_t n = grpc_byte_buffer_length(bb);
  int64_t max = c->srv->opt.max_message_bytes;
  if (max > 0 && (uint64_t)n > (uint64_t)max)
    return ps_status_set(&c->st, PS_RESOURCE_EXHAUSTED,
                         "%s: request %s of %zu bytes is over the limit "
                         "of %lld bytes (--max-message-bytes)",
                         c->srv->h[c->hi].method, header ? "header" : "message", n,
                         (long long)max);
  return 0;
}

/* The caller's token against the server's (options.auth): sets c->role,
 * or c->st with UNAUTHENTICATED (no token, an unknown one) or
 * PERMISSION_DENIED (a worker token on an admin method).  The token is
 * never logged nor echoed. */
static int call_authorize(ps_rpc_call *c, const ps_rpc_handler *h) {
  ps_rpc_server *s = c->srv;
  const char *m = strrchr(h->method, '/') ? strrchr(h->method, '/') + 1 : h->method;
  if (s->opt.auth == NULL) {
    c->role = PS_ROLE_ADMIN;
    ps_rpc_conns_mark_authed_(c); /* without tokens any call will do */
    return 0;
  }
  if (h->access == PS_RPC_ACCESS_OPEN) {
    c->role = PS_ROLE_NONE;
    return 0;
  }
  const grpc_slice *v = NULL;
  int found = 0;
  for (size_t i = 0; i < c->md.count; i++)
    if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
      v = &c->md.metadata[i].value;
      found++;
    }
  if (found != 1)
    return ps_status_set(&c->st, PS_UNAUTHENTICATED,
                         found ? "%s: more than one authorization header"
                               : "%s: no bearer token: this ps takes only calls with "
                                 "'authorization: Bearer TOKEN' of a token in its "
                                 "--auth-token-file (clients: --token-file or "
                                 "PS_TOKEN_FILE)",
                         m);
  ps_role r = ps_auth_check(s->opt.auth, (const char *)GRPC_SLICE_START_PTR(*v),
                            GRPC_SLICE_LENGTH(*v));
  if (r == PS_ROLE_NONE)
    return ps_status_set(&c->st, PS_UNAUTHENTICATED,
                         "%s: the bearer token is not one of this ps's tokens "
                         "(--auth-token-file)",
                         m);
  ps_rpc_conns_mark_authed_(c); /* a valid token, even with the wrong role */
  if (h->access == PS_RPC_ACCESS_ADMIN && r != PS_ROLE_ADMIN)
    return ps_status_set(&c->st, PS_PERMISSION_DENIED,
                         "%s needs an admin token; this call's token has the %s role", m,
                         ps_role_name(r));
  if (h->access == PS_RPC_ACCESS_REPLICA && r != PS_ROLE_REPLICA && r != PS_ROLE_ADMIN)
    return ps_status_set(
        &c->st, PS_PERMISSION_DENIED,
        "%s needs a replica or admin token; this call's token has the %s "
        "role",
        m, ps_role_name(r));
  if (h->access == PS_RPC_ACCESS_WORKER && r == PS_ROLE_REPLICA)
    return ps_status_set(&c->st, PS_PERMISSION_DENIED,
                         "%s needs a worker or admin token; this call's token has the "
                         "replica role (ps to ps replication only)",
                         m);
  c->role = r;
  return 0;
}

/* A refused call is logged at WARN, at most once every 10 s with the
 * count since (a guessing client shows at the default level; the token is
 * never in the message). */
static void auth_refused_log(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  atomic_fetch_add(&s->auth_refused, 1);
  long long t = now_ms(), last = atomic_load(&s->auth_log_ms);
  if (t - last < 10000 || !atomic_compare_exchange_strong(&s->auth_log_ms, &last, t))
    return;
  char *peer = grpc_call_get_peer(c->call);
  PS_WARN("refused %llu call(s) for their token in the last 10 s; the last from %s: %s",
          (unsigned long long)atomic_exchange(&s->auth_refused, 0), peer ? peer : "?",
          c->st.msg);
  gpr_free(peer);
}

ps_role ps_rpc_call_role(const ps_rpc_call *c) {
  return c->role;
}

/* The request's first message (c->payload) is in: checked, then parsed by
 * the handler; the bulk data follows. */
static void header_arrived(ps_rpc_call *c) {
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  if (c->payload == NULL) {
    ps_status_set(&c->st, PS_INVALID_ARGUMENT, "%s: no request message", h->method);
    ps_rpc_scall_fail_(c);
    return;
  }
  if (check_size(c, c->payload, true) != 0) {
    ps_rpc_scall_fail_(c);
    return;
  }
  grpc_slice sl = ps_rpc_read_all_(c->payload);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  c->bytes_in = GRPC_SLICE_LENGTH(sl);
  int rc = h->on_header(c, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), &c->st);
  grpc_slice_unref(sl);
  if (rc != 0)
    ps_rpc_scall_fail_(c);
  else
    ps_rpc_scall_recv_next_(c);
}

static void scall_event(ps_rpc_call *c, int ok) {
  ps_rpc_server *s = c->srv;
  atomic_store(&c->wait_since_ms, 0);
  switch (c->state) {
  case S_REQUESTED: {
    if (!ok) { /* server shutting down */
      ps_rpc_scall_free_(c);
      return;
    }
    if (!atomic_load(&s->shutting_down)) post_request(s, c->hi);
    const ps_rpc_handler *h = &s->h[c->hi];
    c->state = S_RECEIVING; /* from here on_free runs */
    c->t0_ns = mono_ns();
    c->code = -1;
    ps_rpc_call_link_(c);
    if (atomic_load(&s->shutting_down)) { /* a new call while stopping */
      ps_status_set(&c->st, PS_UNAVAILABLE, "%s: the ps is shutting down", h->method);
      ps_rpc_scall_fail_(c);
      return;
    }
    if (call_authorize(c, h) != 0) {
      auth_refused_log(c);
      ps_rpc_scall_fail_(c);
      return;
    }
    if (s->header_later) { /* the request message only now (see header_later) */
      grpc_op op;
      memset(&op, 0, sizeof op);
      op.op = GRPC_OP_RECV_MESSAGE;
      op.data.recv_message.recv_message = &c->payload;
      c->state = S_HEADER;
      ps_rpc_wait_client_(c, 1);
      if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK)
        ps_rpc_scall_free_(c);
      return;
    }
    header_arrived(c);
    return;
  }
  case S_HEADER:
    if (!ok) {
      ps_rpc_scall_free_(c);
      return;
    }
    c->state = S_RECEIVING;
    header_arrived(c);
    return;
  case S_RECEIVING:
  case S_EOS: {
    if (!ok) {
      ps_rpc_scall_free_(c);
      return;
    }
    grpc_byte_buffer *bb = c->bb;
    c->bb = NULL;
    if (c->state == S_EOS) {
      if (bb == NULL) {
        scall_complete(c);
        return;
      }
      grpc_byte_buffer_destroy(bb);
      ps_status_set(&c->st, PS_INVALID_ARGUMENT,
                    "%s: more data than announced (%zu bytes)", s->h[c->hi].method,
                    c->sink.total);
      ps_rpc_scall_fail_(c);
      return;
    }
    if (bb == NULL) {
      ps_status_set(&c->st, PS_INVALID_ARGUMENT,
                    "%s: request data truncated: expected %zu bytes, got %zu",
                    s->h[c->hi].method, c->sink.total, c->received);
      ps_rpc_scall_fail_(c);
      return;
    }
    int rc = check_size(c, bb, false);
    if (rc == 0)
      rc = ps_rpc_consume_chunk_(bb, &c->sink, &c->received, s->h[c->hi].method, &c->st);
    atomic_fetch_add_explicit(&s->bulk_bytes, grpc_byte_buffer_length(bb),
                              memory_order_relaxed);
    grpc_byte_buffer_destroy(bb);
    if (rc == 0 && c->progress) c->progress(c, c->received);
    if (rc != 0)
      ps_rpc_scall_fail_(c);
    else
      ps_rpc_scall_recv_next_(c);
    return;
  }
  case S_SENDING:
    if (c->bb) {
      grpc_byte_buffer_destroy(c->bb);
      c->bb = NULL;
    }
    if (!ok) {
      ps_rpc_scall_free_(c);
      return;
    }
    ps_rpc_scall_send_next_(c, 0);
    return;
  case S_STREAM:
    ps_rpc_stream_sent_(c, ok);
    return;
  case S_FINISH:
  default:
    ps_rpc_scall_free_(c);
    return;
  }
}

static void generic_free(generic_call *g) {
  ps_rpc_server *s = g->srv;
  grpc_call_details_destroy(&g->details);
  grpc_metadata_array_destroy(&g->md);
  if (g->call) grpc_call_unref(g->call);
  free(g);
  ps_rpc_server_unref_(s);
}

/* Unknown methods: the core would leave them hanging until the client's
 * deadline, so answer UNIMPLEMENTED at once. */
static void generic_event(generic_call *g, int ok) {
  if (g->state == 1 || !ok) {
    generic_free(g);
    return;
  }
  if (!atomic_load(&g->srv->shutting_down)) post_generic(g->srv);
  char msg[512];
  snprintf(msg, sizeof msg, "unknown method %.*s",
           (int)GRPC_SLICE_LENGTH(g->details.method),
           (const char *)GRPC_SLICE_START_PTR(g->details.method));
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  grpc_slice details = grpc_slice_from_copied_string(msg);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
  ops[1].data.send_status_from_server.status_details = &details;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &g->cancelled;
  g->state = 1;
  grpc_call_error e = grpc_call_start_batch(g->call, ops, 3, g, NULL);
  grpc_slice_unref(details);
  if (e != GRPC_CALL_OK) generic_free(g);
}

static void *server_thread(void *arg) {
  ps_rpc_server *s = arg;
  /* With several threads only one at a time can wait in epoll (rpc.c): the
   * others' polls would only look at the queue, so they sleep at once. */
  int64_t spin_ns = s->nthreads == 1 ? s->opt.poll_spin_us * 1000 : 0;
  for (;;) {
    grpc_event ev = ps_rpc_cq_wait_(s->cq, spin_ns, gpr_inf_future(GPR_CLOCK_REALTIME));
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    tag *t = ev.tag;
    switch (t->kind) {
    case TAG_SCALL:
      scall_event((ps_rpc_call *)t, ev.success);
      break;
    case TAG_GENERIC:
      generic_event((generic_call *)t, ev.success);
      break;
    case TAG_SCLOSE:
      ps_rpc_stream_closed_(ps_rpc_call_of_close_tag_(t));
      break;
    case TAG_SHUTDOWN:
      ps_rpc_server_unref_(s);
      break;
    default:
      break;
    }
  }
  return NULL;
}

static void server_free(ps_rpc_server *s) {
  ps_rpc_close_listeners_(s);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  pthread_mutex_destroy(&s->calls_mu);
  pthread_mutex_destroy(&s->accept_mu);
  pthread_mutex_destroy(&s->tls_mu);
  ps_rpc_tls_files_free_(&s->tls_cert, &s->tls_key, &s->tls_ca);
  if (s->fd_dir) closedir(s->fd_dir);
  free(s->conns);
  free(s->threads);
  free(s->reg);
  free(s->stats);
  free(s);
}

/* A server that was made but never started: nothing of gRPC's runs yet and
 * no connection was handed to it, so it goes without a shutdown. */
static void destroy_unstarted(ps_rpc_server *s) {
  grpc_server_destroy(s->srv);
  grpc_completion_queue_shutdown(s->cq);
  while (
      grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
      GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(s->cq);
  server_free(s);
}

/* The channel argument of TLS_EXTERNAL_PORT: where gRPC puts its handler. */
static void *slot_copy(void *p) {
  return p;
}
static void slot_destroy(void *p) {
  (void)p;
}
static int slot_cmp(void *a, void *b) {
  return a < b ? -1 : a > b;
}

ps_rpc_server *ps_rpc_server_create(const char *addr, const ps_rpc_handler *h, size_t nh,
                                    const ps_rpc_server_options *opt, void *user,
                                    ps_status *st) {
  ps_rpc_server *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  s->wake[0] = s->wake[1] = -1;
  pthread_mutex_init(&s->calls_mu, NULL);
  pthread_mutex_init(&s->accept_mu, NULL);
  pthread_mutex_init(&s->tls_mu, NULL);
  if (opt)
    s->opt = *opt;
  else
    ps_rpc_server_options_default(&s->opt);
  if (s->opt.max_message_bytes > 0 && s->opt.max_message_bytes < PS_RPC_MIN_MESSAGE_BYTES)
    s->opt.max_message_bytes = PS_RPC_MIN_MESSAGE_BYTES;
  if (s->opt.max_connections < 1) s->opt.max_connections = 1;
  s->h = h;
  s->nh = nh;
  s->user = user;
  s->nthreads = s->opt.nthreads < 1 ? 1 : s->opt.nthreads;
  if (s->opt.poll_spin_us < 0) s->opt.poll_spin_us = 0;
  if (s->opt.poll_spin_us > PS_RPC_MAX_POLL_SPIN_US)
    s->opt.poll_spin_us = PS_RPC_MAX_POLL_SPIN_US;
  s->shutdown_tag.kind = TAG_SHUTDOWN;
  atomic_init(&s->live, 1); /* the shutdown tag's */
  s->reg = calloc(nh ? nh : 1, sizeof *s->reg);
  s->stats = calloc(nh ? nh : 1, sizeof *s->stats);
  s->conns = calloc((size_t)s->opt.max_connections, sizeof *s->conns);
  if (s->reg == NULL || s->stats == NULL || s->conns == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ps_status_set(st, PS_UNAVAILABLE, "pipe: %s", strerror(errno));
    goto fail;
  }
  s->header_later = 1;
  s->tls = s->opt.tls_cert_file || s->opt.tls_key_file;
  if (s->tls) {
    if (ps_rpc_tls_files_read_(&s->opt, &s->tls_cert, &s->tls_key, &s->tls_ca, st) != 0)
      goto fail;
    s->tls_pending = 1;
    if ((s->fd_dir = opendir("/proc/self/fd")) == NULL) {
      ps_status_set(st, PS_UNAVAILABLE, "TLS: cannot list /proc/self/fd: %s",
                    strerror(errno));
      goto fail;
    }
  }
  if (ps_rpc_open_listeners_(s, addr, st) != 0) goto fail;
  grpc_arg a[9]; /* 5, the window's 3, TLS's 1 */
  ps_rpc_unlimited_args_(a, 1);
  /* A connection that has made no call after UNAUTH_CONN_MS is shut by
   * the monitor (and logged); gRPC's own handshake deadline (120 s by
   * default) is a backstop behind it. */
  a[3] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                    .value.integer = UNAUTH_CONN_MS + 5000};
  /* Our own check (with a message naming the flag) runs below this;
   * gRPC's stops a far larger message before it is all buffered. */
  if (s->opt.max_message_bytes > 0)
    a[0].value.integer = s->opt.max_message_bytes > INT_MAX / 2
                             ? INT_MAX
                             : (int)(2 * s->opt.max_message_bytes);
  /* A TCP read takes one buffer of at most a chunk message (see
   * ps_rpc_global_init_server in rpc.c). */
  a[4] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE,
                    .value.integer = (int)PS_RPC_CHUNK_MAX};
  grpc_channel_args args = {5, a};
  args.num_args += ps_rpc_window_args_(a + args.num_args, s->opt.recv_window_bytes);
  static const grpc_arg_pointer_vtable slot_vtable = {slot_copy, slot_destroy, slot_cmp};
  if (s->tls && ps_rpc_tls_external_ok_()) { /* see tls_hand_over */
    a[args.num_args++] = (grpc_arg){.type = GRPC_ARG_POINTER,
                                    .key = (char *)TLS_EXTERNAL_PORT,
                                    .value.pointer = {&s->fd_handler, &slot_vtable}};
    s->tls_external = 1;
  }
  s->srv = grpc_server_create(&args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->srv, s->cq, NULL);
  for (size_t i = 0; i < nh; i++)
    s->reg[i] = grpc_server_register_method(
        s->srv, h[i].method, NULL,
        s->header_later ? GRPC_SRM_PAYLOAD_NONE
                        : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
        0);
  if (s->tls && ps_rpc_tls_listen_(s, addr, st) != 0) {
    destroy_unstarted(s);
    return NULL;
  }
  return s;
fail:
  server_free(s);
  return NULL;
}

int ps_rpc_server_port(const ps_rpc_server *s) {
  return s->port;
}
void *ps_rpc_server_user(const ps_rpc_server *s) {
  return s->user;
}

void ps_rpc_server_start(ps_rpc_server *s) {
  grpc_server_start(s->srv);
  s->started = 1;
  for (size_t i = 0; i < s->nh; i++)
    for (int k = 0; k < REQS_PER_METHOD; k++)
      post_request(s, i);
  post_generic(s);
  post_generic(s);
  s->threads = calloc((size_t)s->nthreads, sizeof *s->threads);
  for (int i = 0; i < s->nthreads && s->threads; i++)
    if (pthread_create(&s->threads[i], NULL, server_thread, s) != 0)
      PS_ERROR("cannot start an RPC thread");
  s->accepting = 1;
  s->monitor_on = pthread_create(&s->monitor, NULL, ps_rpc_monitor_thread_, s) == 0;
  if (!s->monitor_on) PS_ERROR("cannot start the accept thread");
}

void ps_rpc_server_shutdown(ps_rpc_server *s, void (*done)(void *), void *arg) {
  s->done = done;
  s->done_arg = arg;
  atomic_store(&s->shutting_down, 1);
  /* No connection is handed to gRPC from here on; the listening sockets
   * close, so clients fail over at once. */
  pthread_mutex_lock(&s->accept_mu);
  s->accepting = 0;
  pthread_mutex_unlock(&s->accept_mu);
  s->stop_begin_ms = now_ms();
  ps_rpc_streams_end_all_(s);
  /* the monitor starts gRPC's shutdown once the running calls have ended
   * and their responses are out (stop_when_settled) */
  ssize_t w = write(s->wake[1], "x", 1);
  (void)w;
  if (!s->monitor_on) ps_rpc_grpc_stop_(s);
}

void ps_rpc_server_cancel_all(ps_rpc_server *s) {
  ps_rpc_grpc_stop_(s);
  grpc_server_cancel_all_calls(s->srv);
  /* gRPC 1.51 closes the connections, but a stream whose client stopped
   * reading can stay blocked in a send: cancel every call directly too.
   * Calls starting later are cancelled as they are linked. */
  pthread_mutex_lock(&s->calls_mu);
  s->cancelled_all = 1;
  for (ps_rpc_call *c = s->calls; c; c = c->next)
    ps_rpc_cancel_call_(c);
  pthread_mutex_unlock(&s->calls_mu);
  ps_rpc_conns_shutdown_(s, NULL);
}

void ps_rpc_server_destroy(ps_rpc_server *s) {
  if (s == NULL) return;
  if (!s->started) {
    destroy_unstarted(s);
    return;
  }
  if (s->monitor_on) {
    atomic_store(&s->stop_monitor, 1);
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->monitor, NULL);
  }
  grpc_server_destroy(s->srv);
  grpc_completion_queue_shutdown(s->cq);
  for (int i = 0; i < s->nthreads && s->threads; i++)
    pthread_join(s->threads[i], NULL);
  grpc_completion_queue_destroy(s->cq);
  server_free(s);
}
