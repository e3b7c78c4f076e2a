/* RPC glue over gRPC core: the only module that calls gRPC directly.
 *
 * Every method has one shape (see proto/ps.proto): a header message, then
 * bulk bytes as Chunk messages, in both directions.  This module moves the
 * bulk bytes: the sender's tensors go out as zero-copy slices (the ps_buf
 * that owns them is referenced until gRPC lets go), and received chunks are
 * copied straight into the segments the handler or caller named.
 *
 * Server: handlers run on completion-queue threads.  Client: ps_rpc_run()
 * issues any number of calls (to any channels) at once and returns when all
 * have finished. */
#ifndef PS_RPC_H
#define PS_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "security.h"
#include "status.h"
#include "tensor.h"

/* Bulk data larger than this goes in Chunk messages of at most this size;
 * smaller data may travel inline in the header (inline_data fields). */
#define PS_RPC_INLINE_MAX (64 * 1024)

void ps_rpc_global_init(void); /* grpc_init(); call after any fork */
/* ps_rpc_global_init for the ps-server: also gives gRPC's TCP reads
 * buffers that are freed as the chunks are consumed (rpc.c). */
void ps_rpc_global_init_server(void);
void ps_rpc_global_shutdown(void); /* grpc_shutdown() */
/* Turns off Abseil's mutex deadlock detection, which Debian's Abseil
 * leaves on under every lock gRPC takes (rpc.c); ps_rpc_global_init does
 * it.  For a process that calls grpc_init() itself (the bench's bare
 * gRPC server). */
void ps_rpc_quiet_abseil(void);

/* Polling before sleeping.  A thread that waits for gRPC's events (a
 * server's completion-queue thread after each event, when it has just
 * one; a client waiting for its calls' answers) first polls without blocking,
 * yielding its core between polls, for up to this many microseconds, and
 * only then sleeps in epoll.  On a host whose idle cores sleep deeply (a
 * VM: a halted vCPU is woken by the hypervisor) a round trip between two
 * cores then skips two wake-ups: a scalar call on this project's 2-core
 * machine takes ~29 us instead of ~120, and the gaps inside a sparse step
 * or a 4 MiB transfer are bridged too (tests/bench/README.md).  It polls
 * only while the machine has a core for every runnable thread, and stops
 * when a yield shows another thread wanted its core, so busy machines
 * lose nothing.  The cost is CPU time while cores are idle: a ps under
 * traffic with gaps below the window keeps one core busy.  0 turns it
 * off (a host that bills or caps CPU time: a Kubernetes CPU limit).  The
 * client side is process-wide: ps_rpc_set_poll_spin_us, else
 * PS_POLL_SPIN_US in the environment at ps_rpc_global_init. */
#define PS_RPC_DEFAULT_POLL_SPIN_US 1000
#define PS_RPC_MAX_POLL_SPIN_US 10000
/* -1 (and nothing changes) when @us is outside 0..PS_RPC_MAX_POLL_SPIN_US. */
int ps_rpc_set_poll_spin_us(int64_t us);
int64_t ps_rpc_poll_spin_us(void);
/* Parses a --poll-spin-us value ("0".."10000"); -1 when it is not one. */
int ps_rpc_parse_poll_spin_us(const char *s, int64_t *us);

/* A list of byte ranges.  For sending, each range is kept alive by @owner
 * (referenced while gRPC holds it; NULL means the bytes are copied). For
 * receiving, ranges are filled in order. */
typedef struct ps_rpc_seg {
  void *ptr;
  size_t len;
  ps_buf *owner;
} ps_rpc_seg;

typedef struct ps_rpc_segs {
  ps_rpc_seg *v;
  size_t n, cap;
  size_t total;
} ps_rpc_segs;

/* Appends a range; takes a reference on @owner (if any). -1 on no memory. */
int ps_rpc_segs_add(ps_rpc_segs *s, void *ptr, size_t len, ps_buf *owner);
void ps_rpc_segs_fini(ps_rpc_segs *s); /* drops owner refs, frees the array */
/* Copies @n bytes into the ranges, starting at byte @off of the whole list. */
void ps_rpc_segs_fill(ps_rpc_segs *s, size_t off, const void *p, size_t n);

