/* RPC glue over gRPC core (Debian 12: core 29 / gRPC 1.51).
 *
 * All direct gRPC calls of the project live here, because the core API is
 * not stable across releases: one module to adapt when it changes.
 *
 * Each call, server or client side, is a small state machine driven by
 * completion-queue events; the event tag points at a struct whose first
 * field says what kind of tag it is.  Bulk bytes travel as Chunk messages
 * (tag 0x0a, varint length, bytes): outgoing ranges of 4 KiB or more are
 * wrapped as zero-copy slices that hold a reference on the owning ps_buf;
 * smaller ranges are coalesced into one copied slice.  Incoming chunks are
 * walked slice by slice and copied straight into the receiver's ranges, so a
 * tensor is copied once on receive and never on send. */
#include "rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define CHUNK_MAX ((size_t)16 << 20) /* bytes of one Chunk message */
#define ZEROCOPY_MIN 4096            /* smaller ranges are copied */
#define REQS_PER_METHOD 4            /* outstanding server requests */

enum { TAG_SCALL = 1, TAG_GENERIC, TAG_SHUTDOWN, TAG_CSEND, TAG_CRECV };

void ps_rpc_global_init(void) { grpc_init(); }
void ps_rpc_global_shutdown(void) { grpc_shutdown(); }

/* ---- byte ranges ---- */

int ps_rpc_segs_add(ps_rpc_segs *s, void *ptr, size_t len, ps_buf *owner) {
  if (len == 0) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    ps_rpc_seg *v = realloc(s->v, cap * sizeof *v);
    if (v == NULL) return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = (ps_rpc_seg){ptr, len, ps_buf_ref(owner)};
  s->total += len;
  return 0;
}

void ps_rpc_segs_fini(ps_rpc_segs *s) {
  for (size_t i = 0; i < s->n; i++) ps_buf_unref(s->v[i].owner);
  free(s->v);
  memset(s, 0, sizeof *s);
}

void ps_rpc_segs_fill(ps_rpc_segs *s, size_t off, const void *p, size_t n) {
  const uint8_t *src = p;
  for (size_t i = 0; i < s->n && n > 0; i++) {
    if (off >= s->v[i].len) {
      off -= s->v[i].len;
      continue;
    }
    size_t k = s->v[i].len - off;
    if (k > n) k = n;
    memcpy((uint8_t *)s->v[i].ptr + off, src, k);
    src += k;
    n -= k;
    off = 0;
  }
}

/* Cursor over a range list while sending. */
typedef struct cursor {
  size_t seg, pos, off;
} cursor;

static void unref_owner(void *owner) { ps_buf_unref(owner); }

