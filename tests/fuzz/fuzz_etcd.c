/* Fuzz target for the decoders of etcd's answers (common/etcd_decode.h,
 * common/rpc_etcd_decode.c): etcd is outside input, and a lying or broken
 * one must never crash the client.  Byte 0 picks the decoder (the list in
 * decode_one), the rest is the message.  Besides "no crash, no leak, no
 * UB" it checks what each decoder promises: an error carries a message
 * and leaves nothing allocated; a success is about what was asked (the
 * key, keys under the prefix, sorted; the lease), within the limits,
 * values NUL-terminated after their length, revisions in order.
 *
 * Seeds: corpus_etcd/ (gen_etcd_seeds.py writes them).  Built with
 * -DPS_LIBFUZZER it is a libFuzzer target; otherwise driver.c replays the
 * corpus and PS_FUZZ_RUNS deterministic mutations (see driver.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/etcd_decode.h"
#include "driver.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_etcd: " __VA_ARGS__);                                          \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define VIEW "/paramserver/j/view"
#define PRE "/paramserver/j/"
#define NDECODERS 10

static void expect_error(int rc, const ps_status *st, const char *what) {
  if (rc == 0) return;
  if (st->code != rc || st->msg[0] == '\0')
    FAIL("%s failed (%d) without a status message", what, rc);
}

static void check_value(const char *val, size_t len, const char *what) {
  if (len > PS_ETCD_MAX_VALUE) FAIL("%s: value of %zu bytes", what, len);
  if (val[len] != '\0') FAIL("%s: value not terminated", what);
}

static void decode_one(int which, const uint8_t *p, size_t n) {
  ps_status st = {0};
  int rc;
  switch (which) {
  case 0: { /* a one-key Range */
    char *val = NULL;
    size_t len = 0;
    int64_t mod = -1, rev = -1;
    rc = ps_etcd_decode_get(p, n, VIEW, &val, &len, &mod, &rev, &st);
    expect_error(rc, &st, "get");
    if (rc != 0 && val) FAIL("get: a value after an error");
    if (rc == 0) {
      if ((val == NULL) != (mod == 0))
        FAIL("get: value %p with revision %lld", val, (long long)mod);
      if (val) check_value(val, len, "get");
      if (rev < mod)
        FAIL("get: read at %lld before the change at %lld", (long long)rev,
             (long long)mod);
    }
    free(val);
    break;
  }
  case 1: { /* a prefix Range */
    ps_etcd_kv *kv = NULL;
    size_t k = 99;
    int64_t rev = -1;
    rc = ps_etcd_decode_prefix(p, n, PRE, &kv, &k, &rev, &st);
    expect_error(rc, &st, "get_prefix");
    if (rc != 0 && (kv || k)) FAIL("get_prefix: a listing after an error");
    if (k > PS_ETCD_MAX_KEYS) FAIL("get_prefix: %zu keys", k);
    for (size_t i = 0; i < k; i++) {
      if (strncmp(kv[i].key, PRE, strlen(PRE)) != 0)
        FAIL("get_prefix: key %s", kv[i].key);
      if (i && strcmp(kv[i - 1].key, kv[i].key) >= 0) FAIL("get_prefix: not sorted");
      check_value(kv[i].val, kv[i].len, "get_prefix");
      if (kv[i].mod_rev <= 0 || kv[i].mod_rev > rev || kv[i].lease < 0)
        FAIL("get_prefix: revision %lld", (long long)kv[i].mod_rev);
    }
    ps_etcd_kvs_free(kv, k);
    break;
  }
  case 2: { /* the CAS transaction */
    bool ok = true;
    int64_t mod = 0;
    rc = ps_etcd_decode_txn(p, n, VIEW, &ok, &mod, &st);
    expect_error(rc, &st, "cas");
    if (rc != 0 && ok) FAIL("cas: ok after an error");
    if (ok && mod <= 0) FAIL("cas: written at %lld", (long long)mod);
    break;
  }
  case 3:
    rc = ps_etcd_decode_put(p, n, VIEW, &st);
    expect_error(rc, &st, "put");
    break;
  case 4:
    rc = ps_etcd_decode_delete(p, n, VIEW, &st);
    expect_error(rc, &st, "delete");
    break;
  case 5:
    rc = ps_etcd_decode_revoke(p, n, 7, &st);
    expect_error(rc, &st, "revoke");
    break;
  case 6: {
    int64_t id = 0, ttl = 0;
    rc = ps_etcd_decode_grant(p, n, &id, &ttl, &st);
    expect_error(rc, &st, "grant");
    if (rc == 0 && (id <= 0 || ttl <= 0))
      FAIL("grant: lease %lld TTL %lld", (long long)id, (long long)ttl);
    break;
  }
  case 7: {
    int64_t ttl = 0;
    rc = ps_etcd_decode_keepalive(p, n, 7, &ttl, &st);
    expect_error(rc, &st, "keepalive");
    break;
  }
  default: { /* a watch: of the prefix (8) or of the one key (9) */
    bool prefix = which == 8;
    ps_etcd_watch_msg m;
    rc = ps_etcd_decode_watch(p, n, prefix ? PRE : VIEW, prefix, &m, &st);
    expect_error(rc, &st, "watch");
    if (rc != 0 && (m.ev || m.nev)) FAIL("watch: events after an error");
    if (memchr(m.reason, 0, sizeof m.reason) == NULL)
      FAIL("watch: reason not terminated");
    for (size_t i = 0; i < m.nev; i++) {
      const ps_etcd_event *e = &m.ev[i];
      if (prefix ? strncmp(e->key, PRE, strlen(PRE)) != 0 : strcmp(e->key, VIEW) != 0)
        FAIL("watch: event about %s", e->key);
      if (e->deleted != (e->val == NULL))
        FAIL("watch: a delete with a value or a put without");
      if (e->val) check_value(e->val, e->len, "watch");
      if (e->mod_rev <= 0 || e->mod_rev > m.rev ||
          (i && e->mod_rev < m.ev[i - 1].mod_rev))
        FAIL("watch: event %zu at revision %lld", i, (long long)e->mod_rev);
    }
    ps_etcd_watch_msg_free(&m);
    break;
  }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  decode_one(data[0] % NDECODERS, data + 1, size - 1);
  /* ps_etcd_prefix_end on the bytes as a string */
  char key[64], end[66];
  size_t k = size - 1 < sizeof key - 1 ? size - 1 : sizeof key - 1;
  memcpy(key, data + 1, k);
  key[k] = '\0';
  size_t elen = ps_etcd_prefix_end(key, end);
  size_t kl = strlen(key);
  if (elen > kl + 1 || elen == 0)
    FAIL("prefix end of %zu bytes for a key of %zu", elen, kl);
  return 0;
}

