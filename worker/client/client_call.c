/* Running calls: each public call builds one ps_rpc_req per ps task it
 * contacts and runs them together, so calls to several ps overlap.  Safe
 * calls are retried on UNAVAILABLE with exponential backoff; updates are
 * not (an assign_add that reached the ps must not be applied twice). */
#include "client_internal.h"

#include <stdatomic.h>
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

static int on_answer(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                     ps_status *st) {
  answer *a = user;
  a->seen = true;
  const uint8_t *q = p, *end = p + n, *val;
  uint64_t field;
  size_t len, count = 0, most = answer_max_entries(a->max_message_bytes);
  while (ps_cl_wire_next_(&q, end, &field, &val, &len) > 0)
    count++;
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
                .addr = c->addrs[task]};
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

void ps_cl_run_reqs_(ps_client *c, ps_rpc_req *reqs, const int *tasks, size_t n,
                     bool safe) {
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
