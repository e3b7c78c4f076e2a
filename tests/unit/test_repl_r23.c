/* Replication's data plane (ps/repl.h) against the findings of review
 * r23: in one process, 2 real ps servers on loopback ports the kernel
 * picks, as tests/unit/test_repl.c (test_repl_cluster.c). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/view.h"
#include "health.pb-c.h"
#include "test_repl_internal.h"
#include "tests/support/assert.h"

/* ---- tests ---- */

/* How many of @names (NULL-ended) show version @ver in @digest. */
static int at_version(const char *digest, const char *const *names, int ver) {
  int k = 0;
  char want[128];
  for (; *names; names++) {
    snprintf(want, sizeof want, "%s:%d:", *names, ver);
    const char *p = digest;
    while ((p = strstr(p, want)) && p != digest && p[-1] != ';')
      p++;
    k += p != NULL;
  }
  return k;
}

typedef struct bg_adam {
  ps_status st;
  atomic_int done;
} bg_adam;

static void *bg_dense_adam(void *arg) {
  bg_adam *b = arg;
  float g[12];
  for (int k = 0; k < 12; k++)
    g[k] = 0.5f;
  char *slots[2] = {"w/m", "w/v"};
  double hp[6] = {0.9, 0.99, 0.1, 0.9, 0.999, 1e-7};
  Paramserver__Update u, *up = &u;
  rpt_upd_init(&u, "w", PARAMSERVER__UPDATE_OP__APPLY_ADAM, 4, 3);
  u.slots = slots;
  u.n_slots = 2;
  u.hparams = hp;
  u.n_hparams = 6;
  b->st = rpt_update(0, rpt_route(0, 1), 0x77, 1, &up, 1, g, sizeof g);
  atomic_store(&b->done, 1);
  return NULL;
}

/* Review r23 #1: a request's group is never split across Replicate
 * batches, however small the batch limit: with one entry per batch and a
 * backup that takes 250 ms per batch, the backup never shows Adam applied
 * to the variable but not to its slots. */