/* The next Chunk message of at most CHUNK_MAX bytes from @s at @cur. */
static grpc_byte_buffer *build_chunk(ps_rpc_segs *s, cursor *cur) {
  size_t len = s->total - cur->off;
  if (len > CHUNK_MAX) len = CHUNK_MAX;
  grpc_slice stack_slices[16], *slices = stack_slices;
  size_t ns = 0, cap = 16;
  uint8_t hdr[11];
  size_t hn = 0;
  hdr[hn++] = 0x0a;
  for (uint64_t v = len;; v >>= 7) {
    if (v < 0x80) {
      hdr[hn++] = (uint8_t)v;
      break;
    }
    hdr[hn++] = (uint8_t)(v | 0x80);
  }
  /* Small pieces accumulate here and become one copied slice. */
  uint8_t *small = NULL;
  size_t small_n = 0, small_cap = 0;
#define PUSH_SLICE(sl)                                                   \
  do {                                                                   \
    if (ns == cap) {                                                     \
      grpc_slice *nv = malloc(2 * cap * sizeof *nv);                     \
      memcpy(nv, slices, ns * sizeof *nv);                               \
      if (slices != stack_slices) free(slices);                          \
      slices = nv;                                                       \
      cap *= 2;                                                          \
    }                                                                    \
    slices[ns++] = (sl);                                                 \
  } while (0)
#define FLUSH_SMALL()                                                    \
  do {                                                                   \
    if (small_n) {                                                       \
      PUSH_SLICE(grpc_slice_from_copied_buffer((char *)small, small_n)); \
      small_n = 0;                                                       \
    }                                                                    \
  } while (0)
#define ADD_SMALL(p, k)                                                  \
  do {                                                                   \
    if (small_n + (k) > small_cap) {                                     \
      small_cap = (small_n + (k)) * 2 + 256;                             \
      small = realloc(small, small_cap);                                 \
    }                                                                    \
    memcpy(small + small_n, (p), (k));                                   \
    small_n += (k);                                                      \
  } while (0)
  ADD_SMALL(hdr, hn);
  size_t left = len;
  while (left > 0 && cur->seg < s->n) {
    ps_rpc_seg *g = &s->v[cur->seg];
    size_t k = g->len - cur->pos;
    if (k > left) k = left;
    uint8_t *p = (uint8_t *)g->ptr + cur->pos;
    if (k >= ZEROCOPY_MIN && g->owner != NULL) {
      FLUSH_SMALL();
      ps_buf_ref(g->owner);
      PUSH_SLICE(grpc_slice_new_with_user_data(p, k, unref_owner, g->owner));
    } else {
      ADD_SMALL(p, k);
    }
    cur->pos += k;
    cur->off += k;
    left -= k;
    if (cur->pos == g->len) {
      cur->seg++;
      cur->pos = 0;
    }
  }
  FLUSH_SMALL();
  free(small);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, ns);
  for (size_t i = 0; i < ns; i++) grpc_slice_unref(slices[i]);
  if (slices != stack_slices) free(slices);
  return bb;
#undef PUSH_SLICE
#undef FLUSH_SMALL
#undef ADD_SMALL
}

/* Copies the payload of one Chunk message into @sink at *@received. */
static int consume_chunk(grpc_byte_buffer *bb, ps_rpc_segs *sink,
                         size_t *received, const char *what, ps_status *st) {
  size_t msg_len = grpc_byte_buffer_length(bb);
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return ps_status_set(st, PS_INTERNAL, "%s: cannot read message", what);
  uint8_t hdr[11];
  size_t hn = 0, need = msg_len == 0 ? 0 : 2, payload = 0, got = 0;
  int hdr_done = msg_len == 0, rc = 0;
  grpc_slice sl;
  while (grpc_byte_buffer_reader_next(&r, &sl)) {
    const uint8_t *p = GRPC_SLICE_START_PTR(sl);
    size_t n = GRPC_SLICE_LENGTH(sl);
    while (!hdr_done && n > 0 && rc == 0) {
      hdr[hn++] = *p++;
      n--;
      if (hn == 1 && hdr[0] != 0x0a) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: malformed data chunk (tag 0x%02x)", what, hdr[0]);
      } else if (hn >= 2 && !(hdr[hn - 1] & 0x80)) {
        uint64_t v = 0;
        for (size_t i = 1; i < hn; i++) v |= (uint64_t)(hdr[i] & 0x7f) << (7 * (i - 1));
        if (v != msg_len - hn)
          rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s: malformed data chunk (length %llu in a "
                             "message of %zu bytes)",
                             what, (unsigned long long)v, msg_len);
        else if (*received + v > sink->total)
          rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s: more data than announced (%zu bytes)", what,
                             sink->total);
        payload = (size_t)v;
        hdr_done = 1;
      } else if (hn == sizeof hdr) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: malformed data chunk (varint)", what);
      }
    }
    if (rc == 0 && hdr_done && n > 0) {
      ps_rpc_segs_fill(sink, *received + got, p, n);
      got += n;
    }
    grpc_slice_unref(sl);
    if (rc) break;
  }
  grpc_byte_buffer_reader_destroy(&r);
  (void)need;
  if (rc == 0 && !hdr_done)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: truncated data chunk", what);
  if (rc == 0 && got != payload)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: truncated data chunk", what);
  if (rc == 0) *received += got;
  return rc;
}

