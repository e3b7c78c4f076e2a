/* The etcd client (common/etcd.h) against real etcd processes (Debian's
 * etcd-server, started by tests/support/harness.c on free ports, stopped by
 * pid however a test ends): get/put/delete, CAS won and lost, prefix
 * listings, leases (grant, keeper, on_lost on revoke, expiry deleting a
 * key), watches (events in order; a watched member of a 3-member cluster
 * killed and restarted: no event lost or repeated; compaction), failover
 * past a dead endpoint, and every error a user can reach, by its text. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "common/etcd.h"
#include "harness.h"
#include "paramserver/client.h"
#include "tests/support/assert.h"

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A port bound on 127.0.0.1 but never listening (connections are refused,
 * nothing else can take it) for as long as the returned fd is open. */
static int hold_port(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* ---- what a watch saw ---- */

#define MAX_SEEN 4096
typedef struct seen {
  pthread_mutex_t mu;
  int n, resets;
  char key[MAX_SEEN][48];
  char val[MAX_SEEN][48];
  int64_t rev[MAX_SEEN];
  bool deleted[MAX_SEEN];
} seen;

static seen *seen_new(void) {
  seen *s = calloc(1, sizeof *s);
  ck_assert_ptr_nonnull(s);
  pthread_mutex_init(&s->mu, NULL);
  return s;
}

static void seen_fn(void *arg, const char *key, const char *val, size_t len,
                    int64_t mod_rev, bool deleted) {
  seen *s = arg;
  pthread_mutex_lock(&s->mu);
  if (key == NULL) {
    s->resets++;
  } else if (s->n < MAX_SEEN) {
    snprintf(s->key[s->n], sizeof s->key[0], "%s", key);
    snprintf(s->val[s->n], sizeof s->val[0], "%.*s", (int)(len < 47 ? len : 47),
             val ? val : "");
    s->rev[s->n] = mod_rev;
    s->deleted[s->n] = deleted;
    s->n++;
  }
  pthread_mutex_unlock(&s->mu);
}

static int seen_count(seen *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* Waits until @s saw @n events (@ms at most). */
static bool seen_wait(seen *s, int n, int ms) {
  int64_t end = now_ms() + ms;
  while (seen_count(s) < n && now_ms() < end)
    sleep_ms(5);
  return seen_count(s) >= n;
}

/* ---- errors ---- */

START_TEST(bad_endpoints) {
  ps_status st;
  static const struct {
    const char *eps, *want;
  } cases[] = {
      {"", "no etcd endpoints given"},
      {"127.0.0.1", "bad etcd endpoint \"127.0.0.1\" (endpoint 1 of \"127.0.0.1\")"},
      {"127.0.0.1:0", "bad etcd endpoint \"127.0.0.1:0\""},
      {"127.0.0.1:65536", "expected HOST:PORT with a port of 1 to 65535"},
      {"127.0.0.1:2379,,127.0.0.1:2380", "bad etcd endpoint \"\" (endpoint 2 of"},
      {"host name:2379", "bad etcd endpoint \"host name:2379\""},
      {"127.0.0.1:2379,", "bad etcd endpoint \"\" (endpoint 2 of"},
      {"https://127.0.0.1:2379", "TLS to etcd is not supported"},
      {"a:1,a:2,a:3,a:4,a:5,a:6,a:7,a:8,a:9,a:10,a:11,a:12,a:13,a:14,a:15,a:16,a:17",
       "more than 16 etcd endpoints"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ps_status_clear(&st);
    ps_etcd *e = ps_etcd_connect(cases[i].eps, 1000, &st);
    ck_assert_msg(e == NULL, "\"%s\" accepted", cases[i].eps);
    ck_assert_int_eq(st.code, PS_INVALID_ARGUMENT);
    PS_ASSERT_MSG_HAS(st, cases[i].want);
  }
  ck_assert_ptr_null(ps_etcd_connect("127.0.0.1:2379", 0, &st));
  PS_ASSERT_MSG_HAS(st, "etcd timeout of 0 ms");
  /* what is accepted: http:// dropped, names, IPv6 */
  ps_etcd *e =
      ps_etcd_connect("http://127.0.0.1:2379,localhost:2380,[::1]:2381", 1000, &st);
  ck_assert_msg(e != NULL, "%s", st.msg);
  ck_assert_str_eq(ps_etcd_endpoints(e), "127.0.0.1:2379,localhost:2380,[::1]:2381");
  ps_etcd_close(e);
}
END_TEST

START_TEST(nobody_answers) {
  int p1, p2;
  int f1 = hold_port(&p1), f2 = hold_port(&p2);
  char eps[64], one[32];
  snprintf(one, sizeof one, "127.0.0.1:%d", p1);
  snprintf(eps, sizeof eps, "127.0.0.1:%d,127.0.0.1:%d", p1, p2);
  ps_status st;
  ps_etcd *e = ps_etcd_connect(one, 500, &st);
  ck_assert_msg(e != NULL, "%s", st.msg);
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0, rev = 0;
  int64_t t0 = now_ms();
  PS_ASSERT_STATUS(ps_etcd_get(e, "/k", &val, &len, &mod, &rev, &st), st, PS_UNAVAILABLE,
                   "etcd at 127.0.0.1:");
  int64_t took = now_ms() - t0;
  ck_assert_msg(took >= 450 && took < 3000, "gave up after %lld ms", (long long)took);
  PS_ASSERT_MSG_HAS(st, one);
  PS_ASSERT_MSG_HAS(st, "get \"/k\"");
  bool ok = true;
  PS_ASSERT_STATUS(ps_etcd_cas(e, "/view", "x", 1, 0, 0, &ok, NULL, &st), st,
                   PS_UNAVAILABLE, "cas \"/view\"");
  ck_assert(!ok);
  PS_ASSERT_STATUS(ps_etcd_put(e, "/p", "x", 1, 0, &st), st, PS_UNAVAILABLE, one);
  PS_ASSERT_STATUS(ps_etcd_delete(e, "/d", &st), st, PS_UNAVAILABLE, "delete \"/d\"");
  int64_t id = 0;
  PS_ASSERT_STATUS(ps_etcd_lease_grant(e, 2, &id, NULL, &st), st, PS_UNAVAILABLE,
                   "lease grant");
  PS_ASSERT_STATUS(ps_etcd_lease_revoke(e, 7, &st), st, PS_UNAVAILABLE, "lease revoke 7");
  ps_etcd_kv *kvs = NULL;
  size_t n = 0;
  PS_ASSERT_STATUS(ps_etcd_get_prefix(e, "/pre/", &kvs, &n, NULL, &st), st,
                   PS_UNAVAILABLE, "get_prefix \"/pre/\"");
  ck_assert_ptr_null(ps_etcd_watch_start(e, "/w", false, 0, seen_fn, NULL, &st));
  ck_assert_int_eq(st.code, PS_UNAVAILABLE);
  PS_ASSERT_MSG_HAS(st, one);
  ps_etcd_close(e);
  /* two endpoints: both named */
  e = ps_etcd_connect(eps, 500, &st);
  ck_assert_msg(e != NULL, "%s", st.msg);
  PS_ASSERT_STATUS(ps_etcd_get(e, "/k", &val, &len, &mod, &rev, &st), st, PS_UNAVAILABLE,
                   "no etcd endpoint of");
  PS_ASSERT_MSG_HAS(st, eps);
  ps_etcd_close(e);
  /* argument errors */
  e = ps_etcd_connect(one, 500, &st);
  PS_ASSERT_STATUS(ps_etcd_lease_grant(e, 0, &id, NULL, &st), st, PS_INVALID_ARGUMENT,
                   "lease TTL of 0 s: must be 1 to");
  PS_ASSERT_STATUS(ps_etcd_put(e, "/big", "", (16u << 20) + 1, 0, &st), st,
                   PS_INVALID_ARGUMENT, "value for \"/big\" is 16777217 bytes");
  ck_assert_ptr_null(ps_etcd_keeper_start(e, 0, 2, NULL, NULL, &st));
  PS_ASSERT_MSG_HAS(st, "keeper of lease 0");
  ck_assert_ptr_null(ps_etcd_watch_start(e, "", false, 0, seen_fn, NULL, &st));
  PS_ASSERT_MSG_HAS(st, "watch of \"\"");
  ps_etcd_close(e);
  close(f1);
  close(f2);
}
END_TEST

/* ---- one member ---- */

static ps_harness_etcd single;

static void single_up(void) {
  ck_assert_int_eq(ps_harness_etcd_start(&single, 1), 0);
}
static void single_down(void) {
  ps_harness_etcd_stop(&single);
}

static ps_etcd *client_of(const char *eps) {
  ps_status st;
  ps_etcd *e = ps_etcd_connect(eps, 2000, &st);
  ck_assert_msg(e != NULL, "%s", st.msg);
  return e;
}

START_TEST(kv) {
  ps_etcd *e = client_of(single.endpoints);
  ps_status st;
  char *val = (char *)"junk";
  size_t len = 9;
  int64_t mod = 9, rev = 0, rev2 = 0;
  PS_ASSERT_OK(ps_etcd_get(e, "/t/view", &val, &len, &mod, &rev, &st), st);
  ck_assert_ptr_null(val);
  ck_assert_int_eq(mod, 0);
  ck_assert_int_ge(rev, 1);
  /* CAS: create (expect 0) wins once */
  bool ok = false;
  int64_t m1 = 0, m2 = 0;
  PS_ASSERT_OK(ps_etcd_cas(e, "/t/view", "epoch=1", 7, 0, 0, &ok, &m1, &st), st);
  ck_assert(ok);
  ck_assert_int_gt(m1, rev);
  PS_ASSERT_OK(ps_etcd_cas(e, "/t/view", "epoch=X", 7, 0, 0, &ok, &m2, &st), st);
  ck_assert(!ok);
  PS_ASSERT_OK(ps_etcd_get(e, "/t/view", &val, &len, &mod, &rev2, &st), st);
  ck_assert_str_eq(val, "epoch=1");
  ck_assert_int_eq(len, 7);
  ck_assert_int_eq(mod, m1);
  ck_assert_int_ge(rev2, m1);
  free(val);
  /* on the right mod_revision: wins; on the old one: loses, nothing changed */
  PS_ASSERT_OK(ps_etcd_cas(e, "/t/view", "epoch=2", 7, m1, 0, &ok, &m2, &st), st);
  ck_assert(ok);
  ck_assert_int_gt(m2, m1);
  PS_ASSERT_OK(ps_etcd_cas(e, "/t/view", "epoch=3", 7, m1, 0, &ok, NULL, &st), st);
  ck_assert(!ok);
  PS_ASSERT_OK(ps_etcd_get(e, "/t/view", &val, &len, &mod, NULL, &st), st);
  ck_assert_str_eq(val, "epoch=2");
  ck_assert_int_eq(mod, m2);
  free(val);
  /* binary values keep their bytes */
  static const char bin[5] = {'a', 0, 'b', '\n', (char)0xff};
  PS_ASSERT_OK(ps_etcd_put(e, "/t/bin", bin, sizeof bin, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_get(e, "/t/bin", &val, &len, &mod, NULL, &st), st);
  ck_assert_int_eq(len, 5);
  ck_assert(memcmp(val, bin, 5) == 0 && val[5] == '\0');
  free(val);
  /* delete, and delete of a missing key */
  PS_ASSERT_OK(ps_etcd_delete(e, "/t/bin", &st), st);
  PS_ASSERT_OK(ps_etcd_delete(e, "/t/bin", &st), st);
  PS_ASSERT_OK(ps_etcd_get(e, "/t/bin", &val, &len, &mod, NULL, &st), st);
  ck_assert_ptr_null(val);
  /* prefix: sorted, only under the prefix (not "/t/p" itself nor "/t/q") */
  PS_ASSERT_OK(ps_etcd_put(e, "/t/p/b", "2", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/t/p/a", "1", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/t/p/c/d", "3", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/t/p", "no", 2, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/t/q", "no", 2, 0, &st), st);
  ps_etcd_kv *kvs = NULL;
  size_t n = 0;
  PS_ASSERT_OK(ps_etcd_get_prefix(e, "/t/p/", &kvs, &n, &rev, &st), st);
  ck_assert_int_eq(n, 3);
  ck_assert_str_eq(kvs[0].key, "/t/p/a");
  ck_assert_str_eq(kvs[0].val, "1");
  ck_assert_str_eq(kvs[1].key, "/t/p/b");
  ck_assert_str_eq(kvs[2].key, "/t/p/c/d");
  ck_assert_int_eq(kvs[2].len, 1);
  ck_assert_int_gt(kvs[2].mod_rev, kvs[0].mod_rev);
  ck_assert_int_eq(kvs[0].lease, 0);
  ps_etcd_kvs_free(kvs, n);
  PS_ASSERT_OK(ps_etcd_get_prefix(e, "/none/", &kvs, &n, &rev, &st), st);
  ck_assert_int_eq(n, 0);
  ps_etcd_kvs_free(kvs, n);
  /* a revoke of a lease that does not exist: etcd's NOT_FOUND, named */
  PS_ASSERT_STATUS(ps_etcd_lease_revoke(e, 4242, &st), st, PS_NOT_FOUND,
                   "lease revoke 4242: etcdserver: requested lease not found");
  PS_ASSERT_MSG_HAS(st, single.client[0]);
  /* a put with a lease that does not exist */
  PS_ASSERT_STATUS(ps_etcd_put(e, "/t/l", "x", 1, 4242, &st), st, PS_NOT_FOUND,
                   "put \"/t/l\": etcdserver: requested lease not found");
  ps_etcd_close(e);
}
END_TEST

typedef struct lost {
  atomic_int calls;
  char why[512];
  int64_t at_ms;
} lost;

static void on_lost(void *arg, const char *reason) {
  lost *l = arg;
  snprintf(l->why, sizeof l->why, "%s", reason);
  l->at_ms = now_ms();
  atomic_fetch_add(&l->calls, 1);
}

START_TEST(lease_keeper_and_revoke) {
  ps_etcd *e = client_of(single.endpoints);
  ps_status st;
  int64_t id = 0, ttl = 0;
  PS_ASSERT_OK(ps_etcd_lease_grant(e, 1, &id, &ttl, &st), st);
  ck_assert_int_gt(id, 0);
  ck_assert_int_eq(ttl, 1); /* the harness's etcd allows 1 s */
  PS_ASSERT_OK(ps_etcd_put(e, "/t/task/0", "127.0.0.1:1", 11, id, &st), st);
  static lost l;
  memset(&l, 0, sizeof l);
  ps_etcd_keeper *k = ps_etcd_keeper_start(e, id, ttl, on_lost, &l, &st);
  ck_assert_msg(k != NULL, "%s", st.msg);
  /* three TTLs later the key is still there: the keeper kept it */
  sleep_ms(3000);
  ck_assert_int_eq(atomic_load(&l.calls), 0);
  ps_etcd_kv *kvs = NULL;
  size_t n = 0;
  PS_ASSERT_OK(ps_etcd_get_prefix(e, "/t/task/", &kvs, &n, NULL, &st), st);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(kvs[0].lease, id);
  ps_etcd_kvs_free(kvs, n);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t age =
      ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) - ps_etcd_keeper_last_ok_ns(k);
  ck_assert_msg(age >= 0 && age < 800000000LL, "last keepalive %lld ns ago",
                (long long)age);
  /* revoked: the key goes at once, on_lost runs once naming the lease */
  int64_t t0 = now_ms();
  PS_ASSERT_OK(ps_etcd_lease_revoke(e, id, &st), st);
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  PS_ASSERT_OK(ps_etcd_get(e, "/t/task/0", &val, &len, &mod, NULL, &st), st);
  ck_assert_ptr_null(val);
  while (atomic_load(&l.calls) == 0 && now_ms() - t0 < 3000)
    sleep_ms(5);
  ck_assert_int_eq(atomic_load(&l.calls), 1);
  ck_assert_msg(l.at_ms - t0 < 1000, "on_lost %lld ms after the revoke",
                (long long)(l.at_ms - t0));
  char want[64];
  snprintf(want, sizeof want, "lease %lld is gone", (long long)id);
  ck_assert_msg(strstr(l.why, want) && strstr(l.why, "TTL"), "reason: %s", l.why);
  sleep_ms(500);
  ck_assert_int_eq(atomic_load(&l.calls), 1);
  ps_etcd_keeper_stop(k);
  /* a keeper stopped before the lease goes: on_lost never runs */
  PS_ASSERT_OK(ps_etcd_lease_grant(e, 1, &id, &ttl, &st), st);
  memset(&l, 0, sizeof l);
  k = ps_etcd_keeper_start(e, id, ttl, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  sleep_ms(200);
  ps_etcd_keeper_stop(k);
  PS_ASSERT_OK(ps_etcd_lease_revoke(e, id, &st), st);
  ck_assert_int_eq(atomic_load(&l.calls), 0);
  ps_etcd_close(e);
}
END_TEST

START_TEST(lease_expiry_deletes) {
  ps_etcd *e = client_of(single.endpoints);
  ps_status st;
  int64_t id = 0, ttl = 0;
  PS_ASSERT_OK(ps_etcd_lease_grant(e, 1, &id, &ttl, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/x/task/1", "a", 1, id, &st), st);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/x/task/", true, 0, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  int64_t t0 = now_ms();
  ck_assert_msg(seen_wait(s, 1, 4000), "no event of the lease's expiry");
  int64_t took = now_ms() - t0;
  ck_assert_msg(took >= 800 && took < 2500, "deleted %lld ms after the put",
                (long long)took);
  ck_assert_str_eq(s->key[0], "/x/task/1");
  ck_assert(s->deleted[0]);
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  PS_ASSERT_OK(ps_etcd_get(e, "/x/task/1", &val, &len, &mod, NULL, &st), st);
  ck_assert_ptr_null(val);
  /* the keeper of an expired lease: on_lost at its first keepalive */
  static lost l;
  memset(&l, 0, sizeof l);
  ps_etcd_keeper *k = ps_etcd_keeper_start(e, id, 1, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  t0 = now_ms();
  while (atomic_load(&l.calls) == 0 && now_ms() - t0 < 3000)
    sleep_ms(5);
  ck_assert_int_eq(atomic_load(&l.calls), 1);
  ck_assert_msg(strstr(l.why, "is gone"), "reason: %s", l.why);
  ps_etcd_keeper_stop(k);
  ps_etcd_watch_stop(w);
  free(s);
  ps_etcd_close(e);
}
END_TEST

START_TEST(watch_order) {
  ps_etcd *e = client_of(single.endpoints);
  ps_status st;
  int64_t rev0 = 0;
  PS_ASSERT_OK(ps_etcd_put(e, "/w/before", "old", 3, 0, &st), st);
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  PS_ASSERT_OK(ps_etcd_get(e, "/w/before", &val, &len, &mod, &rev0, &st), st);
  free(val);
  seen *s = seen_new(), *one = seen_new(), *hist = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/w/", true, 0, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_etcd_watch *w1 = ps_etcd_watch_start(e, "/w/a", false, 0, seen_fn, one, &st);
  ck_assert_msg(w1 != NULL, "%s", st.msg);
  /* from a past revision: the history first */
  ps_etcd_watch *wh = ps_etcd_watch_start(e, "/w/", true, mod, seen_fn, hist, &st);
  ck_assert_msg(wh != NULL, "%s", st.msg);
  bool ok = false;
  PS_ASSERT_OK(ps_etcd_put(e, "/w/a", "1", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/w/b", "2", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_delete(e, "/w/a", &st), st);
  PS_ASSERT_OK(ps_etcd_cas(e, "/w/a", "3", 1, 0, 0, &ok, NULL, &st), st);
  ck_assert(ok);
  PS_ASSERT_OK(ps_etcd_put(e, "/wx", "not under /w/", 13, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_put(e, "/w/b", "4", 1, 0, &st), st);
  ck_assert(seen_wait(s, 5, 3000));
  ck_assert(seen_wait(one, 3, 3000));
  ck_assert(seen_wait(hist, 6, 3000));
  sleep_ms(200); /* nothing more comes */
  ck_assert_int_eq(seen_count(s), 5);
  ck_assert_int_eq(seen_count(one), 3);
  ck_assert_int_eq(seen_count(hist), 6);
  static const char *keys[] = {"/w/a", "/w/b", "/w/a", "/w/a", "/w/b"};
  static const char *vals[] = {"1", "2", "", "3", "4"};
  for (int i = 0; i < 5; i++) {
    ck_assert_str_eq(s->key[i], keys[i]);
    ck_assert_str_eq(s->val[i], vals[i]);
    ck_assert(s->deleted[i] == (i == 2));
    if (i) ck_assert_int_gt(s->rev[i], s->rev[i - 1]);
    ck_assert_str_eq(hist->key[i + 1], keys[i]);
    ck_assert_int_eq(hist->rev[i + 1], s->rev[i]);
  }
  ck_assert_int_gt(s->rev[0], rev0);
  ck_assert_str_eq(hist->key[0], "/w/before");
  ck_assert_int_eq(hist->rev[0], mod);
  ck_assert(!one->deleted[0] && one->deleted[1] && !one->deleted[2]);
  ck_assert_str_eq(one->val[2], "3");
  ps_etcd_watch_stop(w);
  ps_etcd_watch_stop(w1);
  ps_etcd_watch_stop(wh);
  ck_assert_int_eq(s->resets + one->resets + hist->resets, 0);
  free(s);
  free(one);
  free(hist);
  ps_etcd_close(e);
}
END_TEST

/* A watch from a compacted revision: key NULL once, then the events from
 * the compaction on. */
START_TEST(watch_compacted) {
  ps_etcd *e = client_of(single.endpoints);
  ps_status st;
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0, first = 0;
  PS_ASSERT_OK(ps_etcd_put(e, "/c/k", "0", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_get(e, "/c/k", &val, &len, &first, NULL, &st), st);
  free(val);
  for (int i = 1; i <= 4; i++)
    PS_ASSERT_OK(ps_etcd_put(e, "/c/k", "x", 1, 0, &st), st);
  PS_ASSERT_OK(ps_etcd_get(e, "/c/k", &val, &len, &mod, NULL, &st), st);
  free(val);
  char cmd[256], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --endpoints=%s compact %lld",
           harness_prog("ETCDCTL", "/usr/bin/etcdctl"), single.endpoints, (long long)mod);
  int rc = harness_run(cmd, &out);
  ck_assert_msg(rc == 0, "%s: %s", cmd, out);
  free(out);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/c/", true, first, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ck_assert(seen_wait(s, 1, 3000));
  ck_assert_int_eq(s->resets, 1);
  ck_assert_int_eq(s->rev[0], mod); /* the compaction revision's event */
  PS_ASSERT_OK(ps_etcd_put(e, "/c/k", "y", 1, 0, &st), st);
  ck_assert(seen_wait(s, 2, 3000));
  ck_assert_str_eq(s->val[1], "y");
  ck_assert_int_gt(s->rev[1], mod);
  ps_etcd_watch_stop(w);
  ck_assert_int_eq(s->resets, 1);
  free(s);
  ps_etcd_close(e);
}
END_TEST

/* The first endpoint dead (a held port): every call, the keeper and the
 * watch go to the second. */
START_TEST(failover_past_dead_endpoint) {
  int port;
  int fd = hold_port(&port);
  char eps[128];
  snprintf(eps, sizeof eps, "127.0.0.1:%d,%s", port, single.endpoints);
  ps_etcd *e = client_of(eps);
  ps_status st;
  int64_t t0 = now_ms();
  PS_ASSERT_OK(ps_etcd_put(e, "/f/a", "1", 1, 0, &st), st);
  ck_assert_msg(now_ms() - t0 < 1500, "failover took %lld ms",
                (long long)(now_ms() - t0));
  int64_t id = 0, ttl = 0;
  PS_ASSERT_OK(ps_etcd_lease_grant(e, 1, &id, &ttl, &st), st);
  static lost l;
  memset(&l, 0, sizeof l);
  ps_etcd *e2 = client_of(eps); /* a fresh client starts on the dead one */
  ps_etcd_keeper *k = ps_etcd_keeper_start(e2, id, ttl, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  seen *s = seen_new();
  ps_etcd *e3 = client_of(eps);
  ps_etcd_watch *w = ps_etcd_watch_start(e3, "/f/", true, 0, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_etcd_put(e, "/f/b", "2", 1, id, &st), st);
  ck_assert(seen_wait(s, 1, 3000));
  sleep_ms(2500); /* > 2 TTLs: the keeper holds the lease through the live one */
  ck_assert_int_eq(atomic_load(&l.calls), 0);
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  PS_ASSERT_OK(ps_etcd_get(e, "/f/b", &val, &len, &mod, NULL, &st), st);
  ck_assert_str_eq(val, "2");
  free(val);
  ps_etcd_keeper_stop(k);
  ps_etcd_watch_stop(w);
  ck_assert_int_eq(seen_count(s), 1);
  free(s);
  ps_etcd_close(e3);
  ps_etcd_close(e2);
  ps_etcd_close(e);
  close(fd);
}
END_TEST

/* ---- three members ---- */

typedef struct writer {
  ps_etcd *e;
  int n, done;
  atomic_int i;
  char err[PS_STATUS_MSG_MAX];
} writer;

static void *write_keys(void *arg) {
  writer *wr = arg;
  for (int i = 0; i < wr->n; i++) {
    char key[32], val[16];
    snprintf(key, sizeof key, "/r/k%04d", i);
    snprintf(val, sizeof val, "%d", i);
    ps_status st;
    /* a put that fails is tried again: each key is written at least once */
    int tries = 0;
    while (ps_etcd_put(wr->e, key, val, strlen(val), 0, &st) != 0) {
      if (++tries == 20) {
        snprintf(wr->err, sizeof wr->err, "%s", st.msg);
        return NULL;
      }
      sleep_ms(50);
    }
    atomic_store(&wr->i, i + 1);
    sleep_ms(5);
  }
  return NULL;
}

START_TEST(watch_through_member_restart) {
  static ps_harness_etcd c;
  ck_assert_int_eq(ps_harness_etcd_start(&c, 3), 0);
  ps_status st;
  /* the watcher starts on member 0 (its first endpoint) */
  ps_etcd *we = client_of(c.endpoints);
  char others[80];
  snprintf(others, sizeof others, "%s,%s", c.client[1], c.client[2]);
  ps_etcd *pe = client_of(others);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(we, "/r/", true, 0, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  static lost l;
  memset(&l, 0, sizeof l);
  int64_t id = 0, ttl = 0;
  PS_ASSERT_OK(ps_etcd_lease_grant(we, 1, &id, &ttl, &st), st);
  ps_etcd_keeper *k = ps_etcd_keeper_start(we, id, ttl, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  static writer wr;
  memset(&wr, 0, sizeof wr);
  wr.e = pe;
  wr.n = 300;
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, write_keys, &wr), 0);
  while (atomic_load(&wr.i) < 60 && !wr.err[0])
    sleep_ms(5);
  ps_harness_etcd_kill(&c, 0); /* the watched member */
  while (atomic_load(&wr.i) < 150 && !wr.err[0])
    sleep_ms(5);
  int rc = ps_harness_etcd_restart(&c, 0);
  /* and later member 1, the watcher's second endpoint */
  while (atomic_load(&wr.i) < 220 && !wr.err[0])
    sleep_ms(5);
  ps_harness_etcd_kill(&c, 1);
  pthread_join(th, NULL);
  ck_assert_msg(wr.err[0] == '\0', "writer: %s", wr.err);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(seen_wait(s, 300, 10000), "saw %d of 300", seen_count(s));
  sleep_ms(300);
  ps_etcd_watch_stop(w);
  /* every key once, in order, revisions increasing (a put retried after
   * an unanswered attempt may have written a key twice: then twice) */
  int n = seen_count(s), next = 0;
  for (int i = 0; i < n; i++) {
    char want[32];
    if (i) ck_assert_int_gt(s->rev[i], s->rev[i - 1]);
    snprintf(want, sizeof want, "/r/k%04d", next);
    if (strcmp(s->key[i], want) == 0) {
      next++;
      continue;
    }
    snprintf(want, sizeof want, "/r/k%04d", next - 1);
    ck_assert_msg(next > 0 && strcmp(s->key[i], want) == 0, "event %d: %s", i, s->key[i]);
  }
  ck_assert_int_eq(next, 300);
  ck_assert_int_eq(s->resets, 0);
  /* the keeper held its lease through both */
  ck_assert_msg(atomic_load(&l.calls) == 0, "lease lost: %s", l.why);
  ps_etcd_keeper_stop(k);
  free(s);
  ps_etcd_close(pe);
  ps_etcd_close(we);
  ck_assert_int_eq(ps_harness_etcd_stop(&c), 0);
}
END_TEST

/* A member that lost its quorum: the keeper's and the watch's streams
 * (sent with "hasleader: true") fail at once with etcd's "no leader"
 * instead of hanging; the keeper reports the lease lost within its TTL,
 * naming it, and the watch says so in the log. */
START_TEST(no_leader) {
  static ps_harness_etcd c;
  ck_assert_int_eq(ps_harness_etcd_start(&c, 3), 0);
  ps_status st;
  ps_etcd *all = client_of(c.endpoints);
  int64_t id = 0, ttl = 0;
  PS_ASSERT_OK(ps_etcd_lease_grant(all, 1, &id, &ttl, &st), st);
  ps_etcd_close(all);
  ps_harness_etcd_kill(&c, 1);
  ps_harness_etcd_kill(&c, 2);
  /* the log of this process, to see the watch's warning */
  char log[300];
  snprintf(log, sizeof log, "%s/test.log", c.h.dir);
  FILE *f = freopen(log, "w", stderr);
  ck_assert_ptr_nonnull(f);
  setvbuf(stderr, NULL, _IONBF, 0);
  ps_etcd *e = client_of(c.client[0]);
  static lost l;
  memset(&l, 0, sizeof l);
  int64_t t0 = now_ms();
  ps_etcd_keeper *k = ps_etcd_keeper_start(e, id, ttl, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/n/", true, 1, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  while (atomic_load(&l.calls) == 0 && now_ms() - t0 < 5000)
    sleep_ms(10);
  ck_assert_int_eq(atomic_load(&l.calls), 1);
  ck_assert_msg(l.at_ms - t0 <= 1500, "on_lost after %lld ms", (long long)(l.at_ms - t0));
  ck_assert_msg(strstr(l.why, "acknowledged for its TTL of 1000 ms") &&
                    strstr(l.why, "etcdserver: no leader") && strstr(l.why, c.client[0]),
                "reason: %s", l.why);
  char *out = NULL, cmd[400], want[128];
  snprintf(want, sizeof want, "etcd at %s: etcdserver: no leader", c.client[0]);
  snprintf(cmd, sizeof cmd, "grep -c 'watch of \"/n/\": %s' '%s'", want, log);
  ck_assert_msg(harness_run(cmd, &out) == 0, "no \"%s\" from the watch in the log", want);
  free(out);
  ps_etcd_watch_stop(w);
  ps_etcd_keeper_stop(k);
  ck_assert_int_eq(seen_count(s), 0);
  free(s);
  ps_etcd_close(e);
  ck_assert_int_eq(ps_harness_etcd_stop(&c), 0);
}
END_TEST

/* A member that hangs (SIGSTOP: its port still accepts, nothing answers):
 * each attempt gets its share of the timeout, so a call still succeeds on
 * the next member within the timeout. */
START_TEST(hung_member) {
  static ps_harness_etcd c;
  ck_assert_int_eq(ps_harness_etcd_start(&c, 3), 0);
  ps_status st;
  ps_etcd *e = NULL;
  ck_assert_ptr_nonnull(e = ps_etcd_connect(c.endpoints, 3000, &st));
  PS_ASSERT_OK(ps_etcd_put(e, "/h/a", "1", 1, 0, &st), st);
  /* the member that answered (member 0, unless it was slow to answer on
   * a busy machine: then a later one), the one the next call starts on */
  int m = 0;
  while (m < 3 && strcmp(c.client[m], ps_etcd_endpoint_in_use(e)) != 0)
    m++;
  ck_assert_int_lt(m, 3);
  ck_assert_int_eq(kill(c.pids[m], SIGSTOP), 0);
  int64_t t0 = now_ms();
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  int rc = ps_etcd_get(e, "/h/a", &val, &len, &mod, NULL, &st);
  int64_t took = now_ms() - t0;
  kill(c.pids[m], SIGCONT);
  ck_assert_msg(rc == 0, "%s", st.msg);
  ck_assert_str_eq(val, "1");
  free(val);
  ck_assert_msg(took >= 900 && took < 3000, "answered after %lld ms", (long long)took);
  /* and the next call starts on the member that answered */
  t0 = now_ms();
  PS_ASSERT_OK(ps_etcd_put(e, "/h/b", "2", 1, 0, &st), st);
  ck_assert_msg(now_ms() - t0 < 900, "second call took %lld ms",
                (long long)(now_ms() - t0));
  ps_etcd_close(e);
  ck_assert_int_eq(ps_harness_etcd_stop(&c), 0);
}
END_TEST

/* Big puts on the watch's own client (one HTTP/2 connection): a progress
 * request then often goes out in the same write as a put's bytes, and its
 * answer comes back before that write has completed.  1.8 MiB is above
 * etcd's request limit (1.5 MiB) and below its gRPC message limit (2 MiB):
 * etcd reads each put whole, then refuses it, so nothing is stored. */
typedef struct loader {
  ps_etcd *e;
  atomic_int stop;
  int refused;
} loader;

static void *loader_main(void *arg) {
  loader *l = arg;
  size_t n = 1800 * 1024;
  char *v = malloc(n);
  if (v == NULL) return NULL;
  memset(v, 'x', n);
  while (!atomic_load(&l->stop)) {
    ps_status st;
    if (ps_etcd_put(l->e, "/big", v, n, 0, &st) != 0 &&
        strstr(st.msg, "request is too large") != NULL)
      l->refused++;
  }
  free(v);
  return NULL;
}

/* A watch whose member hangs (SIGSTOP) for longer than the watch's
 * progress timeout gives the stream up ("watch not answered") and opens
 * another, again and again, until the member is back (SIGCONT); then it
 * goes on, quiet for several progress rounds, without losing or repeating
 * an event, while big puts share its connection.  Every message a given-up or quiet
 * stream received is freed (ASan's LeakSanitizer: a received buffer that nobody
 * destroyed, one per restart, fails this test under build-asan). */
START_TEST(watch_restart_after_hang) {
  ps_status st;
  ps_etcd *e = ps_etcd_connect(single.endpoints, 300, &st);
  ck_assert_msg(e != NULL, "%s", st.msg);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/r/", true, 0, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_etcd_put(e, "/r/a", "1", 1, 0, &st), st);
  ck_assert(seen_wait(s, 1, 5000));
  for (int round = 0; round < 6; round++) {
    /* quiet 300 ms: a progress request; unanswered 300 ms more: given up,
     * a new stream (same member, backing off 50 ms, 100 ms...) */
    ck_assert_int_eq(kill(single.pids[0], SIGSTOP), 0);
    sleep_ms(1500);
    ck_assert_int_eq(kill(single.pids[0], SIGCONT), 0);
    /* back: quiet streams get progress requests answered, some of them
     * before their send completed */
    loader l = {.e = e};
    atomic_init(&l.stop, 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, loader_main, &l), 0);
    sleep_ms(3000);
    atomic_store(&l.stop, 1);
    pthread_join(th, NULL);
    ck_assert_int_gt(l.refused, 0);
    char v[2] = {(char)('2' + round), 0};
    PS_ASSERT_OK(ps_etcd_put(e, "/r/b", v, 1, 0, &st), st);
    ck_assert(seen_wait(s, 2 + round, 5000));
  }
  sleep_ms(200); /* nothing more comes */
  ps_etcd_watch_stop(w);
  ck_assert_int_eq(seen_count(s), 7);
  ck_assert_int_eq(s->resets, 0);
  ck_assert_str_eq(s->key[0], "/r/a");
  for (int i = 1; i < 7; i++) {
    ck_assert_str_eq(s->key[i], "/r/b");
    ck_assert_int_eq(s->val[i][0], '1' + i);
    ck_assert_int_gt(s->rev[i], s->rev[i - 1]);
  }
  free(s);
  ps_etcd_close(e);
}
END_TEST

/* ---- an etcd that lies (hostile_etcd.py) ---- */

typedef struct hostile {
  ps_harness h; /* for harness_spawn alone */
  pid_t pid;
  char ep[32];
} hostile;

static void hostile_start(hostile *x, const char *mode) {
  memset(x, 0, sizeof *x);
  x->h.guard_fd = -1;
  const char *argv[] = {"/usr/bin/python3",
                        harness_prog("HOSTILE_ETCD", "hostile_etcd.py"), mode, NULL};
  int fd = -1;
  x->pid = harness_spawn(&x->h, argv, &fd);
  ck_assert_int_gt(x->pid, 0);
  char line[32] = "";
  FILE *f = fdopen(fd, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_msg(fgets(line, sizeof line, f) != NULL, "hostile_etcd.py %s never listened",
                mode);
  fclose(f);
  snprintf(x->ep, sizeof x->ep, "127.0.0.1:%d", atoi(line));
}

static void hostile_stop(hostile *x) {
  kill(x->pid, SIGKILL);
  waitpid(x->pid, NULL, 0);
}

/* Every lie is refused with an error naming the endpoint and what was
 * wrong; nothing crashes, nothing leaks (ASan). */
START_TEST(lying_etcd) {
  static const struct {
    const char *mode, *call;
    int code;
    const char *want;
  } cases[] = {
      {"get_other_key", "get", PS_INTERNAL,
       "malformed get answer for \"/k\": another key"},
      {"get_two", "get", PS_INTERNAL, "malformed get answer for \"/k\": 2 keys for one"},
      {"get_garbage", "get", PS_INTERNAL,
       "not a etcdserverpb.RangeResponse message (4 bytes)"},
      {"get_no_header", "get", PS_INTERNAL, "malformed get answer for \"/k\": no header"},
      {"prefix_unsorted", "prefix", PS_INTERNAL, "keys out of order at 1"},
      {"txn_no_put", "cas", PS_INTERNAL, "0 answers, not one put"},
      {"grant_zero", "grant", PS_INTERNAL, "lease grant answer: lease 0 with TTL 2"},
      {"grant_error", "grant", PS_FAILED_PRECONDITION,
       "lease grant refused: etcdserver: too many leases"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hostile x;
    hostile_start(&x, cases[i].mode);
    ps_etcd *e = client_of(x.ep);
    ps_status st;
    int rc;
    char *val = NULL;
    size_t len = 0;
    int64_t mod = 0, id = 0;
    bool ok = false;
    ps_etcd_kv *kvs = NULL;
    size_t n = 0;
    if (!strcmp(cases[i].call, "get"))
      rc = ps_etcd_get(e, "/k", &val, &len, &mod, NULL, &st);
    else if (!strcmp(cases[i].call, "prefix"))
      rc = ps_etcd_get_prefix(e, "/paramserver/j/", &kvs, &n, NULL, &st);
    else if (!strcmp(cases[i].call, "cas"))
      rc = ps_etcd_cas(e, "/k", "v", 1, 0, 0, &ok, NULL, &st);
    else
      rc = ps_etcd_lease_grant(e, 2, &id, NULL, &st);
    ck_assert_msg(rc == cases[i].code, "%s: %s (%s)", cases[i].mode,
                  ps_status_code_name(rc), st.msg);
    PS_ASSERT_MSG_HAS(st, cases[i].want);
    char at[48];
    snprintf(at, sizeof at, "etcd at %s: ", x.ep);
    PS_ASSERT_MSG_HAS(st, at);
    ck_assert(val == NULL && kvs == NULL && n == 0 && !ok);
    ps_etcd_close(e);
    hostile_stop(&x);
  }
  /* a keepalive answered for another lease: never taken as acknowledged */
  hostile x;
  hostile_start(&x, "keepalive_other");
  ps_etcd *e = client_of(x.ep);
  static lost l;
  memset(&l, 0, sizeof l);
  ps_status st;
  ps_etcd_keeper *k = ps_etcd_keeper_start(e, 7, 1, on_lost, &l, &st);
  ck_assert_ptr_nonnull(k);
  int64_t t0 = now_ms();
  while (atomic_load(&l.calls) == 0 && now_ms() - t0 < 5000)
    sleep_ms(10);
  ck_assert_int_eq(atomic_load(&l.calls), 1);
  ck_assert_msg(strstr(l.why, "malformed keepalive answer for lease 7: about lease 8"),
                "reason: %s", l.why);
  ps_etcd_keeper_stop(k);
  /* a watch event about another key: never delivered */
  ps_etcd_close(e);
  hostile_stop(&x);
  hostile_start(&x, "watch_other");
  e = client_of(x.ep);
  seen *s = seen_new();
  ps_etcd_watch *w = ps_etcd_watch_start(e, "/paramserver/j/", true, 1, seen_fn, s, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  sleep_ms(1000);
  ps_etcd_watch_stop(w);
  ck_assert_int_eq(seen_count(s), 0);
  free(s);
  ps_etcd_close(e);
  hostile_stop(&x);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("etcd");
  TCase *t = tcase_create("errors");
  tcase_add_test(t, bad_endpoints);
  tcase_add_test(t, nobody_answers);
  tcase_set_timeout(t, 60);
  suite_add_tcase(s, t);
  t = tcase_create("hostile");
  tcase_add_test(t, lying_etcd);
  tcase_set_timeout(t, 120);
  suite_add_tcase(s, t);
  t = tcase_create("single");
  tcase_add_checked_fixture(t, single_up, single_down);
  tcase_add_test(t, kv);
  tcase_add_test(t, lease_keeper_and_revoke);
  tcase_add_test(t, lease_expiry_deletes);
  tcase_add_test(t, watch_order);
  tcase_add_test(t, watch_compacted);
  tcase_add_test(t, failover_past_dead_endpoint);
  tcase_set_timeout(t, 120);
  suite_add_tcase(s, t);
  t = tcase_create("hang");
  tcase_add_checked_fixture(t, single_up, single_down);
  tcase_add_test(t, watch_restart_after_hang);
  tcase_set_timeout(t, 120);
  suite_add_tcase(s, t);
  t = tcase_create("cluster");
  tcase_add_test(t, watch_through_member_restart);
  tcase_add_test(t, no_leader);
  tcase_add_test(t, hung_member);
  tcase_set_timeout(t, 180);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
