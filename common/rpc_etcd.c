/* The etcd client (common/etcd.h): endpoints and their channels, unary
 * calls with failover, the KV and lease calls, and the bidi streams the
 * watch and the keeper run on.
 *
 * gRPC core directly, not ps_rpc_run: etcd's methods are plain protobuf
 * messages, not the project's header + Chunk streams.  One channel per
 * endpoint (not one pick_first channel over all of them), so that every
 * error can name the endpoint that gave it and a call can move on to the
 * next one at once.
 *
 * Failover and deadlines.  A unary call starts on the endpoint that
 * answered last.  It has @timeout_ms in all (ps_etcd_connect); one attempt
 * gets at most max(timeout_ms / endpoints, 200 ms) of it, so a member that
 * hangs (no quorum, stopped) leaves time for the others.  UNAVAILABLE and
 * DEADLINE_EXCEEDED move the call to the next endpoint; after a round of
 * failures it waits 50 ms and goes round again until the time is up, then
 * fails UNAVAILABLE "etcd at HOST:PORT: WHAT: why" (the last endpoint
 * tried).  Any other status of etcd (a revoked lease's NOT_FOUND...) is
 * the answer.  A retried write may have been applied by a member that did
 * not answer in time: a put or a delete is the same applied twice; a CAS
 * then reports ok = false (the caller re-reads and finds its own value);
 * a lease grant may leave an unused lease, which expires. */
#include "rpc_etcd_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd.pb-c.h"
#include "etcd_decode.h"
#include "log.h"

#define KV_RANGE "/etcdserverpb.KV/Range"
#define KV_PUT "/etcdserverpb.KV/Put"
#define KV_DELETE "/etcdserverpb.KV/DeleteRange"
#define KV_TXN "/etcdserverpb.KV/Txn"
#define LEASE_GRANT "/etcdserverpb.Lease/LeaseGrant"
#define LEASE_REVOKE "/etcdserverpb.Lease/LeaseRevoke"
/* etcd's MaxLeaseTTL (lease/lessor.go) */
#define MAX_LEASE_TTL 9000000000LL
/* a response above this is refused by gRPC (RESOURCE_EXHAUSTED): four
 * values at their limit */
#define MAX_RECV_BYTES (64 << 20)

int64_t ps_etcd_now_ms_(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ps_etcd_sleep_ms_(int64_t ms, const atomic_int *stop) {
  int64_t end = ps_etcd_now_ms_() + ms;
  for (int64_t left = ms; left > 0 && !atomic_load(stop);
       left = end - ps_etcd_now_ms_()) {
    int64_t step = left < 20 ? left : 20;
    struct timespec ts = {0, (long)step * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static ProtobufCBinaryData bin(const void *p, size_t n) {
  return (ProtobufCBinaryData){n, (uint8_t *)p};
}

/* ---- endpoints ---- */

/* One endpoint "HOST:PORT" (an "http://" in front is dropped): HOST of
 * letters, digits, '.', '-', '_' or a bracketed IPv6 address, PORT in
 * 1..65535.  Returns the length of the "http://" to skip, or -1. */
static int endpoint_check(const char *s, size_t n) {
  int skip = 0;
  if (n > 7 && !strncmp(s, "http://", 7)) skip = 7;
  s += skip;
  n -= (size_t)skip;
  if (n == 0 || n > 255) return -1;
  const char *colon = NULL;
  for (size_t i = n; i-- > 0;)
    if (s[i] == ':') {
      colon = s + i;
      break;
    }
  if (colon == NULL || colon == s) return -1;
  size_t hn = (size_t)(colon - s), pn = n - hn - 1;
  if (pn == 0 || pn > 5) return -1;
  long port = 0;
  for (size_t i = 0; i < pn; i++) {
    if (colon[1 + i] < '0' || colon[1 + i] > '9') return -1;
    port = port * 10 + (colon[1 + i] - '0');
  }
  if (port < 1 || port > 65535) return -1;
  if (s[0] == '[') {
    if (hn < 3 || s[hn - 1] != ']') return -1;
    for (size_t i = 1; i + 1 < hn; i++)
      if (!strchr("0123456789abcdefABCDEF:.", s[i])) return -1;
    return skip;
  }
  for (size_t i = 0; i < hn; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '-' || c == '_'))
      return -1;
  }
  return skip;
}

static struct grpc_channel *channel_for(const char *ep) {
  grpc_arg a[6] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = MAX_RECV_BYTES},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
      /* a restarted member is found again within ~1 s */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
       .value.integer = 100},
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
       .value.integer = 1000},
      /* etcd refuses pings more often than every 5 s (too_many_pings);
       * a member gone silent (host lost) ends its streams within ~15 s */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_KEEPALIVE_TIME_MS,
       .value.integer = 10000},
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
       .value.integer = 5000},
  };
  grpc_channel_args args = {6, a};
  grpc_channel_credentials *cc = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(ep, cc, &args);
  grpc_channel_credentials_release(cc);
  return ch;
}