/* ---- server ---- */

typedef struct ps_rpc_server ps_rpc_server;
typedef struct ps_rpc_call ps_rpc_call;

typedef struct ps_rpc_handler {
  const char *method; /* "/paramserver.Ps/Read" */
  /* Request header arrived.  Parse it; call ps_rpc_call_expect() for bulk
   * bytes that follow (or fill them from an inline field).  Return 0, or a
   * code with @st set to fail the call. */
  int (*on_header)(ps_rpc_call *call, const uint8_t *p, size_t n, ps_status *st);
  /* All expected bulk bytes arrived.  Compute, then ps_rpc_call_reply()
   * (+ ps_rpc_call_reply_data()).  Return 0 or a code with @st set. */
  int (*on_data)(ps_rpc_call *call, ps_status *st);
  /* Free per-call state; runs exactly once, also when the call failed. */
  void (*on_free)(ps_rpc_call *call);
  /* A response stream (PS_RPC_STREAM) ends because the server stops: set
   * its last message with ps_rpc_call_reply(), or none.  Runs under a
   * lock of the server: pack a message, nothing more.  May be NULL. */
  void (*on_stream_end)(ps_rpc_call *call);
  /* Who may call it when the server checks tokens (options.auth):
   * PS_RPC_ACCESS_WORKER (the default: any valid token), _ADMIN (an admin
   * token, else PERMISSION_DENIED), _REPLICA (a replica or admin token:
   * Replicate, ps to ps) or _OPEN (no token needed: health).  A replica
   * token may call _REPLICA methods only. */
  int access;
} ps_rpc_handler;
#define PS_RPC_ACCESS_WORKER 0
#define PS_RPC_ACCESS_ADMIN 1
#define PS_RPC_ACCESS_OPEN 2
#define PS_RPC_ACCESS_REPLICA 3

/* Bytes of bulk data in one Chunk message sent by this module.  gRPC hands
 * a message over only once all of it arrived: 1 MiB chunks let the
 * receiver copy one out while the next arrives, and keep less of a
 * transfer in gRPC's buffers (bench_ps (a): 64 MiB read and assign about
 * 1.4x raw TCP with 1 MiB chunks, 0.85x with 16 MiB). */
#define PS_RPC_CHUNK_MAX ((size_t)1 << 20)
/* The smallest message limit: a full Chunk message of earlier versions
 * (16 MiB) still gets in. */
#define PS_RPC_MIN_MESSAGE_BYTES (((int64_t)16 << 20) + 16)

/* Receive limits and resources of a server (ps-server flags, ps/SERVER.md
 * "Limits"). */