static grpc_byte_buffer *pack_message(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

/* Contiguous copy of a received message; caller unrefs. */
static grpc_slice read_all(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return s;
}

static void unlimited_args(grpc_arg *a, int server) {
  a[0] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                    .value.integer = -1};
  /* A stale daemon must not silently share our port. */
  a[2] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = server ? GRPC_ARG_ALLOW_REUSEPORT : GRPC_ARG_ENABLE_RETRIES,
                    .value.integer = 0};
}

/* ---- server ---- */

typedef struct tag {
  int kind;
} tag;

enum { S_REQUESTED, S_RECEIVING, S_SENDING, S_FINISH };

struct ps_rpc_call {
  tag t;
  ps_rpc_server *srv;
  size_t hi;
  int state;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_byte_buffer *bb; /* in-flight send or receive */
  int cancelled;
  void *ctx;
  ps_rpc_segs sink;
  size_t received;
  grpc_byte_buffer *reply;
  ps_rpc_segs out;
  cursor cur;
  ps_status st;
};

typedef struct generic_call {
  tag t;
  ps_rpc_server *srv;
  int state;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array md;
  int cancelled;
} generic_call;

struct ps_rpc_server {
  grpc_server *srv;
  grpc_completion_queue *cq;
  int port;
  const ps_rpc_handler *h;
  size_t nh;
  void **reg;
  pthread_t *threads;
  int nthreads;
  void *user;
  atomic_int shutting_down;
  tag shutdown_tag;
  void (*done)(void *);
  void *done_arg;
};

static void post_request(ps_rpc_server *s, size_t hi) {
  ps_rpc_call *c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->t.kind = TAG_SCALL;
  c->srv = s;
  c->hi = hi;
  grpc_metadata_array_init(&c->md);
  grpc_call_error e = grpc_server_request_registered_call(
      s->srv, s->reg[hi], &c->call, &c->deadline, &c->md, &c->payload, s->cq,
      s->cq, c);
  if (e != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->md);
    free(c);
  }
}

static void post_generic(ps_rpc_server *s) {
  generic_call *g = calloc(1, sizeof *g);
  if (g == NULL) return;
  g->t.kind = TAG_GENERIC;
  g->srv = s;
  grpc_call_details_init(&g->details);
  grpc_metadata_array_init(&g->md);
  if (grpc_server_request_call(s->srv, &g->call, &g->details, &g->md, s->cq,
                               s->cq, g) != GRPC_CALL_OK) {
    grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->md);
    free(g);
  }
}

static void scall_free(ps_rpc_call *c) {
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  if (c->state != S_REQUESTED && h->on_free) h->on_free(c);
  ps_rpc_segs_fini(&c->sink);
  ps_rpc_segs_fini(&c->out);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->bb) grpc_byte_buffer_destroy(c->bb);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  grpc_metadata_array_destroy(&c->md);
  if (c->call) grpc_call_unref(c->call);
  free(c);
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
  n++;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
  n++;
  c->state = S_FINISH;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
  grpc_slice_unref(details);
  if (e != GRPC_CALL_OK) scall_free(c);
}

static void scall_fail(ps_rpc_call *c) {
  if (c->st.code == PS_OK) ps_status_set(&c->st, PS_INTERNAL, "handler failed");
  PS_DEBUG("%s failed: %s: %s", c->srv->h[c->hi].method,
           ps_status_code_name(c->st.code), c->st.msg);
  scall_finish(c, 1, c->st.code, c->st.msg);
}

static void scall_recv_next(ps_rpc_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->bb;
  c->state = S_RECEIVING;
  if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK)
    scall_free(c);
}

/* Sends the reply header or the next chunk; the last one carries status. */
static void scall_send_next(ps_rpc_call *c, int first) {
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
    c->bb = build_chunk(&c->out, &c->cur);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->bb;
    n++;
  }
  int last = c->cur.off == c->out.total;
  if (last) {
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
  }
  c->state = last ? S_FINISH : S_SENDING;
  if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK)
    scall_free(c);
}

