/* ps_store from many threads at once, without gRPC, so that it can run
 * under ThreadSanitizer (deploy/setup.sh tsan): updates through the
 * snapshot gate (some parked while a snapshot holds it), readers, a
 * snapshotter, creators and listers, and the gate's timer tick.  The
 * results are exact: every update adds 1 to every element of "a" and to
 * "c" under one lock set, so any read or snapshot sees a[i] == c for all
 * i, and at the end a[i] == c == the number of updates. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "tests/support/assert.h"

#define N_UPDATERS 4
#define N_READERS 2
#define N_UPDATES 1500
#define N_ELEMS 64

typedef struct shared {
  ps_store *s;
  atomic_int stop;
  atomic_long applied, snapshots, parked;
} shared;

typedef struct upd {
  shared *sh;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} upd;

static ps_var *lookup(ps_store *s, const char *name) {
  ps_status st;
  ps_var *v = ps_store_find(s, name, &st);
  ck_assert_msg(v != NULL, "%s", st.msg);
  return v;
}

/* One update, entered into the gate (by the updater, or by the thread that
 * reopens the gate when it was parked). */
static void apply(void *arg) {
  upd *u = arg;
  ps_store *s = u->sh->s;
  ps_var *vars[2] = {lookup(s, "c"), lookup(s, "a")};
  ps_store_lock_set(vars, 2, true);
  ps_status st;
  PS_ASSERT_OK(ps_var_make_private(vars[0], &st), st);
  PS_ASSERT_OK(ps_var_make_private(vars[1], &st), st);
  ((int64_t *)vars[0]->buf->data)[0] += 1;
  float *a = vars[1]->buf->data;
  for (int i = 0; i < N_ELEMS; i++)
    a[i] += 1.0f;
  vars[0]->version++;
  vars[1]->version++;
  ps_store_unlock_set(vars, 2);
  ps_store_update_leave(s);
  atomic_fetch_add(&u->sh->applied, 1);
  pthread_mutex_lock(&u->mu);
  u->done = 1;
  pthread_cond_signal(&u->cv);
  pthread_mutex_unlock(&u->mu);
}

static void *updater(void *arg) {
  upd u = {.sh = arg, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  for (int k = 0; k < N_UPDATES; k++) {
    u.done = 0;
    if (ps_store_update_enter(u.sh->s, apply, &u)) {
      apply(&u);
    } else { /* parked: the snapshotter's release runs it */
      atomic_fetch_add(&u.sh->parked, 1);
      pthread_mutex_lock(&u.mu);
      while (!u.done)
        pthread_cond_wait(&u.cv, &u.mu);
      pthread_mutex_unlock(&u.mu);
    }
  }
  return NULL;
}

static void check_consistent(const float *a, int64_t c, const char *what) {
  for (int i = 0; i < N_ELEMS; i++)
    ck_assert_msg(a[i] == (float)c, "%s: a[%d] = %g but c = %lld", what, i, (double)a[i],
                  (long long)c);
}

static void *reader(void *arg) {
  shared *sh = arg;
  float copy[N_ELEMS];
  while (!atomic_load(&sh->stop)) {
    ps_var *vars[2] = {lookup(sh->s, "a"), lookup(sh->s, "c")};
    ps_store_lock_set(vars, 2, false);
    memcpy(copy, vars[0]->buf->data, sizeof copy);
    int64_t c = ((int64_t *)vars[1]->buf->data)[0];
    ps_store_unlock_set(vars, 2);
    check_consistent(copy, c, "read");
    /* the list and the totals walk the table while others create */
    size_t n;
    ps_var **all = ps_store_list(sh->s, &n);
    ck_assert_ptr_nonnull(all);
    free(all);
    int64_t nv, bytes;
    ps_store_totals(sh->s, &nv, &bytes);
  }
  return NULL;
}

static void *snapshotter(void *arg) {
  shared *sh = arg;
  int64_t id = 1;
  while (!atomic_load(&sh->stop)) {
    ps_status st;
    if (ps_store_snapshot_begin(sh->s, id, 60000, true, &st) != 0) {
      ck_assert_msg(st.code == PS_ABORTED, "%s", st.msg);
      continue;
    }
    ps_store_snapshot_release(sh->s, id); /* runs parked updates */
    ps_snapshot *snap = ps_store_snapshot_take(sh->s, id);
    ck_assert_ptr_nonnull(snap);
    const float *a = NULL;
    int64_t c = -1;
    for (size_t i = 0; i < snap->n; i++) {
      if (!strcmp(snap->e[i].name, "a")) a = snap->e[i].buf->data;
      if (!strcmp(snap->e[i].name, "c")) c = ((int64_t *)snap->e[i].buf->data)[0];
    }
    ck_assert(a != NULL && c >= 0);
    check_consistent(a, c, "snapshot");
    ps_snapshot_free(snap);
    atomic_fetch_add(&sh->snapshots, 1);
    id++;
  }
  return NULL;
}

/* Creates variables (some twice, idempotent) and initializes them, and
 * ticks the gate as the daemon's timer does. */
static void *creator(void *arg) {
  shared *sh = arg;
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_ONES);
  ps_shape sh8 = {.rank = 1, .dim = {8}};
  for (int i = 0; !atomic_load(&sh->stop); i++) {
    char name[32];
    snprintf(name, sizeof name, "x%d", i % 400);
    bool created;
    ps_status st;
    PS_ASSERT_OK(ps_store_create_var(sh->s, name, PS_DT_FLOAT, &sh8, &k, NULL, NULL, 0,
                                     &created, &st),
                 st);
    ps_var *v = lookup(sh->s, name);
    ps_store_lock_set(&v, 1, true);
    PS_ASSERT_OK(ps_var_run_initializer(sh->s, v, &st), st);
    ps_store_unlock_set(&v, 1);
    ps_store_gate_tick(sh->s);
  }
  return NULL;
}