typedef struct ps_rpc_server_options {
  int nthreads; /* completion-queue threads serving the handlers */
  /* One request message (header or chunk) larger than this is refused with
   * RESOURCE_EXHAUSTED naming --max-message-bytes (a request's first
   * message, its header, has the same limit: see check_size); gRPC itself
   * refuses a message of twice this size, after buffering it whole (the
   * monitor gives the freed heap back).  At least PS_RPC_MIN_MESSAGE_BYTES. */
  int64_t max_message_bytes;
  /* A call whose request stream brings no message, or whose client reads
   * none of its response, for this long is cancelled with
   * RESOURCE_EXHAUSTED naming --stream-timeout-secs (0: never). */
  int64_t stream_timeout_ms;
  /* Connections served at once; more are accepted and closed at once.  A
   * connection that has made no call 10 s after it was accepted (with
   * @auth: no call with a valid token) is shut down. */
  int max_connections;
  /* TLS: PEM files of the server's certificate chain and key; with
   * tls_client_ca_file, clients must present a certificate it signed
   * (mutual TLS).  NULL: plaintext.  Re-read by ps_rpc_server_reload_tls. */
  const char *tls_cert_file, *tls_key_file, *tls_client_ca_file;
  /* Bearer tokens every call must carry, by role (NULL: none needed, and
   * every caller may do everything).  Borrowed for the server's life. */
  ps_auth *auth;
  /* Polling before sleeping, per completion-queue thread (see
   * PS_RPC_DEFAULT_POLL_SPIN_US; ps-server --poll-spin-us). */
  int64_t poll_spin_us;
  /* Each stream's HTTP/2 receive window (ps-server --recv-window): 0 is
   * gRPC's own bandwidth-delay probing (the default), else
   * PS_RPC_MIN_RECV_WINDOW .. PS_RPC_MAX_RECV_WINDOW bytes. */
  int64_t recv_window_bytes;
} ps_rpc_server_options;
/* HTTP/2 receive windows, of a server and of a client's channels alike.
 * By default (0) gRPC's bandwidth-delay probe grows them.  Fixed (opt-in):
 * each stream's window is fixed at W bytes, the peer may send frames of
 * up to W bytes (at most 16 MiB - 1), and the probe is off.  The probe
 * grows the windows without a bound the ps sets (received data waiting
 * to be copied lifted a ps holding 68 MiB to a peak of 162-188 MiB;
 * fixed: ~156), and the frame size only as it measures, from 16 KiB on
 * each new connection (2 ps + 2 clients pushing 4 MiB moved 2.4-2.9 GB/s
 * with it, 3.3-3.4 fixed).  It is opt-in because as the default it made
 * 64 MiB TLS transfers ~30% slower and replicated ones ~11% slower, and
 * sparse pushes and pulls (~800 KB) 4-9% slower: gRPC 1.51 applies the
 * window to each stream but leaves the connection's at 64 KiB plus what
 * waiting readers ask for, so a message over 64 KiB stops after 64 KiB
 * until the receiver has read its length and sent a WINDOW_UPDATE, one
 * more round trip (tests/bench/README.md).  A client's is PS_RECV_WINDOW
 * in the environment at ps_rpc_global_init. */
#define PS_RPC_MIN_RECV_WINDOW ((int64_t)64 << 10)
#define PS_RPC_MAX_RECV_WINDOW ((int64_t)1 << 30)
/* @s as a window: "0" is 0 (gRPC's probing), else a size (units.h)
 * from PS_RPC_MIN_RECV_WINDOW to PS_RPC_MAX_RECV_WINDOW; 0, or -1 (and
 * *@w unchanged). */
int ps_rpc_parse_recv_window(const char *s, int64_t *w);
/* The window of the channels this process creates from now on (0:
 * gRPC's probing). */
int64_t ps_rpc_client_recv_window(void);

#define PS_RPC_DEFAULT_MAX_MESSAGE_BYTES ((int64_t)32 << 20)
#define PS_RPC_DEFAULT_STREAM_TIMEOUT_SECS 60
#define PS_RPC_DEFAULT_MAX_CONNECTIONS 4096

void ps_rpc_server_options_default(ps_rpc_server_options *o);

/* Binds @addr ("127.0.0.1:0" lets the kernel pick; no other process may
 * share the port).  The server owns its listening sockets and accept loop:
 * out of file descriptors or at @opt->max_connections, it keeps the
 * listener and accepts again once connections close.  @opt may be NULL
 * for the defaults.  NULL with @st set on failure. */
ps_rpc_server *ps_rpc_server_create(const char *addr, const ps_rpc_handler *h, size_t nh,
                                    const ps_rpc_server_options *opt, void *user,
                                    ps_status *st);
int ps_rpc_server_port(const ps_rpc_server *s);
bool ps_rpc_server_tls(const ps_rpc_server *s);
/* Reads the TLS files again (SIGHUP) and checks them: on success new
 * connections get the new certificate (connections open keep theirs); on
 * error nothing changes and @st says why. */
int ps_rpc_server_reload_tls(ps_rpc_server *s, ps_status *st);

/* What the server has answered, per method, for a metrics endpoint: calls
 * by status code (a call that ended without a status, e.g. the client
 * went away, counts as CANCELLED), latency from the request's arrival to
 * the end of the call in buckets of ps_rpc_latency_bounds (seconds; the
 * last bucket is above every bound), request and response bytes. */