static void scall_complete(ps_rpc_call *c) {
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  int rc = h->on_data(c, &c->st);
  if (rc == PS_RPC_PENDING) return; /* ps_rpc_call_resume() finishes it */
  if (rc != 0) {
    scall_fail(c);
    return;
  }
  if (c->reply == NULL) {
    ps_status_set(&c->st, PS_INTERNAL, "handler sent no reply");
    scall_fail(c);
    return;
  }
  scall_send_next(c, 1);
}

static void scall_event(ps_rpc_call *c, int ok) {
  ps_rpc_server *s = c->srv;
  switch (c->state) {
  case S_REQUESTED: {
    if (!ok) { /* server shutting down */
      scall_free(c);
      return;
    }
    if (!atomic_load(&s->shutting_down)) post_request(s, c->hi);
    const ps_rpc_handler *h = &s->h[c->hi];
    c->state = S_RECEIVING; /* from here on_free runs */
    if (c->payload == NULL) {
      ps_status_set(&c->st, PS_INVALID_ARGUMENT, "%s: no request message",
                    h->method);
      scall_fail(c);
      return;
    }
    grpc_slice sl = read_all(c->payload);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    int rc = h->on_header(c, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl),
                          &c->st);
    grpc_slice_unref(sl);
    if (rc != 0) {
      scall_fail(c);
    } else if (c->received < c->sink.total) {
      scall_recv_next(c);
    } else {
      scall_complete(c);
    }
    return;
  }
  case S_RECEIVING: {
    if (!ok) {
      scall_free(c);
      return;
    }
    grpc_byte_buffer *bb = c->bb;
    c->bb = NULL;
    if (bb == NULL) {
      ps_status_set(&c->st, PS_INVALID_ARGUMENT,
                    "%s: request data truncated: expected %zu bytes, got %zu",
                    s->h[c->hi].method, c->sink.total, c->received);
      scall_fail(c);
      return;
    }
    int rc = consume_chunk(bb, &c->sink, &c->received, s->h[c->hi].method,
                           &c->st);
    grpc_byte_buffer_destroy(bb);
    if (rc != 0)
      scall_fail(c);
    else if (c->received < c->sink.total)
      scall_recv_next(c);
    else
      scall_complete(c);
    return;
  }
  case S_SENDING:
    if (c->bb) {
      grpc_byte_buffer_destroy(c->bb);
      c->bb = NULL;
    }
    if (!ok) {
      scall_free(c);
      return;
    }
    scall_send_next(c, 0);
    return;
  case S_FINISH:
  default:
    scall_free(c);
    return;
  }
}

static void generic_free(generic_call *g) {
  grpc_call_details_destroy(&g->details);
  grpc_metadata_array_destroy(&g->md);
  if (g->call) grpc_call_unref(g->call);
  free(g);
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
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    tag *t = ev.tag;
    switch (t->kind) {
    case TAG_SCALL: scall_event((ps_rpc_call *)t, ev.success); break;
    case TAG_GENERIC: generic_event((generic_call *)t, ev.success); break;
    case TAG_SHUTDOWN:
      if (s->done) s->done(s->done_arg);
      break;
    default: break;
    }
  }
  return NULL;
}

