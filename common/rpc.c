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

#include "array.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <linux/sockios.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define ZEROCOPY_MIN 4096 /* smaller ranges are copied */
#define REQS_PER_METHOD 4 /* outstanding server requests */

enum { TAG_SCALL = 1, TAG_GENERIC, TAG_SHUTDOWN, TAG_CSEND, TAG_CRECV, TAG_SCLOSE };

/* gRPC reads each transfer into fresh buffers of up to a few MiB and frees
 * them once the bytes are copied out.  glibc serves such sizes with mmap
 * (or trims its heap back) at once, so every transfer faulted its pages in
 * anew: a 4 MiB read or assign took ~870 page faults a call and a third of
 * the CPU.  Blocks under 32 MiB come from the heap instead, and up to
 * 64 MiB of free heap is kept for the next transfer (bench_ps --bulk-mib 4:
 * faults 174K -> 13K, CPU -30%).  PS_MALLOC_TUNE=0, or any malloc setting
 * in GLIBC_TUNABLES, leaves glibc's own. */
static void tune_malloc(void) {
  const char *e = getenv("PS_MALLOC_TUNE"), *t = getenv("GLIBC_TUNABLES");
  if ((e && !strcmp(e, "0")) || (t && strstr(t, "glibc.malloc."))) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

void ps_rpc_global_init(void) {
  /* A connection attempt of a channel with no call waiting on it (calls
   * fail fast while it reconnects) makes progress only when gRPC's backup
   * poller runs: every 5 s by default, so a restarted ps was found ~5.5 s
   * after it was up.  The environment still wins. */
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", 0);
  tune_malloc();
  grpc_init();
}
void ps_rpc_global_shutdown(void) {
  grpc_shutdown();
}

/* ---- byte ranges ---- */

int ps_rpc_segs_add(ps_rpc_segs *s, void *ptr, size_t len, ps_buf *owner) {
  if (len == 0) return 0;
  if (ps_array_grow(&s->v, &s->cap, s->n + 1, sizeof *s->v) != 0) return -1;
  s->v[s->n++] = (ps_rpc_seg){ptr, len, ps_buf_ref(owner)};
  s->total += len;
  return 0;
}

void ps_rpc_segs_fini(ps_rpc_segs *s) {
  for (size_t i = 0; i < s->n; i++)
    ps_buf_unref(s->v[i].owner);
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

static void unref_owner(void *owner) {
  ps_buf_unref(owner);
}

/* The next Chunk message of at most PS_RPC_CHUNK_MAX bytes from @s at @cur. */
static grpc_byte_buffer *build_chunk(ps_rpc_segs *s, cursor *cur) {
  size_t len = s->total - cur->off;
  if (len > PS_RPC_CHUNK_MAX) len = PS_RPC_CHUNK_MAX;
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
  /* Small pieces accumulate here and become one copied slice.  Out of
   * memory, the chunk is abandoned (NULL): the call then fails. */
  uint8_t *small = NULL;
  size_t small_n = 0, small_cap = 0;
  bool oom = false;
#define PUSH_SLICE(sl)                                                                   \
  do {                                                                                   \
    grpc_slice sl_ = (sl);                                                               \
    if (ns == cap) {                                                                     \
      grpc_slice *nv = malloc(2 * cap * sizeof *nv);                                     \
      if (nv == NULL) {                                                                  \
        grpc_slice_unref(sl_);                                                           \
        oom = true;                                                                      \
        break;                                                                           \
      }                                                                                  \
      memcpy(nv, slices, ns * sizeof *nv);                                               \
      if (slices != stack_slices) free(slices);                                          \
      slices = nv;                                                                       \
      cap *= 2;                                                                          \
    }                                                                                    \
    slices[ns++] = sl_;                                                                  \
  } while (0)
#define FLUSH_SMALL()                                                                    \
  do {                                                                                   \
    if (small_n) {                                                                       \
      PUSH_SLICE(grpc_slice_from_copied_buffer((char *)small, small_n));                 \
      small_n = 0;                                                                       \
    }                                                                                    \
  } while (0)
#define ADD_SMALL(p, k)                                                                  \
  do {                                                                                   \
    if (small_n + (k) > small_cap) {                                                     \
      size_t nc_ = (small_n + (k)) * 2 + 256;                                            \
      uint8_t *ns_ = realloc(small, nc_);                                                \
      if (ns_ == NULL) {                                                                 \
        oom = true;                                                                      \
        break;                                                                           \
      }                                                                                  \
      small = ns_;                                                                       \
      small_cap = nc_;                                                                   \
    }                                                                                    \
    memcpy(small + small_n, (p), (k));                                                   \
    small_n += (k);                                                                      \
  } while (0)
  ADD_SMALL(hdr, hn);
  size_t left = len;
  while (left > 0 && cur->seg < s->n && !oom) {
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
  if (!oom) FLUSH_SMALL();
  free(small);
  grpc_byte_buffer *bb = oom ? NULL : grpc_raw_byte_buffer_create(slices, ns);
  for (size_t i = 0; i < ns; i++)
    grpc_slice_unref(slices[i]);
  if (slices != stack_slices) free(slices);
  return bb;
#undef PUSH_SLICE
#undef FLUSH_SMALL
#undef ADD_SMALL
}

/* Copies the payload of one Chunk message into @sink at *@received. */
static int consume_chunk(grpc_byte_buffer *bb, ps_rpc_segs *sink, size_t *received,
                         const char *what, ps_status *st) {
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
        for (size_t i = 1; i < hn; i++)
          v |= (uint64_t)(hdr[i] & 0x7f) << (7 * (i - 1));
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
        rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: malformed data chunk (varint)",
                           what);
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
  /* no peer sends one; a stream of them would hold a call to its deadline */
  if (rc == 0 && payload == 0)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: an empty data message", what);
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

/* ---- server ----
 *
 * Lifetime.  Every call object (a registered call, a generic call, posted
 * or running, parked with PS_RPC_PENDING or not) holds one count of
 * s->live, and gRPC's shutdown tag holds one more until it arrives.  Who
 * brings the count to zero runs @done; nothing touches the server after
 * dropping its count.  So @done means: gRPC is done with the server and no
 * call of ours can start a batch any more, and only then may the
 * completion queue be shut down (a batch started on a shut-down queue
 * aborts in grpc_cq_begin_op).
 *
 * Listener.  The server binds its own sockets and runs its own accept loop
 * on the monitor thread, handing each connection to gRPC with
 * grpc_server_add_channel_from_fd.  gRPC 1.51's own listener gives up for
 * good on the first accept4() error other than EAGAIN (EMFILE included);
 * ours backs off and accepts again, and closes connections beyond
 * max_connections at once.  The fds handed over are tracked by number and
 * inode (fstat), so connections gRPC has closed are noticed without
 * keeping any descriptor of ours open on them.
 *
 * With TLS, gRPC 1.51's add_channel_from_fd refuses the credentials, but
 * its "external:" port (the door of C++'s ExternalConnectionAcceptor, see
 * tls_hand_over) takes a connection accepted outside gRPC and runs the TLS
 * handshake on it: TLS connections come through the same accept loop, the
 * same table and the same limits.  Only with another gRPC version (or
 * PS_TLS_GRPC_LISTENER=1) does gRPC listen itself (grpc_server_add_http2_port,
 * no SO_REUSEPORT, on the port our own bind just checked); the monitor then
 * finds its connections in /proc/self/fd every 0.2 s (conns_discover), and
 * logs gRPC's listener stopping for good on an accept4 error
 * (listener_check).
 *
 * Silent connections.  A connection that has made no call 10 s after it
 * was accepted (with tokens: no call with a valid token) is shut down, so
 * sockets that never send the HTTP/2 preface or finish the TLS handshake
 * cannot hold the slots or the descriptors.  A call counts from its HTTP/2
 * headers (header_later), and without tokens a connection that has sent
 * more than a handshake is in use too (conns_close_unauthed).
 *
 * Stalled streams.  While a batch that waits on the client is in flight
 * (a request message, or a response message the client must read), the
 * call records when it started; the monitor thread cancels calls that have
 * waited longer than stream_timeout_ms.  Calls parked by a handler do not
 * count: they wait on the ps, not on the client.
 *
 * Locks: calls_mu (the call list) before accept_mu (accepting, the table
 * of connections); neither is held while a handler runs. */

typedef struct tag {
  int kind;
} tag;

enum {
  S_REQUESTED,
  S_HEADER,
  S_RECEIVING,
  S_EOS,
  S_PARKED,
  S_SENDING,
  S_FINISH,
  S_STREAM
};

struct ps_rpc_call {
  tag t;
  ps_rpc_server *srv;
  size_t hi;
  int state;
  /* statistics: when the request arrived, the status sent (-1: none),
   * request and response bytes */
  int64_t t0_ns;
  int code;
  size_t bytes_in, bytes_out;
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
  /* monitor */
  struct ps_rpc_call *prev, *next; /* s->calls, under s->calls_mu */
  int linked;
  atomic_llong wait_since_ms; /* 0: not waiting on the client */
  atomic_int wait_dir;        /* 1 request stream, 2 response */
  atomic_int timed_out;
  /* an open response stream (PS_RPC_STREAM), under srv->calls_mu */
  tag close_t;    /* RECV_CLOSE_ON_SERVER's tag: the client went or the call ended */
  int streaming;  /* on_data returned PS_RPC_STREAM and the stream opened */
  int st_batches; /* batches of the stream in flight */
  int st_sending; /* a send (message or status) is in flight */
  int st_end;     /* the stream is to end after its queued message */
  int st_ended;   /* the status went out */
  int st_dead;    /* a batch failed or the call closed: nothing more is sent */
  int st_free;    /* the call is being freed */
  grpc_byte_buffer *st_next; /* the message to send next (the newest only) */
  ps_role role;              /* the caller's (ps_rpc_call_role) */
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

typedef struct conn_slot {
  int fd;
  ino_t ino;
  dev_t dev;
  int64_t suspect_ms; /* a call of it timed out waiting for the client */
  int outq;           /* unsent bytes then */
  int sent_big;       /* stopping: a big response was leaving through it */
  int64_t since_ms;   /* when it was seen first */
  int authed;         /* with tokens: a call of it had a valid one (or it was shut) */
} conn_slot;

/* A connection that has made no call this long after it was seen (with
 * tokens: no call with a valid token) is shut down, plaintext and TLS
 * alike: silent sockets that never send the HTTP/2 preface or finish the
 * TLS handshake cannot hold the slots of --max-connections (or the
 * descriptors) for good. */
#define UNAUTH_CONN_MS 10000

#define MAX_LISTENERS 8

/* Per-method statistics, updated when a call is freed (any thread). */
typedef struct method_stats {
  atomic_ullong calls[PS_RPC_NCODES];
  atomic_ullong buckets[PS_RPC_NBUCKETS + 1]; /* the last: above every bound */
  atomic_ullong sum_us;
  atomic_ullong bytes_in, bytes_out;
} method_stats;

const double ps_rpc_latency_bounds[PS_RPC_NBUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

struct ps_rpc_server {
  method_stats *stats; /* [nh] */
  grpc_server *srv;
  grpc_completion_queue *cq;
  int port;
  const ps_rpc_handler *h;
  size_t nh;
  void **reg;
  pthread_t *threads;
  int nthreads;
  void *user;
  ps_rpc_server_options opt;
  atomic_int shutting_down;
  atomic_long live; /* see "Lifetime" above */
  tag shutdown_tag;
  void (*done)(void *);
  void *done_arg;
  /* calls with a grpc_call, for the stall check */
  pthread_mutex_t calls_mu;
  ps_rpc_call *calls;
  atomic_long in_flight;       /* calls linked (being served) */
  atomic_int nstreams;         /* open response streams (also in in_flight) */
  atomic_ullong calls_started; /* calls ever linked */
  int cancelled_all;           /* under calls_mu */
  /* listener and monitor thread */
  int lfd[MAX_LISTENERS];
  int nlfd;
  int wake[2];
  pthread_t monitor;
  int monitor_on;
  pthread_mutex_t accept_mu; /* accepting + handing fds to gRPC */
  int accepting;
  atomic_int stop_monitor;
  atomic_int grpc_stopped; /* grpc_server_shutdown_and_notify was called */
  int64_t stop_begin_ms;   /* ps_rpc_server_shutdown was called then */
  conn_slot *conns;
  int nconns;
  int64_t last_full_log_ms, last_emfile_log_ms;
  int64_t idle_since_ms;          /* shutting down: since when no call runs (monitor) */
  int64_t trim_check_ms, trim_ms; /* heap_trim: last look, last trim (monitor) */
  size_t trim_free;               /* heap_trim: free heap bytes at the last trim */
  int64_t look_rss, look_until;   /* heap_trim: RSS at the last look, busy window */
  int idle_closed;                /* the idle connections are shut (monitor) */
  /* TLS: gRPC's own listener (see "Listener"); the next certificate
   * config for its fetcher (tls_pending), under tls_mu */
  /* Methods are registered without their payload and a call's first
   * message is received as its first batch after the checks (S_HEADER):
   * with tokens, gRPC must not read a request message before the call's
   * token is checked (a caller without one could make it buffer up to
   * twice --max-message-bytes per stream, outside the stream timeout);
   * with or without, a call is handed over when its HTTP/2 headers come
   * in, so that its connection counts as used (conns_mark_authed) while
   * its first message is still on the way (a client that sends it late,
   * a header of many MiB on a slow link). */
  int header_later;
  int64_t queue_since_ms, last_dead_log_ms; /* TLS: listener_check */
  atomic_int unauthed; /* tracked connections not authed (conn_slot.authed) */
  int64_t last_unauth_log_ms;
  /* conns_mark_authed: peers marked lately (under accept_mu), so that a
   * connection's later calls skip the scan */
  char authed_peers[16][64];
  int authed_next;
  DIR *fd_dir; /* TLS: /proc/self/fd, for conns_discover */
  /* TLS: gRPC's handler of connections accepted outside it (see
   * "Listener"); NULL: gRPC listens itself */
  void *fd_handler;
  /* calls refused for their token since the last WARN about them */
  atomic_ullong auth_refused;
  atomic_llong auth_log_ms;
  int tls;
  int tls_external; /* TLS_EXTERNAL_PORT's argument was given */
  int tls_own;      /* TLS connections are ours to accept (fd_handler checked) */
  pthread_mutex_t tls_mu;
  char *tls_cert, *tls_key, *tls_ca;
  int tls_pending;
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ps_rpc_server_options_default(ps_rpc_server_options *o) {
  memset(o, 0, sizeof *o);
  o->nthreads = 1;
  o->max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE_BYTES;
  o->stream_timeout_ms = (int64_t)PS_RPC_DEFAULT_STREAM_TIMEOUT_SECS * 1000;
  o->max_connections = PS_RPC_DEFAULT_MAX_CONNECTIONS;
}

/* Drops one count of s->live; the last one runs @done.  The caller must
 * not touch @s afterwards. */
static void server_unref(ps_rpc_server *s) {
  if (atomic_fetch_sub(&s->live, 1) == 1 && s->done) s->done(s->done_arg);
}

static void cancel_call(ps_rpc_call *c);

static void call_link(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  pthread_mutex_lock(&s->calls_mu);
  c->prev = NULL;
  c->next = s->calls;
  if (s->calls) s->calls->prev = c;
  s->calls = c;
  c->linked = 1;
  atomic_fetch_add(&s->in_flight, 1);
  atomic_fetch_add(&s->calls_started, 1);
  if (s->cancelled_all) cancel_call(c);
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
static void wait_client(ps_rpc_call *c, int dir) {
  atomic_store(&c->wait_dir, dir);
  atomic_store(&c->wait_since_ms, now_ms());
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
    server_unref(s);
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
    server_unref(s);
  }
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
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

static void scall_free(ps_rpc_call *c) {
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
  server_unref(s);
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
  wait_client(c, 2);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
  grpc_slice_unref(details);
  if (e != GRPC_CALL_OK) scall_free(c);
}

static void scall_fail(ps_rpc_call *c) {
  if (c->st.code == PS_OK) ps_status_set(&c->st, PS_INTERNAL, "handler failed");
  PS_DEBUG("%s failed: %s: %s", c->srv->h[c->hi].method, ps_status_code_name(c->st.code),
           c->st.msg);
  scall_finish(c, 1, c->st.code, c->st.msg);
}

static void scall_recv_next(ps_rpc_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->bb;
  /* All announced bytes in: the next message must be the end of stream. */
  c->state = c->received < c->sink.total ? S_RECEIVING : S_EOS;
  wait_client(c, 1);
  if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK) scall_free(c);
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
    if (c->bb == NULL) {
      scall_finish(c, 0, PS_RESOURCE_EXHAUSTED,
                   "out of memory building a response chunk");
      return;
    }
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
  wait_client(c, 2);
  if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK) scall_free(c);
}

/* ---- response streams (PS_RPC_STREAM) ----
 *
 * The call stays open after its first message; the server sends more with
 * stream_pump (one send in flight at a time, only the newest queued
 * message kept) until it stops, when the handler's on_stream_end gives the
 * last message and the stream ends with OK.  A RECV_CLOSE_ON_SERVER batch
 * (tag close_t) tells when the client went; the call is freed when no
 * batch of it is in flight.  Everything here runs under calls_mu. */

static ps_rpc_call *call_of_close_tag(tag *t) {
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
  wait_client(c, 2);
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

static void stream_sent(ps_rpc_call *c, int ok) {
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
  if (gone) scall_free(c);
}

static void stream_closed(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  pthread_mutex_lock(&s->calls_mu);
  c->st_dead = 1;
  bool gone = stream_settle(c);
  pthread_mutex_unlock(&s->calls_mu);
  if (gone) scall_free(c);
}

/* Opens the stream of @c with its reply as the first message. */
static void stream_start(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  const char *method = s->h[c->hi].method;
  pthread_mutex_lock(&s->calls_mu);
  if (atomic_load(&s->nstreams) >= PS_RPC_MAX_STREAMS) {
    pthread_mutex_unlock(&s->calls_mu);
    ps_status_set(&c->st, PS_RESOURCE_EXHAUSTED,
                  "%s: %d response streams are open, the most this server keeps", method,
                  PS_RPC_MAX_STREAMS);
    scall_fail(c);
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
  wait_client(c, 2);
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
  if (gone) scall_free(c);
}

static void streams_end_all(ps_rpc_server *s) {
  pthread_mutex_lock(&s->calls_mu);
  for (ps_rpc_call *c = s->calls; c; c = c->next)
    if (c->streaming) stream_end(c);
  pthread_mutex_unlock(&s->calls_mu);
}

static void scall_complete(ps_rpc_call *c) {
  const ps_rpc_handler *h = &c->srv->h[c->hi];
  c->state = S_PARKED;
  int rc = h->on_data(c, &c->st);
  if (rc == PS_RPC_PENDING) return; /* ps_rpc_call_resume() finishes it */
  if (rc == PS_RPC_STREAM && c->reply) {
    stream_start(c);
    return;
  }
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

static void conns_mark_authed(ps_rpc_call *c);

/* The caller's token against the server's (options.auth): sets c->role,
 * or c->st with UNAUTHENTICATED (no token, an unknown one) or
 * PERMISSION_DENIED (a worker token on an admin method).  The token is
 * never logged nor echoed. */
static int call_authorize(ps_rpc_call *c, const ps_rpc_handler *h) {
  ps_rpc_server *s = c->srv;
  const char *m = strrchr(h->method, '/') ? strrchr(h->method, '/') + 1 : h->method;
  if (s->opt.auth == NULL) {
    c->role = PS_ROLE_ADMIN;
    conns_mark_authed(c); /* without tokens any call will do */
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
  conns_mark_authed(c); /* a valid token, even with the wrong role */
  if (h->access == PS_RPC_ACCESS_ADMIN && r != PS_ROLE_ADMIN)
    return ps_status_set(&c->st, PS_PERMISSION_DENIED,
                         "%s needs an admin token; this call's token has the %s role", m,
                         ps_role_name(r));
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
    scall_fail(c);
    return;
  }
  if (check_size(c, c->payload, true) != 0) {
    scall_fail(c);
    return;
  }
  grpc_slice sl = read_all(c->payload);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  c->bytes_in = GRPC_SLICE_LENGTH(sl);
  int rc = h->on_header(c, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), &c->st);
  grpc_slice_unref(sl);
  if (rc != 0)
    scall_fail(c);
  else
    scall_recv_next(c);
}

static void scall_event(ps_rpc_call *c, int ok) {
  ps_rpc_server *s = c->srv;
  atomic_store(&c->wait_since_ms, 0);
  switch (c->state) {
  case S_REQUESTED: {
    if (!ok) { /* server shutting down */
      scall_free(c);
      return;
    }
    if (!atomic_load(&s->shutting_down)) post_request(s, c->hi);
    const ps_rpc_handler *h = &s->h[c->hi];
    c->state = S_RECEIVING; /* from here on_free runs */
    c->t0_ns = mono_ns();
    c->code = -1;
    call_link(c);
    if (atomic_load(&s->shutting_down)) { /* a new call while stopping */
      ps_status_set(&c->st, PS_UNAVAILABLE, "%s: the ps is shutting down", h->method);
      scall_fail(c);
      return;
    }
    if (call_authorize(c, h) != 0) {
      auth_refused_log(c);
      scall_fail(c);
      return;
    }
    if (s->header_later) { /* the request message only now (see header_later) */
      grpc_op op;
      memset(&op, 0, sizeof op);
      op.op = GRPC_OP_RECV_MESSAGE;
      op.data.recv_message.recv_message = &c->payload;
      c->state = S_HEADER;
      wait_client(c, 1);
      if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK) scall_free(c);
      return;
    }
    header_arrived(c);
    return;
  }
  case S_HEADER:
    if (!ok) {
      scall_free(c);
      return;
    }
    c->state = S_RECEIVING;
    header_arrived(c);
    return;
  case S_RECEIVING:
  case S_EOS: {
    if (!ok) {
      scall_free(c);
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
      scall_fail(c);
      return;
    }
    if (bb == NULL) {
      ps_status_set(&c->st, PS_INVALID_ARGUMENT,
                    "%s: request data truncated: expected %zu bytes, got %zu",
                    s->h[c->hi].method, c->sink.total, c->received);
      scall_fail(c);
      return;
    }
    int rc = check_size(c, bb, false);
    if (rc == 0)
      rc = consume_chunk(bb, &c->sink, &c->received, s->h[c->hi].method, &c->st);
    grpc_byte_buffer_destroy(bb);
    if (rc != 0)
      scall_fail(c);
    else
      scall_recv_next(c);
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
  case S_STREAM:
    stream_sent(c, ok);
    return;
  case S_FINISH:
  default:
    scall_free(c);
    return;
  }
}

static void generic_free(generic_call *g) {
  ps_rpc_server *s = g->srv;
  grpc_call_details_destroy(&g->details);
  grpc_metadata_array_destroy(&g->md);
  if (g->call) grpc_call_unref(g->call);
  free(g);
  server_unref(s);
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
    grpc_event ev =
        grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
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
      stream_closed(call_of_close_tag(t));
      break;
    case TAG_SHUTDOWN:
      server_unref(s);
      break;
    default:
      break;
    }
  }
  return NULL;
}

/* ---- listener ---- */

static void close_listeners(ps_rpc_server *s) {
  for (int i = 0; i < s->nlfd; i++)
    close(s->lfd[i]);
  s->nlfd = 0;
}

/* Splits "host:port" / "[v6]:port"; 0 or -1. */
static int split_addr(const char *addr, char *host, size_t hn, char *port, size_t pn) {
  const char *colon = strrchr(addr, ':');
  if (colon == NULL || colon[1] == '\0') return -1;
  const char *h = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl >= hn || strlen(colon + 1) >= pn) return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, pn, "%s", colon + 1);
  return 0;
}

/* Binds and listens on every address of @addr; the port of the first
 * socket is used for the others when @addr asks for port 0.  The
 * wildcards 0.0.0.0 and [::] listen on both IPv4 and IPv6, as gRPC's own
 * listener does. */
static int open_listeners(ps_rpc_server *s, const char *addr, ps_status *st) {
  char host[256], port[32];
  if (split_addr(addr, host, sizeof host, port, sizeof port) != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "cannot listen on %s: not HOST:PORT",
                         addr);
  if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*"))
    host[0] = '\0';
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int e = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (e != 0)
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s: %s", addr,
                         gai_strerror(e));
  int bound_port = 0, err = 0;
  for (struct addrinfo *ai = res; ai && s->nlfd < MAX_LISTENERS; ai = ai->ai_next) {
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    if (bound_port) {
      if (sa.ss_family == AF_INET)
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)bound_port);
      else if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)bound_port);
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    /* SO_REUSEADDR only: a restarted ps may bind over TIME_WAIT, but no
     * second process can share the port (no SO_REUSEPORT). */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, ai->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      err = errno;
      close(fd);
      if (err == EADDRINUSE && s->nlfd == 0) break;
      /* the other family of a wildcard: serve on what was bound */
      if (s->nlfd > 0) err = 0;
      continue;
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0) {
      if (got.ss_family == AF_INET)
        bound_port = ntohs(((struct sockaddr_in *)&got)->sin_port);
      else if (got.ss_family == AF_INET6)
        bound_port = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
    }
    s->lfd[s->nlfd++] = fd;
  }
  freeaddrinfo(res);
  if (s->nlfd == 0 || err == EADDRINUSE) {
    close_listeners(s);
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s: %s", addr,
                         err == EADDRINUSE ? "address in use"
                         : err             ? strerror(err)
                                           : "no address");
  }
  s->port = bound_port;
  return 0;
}