#define PS_RPC_NCODES 17
#define PS_RPC_NBUCKETS 14
extern const double ps_rpc_latency_bounds[PS_RPC_NBUCKETS];
typedef struct ps_rpc_method_stats {
  const char *method;
  unsigned long long calls[PS_RPC_NCODES];
  unsigned long long buckets[PS_RPC_NBUCKETS + 1];
  double sum_secs;
  unsigned long long bytes_in, bytes_out;
} ps_rpc_method_stats;
/* Calls being served now and calls started so far (any thread). */
void ps_rpc_server_activity(ps_rpc_server *s, long *in_flight,
                            unsigned long long *started);
/* A copy of every method's counters (malloc'd, *@n of them); NULL when out
 * of memory.  Any thread, while the server exists. */
ps_rpc_method_stats *ps_rpc_server_stats(const ps_rpc_server *s, size_t *n);
void *ps_rpc_server_user(const ps_rpc_server *s);
void ps_rpc_server_start(ps_rpc_server *s);
/* Stops accepting connections and calls; in-flight calls go on.  @done
 * runs once gRPC's shutdown completed and no call object remains, counting
 * calls parked with PS_RPC_PENDING until they are resumed and finished.  It
 * runs on whichever thread freed the last call (a gRPC thread, or the one
 * that called ps_rpc_call_resume) and must not block.  Call once. */
void ps_rpc_server_shutdown(ps_rpc_server *s, void (*done)(void *arg), void *arg);
/* After ps_rpc_server_shutdown(): cancels the calls still running (calls
 * parked with PS_RPC_PENDING stay until resumed). */
void ps_rpc_server_cancel_all(ps_rpc_server *s);
/* After @done ran: joins threads and frees everything.  No batch of this
 * server starts after @done, so nothing freed here is still in use. */
void ps_rpc_server_destroy(ps_rpc_server *s);

void *ps_rpc_call_server_user(ps_rpc_call *c);
/* The caller's role: its token's, PS_ROLE_ADMIN when the server checks no
 * tokens, PS_ROLE_NONE on an open method. */
ps_role ps_rpc_call_role(const ps_rpc_call *c);
/* True once the client's deadline for @c has passed: work parked for
 * later (a closed snapshot gate) must then be dropped, never applied after
 * the client was told it failed.  Any thread. */
bool ps_rpc_call_expired(const ps_rpc_call *c);
void ps_rpc_call_set_ctx(ps_rpc_call *c, void *ctx);
void *ps_rpc_call_ctx(ps_rpc_call *c);
/* Where the request's bulk bytes go; the call takes the list over. */
void ps_rpc_call_expect(ps_rpc_call *c, ps_rpc_segs *sink);
/* @fn(@c, bytes) after each message of bulk bytes landed in the sink,
 * with how many of them arrived so far (on the call's thread, before
 * on_data; never after a failure).  NULL: none. */
typedef void (*ps_rpc_progress_fn)(ps_rpc_call *c, size_t received);
void ps_rpc_call_on_progress(ps_rpc_call *c, ps_rpc_progress_fn fn);
/* Sets the response header (packed now; @m is not kept). */
int ps_rpc_call_reply(ps_rpc_call *c, const ProtobufCMessage *m);
/* on_data may return PS_RPC_PENDING to answer later from any thread with
 * ps_rpc_call_resume() (blocking work such as checkpoint files runs off the
 * completion-queue threads).  @rc/@st: the outcome; on success the reply
 * must have been set. */
#define PS_RPC_PENDING (-1)
/* on_data may return PS_RPC_STREAM after ps_rpc_call_reply(): the reply is
 * the first message of a response stream that stays open (a health Watch)
 * until the client goes or the server stops; then on_stream_end gives the
 * last message and the call ends OK.  An open stream does not count as a
 * call in flight (ps_rpc_server_activity).  More than PS_RPC_MAX_STREAMS
 * open at once: RESOURCE_EXHAUSTED naming the limit. */
