/* Unit tests of ps/store: the variable table, copy on write, accounting. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "store.h"
#include "tests/support/assert.h"

static ps_shape shape2(int64_t a, int64_t b) {
  ps_shape s = {.rank = 2, .dim = {a, b}};
  return s;
}

START_TEST(create_is_idempotent_and_conflicts_are_named) {
  ps_store *s = ps_store_create("ps/3");
  ps_shape sh = shape2(2, 3);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  bool created;
  ps_status st;
  PS_ASSERT_OK(
      ps_store_create_var(s, "w", PS_DT_FLOAT, &sh, &z, NULL, NULL, 0, &created, &st),
      st);
  ck_assert(created);
  PS_ASSERT_OK(
      ps_store_create_var(s, "w", PS_DT_FLOAT, &sh, &z, NULL, NULL, 0, &created, &st),
      st);
  ck_assert(!created);
  ps_shape other = shape2(3, 2);
  PS_ASSERT_CODE(
      ps_store_create_var(s, "w", PS_DT_FLOAT, &other, &z, NULL, NULL, 0, &created, &st),
      st, PS_ALREADY_EXISTS);
  ck_assert_str_eq(st.msg,
                   "variable w already exists on ps/3 with dtype float shape [2,3]; "
                   "requested dtype float shape [3,2]");
  /* another initializer: shared by name, as TensorFlow's (it was refused) */
  ps_init_spec o;
  ps_init_spec_default(&o, PS_INIT_ONES);
  PS_ASSERT_OK(
      ps_store_create_var(s, "w", PS_DT_FLOAT, &sh, &o, NULL, NULL, 0, &created, &st),
      st);
  ck_assert(!created);
  /* the same name as another part of a partitioned variable */
  ps_shape full = shape2(4, 3);
  PS_ASSERT_OK(ps_store_create_var(s, "p/part_0", PS_DT_FLOAT, &sh, &z, "p", &full, 0,
                                   &created, &st),
               st);
  PS_ASSERT_CODE(ps_store_create_var(s, "p/part_0", PS_DT_FLOAT, &sh, &z, "p", &full, 6,
                                     &created, &st),
                 st, PS_ALREADY_EXISTS);
  ck_assert_str_eq(st.msg, "variable p/part_0 already exists on ps/3 as a part of p at "
                           "offset 0; requested a part of p at offset 6");
  PS_ASSERT_CODE(
      ps_store_create_var(s, "", PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0, &created, &st),
      st, PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(
      ps_store_create_var(s, "x", PS_DT_STRING, &sh, NULL, NULL, NULL, 0, &created, &st),
      st, PS_INVALID_ARGUMENT);
  ck_assert_ptr_null(ps_store_find(s, "nope", &st));
  ck_assert_str_eq(st.msg, "variable nope does not exist on ps/3");
  ps_store_destroy(s);
}
END_TEST

START_TEST(many_variables_listed_in_name_order) {
  ps_store *s = ps_store_create("ps/0");
  ps_shape sh = {.rank = 1, .dim = {4}};
  char name[32];
  bool created;
  for (int i = 5000; i > 0; i--) { /* forces the table to grow */
    snprintf(name, sizeof name, "v%05d", i);
    ck_assert_int_eq(ps_store_create_var(s, name, PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0,
                                         &created, NULL),
                     0);
  }
  size_t n;
  ps_var **all = ps_store_list(s, &n);
  ck_assert_uint_eq(n, 5000);
  ck_assert_str_eq(all[0]->name, "v00001");
  ck_assert_str_eq(all[4999]->name, "v05000");
  free(all);
  ck_assert_ptr_nonnull(ps_store_lookup(s, "v02500"));
  ps_store_destroy(s);
}
END_TEST