/* Forgets connections gRPC has closed (their fd is closed or reused).
 * Under accept_mu. */
static void conns_sweep(ps_rpc_server *s) {
  int k = 0;
  for (int i = 0; i < s->nconns; i++) {
    struct stat sb;
    conn_slot *c = &s->conns[i];
    if (fstat(c->fd, &sb) == 0 && S_ISSOCK(sb.st_mode) && sb.st_ino == c->ino &&
        sb.st_dev == c->dev)
      s->conns[k++] = *c;
    else if (!c->authed)
      atomic_fetch_sub(&s->unauthed, 1);
  }
  s->nconns = k;
}

/* A new connection may carry the peer name ("fd:12", an address and port)
 * of one that closed: the names marked before are forgotten.  Under
 * accept_mu. */
static void authed_peers_forget(ps_rpc_server *s) {
  for (int i = 0; i < 16; i++)
    s->authed_peers[i][0] = '\0';
}

/* TLS: gRPC 1.51's listener stops for good on an accept4 error (out of
 * descriptors): connections then wait in its queue and are never served.
 * A queue that stays non-empty for 5 s is logged at ERROR every 30 s, so
 * that the operator (or a probe: new connections hang) restarts the ps.
 * For a listening socket TCP_INFO's tcpi_unacked is its accept queue.
 * Under accept_mu. */