START_TEST(updates_reads_and_snapshots_from_many_threads_are_exact) {
  shared sh = {.s = ps_store_create("ps/0")};
  ck_assert_ptr_nonnull(sh.s);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_shape sa = {.rank = 1, .dim = {N_ELEMS}}, sc = {.rank = 0};
  bool created;
  ps_status st;
  PS_ASSERT_OK(
      ps_store_create_var(sh.s, "a", PS_DT_FLOAT, &sa, &z, NULL, NULL, 0, &created, &st),
      st);
  PS_ASSERT_OK(
      ps_store_create_var(sh.s, "c", PS_DT_INT64, &sc, &z, NULL, NULL, 0, &created, &st),
      st);
  ps_var *vars[2] = {lookup(sh.s, "a"), lookup(sh.s, "c")};
  for (int i = 0; i < 2; i++)
    PS_ASSERT_OK(ps_var_run_initializer(sh.s, vars[i], &st), st);
  pthread_t up[N_UPDATERS], rd[N_READERS], sn, cr;
  for (int i = 0; i < N_UPDATERS; i++)
    ck_assert_int_eq(pthread_create(&up[i], NULL, updater, &sh), 0);
  for (int i = 0; i < N_READERS; i++)
    ck_assert_int_eq(pthread_create(&rd[i], NULL, reader, &sh), 0);
  ck_assert_int_eq(pthread_create(&sn, NULL, snapshotter, &sh), 0);
  ck_assert_int_eq(pthread_create(&cr, NULL, creator, &sh), 0);
  for (int i = 0; i < N_UPDATERS; i++)
    pthread_join(up[i], NULL);
  atomic_store(&sh.stop, 1);
  for (int i = 0; i < N_READERS; i++)
    pthread_join(rd[i], NULL);
  pthread_join(sn, NULL);
  pthread_join(cr, NULL);
  ck_assert_int_eq(atomic_load(&sh.applied), N_UPDATERS * N_UPDATES);
  ck_assert_int_eq(((int64_t *)vars[1]->buf->data)[0], N_UPDATERS * N_UPDATES);
  check_consistent(vars[0]->buf->data, N_UPDATERS * N_UPDATES, "final");
  ck_assert_int_gt(atomic_load(&sh.snapshots), 0);
  fprintf(stderr, "%ld snapshots, %ld updates parked by a closed gate\n",
          atomic_load(&sh.snapshots), atomic_load(&sh.parked));
  ps_store_destroy(sh.s);
}
END_TEST

/* The first big buffers of a process, from many threads at once: buffers
 * of 1 MiB and more go back to a cache, which reads its size limit on
 * first use. */
static pthread_barrier_t barrier;

static void *buffers(void *arg) {
  (void)arg;
  pthread_barrier_wait(&barrier);
  for (int k = 0; k < 200; k++) {
    ps_buf *b = ps_buf_create(((size_t)1 << 20) + (size_t)(65536 * (k % 8)), k % 2 == 0);
    ck_assert_ptr_nonnull(b);
    memset(b->data, 1, b->size);
    ps_buf *r = ps_buf_ref(b);
    ps_buf_unref(b);
    ps_buf_unref(r);
  }
  return NULL;
}

START_TEST(first_buffers_from_many_threads) {
  enum { T = 8 };
  pthread_t th[T];
  ck_assert_int_eq(pthread_barrier_init(&barrier, NULL, T), 0);
  for (int i = 0; i < T; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, buffers, NULL), 0);
  for (int i = 0; i < T; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
}
END_TEST

int main(void) {
  Suite *s = suite_create("store_threads");
  TCase *tc = tcase_create("threads");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, updates_reads_and_snapshots_from_many_threads_are_exact);
  tcase_add_test(tc, first_buffers_from_many_threads);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
