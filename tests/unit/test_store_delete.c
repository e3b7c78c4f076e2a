/* Unit tests of ps/store's removal of variables, its partition index and
 * the limits of its update gate. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "tests/support/assert.h"

static ps_shape shp(int64_t a, int64_t b) {
  return (ps_shape){.rank = 2, .dim = {a, b}};
}

static int make(ps_store *s, const char *name, const char *full, int64_t rows,
                int64_t off, ps_status *st) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_shape sh = shp(rows, 2), fs = shp(4, 2);
  bool created;
  return ps_store_create_var(s, name, PS_DT_FLOAT, &sh, &z, full, full ? &fs : NULL, off,
                             &created, st);
}

START_TEST(remove_keeps_pointers_valid_and_names_free) {
  ps_store *s = ps_store_create("ps/0");
  ps_status st;
  PS_ASSERT_OK(make(s, "w", NULL, 2, 0, &st), st);
  PS_ASSERT_OK(make(s, "w/Momentum", NULL, 2, 0, &st), st);
  PS_ASSERT_OK(make(s, "w/a/b", NULL, 2, 0, &st), st);
  ps_var *w = ps_store_lookup(s, "w");
  pthread_rwlock_wrlock(&w->lock);
  PS_ASSERT_OK(ps_var_run_initializer(s, w, &st), st);
  pthread_rwlock_unlock(&w->lock);
  int64_t nv, bytes;
  ps_store_totals(s, &nv, &bytes);
  ck_assert_int_eq(bytes, 16);
  /* NOT_FOUND removes nothing */
  char *bad[2] = {"w", "x"};
  ps_var **out;
  size_t n;
  PS_ASSERT_CODE(ps_store_remove(s, bad, 2, PS_REMOVE_SLOTS, &out, &n, NULL, &st), st,
                 PS_NOT_FOUND);
  ck_assert_str_eq(st.msg, "variable x does not exist on ps/0");
  ck_assert_ptr_eq(ps_store_lookup(s, "w"), w);
  bool missing[2];
  PS_ASSERT_OK(ps_store_remove(s, bad, 2, PS_REMOVE_SLOTS | PS_REMOVE_MISSING_OK, &out,
                               &n, missing, &st),
               st);
  ck_assert(!missing[0] && missing[1]);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(out[0]->name, "w");
  ck_assert_str_eq(out[1]->name, "w/Momentum");
  for (size_t i = 0; i < n; i++) {
    pthread_rwlock_wrlock(&out[i]->lock);
    ps_var_mark_deleted(s, out[i]);
    pthread_rwlock_unlock(&out[i]->lock);
  }
  free(out);
  ck_assert_ptr_null(ps_store_lookup(s, "w"));
  ck_assert_ptr_nonnull(ps_store_lookup(s, "w/a/b"));
  /* the old pointer is still a readable, deleted variable */
  pthread_rwlock_rdlock(&w->lock);
  ck_assert(w->deleted);
  ck_assert_ptr_null(w->buf);
  PS_ASSERT_CODE(ps_var_gone(s, w, &st), st, PS_NOT_FOUND);
  pthread_rwlock_unlock(&w->lock);
  ps_store_totals(s, &nv, &bytes);
  ck_assert_int_eq(nv, 1);
  ck_assert_int_eq(bytes, 0);
  /* a value set on a deleted variable is ignored */
  ps_buf *b = ps_buf_create(16, true);
  pthread_rwlock_wrlock(&w->lock);
  ps_var_set_buf(s, w, b, NULL);
  ck_assert_ptr_null(w->buf);
  pthread_rwlock_unlock(&w->lock);
  ps_buf_unref(b);
  /* the name is free again */
  PS_ASSERT_OK(make(s, "w", NULL, 2, 0, &st), st);
  ck_assert_ptr_ne(ps_store_lookup(s, "w"), w);
  ps_store_destroy(s);
}
END_TEST