START_TEST(initializer_accounting_and_copy_on_write) {
  ps_store *s = ps_store_create("ps/0");
  ps_shape sh = shape2(2, 3);
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_CONSTANT);
  k.value = 2.0;
  bool created;
  ps_status st;
  PS_ASSERT_OK(
      ps_store_create_var(s, "w", PS_DT_FLOAT, &sh, &k, NULL, NULL, 0, &created, &st),
      st);
  ps_var *v = ps_store_lookup(s, "w");
  ck_assert_ptr_null(v->buf);
  PS_ASSERT_OK(ps_var_run_initializer(s, v, &st), st);
  ck_assert_ptr_nonnull(v->buf);
  ck_assert(((float *)v->buf->data)[5] == 2.0f);
  int64_t nv, bytes;
  ps_store_totals(s, &nv, &bytes);
  ck_assert_int_eq(nv, 1);
  ck_assert_int_eq(bytes, 24);
  /* A reader holds the buffer: an in-place writer must copy first. */
  ps_buf *reader = ps_buf_ref(v->buf);
  PS_ASSERT_OK(ps_var_make_private(v, &st), st);
  ck_assert_ptr_ne(v->buf, reader);
  ((float *)v->buf->data)[0] = 9.0f;
  ck_assert(((float *)reader->data)[0] == 2.0f);
  ps_buf_unref(reader);
  ps_buf *mine = v->buf;
  PS_ASSERT_OK(ps_var_make_private(v, &st), st);
  ck_assert_ptr_eq(v->buf, mine); /* sole owner: no copy */
  /* Replacing the value accounts the size difference. */
  ps_buf *nb = ps_buf_create(40, true);
  ps_shape s10 = {.rank = 1, .dim = {10}};
  ps_var_set_buf(s, v, nb, &s10);
  ps_buf_unref(nb);
  ps_store_totals(s, &nv, &bytes);
  ck_assert_int_eq(bytes, 40);
  ck_assert_int_eq(v->shape.dim[0], 10);
  /* No initializer: a clear error. */
  PS_ASSERT_OK(
      ps_store_create_var(s, "u", PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0, &created, &st),
      st);
  PS_ASSERT_STATUS(ps_var_run_initializer(s, ps_store_lookup(s, "u"), &st), st,
                   PS_FAILED_PRECONDITION, "variable u has no initializer on ps/0");
  ps_store_destroy(s);
}
END_TEST

/* A Saver's snapshot: only the selected variables, with their keys; an
 * uninitialized variable outside the selection is no obstacle; a selected
 * name that does not exist is NOT_FOUND naming it, and the gate reopens. */
START_TEST(a_selected_snapshot_takes_only_its_variables) {
  ps_store *s = ps_store_create("ps/0");
  ps_shape sh = shape2(2, 3);
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_ZEROS);
  bool created;
  ps_status st;
  const char *names[] = {"b", "a", "c"};
  for (int i = 0; i < 3; i++)
    PS_ASSERT_OK(ps_store_create_var(s, names[i], PS_DT_FLOAT, &sh, &k, NULL, NULL, 0,
                                     &created, &st),
                 st);
  PS_ASSERT_OK(ps_var_run_initializer(s, ps_store_lookup(s, "a"), &st), st);
  PS_ASSERT_OK(ps_var_run_initializer(s, ps_store_lookup(s, "b"), &st), st);
  /* c stays uninitialized */
  const char *sel_names[] = {"b", "a"}, *sel_keys[] = {"renamed_b", ""};
  ps_snapshot_select sel = {sel_names, sel_keys, 2};
  PS_ASSERT_OK(ps_store_snapshot_begin_sel(s, 1, 1000, false, &sel, &st), st);
  ps_store_snapshot_release(s, 1);
  ps_snapshot *snap = ps_store_snapshot_take(s, 1);
  ck_assert_ptr_nonnull(snap);
  ck_assert_uint_eq(snap->n, 2);
  ck_assert_str_eq(snap->e[0].name, "a");
  ck_assert_ptr_null(snap->e[0].key);
  ck_assert_str_eq(snap->e[1].name, "b");
  ck_assert_str_eq(snap->e[1].key, "renamed_b");
  ps_snapshot_free(snap);
  const char *missing[] = {"a", "nope"};
  ps_snapshot_select bad = {missing, NULL, 2};
  PS_ASSERT_CODE(ps_store_snapshot_begin_sel(s, 2, 1000, false, &bad, &st), st,
                 PS_NOT_FOUND);
  ck_assert_str_eq(st.msg, "variable nope does not exist on ps/0");
  ck_assert(ps_store_update_enter(s, NULL, NULL)); /* the gate is open again */
  ps_store_update_leave(s);
  ck_assert_ptr_null(ps_store_snapshot_take(s, 2));
  ps_store_destroy(s);
}
END_TEST