#define PS_RPC_STREAM (-2)
#define PS_RPC_MAX_STREAMS 1024
void ps_rpc_call_resume(ps_rpc_call *c, int rc, const ps_status *st);
/* on_data may also leave work for after its answer: it sets the reply
 * (a header with no reply data), registers @fn here and returns 0.  The
 * reply then goes out first and @fn(@c) runs right after, on the same
 * thread, before the call can be freed (a completion on another thread
 * waits for it) and whatever became of the send.  Registered with any
 * other outcome, @fn runs at once, before anything is sent (logged: a
 * handler bug), so it never stays undone.  An update applies its
 * validated effects there while it still holds the variables' locks, so
 * its client is answered without waiting for the arithmetic and no reader
 * sees the old value after the answer.  Only on_data's own thread may
 * call this. */
typedef void (*ps_rpc_after_fn)(ps_rpc_call *c);
void ps_rpc_call_after_reply(ps_rpc_call *c, ps_rpc_after_fn fn);

/* Appends response bulk bytes, sent zero-copy; the call refs @owner. */
int ps_rpc_call_reply_data(ps_rpc_call *c, void *ptr, size_t len, ps_buf *owner);

/* ---- client ---- */

typedef struct ps_rpc_channel ps_rpc_channel;

ps_rpc_channel *ps_rpc_channel_create(const char *target);
/* How a client reaches a server that checks who calls (common/SECURITY.md). */
typedef struct ps_rpc_channel_security {
  const char *ca_pem; /* verify the server against it: TLS (NULL: plaintext) */
  const char *cert_pem,
      *key_pem; /* this client's certificate (mutual TLS; may be NULL) */
  const char *
      server_name; /* name the server's certificate must have (NULL: the target's host) */
  const char
      *token; /* sent as "authorization: Bearer TOKEN" on every call (may be NULL) */
  /* Response messages larger than this are refused by gRPC before they are
   * buffered (RESOURCE_EXHAUSTED); 0: no limit. */
  int64_t max_recv_bytes;
} ps_rpc_channel_security;
/* @sec may be NULL (ps_rpc_channel_create); its strings are copied. */
ps_rpc_channel *ps_rpc_channel_create_secure(const char *target,
                                             const ps_rpc_channel_security *sec);
void ps_rpc_channel_destroy(ps_rpc_channel *ch);
const char *ps_rpc_channel_target(const ps_rpc_channel *ch);

/* One client call.  Fill the inputs, run it with ps_rpc_run(). */
typedef struct ps_rpc_req {
  ps_rpc_channel *ch;
  const char *method;
  const ProtobufCMessage *request;
  const void *raw_request; /* used when request is NULL (tests, fuzzing) */
  size_t raw_len;
  ps_rpc_segs *send;   /* request bulk bytes (borrowed; may be NULL) */
  bool unary_response; /* the response never carries chunks */
  bool keep_open;      /* tests: never end the request stream (a stalled client) */
  int64_t timeout_ms;
  /* A server that stops answering (deploy/DEPLOY.md "A ps that stops answering"): when >
   * 0, a call that has heard nothing for this long ends DEADLINE_EXCEEDED, "METHOD: no
   * answer for N s (--rpc-timeout)".  Hearing is any progress of the call, or an answer
   * to @probe_method (an empty request, sent on the same channel once the call has been
   * silent a while): a server that is busy or holds the call on purpose still answers it,
   * a stopped one does not. */
  int64_t stall_timeout_ms;
  const char *probe_method;
  /* When not NULL: the CLOCK_MONOTONIC ns since which the call has heard
   * nothing, once that is over a second (else left alone); put back to 0
   * when the call ends.  Calls may share one (metrics of one server). */
  atomic_llong *silent_since_ns;
  /* Response header arrived: parse it and add the ranges its bulk bytes go
   * to into @sink.  Return 0 or a code with @st set. */
  int (*on_header)(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                   ps_status *st);
  void *user;
  /* out */
  ps_status st;
  double elapsed_secs; /* from the start of ps_rpc_run to this call's end */
  /* internal */
  void *priv_;
} ps_rpc_req;

/* Runs all calls concurrently; returns when every one has finished.  Each
 * req->st holds its outcome.  Returns the number of failed calls. */
int ps_rpc_run(ps_rpc_req *reqs, size_t n);

#endif