START_TEST(partition_index_follows_creates_and_removes) {
  ps_store *s = ps_store_create("ps/0");
  ps_status st;
  PS_ASSERT_OK(make(s, "P/part_0", "P", 2, 0, &st), st);
  PS_ASSERT_CODE(make(s, "P", NULL, 4, 0, &st), st, PS_ALREADY_EXISTS);
  PS_ASSERT_CODE(make(s, "P/part_1", "P", 2, 2, &st), st, PS_INVALID_ARGUMENT);
  PS_ASSERT_OK(make(s, "P/part_1", "P", 2, 4, &st), st);
  /* a part whose full name is its own name is a plain variable */
  PS_ASSERT_OK(make(s, "Q", "Q", 4, 0, &st), st);
  PS_ASSERT_CODE(make(s, "Q/part_0", "Q", 2, 0, &st), st, PS_ALREADY_EXISTS);
  char *p[1] = {"P"};
  ps_var **out;
  size_t n;
  PS_ASSERT_OK(ps_store_remove(s, p, 1, 0, &out, &n, NULL, &st), st);
  ck_assert_uint_eq(n, 2);
  for (size_t i = 0; i < n; i++)
    ps_var_mark_deleted(s, out[i]);
  free(out);
  PS_ASSERT_OK(make(s, "P", NULL, 4, 0, &st), st);
  PS_ASSERT_CODE(make(s, "P/part_0", "P", 2, 0, &st), st, PS_ALREADY_EXISTS);
  ps_store_destroy(s);
}
END_TEST

START_TEST(remove_of_many_with_slots) {
  ps_store *s = ps_store_create("ps/0");
  ps_status st;
  enum { N = 20000 };
  char **names = calloc(N, sizeof *names);
  for (int i = 0; i < N; i++) {
    char b[64];
    snprintf(b, sizeof b, "v%d", i);
    names[i] = strdup(b);
    PS_ASSERT_OK(make(s, b, NULL, 1, 0, &st), st);
    snprintf(b, sizeof b, "v%d/Momentum", i);
    PS_ASSERT_OK(make(s, b, NULL, 1, 0, &st), st);
  }
  /* every other name, one given twice and one slot named explicitly too */
  char **del = calloc(N / 2 + 2, sizeof *del);
  for (int i = 0; i < N / 2; i++)
    del[i] = names[2 * i];
  del[N / 2] = names[0];
  del[N / 2 + 1] = "v2/Momentum";
  ps_var **out;
  size_t n;
  PS_ASSERT_OK(ps_store_remove(s, del, N / 2 + 2, PS_REMOVE_SLOTS, &out, &n, NULL, &st),
               st);
  ck_assert_uint_eq(n, N);
  for (size_t i = 1; i < n; i++)
    ck_assert(strcmp(out[i - 1]->name, out[i]->name) < 0);
  free(out);
  int64_t nv, bytes;
  ps_store_totals(s, &nv, &bytes);
  ck_assert_int_eq(nv, N);
  ck_assert_ptr_null(ps_store_lookup(s, "v0/Momentum"));
  ck_assert_ptr_nonnull(ps_store_lookup(s, "v1/Momentum"));
  for (int i = 0; i < N; i++)
    free(names[i]);
  free(names);
  free(del);
  ps_store_destroy(s);
}
END_TEST