START_TEST(lock_set_tolerates_duplicates) {
  ps_store *s = ps_store_create("ps/0");
  ps_shape sh = {.rank = 0};
  bool created;
  ps_store_create_var(s, "b", PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0, &created, NULL);
  ps_store_create_var(s, "a", PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0, &created, NULL);
  ps_var *vars[3] = {ps_store_lookup(s, "b"), ps_store_lookup(s, "a"),
                     ps_store_lookup(s, "b")};
  ps_store_lock_set(vars, 3, true);
  ck_assert_int_ne(pthread_rwlock_trywrlock(&vars[0]->lock), 0);
  ps_store_unlock_set(vars, 3);
  ck_assert_int_eq(pthread_rwlock_trywrlock(&vars[0]->lock), 0);
  pthread_rwlock_unlock(&vars[0]->lock);
  ps_store_destroy(s);
}
END_TEST

/* ASan's and TSan's malloc abort instead of failing */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define LOCK_SET_OOM_TEST 1
#endif
#ifdef LOCK_SET_OOM_TEST
/* With no memory for a sorted copy of a large lock set, the set is still
 * locked, each variable once, and unlocked again (the ps used to abort). */
START_TEST(lock_set_without_memory_to_sort) {
  ps_store *s = ps_store_create("ps/0");
  ps_shape sh = {.rank = 0};
  bool created;
  const char *names[3] = {"c", "a", "b"};
  ps_var *v[3];
  for (int i = 0; i < 3; i++) {
    ps_store_create_var(s, names[i], PS_DT_FLOAT, &sh, NULL, NULL, NULL, 0, &created,
                        NULL);
    v[i] = ps_store_lookup(s, names[i]);
  }
  const size_t n = (size_t)1 << 21; /* a 16 MiB copy */
  ps_var **vars = malloc(n * sizeof *vars);
  ck_assert_ptr_nonnull(vars);
  for (size_t i = 0; i < n; i++)
    vars[i] = v[i % 3];
  /* the address space this process has now, and 1 MiB more */
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  ck_assert(f && fscanf(f, "%lu", &pages) == 1);
  fclose(f);
  rlim_t lim = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (1 << 20);
  struct rlimit rl = {lim, lim};
  ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
  void *copy = malloc(n * sizeof *vars);
  ck_assert_msg(copy == NULL, "the limit left room for the copy");
  ck_assert(!ps_store_lock_set(vars, n, true)); /* they repeat */
  for (int i = 0; i < 3; i++)
    ck_assert_int_ne(pthread_rwlock_trywrlock(&v[i]->lock), 0);
  ps_store_unlock_set(vars, n);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(pthread_rwlock_trywrlock(&v[i]->lock), 0);
    pthread_rwlock_unlock(&v[i]->lock);
  }
  free(vars);
  ps_store_destroy(s);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, create_is_idempotent_and_conflicts_are_named);
  tcase_add_test(tc, many_variables_listed_in_name_order);
  tcase_add_test(tc, initializer_accounting_and_copy_on_write);
  tcase_add_test(tc, lock_set_tolerates_duplicates);
#ifdef LOCK_SET_OOM_TEST
  tcase_add_test(tc, lock_set_without_memory_to_sort);
#endif
  tcase_add_test(tc, a_selected_snapshot_takes_only_its_variables);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