ps_rpc_server *ps_rpc_server_create(const char *addr, const ps_rpc_handler *h,
                                    size_t nh, int nthreads, void *user,
                                    ps_status *st) {
  ps_rpc_server *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  grpc_arg a[3];
  unlimited_args(a, 1);
  grpc_channel_args args = {3, a};
  s->srv = grpc_server_create(&args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->srv, s->cq, NULL);
  s->h = h;
  s->nh = nh;
  s->user = user;
  s->nthreads = nthreads < 1 ? 1 : nthreads;
  s->shutdown_tag.kind = TAG_SHUTDOWN;
  s->reg = calloc(nh, sizeof *s->reg);
  for (size_t i = 0; i < nh; i++)
    s->reg[i] = grpc_server_register_method(
        s->srv, h[i].method, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
  s->port = grpc_server_add_http2_port(s->srv, addr, sc);
  grpc_server_credentials_release(sc);
  if (s->port == 0) {
    ps_status_set(st, PS_UNAVAILABLE,
                  "cannot listen on %s (address in use or not local)", addr);
    grpc_server_destroy(s->srv);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    free(s->reg);
    free(s);
    return NULL;
  }
  return s;
}

int ps_rpc_server_port(const ps_rpc_server *s) { return s->port; }
void *ps_rpc_server_user(const ps_rpc_server *s) { return s->user; }

void ps_rpc_server_start(ps_rpc_server *s) {
  grpc_server_start(s->srv);
  for (size_t i = 0; i < s->nh; i++)
    for (int k = 0; k < REQS_PER_METHOD; k++) post_request(s, i);
  post_generic(s);
  post_generic(s);
  s->threads = calloc((size_t)s->nthreads, sizeof *s->threads);
  for (int i = 0; i < s->nthreads; i++)
    pthread_create(&s->threads[i], NULL, server_thread, s);
}

void ps_rpc_server_shutdown(ps_rpc_server *s, void (*done)(void *), void *arg) {
  s->done = done;
  s->done_arg = arg;
  atomic_store(&s->shutting_down, 1);
  grpc_server_shutdown_and_notify(s->srv, s->cq, &s->shutdown_tag);
}

void ps_rpc_server_cancel_all(ps_rpc_server *s) {
  grpc_server_cancel_all_calls(s->srv);
}

void ps_rpc_server_destroy(ps_rpc_server *s) {
  if (s == NULL) return;
  grpc_server_destroy(s->srv);
  grpc_completion_queue_shutdown(s->cq);
  for (int i = 0; i < s->nthreads && s->threads; i++)
    pthread_join(s->threads[i], NULL);
  grpc_completion_queue_destroy(s->cq);
  free(s->threads);
  free(s->reg);
  free(s);
}

void ps_rpc_call_resume(ps_rpc_call *c, int rc, const ps_status *st) {
  if (rc != 0) {
    if (st) c->st = *st;
    if (c->st.code == PS_OK) c->st.code = rc;
    scall_fail(c);
  } else if (c->reply == NULL) {
    ps_status_set(&c->st, PS_INTERNAL, "handler sent no reply");
    scall_fail(c);
  } else {
    scall_send_next(c, 1);
  }
}

bool ps_rpc_call_expired(const ps_rpc_call *c) {
  return gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
}

void *ps_rpc_call_server_user(ps_rpc_call *c) { return c->srv->user; }
void ps_rpc_call_set_ctx(ps_rpc_call *c, void *ctx) { c->ctx = ctx; }
void *ps_rpc_call_ctx(ps_rpc_call *c) { return c->ctx; }

void ps_rpc_call_expect(ps_rpc_call *c, ps_rpc_segs *sink) {
  ps_rpc_segs_fini(&c->sink);
  c->sink = *sink;
  memset(sink, 0, sizeof *sink);
}

int ps_rpc_call_reply(ps_rpc_call *c, const ProtobufCMessage *m) {
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  c->reply = pack_message(m);
  return 0;
}

int ps_rpc_call_reply_data(ps_rpc_call *c, void *ptr, size_t len, ps_buf *owner) {
  return ps_rpc_segs_add(&c->out, ptr, len, owner);
}

/* ---- client ---- */

#define MAX_METHODS 32

struct ps_rpc_channel {
  grpc_channel *ch;
  char *target;
  pthread_mutex_t mu;
  const char *methods[MAX_METHODS];
  void *handles[MAX_METHODS];
  int nmethods;
};

ps_rpc_channel *ps_rpc_channel_create(const char *target) {
  ps_rpc_channel *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  grpc_arg a[6];
  unlimited_args(a, 0);
  /* A restarted ps should be found again within ~1 s, not after gRPC's
   * default backoff of up to two minutes (nor its 20 s minimum connect
   * timeout, which also spaces out the attempts). */
  a[3] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100};
  a[4] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000};
  a[5] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = 1000};
  grpc_channel_args args = {6, a};
  grpc_channel_credentials *cc = grpc_insecure_credentials_create();
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
  free(c->target);
  free(c);
}

