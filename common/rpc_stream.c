/* Response streams (PS_RPC_STREAM).
 *
 * The call stays open after its first message; the server sends more with
 * stream_pump (one send in flight at a time, only the newest queued
 * message kept) until it stops, when the handler's on_stream_end gives the
 * last message and the stream ends with OK.  A RECV_CLOSE_ON_SERVER batch
 * (tag close_t) tells when the client went; the call is freed when no
 * batch of it is in flight.  Everything here runs under calls_mu.  Above
 * rpc_call.c; driven by rpc_server.c. */
#include "rpc_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <stddef.h>
#include <string.h>

ps_rpc_call *ps_rpc_call_of_close_tag_(tag *t) {
  return (ps_rpc_call *)((char *)t - offsetof(ps_rpc_call, close_t));
}

/* Starts the next send of @c: its queued message, else the final status
 * once the end is asked. */
static void stream_pump(ps_rpc_call *c) {
  if (c->st_sending || c->st_dead || c->st_ended || c->st_free) return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  if (c->st_next) {
    c->bb = c->st_next;
    c->st_next = NULL;
    c->bytes_out += grpc_byte_buffer_length(c->bb);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = c->bb;
  } else if (c->st_end) {
    op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op.data.send_status_from_server.status = GRPC_STATUS_OK;
    c->code = PS_OK;
    c->st_ended = 1;
  } else {
    return;
  }
  ps_rpc_wait_client_(c, 2);
  if (grpc_call_start_batch(c->call, &op, 1, c, NULL) == GRPC_CALL_OK) {
    c->st_sending = 1;
    c->st_batches++;
  } else {
    c->st_dead = 1;
  }
}

/* The server stops: @c's handler sets the last message, then the status. */
static void stream_end(ps_rpc_call *c) {
  if (c->st_end || c->st_free) return;
  c->st_end = 1;
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  if (h->on_stream_end) {
    h->on_stream_end(c);
    if (c->reply) {
      if (c->st_next) grpc_byte_buffer_destroy(c->st_next);
      c->st_next = c->reply;
      c->reply = NULL;
    }
  }
  stream_pump(c);
}

/* After a batch of @c completed (under calls_mu): true when @c is to be
 * freed now (the caller frees it after unlocking). */
static bool stream_settle(ps_rpc_call *c) {
  if (--c->st_batches > 0 || c->st_free) return false;
  c->st_free = 1;
  return true;
}

void ps_rpc_stream_sent_(ps_rpc_call *c, int ok) {
  ps_rpc_server *s = c->srv;
  pthread_mutex_lock(&s->calls_mu);
  c->st_sending = 0;
  if (c->bb) {
    grpc_byte_buffer_destroy(c->bb);
    c->bb = NULL;
  }
  if (!ok) c->st_dead = 1;
  stream_pump(c);
  bool gone = stream_settle(c);
  pthread_mutex_unlock(&s->calls_mu);
  if (gone) ps_rpc_scall_free_(c);
}

void ps_rpc_stream_closed_(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  pthread_mutex_lock(&s->calls_mu);
  c->st_dead = 1;
  bool gone = stream_settle(c);
  pthread_mutex_unlock(&s->calls_mu);
  if (gone) ps_rpc_scall_free_(c);
}

/* Opens the stream of @c with its reply as the first message. */
void ps_rpc_stream_start_(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  const char *method = s->h[c->hi].method;
  pthread_mutex_lock(&s->calls_mu);
  if (atomic_load(&s->nstreams) >= PS_RPC_MAX_STREAMS) {
    pthread_mutex_unlock(&s->calls_mu);
    ps_status_set(&c->st, PS_RESOURCE_EXHAUSTED,
                  "%s: %d response streams are open, the most this server keeps", method,
                  PS_RPC_MAX_STREAMS);
    ps_rpc_scall_fail_(c);
    return;
  }
  atomic_fetch_add(&s->nstreams, 1);
  c->streaming = 1;
  c->state = S_STREAM;
  c->close_t.kind = TAG_SCLOSE;
  c->bb = c->reply;
  c->reply = NULL;
  c->bytes_out += grpc_byte_buffer_length(c->bb);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->bb;
  ps_rpc_wait_client_(c, 2);
  if (grpc_call_start_batch(c->call, ops, 2, c, NULL) == GRPC_CALL_OK) {
    c->st_sending = 1;
    c->st_batches++;
  } else {
    c->st_dead = 1;
  }
  grpc_op cl;
  memset(&cl, 0, sizeof cl);
  cl.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  cl.data.recv_close_on_server.cancelled = &c->cancelled;
  if (grpc_call_start_batch(c->call, &cl, 1, &c->close_t, NULL) == GRPC_CALL_OK)
    c->st_batches++;
  else
    c->st_dead = 1;
  /* a server already stopping ends it at once (ps_rpc_server_shutdown
   * looked for streams before this one opened) */
  if (atomic_load(&s->shutting_down)) stream_end(c);
  bool gone = c->st_batches == 0 && !c->st_free;
  if (gone) c->st_free = 1;
  pthread_mutex_unlock(&s->calls_mu);
  if (gone) ps_rpc_scall_free_(c);
}

void ps_rpc_streams_end_all_(ps_rpc_server *s) {
  pthread_mutex_lock(&s->calls_mu);
  for (ps_rpc_call *c = s->calls; c; c = c->next)
    if (c->streaming) stream_end(c);
  pthread_mutex_unlock(&s->calls_mu);
}