static void listener_check(ps_rpc_server *s, int fd) {
  struct tcp_info ti;
  socklen_t tl = sizeof ti;
  int64_t t = now_ms();
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 || ti.tcpi_unacked == 0) {
    s->queue_since_ms = 0;
    return;
  }
  if (s->queue_since_ms == 0) s->queue_since_ms = t;
  if (t - s->queue_since_ms >= 5000 && t - s->last_dead_log_ms >= 30000) {
    PS_ERROR(
        "the TLS listener accepts no more (%u connection(s) have waited in its queue "
        "for %lld s; gRPC's listener stops for good when descriptors run out): "
        "new clients cannot connect, restart this ps",
        ti.tcpi_unacked, (long long)((t - s->queue_since_ms) / 1000));
    s->last_dead_log_ms = t;
  }
}

/* TLS: adds the connections gRPC's listener accepted to the table (see
 * "Listener"); those over max_connections are shut down.  Under accept_mu. */
static void conns_discover(ps_rpc_server *s) {
  if (!s->tls || s->tls_own || s->port <= 0 || s->fd_dir == NULL) return;
  conns_sweep(s);
  DIR *d = s->fd_dir; /* open for good: out of descriptors, a scan still runs */
  rewinddir(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end || e->d_name[0] == '\0' || fd == dirfd(d)) continue;
    struct stat sb;
    if (fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (getsockname((int)fd, (struct sockaddr *)&sa, &sl) != 0) continue;
    int port = sa.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
               : sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                          : -1;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (port != s->port ||
        getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0)
      continue;
    if (listening) {
      listener_check(s, (int)fd);
      continue;
    }
    int known = 0;
    for (int i = 0; i < s->nconns && !known; i++)
      known = s->conns[i].ino == sb.st_ino && s->conns[i].dev == sb.st_dev;
    if (known) continue;
    if (s->nconns >= s->opt.max_connections || !s->accepting) {
      int64_t t = now_ms();
      if (s->accepting && t - s->last_full_log_ms >= 10000) {
        PS_WARN("%d connections open (--max-connections): closing new ones", s->nconns);
        s->last_full_log_ms = t;
      }
      shutdown((int)fd, SHUT_RDWR);
      continue;
    }
    s->conns[s->nconns++] =
        (conn_slot){(int)fd, sb.st_ino, sb.st_dev, 0, 0, 0, now_ms(), 0};
    atomic_fetch_add(&s->unauthed, 1);
    authed_peers_forget(s); /* its peer name may be a closed one's */
  }
}

