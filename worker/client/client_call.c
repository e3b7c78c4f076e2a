/* Running calls: each public call builds one ps_rpc_req per ps task it
 * contacts and runs them together, so calls to several ps overlap.  Safe
 * calls are retried on UNAVAILABLE with exponential backoff; updates are
 * not (an assign_add that reached the ps must not be applied twice).
 *
 * Replicated shards (c->view set): the "task" of a call names a shard;
 * each call of a message with a route field goes to its shard's primary
 * with Route{shard, epoch}, and one that finds a primary gone, a ps that
 * is not the primary, or a stale primary's answer is sent again by the
 * newer view (updates too: the ps deduplicates their (client_id, seq)),
 * until the rpc timeout.  Unreplicated calls take none of these paths. */
#include "client_internal.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

/* ---- answers ----
 *
 * A ps is input from outside: every answer is checked against its request
 * (counts, names, dtypes, shapes, byte sizes) before anything is used or
 * allocated, and a call answered OK without its header message fails.
 * Each decoder runs through on_answer, which notes that the header came. */

/* The most top-level entries an answer may have: each unpacked entry (a
 * name's pointer and its smallest allocation) takes some 40 bytes, so at
 * most 4 times the receive limit.  A 32 MiB answer of 16 million empty
 * names took 640 MiB in protobuf-c's unpack before any check. */
static size_t answer_max_entries(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  return (size_t)max_message_bytes * 4 / 40;
}

/* The field that starts at @p (its key first): whether it is a varint,
 * and its value. */
static bool varint_field(const uint8_t *p, const uint8_t *end, uint64_t *out) {
  uint64_t v[2] = {0, 0};
  for (int pass = 0; pass < 2; pass++)
    for (int sh = 0; p < end && sh < 64; sh += 7) {
      uint8_t b = *p++;
      v[pass] |= (uint64_t)(b & 0x7f) << sh;
      if (!(b & 0x80)) break;
    }
  *out = v[1];
  return (v[0] & 7) == 0;
}

/* Replication: the answer of a call for a shard names the epoch of the
 * ps's view (Update, Read, List: field 100).  An answer from a primary
 * older than the one the client's view names (its epoch below the
 * primary's since) is refused before it is used: the call is sent again
 * to the new primary. */
static int epoch_check(const answer *a, bool has, uint64_t raw, ps_status *st) {
  if (a->cl == NULL || a->shard < 0 || a->cl->view == NULL) return 0;
  if (strcmp(a->method, M_UPDATE) != 0 && strcmp(a->method, M_READ) != 0 &&
      strcmp(a->method, M_LIST) != 0)
    return 0;
  int64_t epoch = (int64_t)raw;
  if (has && epoch < 0)
    return ps_cl_bad_answer_(st, a->method, "view epoch %lld is negative (shard %d)",
                             (long long)epoch, a->shard);
  int64_t since;
  int primary;
  if (!ps_cl_view_stale_(a->cl, a->shard, epoch, &since, &primary)) return 0;
  return ps_status_set(st, PS_FAILED_PRECONDITION,
                       "ps/%d at %s: %s: a stale answer for shard %d refused: view epoch "
                       "%lld, older than epoch %lld at which ps/%d became its primary",
                       a->task, a->addr, ps_cl_method_name_(a->method), a->shard,
                       (long long)epoch, (long long)since, primary);
}

size_t ps_cl_answer_scan_(const uint8_t *p, size_t n, bool *has_epoch, uint64_t *epoch) {
  const uint8_t *q = p, *end = p + n, *val, *at = p;
  uint64_t field;
  size_t len, count = 0;
  *has_epoch = false;
  *epoch = 0;
  while (ps_cl_wire_next_(&q, end, &field, &val, &len) > 0) {
    count++;
    if (field == 100 && val == NULL && varint_field(at, q, epoch)) *has_epoch = true;
    at = q;
  }
  return count;
}

static int on_answer(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                     ps_status *st) {
  answer *a = user;
  a->seen = true;
  uint64_t epoch;
  bool has_epoch;
  size_t count = ps_cl_answer_scan_(p, n, &has_epoch, &epoch),
         most = answer_max_entries(a->max_message_bytes);
  if (epoch_check(a, has_epoch, epoch, st) != 0) return st->code;
  if (count > most && a->parse != ps_cl_parse_list_) /* List's own cap is lower */
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d at %s: %s: %zu entries, more than the %zu a client "
                         "holds with a limit of %lld bytes (--max-message-bytes)",
                         a->task, a->addr, ps_cl_method_name_(a->method), count, most,
                         (long long)a->max_message_bytes);
  return a->parse(a->user, p, n, sink, st);
}