START_TEST(snapshot_keeps_partition_info_of_deleted_parts) {
  ps_store *s = ps_store_create("ps/0");
  ps_status st;
  PS_ASSERT_OK(make(s, "P/part_1", "P", 2, 4, &st), st);
  PS_ASSERT_OK(make(s, "w", NULL, 2, 0, &st), st);
  ps_var *p = ps_store_lookup(s, "P/part_1"), *w = ps_store_lookup(s, "w");
  PS_ASSERT_OK(ps_var_run_initializer(s, p, &st), st);
  PS_ASSERT_OK(ps_var_run_initializer(s, w, &st), st);
  PS_ASSERT_OK(ps_store_snapshot_begin(s, 5, 1000, false, &st), st);
  ps_store_snapshot_release(s, 5);
  char *names[1] = {"P"};
  ps_var **out;
  size_t n;
  PS_ASSERT_OK(ps_store_remove(s, names, 1, 0, &out, &n, NULL, &st), st);
  ck_assert_uint_eq(n, 1);
  ps_var_mark_deleted(s, out[0]);
  free(out);
  ps_snapshot *snap = ps_store_snapshot_take(s, 5);
  ck_assert_ptr_nonnull(snap);
  ck_assert_uint_eq(snap->n, 2);
  ck_assert_str_eq(snap->e[0].name, "P/part_1");
  ck_assert_str_eq(snap->e[0].full_name, "P");
  ck_assert_int_eq(snap->e[0].offset, 4);
  ck_assert_int_eq(snap->e[0].full_shape.dim[0], 4);
  ck_assert_ptr_null(snap->e[1].full_name);
  ps_snapshot_free(snap);
  /* a snapshot after the delete does not see the part */
  PS_ASSERT_OK(ps_store_snapshot_begin(s, 6, 1000, false, &st), st);
  ps_store_snapshot_release(s, 6);
  snap = ps_store_snapshot_take(s, 6);
  ck_assert_uint_eq(snap->n, 1);
  ps_snapshot_free(snap);
  ps_store_destroy(s);
}
END_TEST

static int ran;
static void count_run(void *arg) {
  (void)arg;
  ran++;
}

START_TEST(gate_limits) {
  ps_store *s = ps_store_create("ps/0");
  ps_status st;
  ps_store_set_gate_limits(s, 0, 100);
  /* hold clamped to 0 ms: the gate reopens at the next tick */
  PS_ASSERT_OK(ps_store_snapshot_begin(s, 1, 1000000000000LL, false, &st), st);
  bool parked;
  ran = 0;
  PS_ASSERT_OK(ps_store_update_admit(s, count_run, NULL, 10, &parked, &st), st);
  ck_assert(!parked); /* expired: reopened on entry */
  ps_store_update_leave(s);
  ps_snapshot_free(ps_store_snapshot_take(s, 1));
  ps_store_set_gate_limits(s, 60000, 100);
  PS_ASSERT_OK(ps_store_snapshot_begin(s, 2, 60000, false, &st), st);
  PS_ASSERT_OK(ps_store_update_admit(s, count_run, NULL, 60, &parked, &st), st);
  ck_assert(parked);
  PS_ASSERT_CODE(ps_store_update_admit(s, count_run, NULL, 60, &parked, &st), st,
                 PS_RESOURCE_EXHAUSTED);
  ck_assert_str_eq(st.msg,
                   "ps/0: updates waiting for snapshot 2 to end hold 60 bytes; this "
                   "one (60 bytes) would pass the limit of 100 bytes "
                   "(--max-tensor-bytes); try again");
  PS_ASSERT_OK(ps_store_update_admit(s, count_run, NULL, 40, &parked, &st), st);
  ck_assert(parked);
  ps_store_snapshot_release(s, 2);
  ck_assert_int_eq(ran, 2);
  ps_store_update_leave(s);
  ps_store_update_leave(s);
  /* open again: the count starts over */
  PS_ASSERT_OK(ps_store_update_admit(s, count_run, NULL, 60, &parked, &st), st);
  ck_assert(!parked);
  ps_store_update_leave(s);
  ps_snapshot_free(ps_store_snapshot_take(s, 2));
  ps_store_destroy(s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("store_delete");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, remove_keeps_pointers_valid_and_names_free);
  tcase_add_test(tc, partition_index_follows_creates_and_removes);
  tcase_add_test(tc, gate_limits);
  tcase_add_test(tc, remove_of_many_with_slots);
  tcase_add_test(tc, snapshot_keeps_partition_info_of_deleted_parts);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