ps_etcd *ps_etcd_connect(const char *endpoints, int64_t timeout_ms, ps_status *st) {
  if (endpoints == NULL || endpoints[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "no etcd endpoints given (expected HOST:PORT[,HOST:PORT...])");
    return NULL;
  }
  if (timeout_ms <= 0 || timeout_ms > 3600 * 1000) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "etcd timeout of %lld ms: must be 1 ms to one hour",
                  (long long)timeout_ms);
    return NULL;
  }
  ps_etcd *e = calloc(1, sizeof *e);
  if (e == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "etcd client: out of memory");
    return NULL;
  }
  e->timeout_ms = timeout_ms;
  size_t total = strlen(endpoints);
  if ((e->all = malloc(total + 1)) == NULL) goto oom;
  e->all[0] = '\0';
  size_t off = 0;
  for (const char *p = endpoints;; p++) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (e->n == ETCD_MAX_ENDPOINTS) {
      ps_status_set(st, PS_INVALID_ARGUMENT, "more than %d etcd endpoints in \"%.200s\"",
                    ETCD_MAX_ENDPOINTS, endpoints);
      goto fail;
    }
    int skip = endpoint_check(p, n);
    if (skip < 0) {
      char esc[300];
      ps_log_escape(esc, sizeof esc, p, n);
      if (n > 8 && !strncmp(p, "https://", 8))
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "bad etcd endpoint \"%s\": TLS to etcd is not supported", esc);
      else
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "bad etcd endpoint \"%s\" (endpoint %d of \"%.200s\"): expected "
                      "HOST:PORT with a port of 1 to 65535",
                      esc, e->n + 1, endpoints);
      goto fail;
    }
    if ((e->ep[e->n] = strndup(p + skip, n - (size_t)skip)) == NULL) goto oom;
    off += (size_t)snprintf(e->all + off, total + 1 - off, "%s%s", e->n ? "," : "",
                            e->ep[e->n]);
    e->n++;
    if (end == NULL) break;
    p = end;
  }
  grpc_init();
  for (int i = 0; i < e->n; i++)
    if ((e->ch[i] = channel_for(e->ep[i])) == NULL) {
      ps_status_set(st, PS_INTERNAL, "etcd at %s: cannot make a channel", e->ep[i]);
      ps_etcd_close(e);
      return NULL;
    }
  return e;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "etcd client: out of memory");
fail:
  for (int i = 0; i < e->n; i++)
    free(e->ep[i]);
  free(e->all);
  free(e);
  return NULL;
}

void ps_etcd_close(ps_etcd *e) {
  if (e == NULL) return;
  for (int i = 0; i < e->n; i++) {
    if (e->ch[i]) grpc_channel_destroy(e->ch[i]);
    free(e->ep[i]);
  }
  free(e->all);
  free(e);
  grpc_shutdown();
}

const char *ps_etcd_endpoints(const ps_etcd *e) {
  return e->all;
}

const char *ps_etcd_endpoint_in_use(ps_etcd *e) {
  return e->ep[atomic_load(&e->cur) % e->n];
}

/* ---- unary calls ---- */

/* One attempt of @method on endpoint @ep with @deadline_ms (monotonic):
 * 0 with the answer's bytes in *@out (caller unrefs), else the status. */
