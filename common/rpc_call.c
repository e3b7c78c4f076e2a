/* A server call's own machinery: the call list the monitor walks, the
 * batches that receive request data and send the reply (chunk by chunk,
 * status last), per-method statistics, and what handlers call on a call
 * (reply, expect, resume, ctx).  Above rpc_bytes.c; below the streams
 * (rpc_stream.c) and the event loop (rpc_server.c). */
#include "rpc_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

const double ps_rpc_latency_bounds[PS_RPC_NBUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

/* Drops one count of s->live; the last one runs @done.  The caller must
 * not touch @s afterwards. */
void ps_rpc_server_unref_(ps_rpc_server *s) {
  if (atomic_fetch_sub(&s->live, 1) == 1 && s->done) s->done(s->done_arg);
}

void ps_rpc_call_link_(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  pthread_mutex_lock(&s->calls_mu);
  c->prev = NULL;
  c->next = s->calls;
  if (s->calls) s->calls->prev = c;
  s->calls = c;
  c->linked = 1;
  atomic_fetch_add(&s->in_flight, 1);
  atomic_fetch_add(&s->calls_started, 1);
  if (s->cancelled_all) ps_rpc_cancel_call_(c);
  pthread_mutex_unlock(&s->calls_mu);
}

static void call_unlink(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  if (!c->linked) return;
  pthread_mutex_lock(&s->calls_mu);
  if (c->prev)
    c->prev->next = c->next;
  else
    s->calls = c->next;
  if (c->next) c->next->prev = c->prev;
  c->linked = 0;
  atomic_fetch_sub(&s->in_flight, 1);
  pthread_mutex_unlock(&s->calls_mu);
}

/* Before a batch that waits on the client (@dir 1: request, 2: response). */
void ps_rpc_wait_client_(ps_rpc_call *c, int dir) {
  atomic_store(&c->wait_dir, dir);
  atomic_store(&c->wait_since_ms, now_ms());
}

/* A call that was served ends: its method's counters. */
static void record_call(ps_rpc_call *c) {
  method_stats *m = &c->srv->stats[c->hi];
  int code = c->code >= 0 && c->code < PS_RPC_NCODES ? c->code : PS_CANCELLED;
  double secs = (double)(mono_ns() - c->t0_ns) / 1e9;
  int b = 0;
  while (b < PS_RPC_NBUCKETS && secs > ps_rpc_latency_bounds[b])
    b++;
  atomic_fetch_add_explicit(&m->calls[code], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->sum_us, (unsigned long long)(secs * 1e6),
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&m->bytes_in, c->bytes_in + c->received,
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&m->bytes_out, c->bytes_out + c->out.total,
                            memory_order_relaxed);
}

void ps_rpc_server_activity(ps_rpc_server *s, long *in_flight,
                            unsigned long long *started) {
  /* an open response stream (a health watcher) is no work in progress */
  long n = atomic_load(&s->in_flight) - atomic_load(&s->nstreams);
  *in_flight = n > 0 ? n : 0; /* a stream being freed may be uncounted first */
  *started = atomic_load(&s->calls_started);
}

ps_rpc_method_stats *ps_rpc_server_stats(const ps_rpc_server *s, size_t *n) {
  *n = 0;
  ps_rpc_method_stats *out = calloc(s->nh + 1, sizeof *out);
  if (out == NULL) return NULL;
  for (size_t i = 0; i < s->nh; i++) {
    method_stats *m = &s->stats[i];
    ps_rpc_method_stats *o = &out[i];
    o->method = s->h[i].method;
    for (int k = 0; k < PS_RPC_NCODES; k++)
      o->calls[k] = atomic_load_explicit(&m->calls[k], memory_order_relaxed);
    for (int k = 0; k <= PS_RPC_NBUCKETS; k++)
      o->buckets[k] = atomic_load_explicit(&m->buckets[k], memory_order_relaxed);
    o->sum_secs = (double)atomic_load_explicit(&m->sum_us, memory_order_relaxed) / 1e6;
    o->bytes_in = atomic_load_explicit(&m->bytes_in, memory_order_relaxed);
    o->bytes_out = atomic_load_explicit(&m->bytes_out, memory_order_relaxed);
  }
  *n = s->nh;
  return out;
}

void ps_rpc_scall_free_(ps_rpc_call *c) {
  int pinned = 1; /* after-reply work still running: it frees the call */
  if (atomic_compare_exchange_strong(&c->pin, &pinned, 2)) return;
  ps_rpc_server *s = c->srv;
  const ps_rpc_handler *h = &s->h[c->hi];
  if (c->state != S_REQUESTED) record_call(c);
  call_unlink(c);
  if (c->state != S_REQUESTED && h->on_free) h->on_free(c);
  ps_rpc_segs_fini(&c->sink);
  ps_rpc_segs_fini(&c->out);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->bb) grpc_byte_buffer_destroy(c->bb);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  if (c->st_next) grpc_byte_buffer_destroy(c->st_next);
  if (c->streaming) atomic_fetch_sub(&s->nstreams, 1);
  grpc_metadata_array_destroy(&c->md);
  if (c->call) grpc_call_unref(c->call);
  free(c);
  ps_rpc_server_unref_(s);
}

