/* The decoders of etcd's answers (etcd_decode.h): protobuf-c unpacks the
 * bytes (it bounds every length by the message), then each decoder checks
 * what protobuf cannot: that the answer is about what was asked (the key,
 * the prefix, the lease), that counts and sizes are within common/etcd.h's
 * limits, that revisions are positive and in order, before anything is
 * copied out.  A lying or broken etcd gets an error, never a crash.  No
 * gRPC here: the fuzz target links it with bytes alone. */
#include "etcd_decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.pb-c.h"
#include "log.h"

#define MALFORMED(st, ...) ps_status_set((st), PS_INTERNAL, "malformed " __VA_ARGS__)

static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                                size_t n, const char *what, const char *key,
                                ps_status *st) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, n, p);
  if (m == NULL)
    MALFORMED(st, "%s answer for \"%s\": not a %s message (%zu bytes)", what, key,
              d->name, n);
  return m;
}

/* A header with a non-negative revision; *@rev gets it (may be NULL). */
static int check_header(const Etcdserverpb__ResponseHeader *h, const char *what,
                        const char *key, int64_t *rev, ps_status *st) {
  if (h == NULL) return MALFORMED(st, "%s answer for \"%s\": no header", what, key);
  if (h->revision < 0)
    return MALFORMED(st, "%s answer for \"%s\": revision %lld", what, key,
                     (long long)h->revision);
  if (rev) *rev = h->revision;
  return 0;
}

/* A copy of @b as a string; @b must hold no NUL (keys). */
static char *key_dup(ProtobufCBinaryData b) {
  if (b.len > 0 && memchr(b.data, 0, b.len) != NULL) return NULL;
  char *s = malloc(b.len + 1);
  if (s == NULL) return NULL;
  if (b.len) memcpy(s, b.data, b.len);
  s[b.len] = '\0';
  return s;
}

/* A copy of a value (NUL-terminated after its bytes), within the limit. */
static int val_dup(ProtobufCBinaryData b, const char *key, char **out, ps_status *st) {
  if (b.len > PS_ETCD_MAX_VALUE)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "value of \"%s\" is %zu bytes, over the limit of %u bytes", key,
                         b.len, PS_ETCD_MAX_VALUE);
  char *s = malloc(b.len + 1);
  if (s == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "value of \"%s\": out of memory",
                         key);
  if (b.len) memcpy(s, b.data, b.len);
  s[b.len] = '\0';
  *out = s;
  return 0;
}

static bool key_is(ProtobufCBinaryData b, const char *key) {
  size_t n = strlen(key);
  return b.len == n && (n == 0 || memcmp(b.data, key, n) == 0);
}

static bool key_under(ProtobufCBinaryData b, const char *prefix) {
  size_t n = strlen(prefix);
  return b.len >= n && (n == 0 || memcmp(b.data, prefix, n) == 0);
}

/* A KeyValue of a listing: present, a positive mod_revision. */
static int check_kv(const Etcdserverpb__KeyValue *kv, const char *what, const char *key,
                    ps_status *st) {
  if (kv == NULL)
    return MALFORMED(st, "%s answer for \"%s\": empty key-value", what, key);
  if (kv->mod_revision <= 0 || kv->create_revision < 0 || kv->lease < 0)
    return MALFORMED(st, "%s answer for \"%s\": revision %lld, lease %lld", what, key,
                     (long long)kv->mod_revision, (long long)kv->lease);
  return 0;
}