static int attempt(ps_etcd *e, int ep, const char *method, grpc_slice msg,
                   int64_t deadline_ms, const char *what, grpc_slice *out,
                   ps_status *st) {
  /* a buffer per attempt: gRPC 1.51 takes the slices out of the one it
   * sends */
  grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&msg, 1);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  int64_t left = deadline_ms - ps_etcd_now_ms_();
  if (left < 1) left = 1;
  gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                 gpr_time_from_millis(left, GPR_TIMESPAN));
  grpc_call *c =
      grpc_channel_create_call(e->ch[ep], NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                               grpc_slice_from_static_string(method), NULL, dl, NULL);
  grpc_metadata_array im, tm;
  grpc_metadata_array_init(&im);
  grpc_metadata_array_init(&tm);
  grpc_byte_buffer *in = NULL;
  grpc_status_code code = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = req;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &im;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &tm;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &details;
  int rc = 0;
  if (c == NULL) {
    rc = ps_status_set(st, PS_INTERNAL, "etcd at %s: %s: cannot make a call", e->ep[ep],
                       what);
  } else if (grpc_call_start_batch(c, ops, 6, ops, NULL) != GRPC_CALL_OK) {
    rc = ps_status_set(st, PS_INTERNAL, "etcd at %s: %s: cannot start the call",
                       e->ep[ep], what);
  } else {
    grpc_event ev =
        grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) code = GRPC_STATUS_INTERNAL;
    if (code != GRPC_STATUS_OK) {
      char *d = grpc_slice_to_c_string(details);
      char esc[400];
      ps_log_escape(esc, sizeof esc, d, strlen(d));
      gpr_free(d);
      rc = ps_status_set(st, (int)code, "etcd at %s: %s: %s", e->ep[ep], what,
                         esc[0] ? esc : "no answer");
    } else if (in == NULL) {
      rc = ps_status_set(st, PS_INTERNAL, "etcd at %s: %s: OK without an answer",
                         e->ep[ep], what);
    } else {
      grpc_byte_buffer_reader r;
      if (!grpc_byte_buffer_reader_init(&r, in)) {
        rc = ps_status_set(st, PS_INTERNAL, "etcd at %s: %s: unreadable answer",
                           e->ep[ep], what);
      } else {
        *out = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
      }
    }
  }
  if (in) grpc_byte_buffer_destroy(in);
  grpc_byte_buffer_destroy(req);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&im);
  grpc_metadata_array_destroy(&tm);
  if (c) grpc_call_unref(c);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return rc;
}

/* A decoder of one answer (etcd_decode.h), with its arguments. */
typedef int (*decode_fn)(const uint8_t *p, size_t n, void *args, ps_status *st);

/* @method with @req, failing over as the file's comment says; the answer
 * goes through @dec (its errors prefixed with the endpoint). */
static int unary(ps_etcd *e, const char *method, const ProtobufCMessage *req,
                 const char *what, decode_fn dec, void *args, ps_status *st) {
  size_t n = protobuf_c_message_get_packed_size(req);
  grpc_slice sl = grpc_slice_malloc(n);
  protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(sl));
  int64_t start = ps_etcd_now_ms_(), end = start + e->timeout_ms;
  int64_t per = e->timeout_ms / e->n;
  if (per < 200) per = 200;
  int first = atomic_load(&e->cur) % e->n, ep = first, rc = PS_UNAVAILABLE, tried = 0;
  for (;;) {
    /* the first round gives every endpoint its full share */
    int64_t now = ps_etcd_now_ms_();
    int64_t dl = now + per < end || tried < e->n ? now + per : end;
    grpc_slice out;
    rc = attempt(e, ep, method, sl, dl, what, &out, st);
    tried++;
    if (rc == 0) {
      atomic_store(&e->cur, ep);
      rc = dec(GRPC_SLICE_START_PTR(out), GRPC_SLICE_LENGTH(out), args, st);
      grpc_slice_unref(out);
      if (rc != 0) ps_status_prefix(st, "etcd at %s", e->ep[ep]);
      break;
    }
    if (rc != PS_UNAVAILABLE && rc != PS_DEADLINE_EXCEEDED) break;
    if (ps_etcd_now_ms_() >= end && tried >= e->n) {
      if (rc == PS_DEADLINE_EXCEEDED) st->code = rc = PS_UNAVAILABLE;
      if (e->n > 1)
        ps_status_prefix(st, "no etcd endpoint of %s answered within %lld ms", e->all,
                         (long long)e->timeout_ms);
      break;
    }
    ep = (ep + 1) % e->n;
    if (ep == first) { /* a round failed: a pause */
      static const atomic_int never = 0;
      ps_etcd_sleep_ms_(50, &never);
    }
  }
  grpc_slice_unref(sl);
  return rc;
}