/* Starts the final batch carrying @code; the call is freed on completion. */
static void scall_finish(ps_rpc_call *c, int with_md, int code, const char *msg) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (with_md) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  grpc_slice details = grpc_slice_from_copied_string(msg ? msg : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)code;
  ops[n].data.send_status_from_server.status_details = code ? &details : NULL;
  c->code = code;
  n++;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
  n++;
  c->state = S_FINISH;
  ps_rpc_wait_client_(c, 2);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
  grpc_slice_unref(details);
  if (e != GRPC_CALL_OK) ps_rpc_scall_free_(c);
}

void ps_rpc_scall_fail_(ps_rpc_call *c) {
  if (c->st.code == PS_OK) ps_status_set(&c->st, PS_INTERNAL, "handler failed");
  PS_DEBUG("%s failed: %s: %s", c->srv->h[c->hi].method, ps_status_code_name(c->st.code),
           c->st.msg);
  scall_finish(c, 1, c->st.code, c->st.msg);
}

void ps_rpc_scall_recv_next_(ps_rpc_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->bb;
  /* All announced bytes in: the next message must be the end of stream. */
  c->state = c->received < c->sink.total ? S_RECEIVING : S_EOS;
  ps_rpc_wait_client_(c, 1);
  if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK)
    ps_rpc_scall_free_(c);
}

/* Sends the reply header or the next chunk; the last one carries status. */
void ps_rpc_scall_send_next_(ps_rpc_call *c, int first) {
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (first) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->reply;
    n++;
  } else {
    c->bb = ps_rpc_build_chunk_(&c->out, &c->cur);
    if (c->bb == NULL) {
      scall_finish(c, 0, PS_RESOURCE_EXHAUSTED,
                   "out of memory building a response chunk");
      return;
    }
    atomic_fetch_add_explicit(&c->srv->bulk_bytes, grpc_byte_buffer_length(c->bb),
                              memory_order_relaxed);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->bb;
    n++;
  }
  int last = c->cur.off == c->out.total;
  if (first && c->reply) c->bytes_out += grpc_byte_buffer_length(c->reply);
  if (last) {
    c->code = PS_OK;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
  }
  c->state = last ? S_FINISH : S_SENDING;
  ps_rpc_wait_client_(c, 2);
  if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK)
    ps_rpc_scall_free_(c);
}

/* Cancels @c (under calls_mu). */
void ps_rpc_cancel_call_(ps_rpc_call *c) {
  grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE,
                               "ps shutting down: call cancelled", NULL);
}

void ps_rpc_call_resume(ps_rpc_call *c, int rc, const ps_status *st) {
  if (rc != 0) {
    if (st) c->st = *st;
    if (c->st.code == PS_OK) c->st.code = rc;
    ps_rpc_scall_fail_(c);
  } else if (c->reply == NULL) {
    ps_status_set(&c->st, PS_INTERNAL, "handler sent no reply");
    ps_rpc_scall_fail_(c);
  } else {
    ps_rpc_scall_send_next_(c, 1);
  }
}

void ps_rpc_call_after_reply(ps_rpc_call *c, ps_rpc_after_fn fn) {
  c->after = fn;
}

/* Sends the reply, then runs the handler's after-reply work with the call
 * pinned; frees the call if its last completion came meanwhile. */
void ps_rpc_scall_reply_then_after_(ps_rpc_call *c) {
  ps_rpc_after_fn fn = c->after;
  c->after = NULL;
  atomic_store(&c->pin, 1);
  ps_rpc_scall_send_next_(c, 1);
  fn(c);
  if (atomic_exchange(&c->pin, 0) == 2) ps_rpc_scall_free_(c);
}

bool ps_rpc_call_expired(const ps_rpc_call *c) {
  return gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
}

void *ps_rpc_call_server_user(ps_rpc_call *c) {
  return c->srv->user;
}
void ps_rpc_call_set_ctx(ps_rpc_call *c, void *ctx) {
  c->ctx = ctx;
}
void *ps_rpc_call_ctx(ps_rpc_call *c) {
  return c->ctx;
}

void ps_rpc_call_expect(ps_rpc_call *c, ps_rpc_segs *sink) {
  ps_rpc_segs_fini(&c->sink);
  c->sink = *sink;
  memset(sink, 0, sizeof *sink);
}

void ps_rpc_call_on_progress(ps_rpc_call *c, ps_rpc_progress_fn fn) {
  c->progress = fn;
}

int ps_rpc_call_reply(ps_rpc_call *c, const ProtobufCMessage *m) {
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  c->reply = ps_rpc_pack_message_(m);
  return 0;
}

int ps_rpc_call_reply_data(ps_rpc_call *c, void *ptr, size_t len, ps_buf *owner) {
  return ps_rpc_segs_add(&c->out, ptr, len, owner);
}