const char *ps_rpc_channel_target(const ps_rpc_channel *c) { return c->target; }

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
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
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
  grpc_call_cancel_with_status(cc->call, GRPC_STATUS_CANCELLED, "client error",
                               NULL);
}

static int ccall_send_next(ccall *cc) {
  ps_rpc_segs *s = cc->req->send;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  cc->send_bb = build_chunk(s, &cc->cur);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = cc->send_bb;
  if (cc->cur.off == s->total) ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  return grpc_call_start_batch(cc->call, ops, n, &cc->send_tag, NULL) == GRPC_CALL_OK;
}

/* Parses the response header; returns 0 or sets cc->err. */
static int ccall_header(ccall *cc, grpc_byte_buffer *bb) {
  grpc_slice sl = read_all(bb);
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
    if (ok && bb != NULL && cc->err.code == PS_OK && cc->received < cc->sink.total) {
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
    if (consume_chunk(bb, &cc->sink, &cc->received, "response", &cc->err) != 0)
      ccall_local_error(cc);
    grpc_byte_buffer_destroy(bb);
    if (cc->err.code == PS_OK && cc->received < cc->sink.total) {
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
  cc->call = h ? grpc_channel_create_registered_call(r->ch->ch, NULL,
                                                     GRPC_PROPAGATE_DEFAULTS, cq,
                                                     h, deadline, NULL)
               : NULL;
  if (cc->call == NULL) {
    ps_status_set(&cc->err, PS_INTERNAL, "cannot create call %s", r->method);
    cc->send_done = cc->recv_done = 1;
    return;
  }
  cc->hdr_bb = NULL;
  grpc_byte_buffer *hdr;
  if (r->request) {
    hdr = pack_message(r->request);
  } else {
    grpc_slice sl = grpc_slice_from_copied_buffer(r->raw_request, r->raw_len);
    hdr = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
  }
  int has_data = r->send && r->send->total > 0;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = hdr;
  if (!has_data) ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
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
    snprintf(r->st.msg, sizeof r->st.msg, "%.*s",
             (int)GRPC_SLICE_LENGTH(cc->details),
             (const char *)GRPC_SLICE_START_PTR(cc->details));
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

int ps_rpc_run(ps_rpc_req *reqs, size_t n) {
  if (n == 0) return 0;
  ccall *cs = calloc(n, sizeof *cs);
  if (cs == NULL) {
    for (size_t i = 0; i < n; i++)
      ps_status_set(&reqs[i].st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return (int)n;
  }
  grpc_completion_queue *cq = cq_get();
  size_t live = 0;
  for (size_t i = 0; i < n; i++) {
    ccall *cc = &cs[i];
    cc->req = &reqs[i];
    cc->send_tag = (ctag){TAG_CSEND, cc};
    cc->recv_tag = (ctag){TAG_CRECV, cc};
    cc->details = grpc_empty_slice();
    grpc_metadata_array_init(&cc->init_md);
    grpc_metadata_array_init(&cc->trail_md);
    ccall_start(cc, cq);
    if (!(cc->send_done && cc->recv_done)) live++;
  }
  while (live > 0) {
    grpc_event ev =
        grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) continue;
    ctag *t = ev.tag;
    ccall *cc = t->cc;
    int was_done = cc->send_done && cc->recv_done;
    if (t->kind == TAG_CSEND)
      ccall_send_event(cc, ev.success);
    else
      ccall_recv_event(cc, ev.success);
    if (!was_done && cc->send_done && cc->recv_done) live--;
  }
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    ccall_finish(&cs[i]);
    if (reqs[i].st.code != PS_OK) failed++;
  }
  cq_put(cq);
  free(cs);
  return failed;
}
