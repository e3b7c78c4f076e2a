/* Shared by the rpc files (private to common/, included by common/rpc*.c
 * alone; the rest of the tree uses rpc.h).  Layers, each calling only
 * the files below it (check_layers refuses a call cycle):
 *   rpc_server.c   the server's life and its event loop (request checks,
 *                  handlers), on top of
 *   rpc_monitor.c  the monitor thread (accept loop, stalls, stop, heap)
 *   rpc_tls.c      TLS files, the certificate fetcher, the TLS port
 *   rpc_listen.c   listening sockets, accepting, handing over to gRPC
 *   rpc_stream.c   response streams (PS_RPC_STREAM)
 *   rpc_conns.c    the table of connections and its policing
 *   rpc_call.c     a server call's batches, statistics, handler calls
 *   rpc_client.c   channels and ps_rpc_run
 *   rpc_bytes.c    byte ranges, Chunk messages, message packing
 *   rpc.c          the library's init (and what the module is)
 * Names of functions shared between the files end in an underscore. */
#ifndef PS_RPC_INTERNAL_H
#define PS_RPC_INTERNAL_H

#include <dirent.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "rpc.h"

enum { TAG_SCALL = 1, TAG_GENERIC, TAG_SHUTDOWN, TAG_CSEND, TAG_CRECV, TAG_SCLOSE };

/* Cursor over a range list while sending. */
typedef struct cursor {
  size_t seg, pos, off;
} cursor;

/* The monotonic clock in milliseconds, and in nanoseconds. */
static inline int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next event of @cq: polled for up to @spin_ns first (rpc.h,
 * PS_RPC_DEFAULT_POLL_SPIN_US), then waited for until @deadline. */
grpc_event ps_rpc_cq_wait_(grpc_completion_queue *cq, int64_t spin_ns,
                           gpr_timespec deadline);

/* The server.
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
  ps_rpc_progress_fn progress; /* ps_rpc_call_on_progress */
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
  /* ps_rpc_call_after_reply: the work, and while it runs a pin that
   * keeps the call alive (1; 2 once a completion wanted it freed) */
  ps_rpc_after_fn after;
  atomic_int pin;
};

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
  atomic_ullong bulk_bytes;    /* request and reply chunk bytes moved so far */
  int cancelled_all;           /* under calls_mu */
  /* listener and monitor thread */
  int lfd[MAX_LISTENERS];
  int nlfd;
  int wake[2];
  pthread_t monitor;
  int monitor_on;
  pthread_mutex_t accept_mu; /* accepting + handing fds to gRPC */
  int accepting;
  int started; /* ps_rpc_server_start ran */
  atomic_int stop_monitor;
  atomic_int grpc_stopped; /* grpc_server_shutdown_and_notify was called */
  int64_t stop_begin_ms;   /* ps_rpc_server_shutdown was called then */
  conn_slot *conns;
  int nconns;
  int64_t last_full_log_ms, last_emfile_log_ms;
  int64_t idle_since_ms;          /* shutting down: since when no call runs (monitor) */
  int64_t trim_check_ms, trim_ms; /* heap_trim: last look, last trim (monitor) */
  size_t trim_free;               /* heap_trim: free heap bytes at the last trim */
  /* idle_trim: bulk_bytes when bytes last moved, then; done */
  unsigned long long quiet_bytes;
  int64_t quiet_since_ms;
  int quiet_trimmed;
  int64_t look_rss, look_until; /* heap_trim: RSS at the last look, busy window */
  int idle_closed;              /* the idle connections are shut (monitor) */
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

/* TLS: the port of gRPC's external-connection handler, and the type it
 * must have (see rpc_listen.c, ps_rpc_tls_handler_ok_). */
#define TLS_EXTERNAL_PORT "external:paramserver"
#define TLS_EXTERNAL_TYPE "N12_GLOBAL__N_125ExternalConnectionHandlerE"

/* rpc_bytes.c */
grpc_byte_buffer *ps_rpc_build_chunk_(ps_rpc_segs *s, cursor *cur);
int ps_rpc_consume_chunk_(grpc_byte_buffer *bb, ps_rpc_segs *sink, size_t *received,
                          const char *what, ps_status *st);
grpc_byte_buffer *ps_rpc_pack_message_(const ProtobufCMessage *m);
grpc_slice ps_rpc_read_all_(grpc_byte_buffer *bb);
void ps_rpc_unlimited_args_(grpc_arg *a, int server);
/* The arguments of receive window @w (rpc.h) at @a, which has room for
 * 3; how many it wrote (none for 0, gRPC's probing). */
size_t ps_rpc_window_args_(grpc_arg *a, int64_t w);

/* rpc_call.c */
void ps_rpc_server_unref_(ps_rpc_server *s);
void ps_rpc_call_link_(ps_rpc_call *c);
void ps_rpc_cancel_call_(ps_rpc_call *c);
void ps_rpc_wait_client_(ps_rpc_call *c, int dir);
void ps_rpc_scall_free_(ps_rpc_call *c);
void ps_rpc_scall_fail_(ps_rpc_call *c);
void ps_rpc_scall_recv_next_(ps_rpc_call *c);
void ps_rpc_scall_send_next_(ps_rpc_call *c, int first);
void ps_rpc_scall_reply_then_after_(ps_rpc_call *c);

/* rpc_stream.c */
ps_rpc_call *ps_rpc_call_of_close_tag_(tag *t);
void ps_rpc_stream_sent_(ps_rpc_call *c, int ok);
void ps_rpc_stream_closed_(ps_rpc_call *c);
void ps_rpc_stream_start_(ps_rpc_call *c);
void ps_rpc_streams_end_all_(ps_rpc_server *s);

/* rpc_conns.c */
void ps_rpc_conns_sweep_(ps_rpc_server *s);
void ps_rpc_authed_peers_forget_(ps_rpc_server *s);
void ps_rpc_conns_discover_(ps_rpc_server *s);
int ps_rpc_conns_shutdown_(ps_rpc_server *s, const char *peer);
void ps_rpc_conns_mark_authed_(ps_rpc_call *c);
void ps_rpc_conns_close_unauthed_(ps_rpc_server *s, int64_t t);
void ps_rpc_conns_suspect_(ps_rpc_server *s, int64_t t);
void ps_rpc_conns_check_suspects_(ps_rpc_server *s, int64_t t);

/* rpc_listen.c */
void ps_rpc_close_listeners_(ps_rpc_server *s);
int ps_rpc_split_addr_(const char *addr, char *host, size_t hn, char *port, size_t pn);
int ps_rpc_open_listeners_(ps_rpc_server *s, const char *addr, ps_status *st);
bool ps_rpc_tls_external_ok_(void);
bool ps_rpc_tls_handler_ok_(void *h);
void ps_rpc_accept_ready_(ps_rpc_server *s, int lfd, int64_t *backoff_until);

/* rpc_tls.c */
void ps_rpc_tls_files_free_(char **cert, char **key, char **ca);
int ps_rpc_tls_files_read_(const ps_rpc_server_options *o, char **cert, char **key,
                           char **ca, ps_status *st);
int ps_rpc_tls_listen_(ps_rpc_server *s, const char *addr, ps_status *st);

/* rpc_monitor.c */
void ps_rpc_grpc_stop_(ps_rpc_server *s);
void *ps_rpc_monitor_thread_(void *arg);

#endif