/* ---- the calls ---- */

/* @what for errors: VERB "KEY" (escaped, truncated). */
static void what_key(char *buf, size_t n, const char *verb, const char *key) {
  char esc[200];
  ps_log_escape(esc, sizeof esc, key, strlen(key));
  snprintf(buf, n, "%s \"%s\"", verb, esc);
}

typedef struct get_args {
  const char *key;
  char **val;
  size_t *len;
  int64_t *mod_rev, *rev;
} get_args;

static int dec_get(const uint8_t *p, size_t n, void *a, ps_status *st) {
  get_args *g = a;
  return ps_etcd_decode_get(p, n, g->key, g->val, g->len, g->mod_rev, g->rev, st);
}

/* A Range of one key (@count_only: its count alone, for the revision). */
static int range_one(ps_etcd *e, const char *verb, bool count_only, get_args *g,
                     ps_status *st) {
  Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
  req.key = bin(g->key, strlen(g->key));
  req.count_only = count_only;
  char what[256];
  what_key(what, sizeof what, verb, g->key);
  return unary(e, KV_RANGE, &req.base, what, dec_get, g, st);
}

int ps_etcd_get(ps_etcd *e, const char *key, char **val, size_t *len, int64_t *mod_rev,
                int64_t *rev, ps_status *st) {
  int64_t r = 0;
  size_t l = 0;
  get_args g = {key, val, len ? len : &l, mod_rev, rev ? rev : &r};
  return range_one(e, "get", false, &g, st);
}

int ps_etcd_revision_(ps_etcd *e, const char *key, int64_t *rev, ps_status *st) {
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  get_args g = {key, &val, &len, &mod, rev};
  int rc = range_one(e, "revision at", true, &g, st);
  free(val);
  return rc;
}

typedef struct prefix_args {
  const char *prefix;
  ps_etcd_kv **out;
  size_t *n;
  int64_t *rev;
} prefix_args;

static int dec_prefix(const uint8_t *p, size_t n, void *a, ps_status *st) {
  prefix_args *g = a;
  return ps_etcd_decode_prefix(p, n, g->prefix, g->out, g->n, g->rev, st);
}

int ps_etcd_get_prefix(ps_etcd *e, const char *prefix, ps_etcd_kv **out, size_t *n,
                       int64_t *rev, ps_status *st) {
  int64_t r = 0;
  prefix_args g = {prefix, out, n, rev ? rev : &r};
  char *end = malloc(strlen(prefix) + 2);
  if (end == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "get_prefix: out of memory");
  size_t elen = ps_etcd_prefix_end(prefix, end);
  Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
  req.key = bin(prefix, strlen(prefix));
  if (req.key.len == 0) req.key = bin("", 1); /* key "\0" + range_end "\0": every key */
  req.range_end = bin(end, elen);
  req.limit = PS_ETCD_MAX_KEYS + 1;
  req.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
  req.sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__KEY;
  char what[256];
  what_key(what, sizeof what, "get_prefix", prefix);
  int rc = unary(e, KV_RANGE, &req.base, what, dec_prefix, &g, st);
  free(end);
  return rc;
}

typedef struct txn_args {
  const char *key;
  bool *ok;
  int64_t *new_mod_rev;
} txn_args;

static int dec_txn(const uint8_t *p, size_t n, void *a, ps_status *st) {
  txn_args *g = a;
  return ps_etcd_decode_txn(p, n, g->key, g->ok, g->new_mod_rev, st);
}