#ifndef PS_LIBFUZZER
size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  /* protobuf pieces: tags of the fields etcd's answers use, varints at
   * their limits, lengths that lie */
  static const uint8_t pieces[][11] = {
      {1, 0x0a},
      {1, 0x12},
      {1, 0x08},
      {1, 0x10},
      {1, 0x18},
      {1, 0x20},
      {1, 0x5a},
      {2, 0x22, 0x00},
      {2, 0x2a, 0x7f},
      {3, 0x12, 0xff, 0x7f},
      {10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
      {2, 0x18, 0x00},
      {5, 0x0a, 0x02, 0x18, 0x01, 0x00}};
  int rounds = 1 + (int)fuzz_rnd(4);
  for (int r = 0; r < rounds && n > 0; r++) {
    size_t pos = 1 + fuzz_rnd(n); /* byte 0 picks the decoder */
    switch (fuzz_rnd(7)) {
    case 0:
      buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1:
    case 2: {
      const uint8_t *t = pieces[fuzz_rnd(sizeof pieces / sizeof pieces[0])];
      n = fuzz_insert(buf, n, cap, pos > n ? n : pos, t + 1, t[0]);
      break;
    }
    case 3:
      if (pos < n) n = fuzz_erase(buf, n, pos);
      break;
    case 4:
      n = fuzz_splice(buf, n, cap, pos > n ? n : pos);
      break;
    case 5:
      n = fuzz_duplicate(buf, n, cap, pos > n ? n : pos, 40);
      break;
    default:
      if (pos < n) n = pos;
      break;
    }
  }
  return n;
}
#endif