/* TLS: gRPC 1.51 takes a connection accepted outside it, with the
 * server's TLS credentials, through the port "external:NAME" (the C++
 * ExternalConnectionAcceptor's door): grpc_server_add_http2_port stores a
 * grpc_core::TcpServerFdHandler* where the channel argument NAME points
 * (src/core/lib/iomgr/tcp_server.h):
 *
 *   class TcpServerFdHandler {
 *    public:
 *     virtual ~TcpServerFdHandler() = default;
 *     virtual void Handle(int listener_fd, int fd, grpc_byte_buffer *pending_read) = 0;
 *   };
 *
 * Its Handle (with an ExecCtx of its own) starts the TLS handshake on fd as
 * gRPC's own listener would.  Under the Itanium C++ ABI the object starts
 * with its vtable pointer, whose entries are the two destructors, then
 * Handle: the third.  Used only with gRPC core 29 (1.51), where this was
 * checked (tls_external_ok); any other falls back to gRPC's listener. */
#define TLS_EXTERNAL_PORT "external:paramserver"
typedef void (*fd_handle_fn)(void *self, int listener_fd, int fd,
                             grpc_byte_buffer *pending);

static bool tls_external_ok(void) {
  const char *e = getenv("PS_TLS_GRPC_LISTENER"); /* 1: gRPC's listener (tests) */
  return strncmp(grpc_version_string(), "29.", 3) == 0 && !(e && !strcmp(e, "1"));
}

