/* The bidi streams of the etcd client (rpc_etcd_internal.h): one call on
 * one endpoint with its own completion queue, driven by the one thread of
 * a watch or a keeper through blocking send and receive with timeouts.
 * Every stream sends "hasleader: true" (etcd's rpctypes.MetadataRequireLeaderKey):
 * a member without a leader then ends it with "etcdserver: no leader"
 * rather than leaving a watch silent or a keepalive unanswered.  The
 * call's status is asked for at open, so an ended stream's error carries
 * etcd's own text. */
#include "rpc_etcd_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

enum { T_INIT, T_STATUS, T_SEND, T_RECV, T_N };

struct ps_etcd_stream {
  ps_etcd *e;
  int ep;
  grpc_completion_queue *cq;
  grpc_call *call;
  char tags[T_N]; /* the address of tags[k] is tag k */
  bool pending[T_N], done[T_N], ok[T_N];
  bool md_sent;
  grpc_metadata md[1];
  grpc_metadata_array im, tm;
  grpc_status_code code;
  grpc_slice details;
  grpc_byte_buffer *send_bb, *recv_bb;
};

static bool start(ps_etcd_stream *s, int t, grpc_op *ops, size_t n) {
  s->done[t] = false;
  if (grpc_call_start_batch(s->call, ops, n, &s->tags[t], NULL) != GRPC_CALL_OK)
    return false;
  s->pending[t] = true;
  return true;
}

/* Takes one event, waiting until @deadline_ms at most; false on timeout. */
static bool pump(ps_etcd_stream *s, int64_t deadline_ms) {
  int64_t left = deadline_ms - ps_etcd_now_ms_();
  if (left < 0) left = 0;
  grpc_event ev =
      grpc_completion_queue_next(s->cq,
                                 gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                              gpr_time_from_millis(left, GPR_TIMESPAN)),
                                 NULL);
  if (ev.type != GRPC_OP_COMPLETE) return false;
  int t = (int)((char *)ev.tag - s->tags);
  s->pending[t] = false;
  s->done[t] = true;
  s->ok[t] = ev.success != 0;
  return true;
}