int ps_etcd_decode_get(const uint8_t *p, size_t n, const char *key, char **val,
                       size_t *len, int64_t *mod_rev, int64_t *rev, ps_status *st) {
  *val = NULL;
  *len = 0;
  *mod_rev = 0;
  Etcdserverpb__RangeResponse *r = (Etcdserverpb__RangeResponse *)unpack(
      &etcdserverpb__range_response__descriptor, p, n, "get", key, st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "get", key, rev, st);
  if (rc == 0 && r->n_kvs > 1)
    rc = MALFORMED(st, "get answer for \"%s\": %zu keys for one", key, r->n_kvs);
  if (rc == 0 && r->n_kvs == 1) {
    const Etcdserverpb__KeyValue *kv = r->kvs[0];
    rc = check_kv(kv, "get", key, st);
    if (rc == 0 && !key_is(kv->key, key))
      rc = MALFORMED(st, "get answer for \"%s\": another key (%zu bytes)", key,
                     kv->key.len);
    if (rc == 0 && r->header->revision < kv->mod_revision)
      rc = MALFORMED(st, "get answer for \"%s\": modified at %lld after the read at %lld",
                     key, (long long)kv->mod_revision, (long long)r->header->revision);
    if (rc == 0 && (rc = val_dup(kv->value, key, val, st)) == 0) {
      *len = kv->value.len;
      *mod_rev = kv->mod_revision;
    }
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

void ps_etcd_kvs_free(ps_etcd_kv *kv, size_t n) {
  if (kv == NULL) return;
  for (size_t i = 0; i < n; i++) {
    free(kv[i].key);
    free(kv[i].val);
  }
  free(kv);
}

static int key_cmp(ProtobufCBinaryData a, ProtobufCBinaryData b) {
  size_t m = a.len < b.len ? a.len : b.len;
  int c = m ? memcmp(a.data, b.data, m) : 0;
  if (c) return c;
  return a.len < b.len ? -1 : a.len > b.len;
}

int ps_etcd_decode_prefix(const uint8_t *p, size_t n, const char *prefix,
                          ps_etcd_kv **out, size_t *nout, int64_t *rev, ps_status *st) {
  *out = NULL;
  *nout = 0;
  Etcdserverpb__RangeResponse *r = (Etcdserverpb__RangeResponse *)unpack(
      &etcdserverpb__range_response__descriptor, p, n, "get_prefix", prefix, st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "get_prefix", prefix, rev, st);
  ps_etcd_kv *kvs = NULL;
  size_t k = 0;
  if (rc == 0 && (r->n_kvs > PS_ETCD_MAX_KEYS || r->more))
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "more than %d keys under \"%s\" (the limit of one listing)",
                       PS_ETCD_MAX_KEYS, prefix);
  if (rc == 0 && r->n_kvs > 0 && (kvs = calloc(r->n_kvs, sizeof *kvs)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "get_prefix \"%s\": out of memory",
                       prefix);
  for (; rc == 0 && k < r->n_kvs; k++) {
    const Etcdserverpb__KeyValue *kv = r->kvs[k];
    if ((rc = check_kv(kv, "get_prefix", prefix, st)) != 0) break;
    if (!key_under(kv->key, prefix)) {
      rc = MALFORMED(st, "get_prefix answer for \"%s\": key %zu is not under it", prefix,
                     k);
      break;
    }
    if (k > 0 && key_cmp(r->kvs[k - 1]->key, kv->key) >= 0) {
      rc = MALFORMED(st, "get_prefix answer for \"%s\": keys out of order at %zu", prefix,
                     k);
      break;
    }
    if (kv->mod_revision > r->header->revision) {
      rc = MALFORMED(st, "get_prefix answer for \"%s\": key %zu modified after the read",
                     prefix, k);
      break;
    }
    if ((kvs[k].key = key_dup(kv->key)) == NULL) {
      rc = MALFORMED(st, "get_prefix answer for \"%s\": key %zu holds a NUL byte", prefix,
                     k);
      break;
    }
    if ((rc = val_dup(kv->value, kvs[k].key, &kvs[k].val, st)) != 0) {
      free(kvs[k].key);
      kvs[k].key = NULL;
      break;
    }
    kvs[k].len = kv->value.len;
    kvs[k].mod_rev = kv->mod_revision;
    kvs[k].lease = kv->lease;
  }
  if (rc == 0) {
    *out = kvs;
    *nout = k;
  } else {
    ps_etcd_kvs_free(kvs, k);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_txn(const uint8_t *p, size_t n, const char *key, bool *ok,
                       int64_t *new_mod_rev, ps_status *st) {
  *ok = false;
  Etcdserverpb__TxnResponse *r = (Etcdserverpb__TxnResponse *)unpack(
      &etcdserverpb__txn_response__descriptor, p, n, "cas", key, st);
  if (r == NULL) return st->code;
  int64_t rev = 0;
  int rc = check_header(r->header, "cas", key, &rev, st);
  if (rc == 0 && r->succeeded) {
    /* the success branch is one Put: its answer, and a revision it made */
    if (r->n_responses != 1 || r->responses[0] == NULL ||
        r->responses[0]->response_case !=
            ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT)
      rc = MALFORMED(st, "cas answer for \"%s\": %zu answers, not one put", key,
                     r->n_responses);
    else if (rev <= 0)
      rc = MALFORMED(st, "cas answer for \"%s\": written at revision %lld", key,
                     (long long)rev);
    else {
      *ok = true;
      if (new_mod_rev) *new_mod_rev = rev;
    }
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_put(const uint8_t *p, size_t n, const char *key, ps_status *st) {
  Etcdserverpb__PutResponse *r = (Etcdserverpb__PutResponse *)unpack(
      &etcdserverpb__put_response__descriptor, p, n, "put", key, st);
  if (r == NULL) return st->code;
  int64_t rev = 0;
  int rc = check_header(r->header, "put", key, &rev, st);
  if (rc == 0 && rev <= 0)
    rc = MALFORMED(st, "put answer for \"%s\": written at revision %lld", key,
                   (long long)rev);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_delete(const uint8_t *p, size_t n, const char *key, ps_status *st) {
  Etcdserverpb__DeleteRangeResponse *r = (Etcdserverpb__DeleteRangeResponse *)unpack(
      &etcdserverpb__delete_range_response__descriptor, p, n, "delete", key, st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "delete", key, NULL, st);
  if (rc == 0 && (r->deleted < 0 || r->deleted > 1))
    rc = MALFORMED(st, "delete answer for \"%s\": %lld keys deleted for one", key,
                   (long long)r->deleted);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_revoke(const uint8_t *p, size_t n, int64_t id, ps_status *st) {
  char what[32];
  snprintf(what, sizeof what, "%lld", (long long)id);
  Etcdserverpb__LeaseRevokeResponse *r = (Etcdserverpb__LeaseRevokeResponse *)unpack(
      &etcdserverpb__lease_revoke_response__descriptor, p, n, "lease revoke", what, st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "lease revoke", what, NULL, st);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_grant(const uint8_t *p, size_t n, int64_t *id, int64_t *ttl,
                         ps_status *st) {
  Etcdserverpb__LeaseGrantResponse *r = (Etcdserverpb__LeaseGrantResponse *)unpack(
      &etcdserverpb__lease_grant_response__descriptor, p, n, "lease grant", "", st);
  if (r == NULL) return st->code;
  int rc = 0;
  if (r->error && r->error[0]) {
    char esc[160];
    ps_log_escape(esc, sizeof esc, r->error, strlen(r->error));
    rc = ps_status_set(st, PS_FAILED_PRECONDITION, "lease grant refused: %s", esc);
  } else if ((rc = check_header(r->header, "lease grant", "", NULL, st)) != 0) {
  } else if (r->id <= 0 || r->ttl <= 0) {
    rc = MALFORMED(st, "lease grant answer: lease %lld with TTL %lld", (long long)r->id,
                   (long long)r->ttl);
  } else {
    *id = r->id;
    *ttl = r->ttl;
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

int ps_etcd_decode_keepalive(const uint8_t *p, size_t n, int64_t id, int64_t *ttl,
                             ps_status *st) {
  char what[32];
  snprintf(what, sizeof what, "%lld", (long long)id);
  Etcdserverpb__LeaseKeepAliveResponse *r =
      (Etcdserverpb__LeaseKeepAliveResponse *)unpack(
          &etcdserverpb__lease_keep_alive_response__descriptor, p, n, "keepalive", what,
          st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "keepalive", what, NULL, st);
  if (rc == 0 && r->id != id)
    rc = MALFORMED(st, "keepalive answer for lease %lld: about lease %lld", (long long)id,
                   (long long)r->id);
  if (rc == 0) *ttl = r->ttl;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

void ps_etcd_watch_msg_free(ps_etcd_watch_msg *m) {
  if (m == NULL) return;
  for (size_t i = 0; i < m->nev; i++) {
    free(m->ev[i].key);
    free(m->ev[i].val);
  }
  free(m->ev);
  m->ev = NULL;
  m->nev = 0;
}

int ps_etcd_decode_watch(const uint8_t *p, size_t n, const char *key, bool prefix,
                         ps_etcd_watch_msg *m, ps_status *st) {
  memset(m, 0, sizeof *m);
  Etcdserverpb__WatchResponse *r = (Etcdserverpb__WatchResponse *)unpack(
      &etcdserverpb__watch_response__descriptor, p, n, "watch", key, st);
  if (r == NULL) return st->code;
  int rc = check_header(r->header, "watch", key, &m->rev, st);
  m->watch_id = r->watch_id;
  m->created = r->created;
  m->canceled = r->canceled;
  m->compact_rev = r->compact_revision;
  if (r->cancel_reason)
    ps_log_escape(m->reason, sizeof m->reason, r->cancel_reason,
                  strlen(r->cancel_reason));
  if (rc == 0 && (r->fragment || r->compact_revision < 0))
    rc = MALFORMED(st, "watch answer for \"%s\": fragment %d, compact revision %lld", key,
                   (int)r->fragment, (long long)r->compact_revision);
  if (rc == 0 && r->n_events > 0 && (r->created || r->canceled))
    rc = MALFORMED(st, "watch answer for \"%s\": events in a %s answer", key,
                   r->created ? "created" : "canceled");
  if (rc == 0 && r->n_events > 0 && (m->ev = calloc(r->n_events, sizeof *m->ev)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "watch of \"%s\": out of memory", key);
  for (size_t i = 0; rc == 0 && i < r->n_events; i++) {
    const Etcdserverpb__Event *e = r->events[i];
    if (e == NULL || e->kv == NULL) {
      rc = MALFORMED(st, "watch answer for \"%s\": event %zu without a key", key, i);
      break;
    }
    if (e->type != ETCDSERVERPB__EVENT__EVENT_TYPE__PUT &&
        e->type != ETCDSERVERPB__EVENT__EVENT_TYPE__DELETE) {
      rc = MALFORMED(st, "watch answer for \"%s\": event %zu of type %d", key, i,
                     (int)e->type);
      break;
    }
    const Etcdserverpb__KeyValue *kv = e->kv;
    if ((rc = check_kv(kv, "watch", key, st)) != 0) break;
    if (prefix ? !key_under(kv->key, key) : !key_is(kv->key, key)) {
      rc = MALFORMED(st, "watch answer for \"%s\": event %zu about another key", key, i);
      break;
    }
    if ((i > 0 && kv->mod_revision < m->ev[i - 1].mod_rev) ||
        kv->mod_revision > r->header->revision) {
      rc = MALFORMED(st,
                     "watch answer for \"%s\": event %zu at revision %lld out of order",
                     key, i, (long long)kv->mod_revision);
      break;
    }
    ps_etcd_event *ev = &m->ev[i];
    if ((ev->key = key_dup(kv->key)) == NULL) {
      rc = MALFORMED(st, "watch answer for \"%s\": event %zu key holds a NUL byte", key,
                     i);
      break;
    }
    m->nev = i + 1; /* owns ev->key from here */
    ev->mod_rev = kv->mod_revision;
    ev->deleted = e->type == ETCDSERVERPB__EVENT__EVENT_TYPE__DELETE;
    if (!ev->deleted && (rc = val_dup(kv->value, ev->key, &ev->val, st)) != 0) break;
    ev->len = ev->deleted ? 0 : kv->value.len;
  }
  if (rc != 0) ps_etcd_watch_msg_free(m);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

size_t ps_etcd_prefix_end(const char *prefix, char *end) {
  size_t n = strlen(prefix);
  memcpy(end, prefix, n + 1);
  while (n > 0) {
    unsigned char c = (unsigned char)end[n - 1];
    if (c < 0xff) {
      end[n - 1] = (char)(c + 1);
      end[n] = '\0';
      return n;
    }
    n--; /* 0xff: drop it and carry */
  }
  end[0] = '\0'; /* every key: range_end "\0" (length 1) */
  return 1;
}