/* Whether @h is the handler checked above: its vtable's type_info
 * (vtable[-1]; its second word the mangled name, '*' first for a type of
 * internal linkage) names ExternalConnectionHandler of
 * src/cpp/server/external_connection_acceptor_impl.cc's anonymous
 * namespace.  Anything else (another build, an object of another type
 * in the argument) is not called. */
#define TLS_EXTERNAL_TYPE "N12_GLOBAL__N_125ExternalConnectionHandlerE"
static bool tls_handler_ok(void *h) {
  void **vt = *(void ***)h;
  if (vt == NULL || vt[-1] == NULL) return false;
  const char *name = ((const char *const *)vt[-1])[1];
  if (name == NULL) return false;
  if (name[0] == '*') name++;
  /* tests: PS_TLS_HANDLER_TYPE names another type, as another build would */
  const char *want = getenv("PS_TLS_HANDLER_TYPE");
  return strcmp(name, want && *want ? want : TLS_EXTERNAL_TYPE) == 0;
}

static void tls_hand_over(ps_rpc_server *s, int lfd, int fd) {
  fd_handle_fn *vt = *(fd_handle_fn **)s->fd_handler;
  vt[2](s->fd_handler, lfd, fd, NULL);
}

static void accept_ready(ps_rpc_server *s, int lfd, int64_t *backoff_until) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      /* EMFILE, ENFILE, ENOBUFS, ENOMEM...: leave the connection in the
       * backlog and try again shortly. */
      int64_t t = now_ms();
      if (t - s->last_emfile_log_ms >= 10000) {
        PS_WARN("accepting connections: %s; retrying every 100 ms", strerror(errno));
        s->last_emfile_log_ms = t;
      }
      *backoff_until = t + 100;
      return;
    }
    pthread_mutex_lock(&s->accept_mu);
    if (s->nconns >= s->opt.max_connections) conns_sweep(s);
    if (s->nconns >= s->opt.max_connections) {
      int64_t t = now_ms();
      if (t - s->last_full_log_ms >= 10000) {
        PS_WARN("%d connections open (--max-connections): closing new ones", s->nconns);
        s->last_full_log_ms = t;
      }
      pthread_mutex_unlock(&s->accept_mu);
      close(fd);
      continue;
    }
    struct stat sb;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fstat(fd, &sb) != 0 || !s->accepting) {
      pthread_mutex_unlock(&s->accept_mu);
      close(fd);
      return;
    }
    s->conns[s->nconns++] = (conn_slot){fd, sb.st_ino, sb.st_dev, 0, 0, 0, now_ms(), 0};
    atomic_fetch_add(&s->unauthed, 1);
    authed_peers_forget(s); /* its peer name may be a closed one's */
    if (s->fd_handler) {
      tls_hand_over(s, lfd, fd); /* gRPC owns fd now */
    } else {
      grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
      grpc_server_add_channel_from_fd(s->srv, fd, sc); /* gRPC owns fd now */
      grpc_server_credentials_release(sc);
    }
    pthread_mutex_unlock(&s->accept_mu);
  }
}

/* Shuts down the sockets of the connections still open (all, or the one
 * whose peer is @peer, as gRPC spells it: "fd:12" for connections added
 * by fd, "ipv4:127.0.0.1:5000").  gRPC
 * 1.51 delays closing a connection until its in-flight write finishes, and
 * a write to a client that stopped reading never does: so a cancelled call
 * would stay, holding its memory, and shutdown would wait forever.  A
 * socket shut down under it fails the write.  Returns the number shut. */
/* Whether @c is the connection gRPC names @peer: "fd:12" for connections
 * handed over by fd, else "ipv4:1.2.3.4:5" or "ipv6:[::1]:5" (an IPv4
 * client of a dual-stack listener, ::ffff:1.2.3.4, is ipv4 to gRPC). */
static bool slot_is_peer(const conn_slot *c, const char *peer) {
  if (!strncmp(peer, "fd:", 3)) return atoi(peer + 3) == c->fd;
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  char host[INET6_ADDRSTRLEN], name[INET6_ADDRSTRLEN + 32];
  if (getpeername(c->fd, (struct sockaddr *)&sa, &sl) != 0) return false;
  if (sa.ss_family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&sa;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(name, sizeof name, "ipv4:%s:%d", host, ntohs(a->sin_port));
  } else if (sa.ss_family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
      snprintf(name, sizeof name, "ipv4:%s:%d", host, ntohs(a->sin6_port));
    } else {
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      snprintf(name, sizeof name, "ipv6:[%s]:%d", host, ntohs(a->sin6_port));
    }
  } else {
    return false;
  }
  return strcmp(name, peer) == 0;
}

static int conns_shutdown(ps_rpc_server *s, const char *peer) {
  int n = 0;
  pthread_mutex_lock(&s->accept_mu);
  conns_sweep(s);
  conns_discover(s);
  for (int i = 0; i < s->nconns; i++) {
    if (peer && !slot_is_peer(&s->conns[i], peer)) continue;
    if (shutdown(s->conns[i].fd, SHUT_RDWR) == 0) n++;
  }
  pthread_mutex_unlock(&s->accept_mu);
  return n;
}

/* The connection of @c, which made a call (with tokens: whose token
 * checked out), keeps its slot.  Only while some tracked connection is
 * not authed (a connection is marked once; the lookup is a scan). */
static void conns_mark_authed(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  if (atomic_load(&s->unauthed) <= 0) return;
  char *peer = grpc_call_get_peer(c->call);
  if (peer == NULL) return;
  pthread_mutex_lock(&s->accept_mu);
  for (int i = 0; i < 16; i++)
    if (!strcmp(s->authed_peers[i], peer)) goto done; /* marked already */
  snprintf(s->authed_peers[s->authed_next], sizeof s->authed_peers[0], "%s", peer);
  s->authed_next = (s->authed_next + 1) % 16;
  for (int pass = 0; pass < 2; pass++) {
    int found = 0;
    for (int i = 0; i < s->nconns && !found; i++)
      if (slot_is_peer(&s->conns[i], peer)) {
        found = 1;
        if (!s->conns[i].authed) {
          s->conns[i].authed = 1;
          atomic_fetch_sub(&s->unauthed, 1);
        }
      }
    if (found || !s->tls) break;
    conns_discover(s); /* TLS: not seen by the monitor yet */
  }
done:
  pthread_mutex_unlock(&s->accept_mu);
  gpr_free(peer);
}

/* The bytes the peer of socket @fd has sent (TCP_INFO's
 * tcpi_bytes_received, Linux 4.1 and later; glibc's struct tcp_info ends
 * before it, so it is read at its offset in the kernel's, which never
 * moves); -1 if the kernel does not say. */
static int64_t conn_bytes_in(int fd) {
  enum { BYTES_RECEIVED_OFF = 128 };
  uint64_t ti[32];
  socklen_t tl = sizeof ti;
  memset(ti, 0, sizeof ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, ti, &tl) != 0 ||
      tl < BYTES_RECEIVED_OFF + sizeof(uint64_t))
    return -1;
  return (int64_t)ti[BYTES_RECEIVED_OFF / sizeof(uint64_t)];
}

