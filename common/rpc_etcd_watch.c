/* Watches (ps_etcd_watch_*, common/etcd.h): a thread per watch, one Watch
 * stream at a time with one watcher on it, "hasleader: true" (a member
 * that loses its quorum ends the stream rather than going silent).
 *
 * No event lost or repeated.  The watch always knows the next revision it
 * needs (@next): the start revision, or, for "from now", the store's
 * revision read before the first stream plus one.  Each stream is created
 * from @next; after delivering a response's events @next becomes the last
 * one's revision plus one (etcd never splits a revision across responses
 * unless asked to fragment, which we do not).  Events below @next (a
 * member replaying what another already sent) are dropped.  So when a
 * stream ends (its member killed, restarted, or without a leader), the
 * next one, on the next endpoint, starts exactly where the last left off.
 *
 * Liveness.  A stream quiet for the client's timeout gets a progress
 * request; if nothing at all comes back within another timeout the member
 * is taken as hung and the watch moves on.  Failed attempts back off from
 * 50 ms to 1 s.
 *
 * Compaction.  If @next was compacted away, etcd cancels the watcher with
 * the compaction revision C: @fn gets key NULL once (the caller re-reads),
 * and the watch goes on from C, the oldest revision etcd still has: a
 * re-read that runs inside @fn or later misses nothing after it. */
#include "rpc_etcd_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.pb-c.h"
#include "etcd_decode.h"
#include "log.h"

#define WATCH_METHOD "/etcdserverpb.Watch/Watch"

struct ps_etcd_watch {
  ps_etcd *e;
  char *key;
  char *end; /* range_end of a prefix watch */
  size_t end_len;
  bool prefix;
  ps_etcd_watch_fn fn;
  void *arg;
  int64_t next; /* the revision to watch from */
  atomic_int stop;
  pthread_t th;
};

/* Sends the create request for @w on @s. */
static int create(ps_etcd_watch *w, ps_etcd_stream *s, ps_status *st) {
  Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
  cr.key = (ProtobufCBinaryData){strlen(w->key), (uint8_t *)w->key};
  if (w->prefix) {
    cr.range_end = (ProtobufCBinaryData){w->end_len, (uint8_t *)w->end};
    if (cr.key.len == 0) cr.key = (ProtobufCBinaryData){1, (uint8_t *)""};
  }
  cr.start_revision = w->next;
  Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
  req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
  req.create_request = &cr;
  return ps_etcd_stream_send_(s, &req.base, w->e->timeout_ms, st);
}

static int progress(ps_etcd_watch *w, ps_etcd_stream *s, ps_status *st) {
  Etcdserverpb__WatchProgressRequest pr = ETCDSERVERPB__WATCH_PROGRESS_REQUEST__INIT;
  Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
  req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST;
  req.progress_request = &pr;
  return ps_etcd_stream_send_(s, &req.base, w->e->timeout_ms, st);
}

/* One stream on endpoint @ep until it fails (returns -1 with @st), is
 * cancelled by compaction (0: reopen at once) or the watch stops (0). */