/* "Read" of "/paramserver.Ps/Read". */

void ps_cl_answer_init_(const ps_client *c, int task, ps_rpc_req *r, answer *a,
                        parse_fn parse, void *user, const char *about) {
  *a = (answer){.parse = parse,
                .user = user,
                .about = about,
                .method = r->method,
                .max_message_bytes = c->opt.max_message_bytes,
                .task = task,
                .addr = c->addrs[task],
                .shard = -1};
  if (parse == NULL) return;
  r->on_header = on_answer;
  r->user = a;
}

/* An OK call whose header never came fails. */
static void answer_check(ps_rpc_req *r) {
  if (r->on_header != on_answer || r->st.code != PS_OK) return;
  const answer *a = r->user;
  if (a->seen) return;
  if (a->about)
    ps_cl_bad_answer_(&r->st, r->method, "the answer has no header (variable %s)",
                      a->about);
  else
    ps_cl_bad_answer_(&r->st, r->method, "the answer has no header");
}

/* Counts each call's wait against its task. */
static void count_waits(ps_client *c, const ps_rpc_req *reqs, const int *tasks,
                        size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (tasks[i] < 0 || tasks[i] >= c->nps) continue;
    atomic_fetch_add_explicit(&c->calls[tasks[i]], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->wait_us[tasks[i]],
                              (unsigned long long)(reqs[i].elapsed_secs * 1e6),
                              memory_order_relaxed);
  }
}

/* A connection the ps accepted but never answered on (the kernel takes it
 * for a stopped process): the call never reached the ps, so it may be
 * tried again whatever it is, until the rpc timeout. */