/* Without tokens, a connection that has sent more than its handshake
 * takes is in use even before a call of it reached call_authorize (its
 * calls wait behind a busy RPC thread): plaintext, the HTTP/2 preface and
 * SETTINGS (24 + 9 + 6 per setting: 91 bytes from gRPC's clients, a call's
 * HEADERS frame brings ~250 more); TLS, a ClientHello (517 from gRPC's
 * clients, larger with post-quantum key shares), the client's Finished and
 * the encrypted preface.  A client that stops halfway through a handshake
 * of more than this is left to gRPC's handshake deadline
 * (UNAUTH_CONN_MS + 5 s). */
#define CONN_HANDSHAKE_BYTES_PLAIN 128
#define CONN_HANDSHAKE_BYTES_TLS 2048

/* Shuts down the connections that made no call (with tokens: none with a
 * valid token; without, that sent no more than a handshake either) within
 * UNAUTH_CONN_MS of being seen (monitor). */
static void conns_close_unauthed(ps_rpc_server *s, int64_t t) {
  if (atomic_load(&s->unauthed) <= 0) return;
  int n = 0;
  int64_t allowance = s->tls ? CONN_HANDSHAKE_BYTES_TLS : CONN_HANDSHAKE_BYTES_PLAIN;
  pthread_mutex_lock(&s->accept_mu);
  conns_sweep(s);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    if (c->authed || t - c->since_ms < UNAUTH_CONN_MS) continue;
    if (s->opt.auth == NULL && conn_bytes_in(c->fd) > allowance) {
      c->authed = 1; /* in use: its call is on the way */
      atomic_fetch_sub(&s->unauthed, 1);
      continue;
    }
    shutdown(c->fd, SHUT_RDWR);
    c->authed = 1;
    atomic_fetch_sub(&s->unauthed, 1);
    n++;
  }
  if (n && t - s->last_unauth_log_ms >= 10000) {
    if (s->opt.auth)
      PS_WARN("closed %d connection(s) that made no call with a valid token within %d s",
              n, UNAUTH_CONN_MS / 1000);
    else
      PS_WARN("closed %d connection(s) that made no call within %d s (silent, or never "
              "past their handshake)",
              n, UNAUTH_CONN_MS / 1000);
    s->last_unauth_log_ms = t;
  }
  pthread_mutex_unlock(&s->accept_mu);
}

/* A call timed out waiting for its client to read: remember how much each
 * connection's socket had not sent yet. */
static void conns_suspect(ps_rpc_server *s, int64_t t) {
  pthread_mutex_lock(&s->accept_mu);
  conns_sweep(s);
  for (int i = 0; i < s->nconns; i++) {
    int q = 0;
    if (s->conns[i].suspect_ms || ioctl(s->conns[i].fd, SIOCOUTQ, &q) != 0) continue;
    PS_DEBUG("connection fd:%d: %d bytes unsent", s->conns[i].fd, q);
    if (q == 0) continue;
    s->conns[i].suspect_ms = t;
    s->conns[i].outq = q;
  }
  pthread_mutex_unlock(&s->accept_mu);
}

/* 2 s after a call was cancelled that way: a connection that has still
 * not sent a byte of what it had queued belongs to a client that reads
 * nothing, and
 * gRPC would keep the connection, its write and all it references for
 * good (see conns_shutdown): shut the socket down. */
static void conns_check_suspects(ps_rpc_server *s, int64_t t) {
  pthread_mutex_lock(&s->accept_mu);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    if (c->suspect_ms == 0 || t - c->suspect_ms < 2000) continue;
    int q = 0;
    struct stat sb;
    int bad = fstat(c->fd, &sb) != 0 || sb.st_ino != c->ino || sb.st_dev != c->dev ||
              ioctl(c->fd, SIOCOUTQ, &q) != 0;
    PS_DEBUG("connection fd:%d: %d bytes unsent (was %d)", c->fd, bad ? -1 : q, c->outq);
    if (bad || q == 0) {
      c->suspect_ms = 0; /* gone, or it sent everything: it reads */
    } else if (q != c->outq) {
      c->suspect_ms = t; /* still moving: watch on */
      c->outq = q;
    } else {
      if (shutdown(c->fd, SHUT_RDWR) == 0)
        PS_WARN("closed the connection of fd:%d: its client has read nothing for "
                "2 s after a call was cancelled (--stream-timeout-secs)",
                c->fd);
      c->suspect_ms = 0;
    }
  }
  pthread_mutex_unlock(&s->accept_mu);
}

/* Cancels calls that waited on their client for too long. */
static void check_stalls(ps_rpc_server *s) {
  int64_t limit = s->opt.stream_timeout_ms, t = now_ms();
  if (limit <= 0) return;
  pthread_mutex_lock(&s->calls_mu);
  for (ps_rpc_call *c = s->calls; c; c = c->next) {
    int64_t since = atomic_load(&c->wait_since_ms);
    if (since == 0 || t - since < limit) continue;
    if (atomic_load(&c->timed_out)) continue;
    atomic_store(&c->timed_out, 1);
    char msg[256];
    int dir = atomic_load(&c->wait_dir);
    snprintf(msg, sizeof msg,
             "%s: %s for %lld s: call cancelled (limit --stream-timeout-secs)",
             s->h[c->hi].method,
             dir == 1 ? "no request data arrived" : "the client read no response data",
             (long long)(limit / 1000));
    PS_WARN("%s", msg);
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg, NULL);
    /* gRPC names a connection added by fd "unknown", so every
     * connection is checked for a client that reads nothing at all. */
    if (dir == 2) conns_suspect(s, t);
  }
  pthread_mutex_unlock(&s->calls_mu);
}

/* Shutting down with no call left: gRPC waits for every connection to go,
 * and a client that keeps one open without calls (or never finishes its
 * handshake) would hold the exit until the grace period ends.  Once no
 * call has run for IDLE_CLOSE_MS, the sockets are shut down (what the
 * finished calls sent is in the kernel already and still goes out). */
#define IDLE_CLOSE_MS 200
/* gRPC's own shutdown sends GOAWAY and closes each connection as soon as
 * its last call ended, while a big response may still be on its way: the
 * bytes sit in the kernel's send queue, and the client's window updates
 * arriving at the shut socket make the kernel reset it, so the client
 * loses the tail of its read.  So a stop first refuses new calls itself
 * (UNAVAILABLE) and lets the running ones end; gRPC's shutdown starts
 * once no call runs, every connection has sent everything (SIOCOUTQ 0)
 * and those that carried a big response have gone quiet for
 * STOP_QUIET_MS (the client took it all), or after STOP_WAIT_MAX_MS, or
 * at a cancel. */
#define STOP_QUIET_MS 200
#define STOP_WAIT_MAX_MS 5000
#define STOP_BIG_BYTES 65536

/* Nothing is handed to gRPC once its shutdown starts: gRPC deletes the
 * external-connection handler (fd_handler) when it finishes shutting
 * down, so it is forgotten here, under accept_mu (accept_ready checks
 * accepting under it), whoever stops gRPC (shutdown, cancel_all). */
static void grpc_stop(ps_rpc_server *s) {
  pthread_mutex_lock(&s->accept_mu);
  s->accepting = 0;
  s->fd_handler = NULL;
  pthread_mutex_unlock(&s->accept_mu);
  if (atomic_exchange(&s->grpc_stopped, 1) == 0)
    grpc_server_shutdown_and_notify(s->srv, s->cq, &s->shutdown_tag);
}

static bool conns_settled(ps_rpc_server *s) {
  bool settled = true;
  pthread_mutex_lock(&s->accept_mu);
  conns_sweep(s);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    int q = 0;
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (ioctl(c->fd, SIOCOUTQ, &q) != 0 ||
        getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0)
      continue;
    if (q >= STOP_BIG_BYTES) c->sent_big = 1;
    if (q > 0 || (c->sent_big && ti.tcpi_last_data_recv < STOP_QUIET_MS)) settled = false;
  }
  pthread_mutex_unlock(&s->accept_mu);
  return settled;
}