static int run_stream(ps_etcd_watch *w, int ep, bool *healthy, ps_status *st) {
  ps_etcd *e = w->e;
  ps_etcd_stream *s = ps_etcd_stream_open_(e, ep, WATCH_METHOD, st);
  if (s == NULL) return -1;
  int rc = create(w, s, st);
  bool created = false;
  int64_t watch_id = -1, last_rx = ps_etcd_now_ms_(), asked = 0;
  while (rc == 0 && !atomic_load(&w->stop)) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int r = ps_etcd_stream_recv_(s, 100, &buf, &len, st);
    int64_t now = ps_etcd_now_ms_();
    if (r < 0) {
      rc = -1;
      break;
    }
    if (r == 0) {
      if (asked ? now - asked > e->timeout_ms : now - last_rx > e->timeout_ms) {
        if (!created || asked) {
          rc = ps_status_set(st, PS_UNAVAILABLE,
                             "etcd at %s: watch not answered in %lld ms", e->ep[ep],
                             (long long)e->timeout_ms);
          break;
        }
        rc = progress(w, s, st);
        asked = now;
      }
      continue;
    }
    last_rx = now;
    asked = 0;
    ps_etcd_watch_msg m;
    rc = ps_etcd_decode_watch(buf, len, w->key, w->prefix, &m, st);
    free(buf);
    if (rc != 0) {
      ps_status_prefix(st, "etcd at %s", e->ep[ep]);
      break;
    }
    if (m.created) {
      if (created || m.watch_id < 0)
        rc = ps_status_set(st, PS_INTERNAL,
                           "etcd at %s: malformed watch answer: created "
                           "twice or watch id %lld",
                           e->ep[ep], (long long)m.watch_id);
      created = true;
      watch_id = m.watch_id;
      *healthy = true;
    } else if (!created) {
      rc = ps_status_set(
          st, PS_INTERNAL,
          "etcd at %s: malformed watch answer: before the watch was created", e->ep[ep]);
    } else if (m.canceled && m.watch_id == watch_id) {
      if (m.compact_rev > 0 && m.compact_rev > w->next) {
        PS_WARN("etcd watch of \"%s\": revision %lld was compacted; the watch goes on "
                "from %lld (the caller re-reads)",
                w->key, (long long)w->next, (long long)m.compact_rev);
        w->fn(w->arg, NULL, NULL, 0, 0, false);
        w->next = m.compact_rev;
        ps_etcd_watch_msg_free(&m);
        break; /* rc 0: a new stream from there */
      }
      rc = ps_status_set(st, PS_UNAVAILABLE, "etcd at %s: watch cancelled: %s", e->ep[ep],
                         m.reason[0] ? m.reason : "no reason given");
    } else if (m.watch_id == watch_id) {
      for (size_t i = 0; i < m.nev && !atomic_load(&w->stop); i++) {
        ps_etcd_event *ev = &m.ev[i];
        if (ev->mod_rev < w->next) continue; /* delivered already */
        w->fn(w->arg, ev->key, ev->val, ev->len, ev->mod_rev, ev->deleted);
        /* all of a revision comes in one answer: the next starts after it */
        if (i + 1 == m.nev || m.ev[i + 1].mod_rev != ev->mod_rev)
          w->next = ev->mod_rev + 1;
      }
    } /* else a progress answer (watch id -1): the stream is alive */
    ps_etcd_watch_msg_free(&m);
  }
  ps_etcd_stream_close_(s);
  return rc;
}

static void *watch_main(void *arg) {
  ps_etcd_watch *w = arg;
  ps_etcd *e = w->e;
  int ep = atomic_load(&e->cur) % e->n;
  int64_t backoff = 50;
  char last[PS_STATUS_MSG_MAX] = "";
  while (!atomic_load(&w->stop)) {
    ps_status st = {0};
    bool healthy = false;
    int rc = run_stream(w, ep, &healthy, &st);
    if (atomic_load(&w->stop)) break;
    if (rc == 0) continue;
    if (healthy) backoff = 50;
    if (strcmp(st.msg, last) != 0)
      PS_WARN("etcd watch of \"%s\": %s; again from revision %lld on %s", w->key, st.msg,
              (long long)w->next, e->ep[(ep + 1) % e->n]);
    snprintf(last, sizeof last, "%s", st.msg);
    ep = (ep + 1) % e->n;
    ps_etcd_sleep_ms_(backoff, &w->stop);
    backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
  }
  return NULL;
}

ps_etcd_watch *ps_etcd_watch_start(ps_etcd *e, const char *key, bool prefix,
                                   int64_t start_rev, ps_etcd_watch_fn fn, void *arg,
                                   ps_status *st) {
  if (fn == NULL || start_rev < 0 || (!prefix && key[0] == '\0')) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "watch of \"%.200s\" from revision %lld%s",
                  key, (long long)start_rev, fn ? "" : " without a function");
    return NULL;
  }
  ps_etcd_watch *w = calloc(1, sizeof *w);
  if (w == NULL || (w->key = strdup(key)) == NULL ||
      (w->end = malloc(strlen(key) + 2)) == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "watch of \"%.200s\": out of memory", key);
    goto fail;
  }
  w->end_len = ps_etcd_prefix_end(key, w->end);
  w->e = e;
  w->prefix = prefix;
  w->fn = fn;
  w->arg = arg;
  w->next = start_rev;
  atomic_init(&w->stop, 0);
  if (start_rev == 0) { /* "from now": the revision after the current one */
    int64_t rev = 0;
    if (ps_etcd_revision_(e, key, &rev, st) != 0) goto fail;
    w->next = rev + 1;
  }
  int rc = pthread_create(&w->th, NULL, watch_main, w);
  if (rc != 0) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "watch of \"%.200s\": no thread: %s", key,
                  strerror(rc));
    goto fail;
  }
  return w;
fail:
  if (w) {
    free(w->key);
    free(w->end);
    free(w);
  }
  return NULL;
}

void ps_etcd_watch_stop(ps_etcd_watch *w) {
  if (w == NULL) return;
  atomic_store(&w->stop, 1);
  pthread_join(w->th, NULL);
  free(w->key);
  free(w->end);
  free(w);
}