static bool no_handshake(const ps_status *st) {
  return st->code == PS_UNAVAILABLE && strstr(st->msg, "before receiving SETTINGS frame");
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether call @r is tried again: UNAVAILABLE ones of @safe calls up to
 * max_retries times, and ones that found no answering ps (no_handshake)
 * until the rpc timeout has passed since @t0. */
static bool try_again(const ps_client *c, const ps_rpc_req *r, bool safe, int attempt,
                      int64_t t0) {
  if (no_handshake(&r->st)) return mono_ms() - t0 < r->stall_timeout_ms;
  return safe && attempt < c->opt.max_retries && r->st.code == PS_UNAVAILABLE;
}

static void run_routed(ps_client *c, ps_rpc_req *reqs, const int *shards, size_t n,
                       bool safe);

void ps_cl_run_reqs_(ps_client *c, ps_rpc_req *reqs, const int *tasks, size_t n,
                     bool safe) {
  if (c->view) {
    run_routed(c, reqs, tasks, n, safe);
    return;
  }
  int64_t t0 = mono_ms();
  ps_rpc_run(reqs, n);
  count_waits(c, reqs, tasks, n);
  int64_t backoff = c->opt.retry_initial_ms;
  for (int attempt = 0;; attempt++) {
    size_t nretry = 0;
    for (size_t i = 0; i < n; i++)
      nretry += try_again(c, &reqs[i], safe, attempt, t0);
    if (nretry == 0) break;
    PS_DEBUG("retrying %zu call(s) after UNAVAILABLE in %lld ms", nretry,
             (long long)backoff);
    ps_cl_sleep_ms_(backoff);
    backoff = backoff * 2 > c->opt.retry_max_ms ? c->opt.retry_max_ms : backoff * 2;
    ps_rpc_req *again = malloc(nretry * sizeof *again);
    size_t *which = malloc(nretry * sizeof *which);
    if (again == NULL || which == NULL) {
      free(again);
      free(which);
      break;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (try_again(c, &reqs[i], safe, attempt, t0) && k < nretry) {
        which[k] = i;
        again[k] = reqs[i];
        again[k].priv_ = NULL;
        ps_status_clear(&again[k].st);
        if (again[k].on_header == on_answer) ((answer *)again[k].user)->seen = false;
        k++;
      }
    ps_rpc_run(again, k);
    for (size_t j = 0; j < k; j++) {
      reqs[which[j]].st = again[j].st;
      int t = tasks[which[j]];
      count_waits(c, &again[j], &t, 1);
    }
    free(again);
    free(which);
  }
  for (size_t i = 0; i < n; i++) {
    if (no_handshake(&reqs[i].st)) { /* as a call on an open connection says it */
      const char *m = strrchr(reqs[i].method, '/');
      ps_status_set(&reqs[i].st, PS_DEADLINE_EXCEEDED,
                    "%s: no answer for %g s (--rpc-timeout)", m ? m + 1 : reqs[i].method,
                    (double)reqs[i].stall_timeout_ms / 1000);
    }
    answer_check(&reqs[i]);
    ps_cl_annotate_(c, tasks[i], &reqs[i].st);
  }
}

/* ---- replicated shards ---- */

/* The route field of @msg's message, or NULL when it has none. */
static Paramserver__Route **route_slot(const ProtobufCMessage *msg) {
  if (msg == NULL) return NULL;
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, "route");
  if (f == NULL || f->type != PROTOBUF_C_TYPE_MESSAGE ||
      f->descriptor != &paramserver__route__descriptor)
    return NULL;
  return (Paramserver__Route **)((char *)msg + f->offset);
}

/* One call of a routed run. */
typedef struct routed {
  Paramserver__Route **slot; /* the message's route field (NULL: not routed) */
  bool preset;               /* the caller set the route and the task (checkpoints) */
  Paramserver__Route route;
  int to;        /* the task it goes to */
  int64_t epoch; /* the view's epoch it was routed by */
} routed;

/* A task that is the primary of some shard in the view: the one asked
 * about a lost shard, which answers naming it and the tasks it had. */
static int some_primary(ps_client *c) {
  int64_t e;
  for (int s = 0; s < c->nps; s++) {
    int p = ps_cl_view_route_(c, s, &e);
    if (p >= 0) return p;
  }
  return 0;
}

static void route_one(ps_client *c, ps_rpc_req *r, int shard, routed *x) {
  if (x->slot == NULL || x->preset) {
    x->to = shard;
    x->epoch = ps_cl_view_epoch_(c);
  } else {
    int p = ps_cl_view_route_(c, shard, &x->epoch);
    x->to = p >= 0 ? p : some_primary(c);
    paramserver__route__init(&x->route);
    /* Restore: every shard of the primary (the variables are named) */
    x->route.shard = strcmp(r->method, M_RESTORE) == 0 ? -1 : shard;
    x->route.epoch = x->epoch;
    *x->slot = &x->route;
  }
  r->ch = c->ch[x->to];
  r->silent_since_ns = &c->silent_since[x->to];
  if (r->on_header == on_answer) {
    answer *a = r->user;
    a->task = x->to;
    a->addr = c->addrs[x->to];
    a->cl = c;
    a->shard = x->slot && !x->preset ? shard : -1;
  }
}

/* Whether a routed call is sent again after the view moves on: a primary
 * gone (UNAVAILABLE: safe calls, and updates, which the ps deduplicates),
 * a ps that is no longer the primary, or a stale primary's answer. */
static bool route_again(const ps_rpc_req *r, const routed *x, bool safe) {
  if (no_handshake(&r->st)) return true;
  if (x->slot == NULL || x->preset) return false;
  if (r->st.code == PS_UNAVAILABLE)
    return !strstr(r->st.msg, " is lost") && (safe || strcmp(r->method, M_UPDATE) == 0);
  return r->st.code == PS_FAILED_PRECONDITION &&
         (strstr(r->st.msg, "is not the primary") || strstr(r->st.msg, "stale"));
}

static void run_routed(ps_client *c, ps_rpc_req *reqs, const int *shards, size_t n,
                       bool safe) {
  int64_t t0 = mono_ms();
  routed *x = calloc(n + 1, sizeof *x);
  ps_rpc_req *again = calloc(n + 1, sizeof *again);
  size_t *which = calloc(n + 1, sizeof *which);
  if (x == NULL || again == NULL || which == NULL) {
    for (size_t i = 0; i < n; i++)
      ps_status_set(&reqs[i].st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    x[i].slot = route_slot(reqs[i].request);
    x[i].preset = x[i].slot && *x[i].slot != NULL;
    route_one(c, &reqs[i], shards[i], &x[i]);
  }
  ps_rpc_run(reqs, n);
  for (size_t i = 0; i < n; i++)
    count_waits(c, &reqs[i], &x[i].to, 1);
  int64_t backoff = c->opt.retry_initial_ms;
  for (;;) {
    size_t k = 0;
    int64_t oldest = INT64_MAX;
    for (size_t i = 0; i < n; i++)
      if (route_again(&reqs[i], &x[i], safe)) {
        which[k++] = i;
        if (x[i].epoch < oldest) oldest = x[i].epoch;
      }
    int64_t left = t0 + c->opt.rpc_timeout_ms - mono_ms();
    if (k == 0 || left <= 0) break;
    /* the view moves on when the ps tasks have agreed on the failover;
     * a ps that had not learnt the view yet is asked again after a pause */
    ps_cl_view_wait_(c, oldest, backoff < left ? backoff : left);
    backoff = backoff * 2 > c->opt.retry_max_ms ? c->opt.retry_max_ms : backoff * 2;
    for (size_t j = 0; j < k; j++) {
      size_t i = which[j];
      PS_INFO("shard %d: %s sent again by the view after epoch %lld: %s", shards[i],
              ps_cl_method_name_(reqs[i].method), (long long)x[i].epoch, reqs[i].st.msg);
      again[j] = reqs[i];
      again[j].priv_ = NULL;
      ps_status_clear(&again[j].st);
      if (again[j].on_header == on_answer) ((answer *)again[j].user)->seen = false;
      route_one(c, &again[j], shards[i], &x[i]);
    }
    ps_rpc_run(again, k);
    for (size_t j = 0; j < k; j++) {
      size_t i = which[j];
      reqs[i].st = again[j].st;
      reqs[i].ch = again[j].ch;
      reqs[i].silent_since_ns = again[j].silent_since_ns;
      count_waits(c, &again[j], &x[i].to, 1);
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (no_handshake(&reqs[i].st)) {
      const char *m = strrchr(reqs[i].method, '/');
      ps_status_set(&reqs[i].st, PS_DEADLINE_EXCEEDED,
                    "%s: no answer for %g s (--rpc-timeout)", m ? m + 1 : reqs[i].method,
                    (double)reqs[i].stall_timeout_ms / 1000);
    }
    answer_check(&reqs[i]);
    ps_cl_annotate_(c, x[i].to, &reqs[i].st);
    if (x[i].slot && !x[i].preset) *x[i].slot = NULL; /* the caller's message */
  }
out:
  free(x);
  free(again);
  free(which);
}

void ps_cl_req_init_(ps_client *c, ps_rpc_req *r, int task, const char *method,
                     const ProtobufCMessage *msg, bool unary, bool data) {
  memset(r, 0, sizeof *r);
  r->ch = c->ch[task];
  r->method = method;
  r->request = msg;
  r->unary_response = unary;
  r->timeout_ms = data ? c->opt.data_timeout_ms : c->opt.control_timeout_ms;
  /* a ps that stops answering: ps_client_options.rpc_timeout_ms */
  r->stall_timeout_ms = c->opt.rpc_timeout_ms;
  r->probe_method = M_STATUS;
  r->silent_since_ns = &c->silent_since[task];
}

/* One control call with a unary response parsed by @parse. */
int ps_cl_control_call_(ps_client *c, int task, const char *method,
                        const ProtobufCMessage *msg, bool safe, parse_fn parse,
                        void *user, ps_status *st) {
  if (ps_cl_check_task_(c, task, st)) return st->code;
  ps_rpc_req r;
  answer a;
  ps_cl_req_init_(c, &r, task, method, msg, true, false);
  ps_cl_answer_init_(c, task, &r, &a, parse, user, NULL);
  ps_cl_run_reqs_(c, &r, &task, 1, safe);
  if (st) *st = r.st;
  return r.st.code;
}

void ps_cl_init_to_proto_(const ps_init_spec *in, Paramserver__Initializer *p) {
  paramserver__initializer__init(p);
  p->type = (char *)ps_init_type_name(in->type);
  p->value = in->value;
  p->values = (double *)in->values;
  p->n_values = in->nvalues;
  p->minval = in->minval;
  p->maxval = in->maxval;
  p->mean = in->mean;
  p->stddev = in->stddev;
  p->scale = in->scale;
  static const char *const modes[] = {"fan_in", "fan_out", "fan_avg"};
  static const char *const dists[] = {"truncated_normal", "untruncated_normal",
                                      "uniform"};
  p->mode = (char *)modes[in->mode % 3];
  p->distribution = (char *)dists[in->distribution % 3];
  p->seed = in->seed;
}