ps_etcd_stream *ps_etcd_stream_open_(ps_etcd *e, int ep, const char *method,
                                     ps_status *st) {
  ps_etcd_stream *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "etcd at %s: out of memory", e->ep[ep]);
    return NULL;
  }
  s->e = e;
  s->ep = ep;
  s->details = grpc_empty_slice();
  grpc_metadata_array_init(&s->im);
  grpc_metadata_array_init(&s->tm);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  s->call = grpc_channel_create_call(e->ch[ep], NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
                                     grpc_slice_from_static_string(method), NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_op op[1];
  memset(op, 0, sizeof op);
  bool ok = s->call != NULL;
  /* C core: a RECV_MESSAGE completes only once RECV_INITIAL_METADATA
   * was asked for (ETCD_NOTES.md §5) */
  op[0].op = GRPC_OP_RECV_INITIAL_METADATA;
  op[0].data.recv_initial_metadata.recv_initial_metadata = &s->im;
  ok = ok && start(s, T_INIT, op, 1);
  memset(op, 0, sizeof op);
  op[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op[0].data.recv_status_on_client.trailing_metadata = &s->tm;
  op[0].data.recv_status_on_client.status = &s->code;
  op[0].data.recv_status_on_client.status_details = &s->details;
  ok = ok && start(s, T_STATUS, op, 1);
  if (!ok) {
    ps_status_set(st, PS_INTERNAL, "etcd at %s: cannot open %s", e->ep[ep], method);
    ps_etcd_stream_close_(s);
    return NULL;
  }
  return s;
}

const char *ps_etcd_stream_endpoint_(const ps_etcd_stream *s) {
  return s->e->ep[s->ep];
}

/* The stream's status as @st (it ended, or a batch failed). */
static int stream_error(ps_etcd_stream *s, const char *why, ps_status *st) {
  /* the status comes soon after the end; wait a little for its text */
  int64_t dl = ps_etcd_now_ms_() + 1000;
  while (!s->done[T_STATUS] && s->pending[T_STATUS] && pump(s, dl)) {
  }
  if (s->done[T_STATUS] && s->code != GRPC_STATUS_OK) {
    char *d = grpc_slice_to_c_string(s->details);
    char esc[400];
    ps_log_escape(esc, sizeof esc, d, strlen(d));
    gpr_free(d);
    return ps_status_set(st, (int)s->code, "etcd at %s: %s", ps_etcd_stream_endpoint_(s),
                         esc[0] ? esc : why);
  }
  return ps_status_set(st, PS_UNAVAILABLE, "etcd at %s: %s", ps_etcd_stream_endpoint_(s),
                       why);
}

int ps_etcd_stream_send_(ps_etcd_stream *s, const ProtobufCMessage *m, int64_t timeout_ms,
                         ps_status *st) {
  int64_t dl = ps_etcd_now_ms_() + timeout_ms;
  while (s->pending[T_SEND])
    if (!pump(s, dl)) return stream_error(s, "send timed out", st);
  if (s->send_bb) {
    grpc_byte_buffer_destroy(s->send_bb);
    s->send_bb = NULL;
  }
  if (s->done[T_SEND] && !s->ok[T_SEND]) return stream_error(s, "stream ended", st);
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  s->send_bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t k = 0;
  if (!s->md_sent) {
    s->md[0].key = grpc_slice_from_static_string("hasleader");
    s->md[0].value = grpc_slice_from_static_string("true");
    ops[k].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[k].data.send_initial_metadata.count = 1;
    ops[k++].data.send_initial_metadata.metadata = s->md;
  }
  ops[k].op = GRPC_OP_SEND_MESSAGE;
  ops[k++].data.send_message.send_message = s->send_bb;
  if (!start(s, T_SEND, ops, k)) return stream_error(s, "cannot send", st);
  s->md_sent = true;
  while (s->pending[T_SEND])
    if (!pump(s, dl)) return stream_error(s, "send timed out", st);
  if (!s->ok[T_SEND]) return stream_error(s, "stream ended", st);
  return 0;
}

int ps_etcd_stream_recv_(ps_etcd_stream *s, int64_t timeout_ms, uint8_t **buf,
                         size_t *len, ps_status *st) {
  int64_t dl = ps_etcd_now_ms_() + timeout_ms;
  /* a receive that completed while something else was waited for (a send's
   * or the status's pump) holds its message in recv_bb: take that one
   * first, never start a new receive over it (its buffer would leak and
   * its message be lost) */
  if (!s->pending[T_RECV] && !s->done[T_RECV]) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_bb;
    s->recv_bb = NULL;
    if (!start(s, T_RECV, &op, 1)) return stream_error(s, "cannot receive", st), -1;
  }
  while (s->pending[T_RECV])
    if (!pump(s, dl)) return 0;
  s->done[T_RECV] = false;
  if (!s->ok[T_RECV] || s->recv_bb == NULL)
    return stream_error(s, "stream ended", st), -1;
  grpc_byte_buffer_reader r;
  int rc = -1;
  if (grpc_byte_buffer_reader_init(&r, s->recv_bb)) {
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(sl);
    if ((*buf = malloc(n ? n : 1)) != NULL) {
      if (n) memcpy(*buf, GRPC_SLICE_START_PTR(sl), n);
      *len = n;
      rc = 1;
    } else {
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "etcd at %s: out of memory",
                    ps_etcd_stream_endpoint_(s));
    }
    grpc_slice_unref(sl);
  } else {
    ps_status_set(st, PS_INTERNAL, "etcd at %s: unreadable message",
                  ps_etcd_stream_endpoint_(s));
  }
  grpc_byte_buffer_destroy(s->recv_bb);
  s->recv_bb = NULL;
  return rc;
}

void ps_etcd_stream_close_(ps_etcd_stream *s) {
  if (s == NULL) return;
  if (s->call) {
    grpc_call_cancel(s->call, NULL);
    for (int t = 0; t < T_N; t++)
      while (s->pending[t])
        pump(s, ps_etcd_now_ms_() + 1000);
    grpc_call_unref(s->call);
  }
  grpc_completion_queue_shutdown(s->cq);
  while (
      grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
      GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(s->cq);
  if (s->send_bb) grpc_byte_buffer_destroy(s->send_bb);
  if (s->recv_bb) grpc_byte_buffer_destroy(s->recv_bb);
  grpc_slice_unref(s->details);
  grpc_metadata_array_destroy(&s->im);
  grpc_metadata_array_destroy(&s->tm);
  free(s);
}