static void stop_when_settled(ps_rpc_server *s) {
  if (!atomic_load(&s->shutting_down) || atomic_load(&s->grpc_stopped)) return;
  pthread_mutex_lock(&s->calls_mu);
  bool idle = s->calls == NULL;
  pthread_mutex_unlock(&s->calls_mu);
  if ((idle && conns_settled(s)) || now_ms() - s->stop_begin_ms >= STOP_WAIT_MAX_MS)
    grpc_stop(s);
}

static void close_idle(ps_rpc_server *s) {
  if (!atomic_load(&s->grpc_stopped) || s->idle_closed) return;
  pthread_mutex_lock(&s->calls_mu);
  bool idle = s->calls == NULL;
  pthread_mutex_unlock(&s->calls_mu);
  int64_t t = now_ms();
  if (!idle) {
    s->idle_since_ms = 0;
    return;
  }
  if (s->idle_since_ms == 0) {
    s->idle_since_ms = t;
    return;
  }
  if (t - s->idle_since_ms < IDLE_CLOSE_MS) return;
  int n = conns_shutdown(s, NULL);
  if (n > 0) PS_INFO("shutting down: closed %d idle connection%s", n, n == 1 ? "" : "s");
  s->idle_closed = 1;
}

/* Freed heap goes back to the system.  gRPC 1.51 buffers a request
 * message whole before any limit is checked, its own (twice
 * --max-message-bytes) included: one refused 1 GiB message left ~1 GiB of
 * free heap in the arenas of gRPC's threads, and glibc keeps free heap
 * (tune_malloc keeps up to 64 MiB at the top of the main heap on purpose;
 * the other arenas shrink only from their top, which a live block pins).
 * The monitor reads the process's RSS once a second (/proc/self/statm: no
 * allocator lock); only for 10 s after it grew by HEAP_KEEP_BYTES / 2
 * since the last look, and every 60 s otherwise, does it look at the free
 * heap (mallinfo2, which walks the free chunks under the arenas' locks)
 * and, above HEAP_KEEP_BYTES, hand its free pages back with
 * malloc_trim: when it has changed by HEAP_MOVED_BYTES since the last
 * trim (gRPC frees a refused message's buffers over a few seconds), or
 * 60 s after it.  The transfers of a busy ps free far less than
 * that (their messages are 1 MiB chunks), so they keep their warm heap. */
#define HEAP_KEEP_BYTES ((size_t)128 << 20)
#define HEAP_MOVED_BYTES ((size_t)4 << 20)

/* Under AddressSanitizer (build-asan) glibc's heap is not the one in use:
 * its allocator's own figures and purge stand in (weak: absent otherwise). */
extern size_t __sanitizer_get_heap_size(void) __attribute__((weak));
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));
extern void __sanitizer_purge_allocator(void) __attribute__((weak));

static size_t heap_free_bytes(void) {
  if (__sanitizer_get_heap_size && __sanitizer_get_current_allocated_bytes) {
    size_t h = __sanitizer_get_heap_size(), a = __sanitizer_get_current_allocated_bytes();
    return h > a ? h - a : 0;
  }
  return mallinfo2().fordblks;
}

/* The process's resident bytes, or -1. */
static int64_t rss_bytes(void) {
  char b[128];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, b, sizeof b - 1);
  close(fd);
  long long size, res;
  if (n <= 0) return -1;
  b[n] = '\0';
  if (sscanf(b, "%lld %lld", &size, &res) != 2) return -1;
  return (int64_t)res * sysconf(_SC_PAGESIZE);
}

static void heap_trim(ps_rpc_server *s, int64_t t) {
  if (t - s->trim_check_ms < 1000) return;
  int64_t rss = rss_bytes();
  if (rss < 0 || rss >= s->look_rss + (int64_t)(HEAP_KEEP_BYTES / 2))
    s->look_until = t + 10000; /* grew: a large message came in */
  if (t >= s->look_until && t - s->trim_check_ms < 60000) return;
  s->trim_check_ms = t;
  s->look_rss = rss;
  size_t f = heap_free_bytes(),
         d = f > s->trim_free ? f - s->trim_free : s->trim_free - f;
  if (f <= HEAP_KEEP_BYTES || (d < HEAP_MOVED_BYTES && t - s->trim_ms < 60000)) return;
  if (__sanitizer_purge_allocator)
    __sanitizer_purge_allocator();
  else
    malloc_trim(0);
  if (d >= HEAP_KEEP_BYTES / 2) {
    int64_t after = rss_bytes();
    PS_INFO("gave %zu MiB of freed heap back to the system (a large message was "
            "received or refused; RSS %lld -> %lld MiB)",
            f >> 20, (long long)(rss >> 20), (long long)(after >> 20));
  }
  s->look_rss = rss_bytes();
  s->trim_free = f;
  s->trim_ms = t;
}

static void *monitor_thread(void *arg) {
  ps_rpc_server *s = arg;
  int64_t backoff_until = 0;
  while (!atomic_load(&s->stop_monitor)) {
    struct pollfd p[MAX_LISTENERS + 1];
    int n = 0;
    p[n++] = (struct pollfd){s->wake[0], POLLIN, 0};
    int64_t t = now_ms();
    int listening = s->nlfd > 0 && t >= backoff_until;
    if (listening)
      for (int i = 0; i < s->nlfd; i++)
        p[n++] = (struct pollfd){s->lfd[i], POLLIN, 0};
    int timeout = !atomic_load(&s->shutting_down)  ? 1000
                  : !atomic_load(&s->grpc_stopped) ? 10
                  : !s->idle_closed                ? IDLE_CLOSE_MS / 2
                                                   : 1000;
    if (s->opt.stream_timeout_ms > 0 && s->opt.stream_timeout_ms / 4 < timeout)
      timeout = (int)(s->opt.stream_timeout_ms / 4) + 1;
    /* TLS: connections over the limit are shut within 0.2 s */
    if (s->tls && !s->tls_own && timeout > 200) timeout = 200;
    if (s->nlfd > 0 && !listening && backoff_until - t < timeout)
      timeout = (int)(backoff_until - t) + 1;
    int r = poll(p, (nfds_t)n, timeout);
    if (r > 0 && (p[0].revents & POLLIN)) {
      char buf[64];
      while (read(s->wake[0], buf, sizeof buf) > 0) {
      }
      pthread_mutex_lock(&s->accept_mu);
      if (!s->accepting) close_listeners(s);
      pthread_mutex_unlock(&s->accept_mu);
      continue;
    }
    for (int i = 1; r > 0 && i < n; i++)
      if (p[i].revents & POLLIN) accept_ready(s, p[i].fd, &backoff_until);
    if (s->tls && !s->tls_own) {
      pthread_mutex_lock(&s->accept_mu);
      conns_discover(s);
      pthread_mutex_unlock(&s->accept_mu);
    }
    check_stalls(s);
    conns_close_unauthed(s, now_ms());
    conns_check_suspects(s, now_ms());
    stop_when_settled(s);
    close_idle(s);
    heap_trim(s, now_ms());
  }
  return NULL;
}

static void tls_files_free(char **cert, char **key, char **ca) {
  free(*cert);
  if (*key) {
    ps_secure_zero(*key, strlen(*key));
    free(*key);
  }
  free(*ca);
  *cert = *key = *ca = NULL;
}

/* The TLS files of @o, read and checked: a certificate, its key, and the
 * client CA if any.  0, or an error naming the flag and file. */