START_TEST(a_request_is_never_split_across_batches) {
  setenv("PS_TEST_REPL_BATCH_ENTRIES", "1", 1);
  rpt_start(2);
  rpt_set_view(1, 2, rpt_reps2, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  rpt_create(0, 0, "w/m", 4, 3);
  rpt_create(0, 0, "w/v", 4, 3);
  rpt_assert_same(0, 1, 0);
  setenv("PS_TEST_REPLICATE_DELAY_MS", "250", 1);
  bg_adam b = {0};
  pthread_t th;
  pthread_create(&th, NULL, bg_dense_adam, &b);
  const char *names[] = {"w", "w/m", "w/v", NULL};
  int polls = 0;
  while (!atomic_load(&b.done)) {
    char *d = rpt_digest(1, 0);
    int k = at_version(d, names, 2);
    ck_assert_msg(k == 0 || k == 3, "the backup holds half of an update: %s", d);
    free(d);
    polls++;
    rpt_sleep_ms(10);
  }
  pthread_join(th, NULL);
  PS_ASSERT_OK(b.st.code, b.st);
  ck_assert_int_ge(polls, 1);
  rpt_assert_same(0, 1, 0);
  rpt_stop_all();
}
END_TEST

/* Review r23 #4: a batch that passed the backup's fencing check under
 * one view does not apply under the next.  ps/1 is applying ps/0's
 * batch (w += 1; it takes 1 s) when a view makes ps/1 the primary and
 * ps/1 acknowledges its own w += 1: the batch lands first, never on top
 * (w is 3 at version 3 on ps/1, not 2). */
START_TEST(a_batch_checked_under_an_old_view_never_overwrites_the_new) {
  setenv("PS_TEST_RPC_THREADS", "4", 1);
  rpt_start(2);
  rpt_set_view(1, 2, rpt_reps2, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  setenv("PS_TEST_REPLICATE_DELAY_MS", "1000", 1);
  rpt_bg_update b = {.node = 0};
  pthread_t th;
  pthread_create(&th, NULL, rpt_bg_assign_add, &b);
  rpt_sleep_ms(300); /* ps/1 checked the batch and is applying it (1 s) */
  int moved[MAXN][MAXN + 1] = {{1, -1}, {1, -1}};
  rpt_set_view_on(1, 2, 2, moved, NULL, 2);
  ps_status st = rpt_add_ones(1, rpt_route(0, 2), 0, 0, 0);
  PS_ASSERT_OK(st.code, st);
  rpt_wait_for(&b.done, 1);
  pthread_join(th, NULL);
  PS_ASSERT_OK(b.st.code, b.st);
  char *d = rpt_digest(1, 0);
  ck_assert_msg(strstr(d, "w:3:"), "ps/1's own update was overwritten: %s", d);
  free(d);
  rpt_stop_all();
}
END_TEST

typedef struct bg_sync {
  int node;
  int64_t epoch;
  uint64_t cid;
  ps_status st;
  atomic_int done;
} bg_sync;

/* One synchronous (2 replicas to aggregate) w += 1 of local step 0. */
static void *bg_sync_add(void *arg) {
  bg_sync *b = arg;
  b->st = rpt_add_ones(b->node, rpt_route(0, b->epoch), b->cid, 1, 2);
  atomic_store(&b->done, 1);
  return NULL;
}

/* Review r23 #2: a synchronous contribution keeps no dedup record, so its
 * retry on the new primary after a failover accumulates again (it is not
 * answered "OK, already applied" while the step never fills). */
START_TEST(a_retried_sync_contribution_accumulates_on_the_new_primary) {
  setenv("PS_TEST_RPC_THREADS", "4", 1);
  rpt_start(2);
  rpt_set_view(1, 2, rpt_reps2, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  bg_sync a = {.node = 0, .epoch = 1, .cid = 0xa};
  pthread_t ta, tr, tb;
  pthread_create(&ta, NULL, bg_sync_add, &a);
  rpt_sleep_ms(300); /* parked in ps/0's accumulator (what it replicated is on ps/1) */
  ck_assert_int_eq(atomic_load(&a.done), 0);
  int moved[MAXN][MAXN + 1] = {{1, -1}, {1, -1}};
  rpt_set_view_on(1, 2, 2, moved, NULL, 2);
  bg_sync retry = {.node = 1, .epoch = 2, .cid = 0xa};
  pthread_create(&tr, NULL, bg_sync_add, &retry);
  rpt_sleep_ms(300);
  ck_assert_msg(atomic_load(&retry.done) == 0,
                "the retry was answered (%s) before its step was applied", retry.st.msg);
  bg_sync b = {.node = 1, .epoch = 2, .cid = 0xb};
  pthread_create(&tb, NULL, bg_sync_add, &b);
  rpt_wait_for(&b.done, 1);
  rpt_wait_for(&retry.done, 1);
  pthread_join(tb, NULL);
  pthread_join(tr, NULL);
  PS_ASSERT_OK(b.st.code, b.st);
  PS_ASSERT_OK(retry.st.code, retry.st);
  char *d = rpt_digest(1, 0);
  ck_assert_msg(strstr(d, "w:2:"), "the step was not applied on ps/1: %s", d);
  free(d);
  rpt_stop_all();
  pthread_join(ta, NULL);
}
END_TEST

/* w += 1 on node @i as (0xd, @seq). */
static ps_status add_seq(int i, int64_t epoch, uint64_t seq) {
  return rpt_add_ones(i, rpt_route(0, epoch), 0xd, seq, 0);
}

/* Review r23 #5 and #6: seqs are remembered by value, whatever order they
 * arrived in, and a state copy rebuilds the same record on the new
 * backup.  Seq 100, then a late 50, then 300 more: retries of 100 and 50
 * apply nothing, on the primary and, after a copy and a failover, on the
 * new primary; seq 10 (never sent) applies. */
START_TEST(dedup_remembers_seqs_by_value_and_copies_them) {
  rpt_start(2);
  int solo[MAXN][MAXN + 1] = {{0, -1}, {1, -1}};
  rpt_set_view(1, 2, solo, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  ps_status st = add_seq(0, 1, 100);
  PS_ASSERT_OK(st.code, st);
  st = add_seq(0, 1, 50);
  PS_ASSERT_OK(st.code, st);
  for (uint64_t q = 101; q <= 400; q++) {
    st = add_seq(0, 1, q);
    PS_ASSERT_OK(st.code, st);
  }
  char *before = rpt_digest(0, 0);
  ck_assert_msg(strstr(before, "w:303:"), "%s", before);
  for (uint64_t q = 50; q <= 100; q += 50) {
    st = add_seq(0, 1, q);
    PS_ASSERT_OK(st.code, st);
    char *d = rpt_digest(0, 0);
    ck_assert_msg(strcmp(d, before) == 0, "seq %d applied twice: %s", (int)q, d);
    free(d);
  }
  free(before);
  /* a copy to ps/1, then ps/1 takes over */
  int two[MAXN][MAXN + 1] = {{0, 1, -1}, {1, -1}};
  int syncing[MAXN] = {1, -1};
  rpt_set_view_on(1, 2, 2, two, syncing, 1);
  rpt_set_view_on(0, 2, 2, two, syncing, 1);
  rpt_wait_for(&rpt_nsynced, 1);
  rpt_assert_same(0, 1, 0);
  int moved[MAXN][MAXN + 1] = {{1, -1}, {1, -1}};
  rpt_set_view_on(1, 3, 2, moved, NULL, 3);
  before = rpt_digest(1, 0);
  for (uint64_t q = 50; q <= 400; q += 50) {
    st = add_seq(1, 3, q == 350 ? 101 : q);
    PS_ASSERT_OK(st.code, st);
    char *d = rpt_digest(1, 0);
    ck_assert_msg(strcmp(d, before) == 0, "seq %d applied twice on the new primary: %s",
                  (int)q, d);
    free(d);
  }
  free(before);
  st = add_seq(1, 3, 10);
  PS_ASSERT_OK(st.code, st);
  char *d = rpt_digest(1, 0);
  ck_assert_msg(strstr(d, "w:304:"), "%s", d);
  free(d);
  /* far below the window: refused, naming the client and the seq */
  for (uint64_t q = 5000; q <= 5001; q++) {
    st = add_seq(1, 3, q);
    PS_ASSERT_OK(st.code, st);
  }
  st = add_seq(1, 3, 400);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "Update: seq 400 of client 000000000000000d is older than the 4096 "
                   "seqs shard 0 remembers for it (newest 5001)");
  rpt_stop_all();
}
END_TEST

/* Review r23 #3: once a SYNCING backup acknowledged the end of its copy,
 * its acknowledgements are waited for, before a view says it is IN_SYNC
 * (the copy's DONE; membership has not marked it in sync here): an update
 * is answered only when it is on that backup. */
START_TEST(a_caught_up_syncing_backup_is_waited_for) {
  setenv("PS_TEST_RPC_THREADS", "4", 1); /* a Digest is not queued behind a batch */
  rpt_start(2);
  int solo[MAXN][MAXN + 1] = {{0, -1}, {1, -1}};
  rpt_set_view(1, 2, solo, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  int two[MAXN][MAXN + 1] = {{0, 1, -1}, {1, -1}};
  int syncing[MAXN] = {1, -1};
  rpt_set_view_on(1, 2, 2, two, syncing, 1);
  rpt_set_view_on(0, 2, 2, two, syncing, 1);
  rpt_wait_for(&rpt_nsynced, 1);
  setenv("PS_TEST_REPLICATE_DELAY_MS", "300", 1);
  for (int k = 0; k < 2; k++) {
    ps_status st = rpt_add_ones(0, rpt_route(0, 2), 0, 0, 0);
    PS_ASSERT_OK(st.code, st);
    rpt_assert_same(0, 1, 0);
  }
  rpt_stop_all();
}
END_TEST

/* Review r23 #10: a batch being retried (its backup's view is behind)
 * when a view takes its shard from this ps is not re-sent under the new
 * epoch: the healthy backup is not reported failed, and the sender goes
 * on with the shards it still sends to that backup. */
START_TEST(a_lost_shards_inflight_batch_does_not_fail_the_backup) {
  rpt_start(2);
  rpt_set_view(1, 2, rpt_reps2, NULL, 1);
  rpt_create(0, 0, "w", 4, 3);
  rpt_set_view_on(0, 2, 2, rpt_reps2, NULL, 1); /* ps/1 stays at epoch 1 */
  rpt_bg_update b = {.node = 0};
  pthread_t th;
  pthread_create(&th, NULL, rpt_bg_assign_add, &b);
  rpt_sleep_ms(100); /* its batch is retried: ps/1 answers ABORTED */
  ck_assert_int_eq(atomic_load(&b.done), 0);
  int swapped[MAXN][MAXN + 1] = {{1, 0, -1}, {0, 1, -1}};
  rpt_set_view_on(0, 3, 2, swapped, NULL, 3);
  rpt_wait_for(&b.done, 1);
  pthread_join(th, NULL);
  PS_ASSERT_STATUS(b.st.code, b.st, PS_UNAVAILABLE,
                   "ps/0 is no longer the primary of shard 0 (view epoch 3)");
  rpt_set_view_on(1, 3, 2, swapped, NULL, 3);
  rpt_sleep_ms(300); /* the retries (every 20 ms) reach ps/1 at epoch 3 */
  ck_assert_msg(atomic_load(&rpt_nfailed) == 0, "ps/%d reported failed: %s",
                atomic_load(&rpt_failed_task), rpt_failed_reason);
  rpt_create(0, 1, "x", 4, 3); /* shard 1 still reaches ps/1 */
  rpt_assert_same(0, 1, 1);
  rpt_stop_all();
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("repl_r23");
  TCase *t = tcase_create("review r23");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, a_request_is_never_split_across_batches);
  tcase_add_test(t, a_batch_checked_under_an_old_view_never_overwrites_the_new);
  tcase_add_test(t, a_retried_sync_contribution_accumulates_on_the_new_primary);
  tcase_add_test(t, dedup_remembers_seqs_by_value_and_copies_them);
  tcase_add_test(t, a_caught_up_syncing_backup_is_waited_for);
  tcase_add_test(t, a_lost_shards_inflight_batch_does_not_fail_the_backup);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