static int check_value(const char *key, size_t len, int64_t lease, ps_status *st) {
  if (len > PS_ETCD_MAX_VALUE)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "value for \"%.200s\" is %zu bytes, over the limit of %u bytes",
                         key, len, PS_ETCD_MAX_VALUE);
  if (lease < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "put \"%.200s\": lease %lld", key,
                         (long long)lease);
  return 0;
}

int ps_etcd_cas(ps_etcd *e, const char *key, const void *val, size_t len,
                int64_t expect_mod_rev, int64_t lease, bool *ok, int64_t *new_mod_rev,
                ps_status *st) {
  *ok = false;
  if (check_value(key, len, lease, st) != 0) return st->code;
  if (expect_mod_rev < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "cas \"%.200s\": expected revision %lld", key,
                         (long long)expect_mod_rev);
  Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
  cmp.key = bin(key, strlen(key));
  cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
  cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
  /* a missing key has mod_revision 0: expect 0 is "must not exist" */
  cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
  cmp.mod_revision = expect_mod_rev;
  Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
  put.key = cmp.key;
  put.value = bin(val, len);
  put.lease = lease;
  Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT;
  op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
  op.request_put = &put;
  Etcdserverpb__Compare *cmps[1] = {&cmp};
  Etcdserverpb__RequestOp *ops[1] = {&op};
  Etcdserverpb__TxnRequest req = ETCDSERVERPB__TXN_REQUEST__INIT;
  req.n_compare = 1;
  req.compare = cmps;
  req.n_success = 1;
  req.success = ops;
  txn_args g = {key, ok, new_mod_rev};
  char what[256];
  what_key(what, sizeof what, "cas", key);
  return unary(e, KV_TXN, &req.base, what, dec_txn, &g, st);
}

static int dec_put(const uint8_t *p, size_t n, void *a, ps_status *st) {
  return ps_etcd_decode_put(p, n, a, st);
}

int ps_etcd_put(ps_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                ps_status *st) {
  if (check_value(key, len, lease, st) != 0) return st->code;
  Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
  req.key = bin(key, strlen(key));
  req.value = bin(val, len);
  req.lease = lease;
  char what[256];
  what_key(what, sizeof what, "put", key);
  return unary(e, KV_PUT, &req.base, what, dec_put, (void *)key, st);
}

static int dec_delete(const uint8_t *p, size_t n, void *a, ps_status *st) {
  return ps_etcd_decode_delete(p, n, a, st);
}

int ps_etcd_delete(ps_etcd *e, const char *key, ps_status *st) {
  Etcdserverpb__DeleteRangeRequest req = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
  req.key = bin(key, strlen(key));
  char what[256];
  what_key(what, sizeof what, "delete", key);
  return unary(e, KV_DELETE, &req.base, what, dec_delete, (void *)key, st);
}

typedef struct grant_args {
  int64_t *id, *ttl;
} grant_args;

static int dec_grant(const uint8_t *p, size_t n, void *a, ps_status *st) {
  grant_args *g = a;
  return ps_etcd_decode_grant(p, n, g->id, g->ttl, st);
}

int ps_etcd_lease_grant(ps_etcd *e, int64_t ttl_s, int64_t *id, int64_t *ttl_out,
                        ps_status *st) {
  if (ttl_s < 1 || ttl_s > MAX_LEASE_TTL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "lease TTL of %lld s: must be 1 to %lld s", (long long)ttl_s,
                         MAX_LEASE_TTL);
  int64_t t = 0;
  grant_args g = {id, ttl_out ? ttl_out : &t};
  Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
  req.ttl = ttl_s;
  return unary(e, LEASE_GRANT, &req.base, "lease grant", dec_grant, &g, st);
}

static int dec_revoke(const uint8_t *p, size_t n, void *a, ps_status *st) {
  return ps_etcd_decode_revoke(p, n, *(int64_t *)a, st);
}

int ps_etcd_lease_revoke(ps_etcd *e, int64_t id, ps_status *st) {
  Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
  req.id = id;
  char what[64];
  snprintf(what, sizeof what, "lease revoke %lld", (long long)id);
  return unary(e, LEASE_REVOKE, &req.base, what, dec_revoke, &id, st);
}