static int tls_files_read(const ps_rpc_server_options *o, char **cert, char **key,
                          char **ca, ps_status *st) {
  *cert = *key = *ca = NULL;
  if (o->tls_cert_file == NULL || o->tls_key_file == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TLS needs both --tls-cert and --tls-key (got only %s)",
                         o->tls_cert_file ? "--tls-cert" : "--tls-key");
  if ((*cert = ps_pem_read(o->tls_cert_file, "--tls-cert", false, st)) == NULL ||
      (*key = ps_pem_read(o->tls_key_file, "--tls-key", true, st)) == NULL ||
      (o->tls_client_ca_file &&
       (*ca = ps_pem_read(o->tls_client_ca_file, "--tls-client-ca", false, st)) ==
           NULL) ||
      ps_pem_check_pair(*cert, *key, o->tls_cert_file, o->tls_key_file, st) != 0) {
    tls_files_free(cert, key, ca);
    return st->code;
  }
  return 0;
}

/* gRPC asks on every TLS handshake: a new certificate config once one was
 * loaded (at the start, then by ps_rpc_server_reload_tls). */
static grpc_ssl_certificate_config_reload_status
tls_fetch(void *user, grpc_ssl_server_certificate_config **config) {
  ps_rpc_server *s = user;
  pthread_mutex_lock(&s->tls_mu);
  grpc_ssl_certificate_config_reload_status r =
      GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  if (s->tls_pending) {
    grpc_ssl_pem_key_cert_pair kp = {s->tls_key, s->tls_cert};
    /* gRPC 1.51 asserts the roots are set even when it asks no client for
     * a certificate (then they are never used): its own chain stands in */
    *config = grpc_ssl_server_certificate_config_create(
        s->tls_ca ? s->tls_ca : s->tls_cert, &kp, 1);
    r = *config ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW
                : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    s->tls_pending = 0;
  }
  pthread_mutex_unlock(&s->tls_mu);
  return r;
}

bool ps_rpc_server_tls(const ps_rpc_server *s) {
  return s->tls;
}

int ps_rpc_server_reload_tls(ps_rpc_server *s, ps_status *st) {
  if (!s->tls)
    return ps_status_set(st, PS_FAILED_PRECONDITION, "this server has no TLS to reload");
  char *cert, *key, *ca;
  if (tls_files_read(&s->opt, &cert, &key, &ca, st) != 0) return st->code;
  pthread_mutex_lock(&s->tls_mu);
  tls_files_free(&s->tls_cert, &s->tls_key, &s->tls_ca);
  s->tls_cert = cert;
  s->tls_key = key;
  s->tls_ca = ca;
  s->tls_pending = 1;
  pthread_mutex_unlock(&s->tls_mu);
  return 0;
}

/* TLS: gRPC listens on the port open_listeners just bound and checked
 * (it is released first).  0, or an error naming the address. */
static int tls_listen(ps_rpc_server *s, const char *addr, ps_status *st) {
  char host[256], port[32], gaddr[320];
  split_addr(addr, host, sizeof host, port, sizeof port);
  int wild = !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*") ||
             host[0] == '\0';
  snprintf(gaddr, sizeof gaddr, "%s%s%s:%d", wild || strchr(host, ':') ? "[" : "",
           wild ? "::" : host, wild || strchr(host, ':') ? "]" : "", s->port);
  grpc_ssl_server_credentials_options *so =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          s->tls_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          tls_fetch, s);
  grpc_server_credentials *sc =
      so ? grpc_ssl_server_credentials_create_with_options(so) : NULL;
  /* our own listeners and accept loop, connections handed over by fd */
  if (sc && s->tls_external) grpc_server_add_http2_port(s->srv, TLS_EXTERNAL_PORT, sc);
  if (s->fd_handler && !tls_handler_ok(s->fd_handler)) {
    PS_WARN("TLS: gRPC's external-connection handler is not of the type this ps was "
            "built for (%s): gRPC's own listener accepts TLS connections instead",
            TLS_EXTERNAL_TYPE);
    pthread_mutex_lock(&s->accept_mu);
    s->fd_handler = NULL;
    pthread_mutex_unlock(&s->accept_mu);
    pthread_mutex_lock(&s->tls_mu); /* the external port took the first config */
    s->tls_pending = 1;
    pthread_mutex_unlock(&s->tls_mu);
  }
  if (s->fd_handler) {
    s->tls_own = 1;
    grpc_server_credentials_release(sc);
    return 0;
  }
  close_listeners(s); /* gRPC listens itself, on the port just checked */
  int got = sc ? grpc_server_add_http2_port(s->srv, gaddr, sc) : 0;
  if (sc) grpc_server_credentials_release(sc);
  if (got != s->port)
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s with TLS: %s", addr,
                         sc ? "address in use" : "the certificate was refused");
  return 0;
}

static void server_free(ps_rpc_server *s) {
  close_listeners(s);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  pthread_mutex_destroy(&s->calls_mu);
  pthread_mutex_destroy(&s->accept_mu);
  pthread_mutex_destroy(&s->tls_mu);
  tls_files_free(&s->tls_cert, &s->tls_key, &s->tls_ca);
  if (s->fd_dir) closedir(s->fd_dir);
  free(s->conns);
  free(s->threads);
  free(s->reg);
  free(s->stats);
  free(s);
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
    if (tls_files_read(&s->opt, &s->tls_cert, &s->tls_key, &s->tls_ca, st) != 0)
      goto fail;
    s->tls_pending = 1;
    if ((s->fd_dir = opendir("/proc/self/fd")) == NULL) {
      ps_status_set(st, PS_UNAVAILABLE, "TLS: cannot list /proc/self/fd: %s",
                    strerror(errno));
      goto fail;
    }
  }
  if (open_listeners(s, addr, st) != 0) goto fail;
  grpc_arg a[5];
  unlimited_args(a, 1);
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
  grpc_channel_args args = {4, a};
  static const grpc_arg_pointer_vtable slot_vtable = {slot_copy, slot_destroy, slot_cmp};
  if (s->tls && tls_external_ok()) { /* see tls_hand_over */
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
  if (s->tls && tls_listen(s, addr, st) != 0) {
    /* never started: nothing of gRPC's runs yet */
    grpc_server_destroy(s->srv);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    goto fail;
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
  s->monitor_on = pthread_create(&s->monitor, NULL, monitor_thread, s) == 0;
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
  streams_end_all(s);
  /* the monitor starts gRPC's shutdown once the running calls have ended
   * and their responses are out (stop_when_settled) */
  ssize_t w = write(s->wake[1], "x", 1);
  (void)w;
  if (!s->monitor_on) grpc_stop(s);
}

/* Cancels @c (under calls_mu). */
static void cancel_call(ps_rpc_call *c) {
  grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE,
                               "ps shutting down: call cancelled", NULL);
}

void ps_rpc_server_cancel_all(ps_rpc_server *s) {
  grpc_stop(s);
  grpc_server_cancel_all_calls(s->srv);
  /* gRPC 1.51 closes the connections, but a stream whose client stopped
   * reading can stay blocked in a send: cancel every call directly too.
   * Calls starting later are cancelled as they are linked. */
  pthread_mutex_lock(&s->calls_mu);
  s->cancelled_all = 1;
  for (ps_rpc_call *c = s->calls; c; c = c->next)
    cancel_call(c);
  pthread_mutex_unlock(&s->calls_mu);
  conns_shutdown(s, NULL);
}

void ps_rpc_server_destroy(ps_rpc_server *s) {
  if (s == NULL) return;
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
  grpc_arg a[7];
  unlimited_args(a, 0);
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
  cc->send_bb = build_chunk(s, &cc->cur);
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
    if (consume_chunk(bb, &cc->sink, &cc->received, r->method, &cc->err) != 0) {
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
    grpc_event ev = grpc_completion_queue_next(
        cq,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(watching ? 100 : 500, GPR_TIMESPAN)),
        NULL);
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
