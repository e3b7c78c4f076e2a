/* Integration tests: real ps-server processes, the libpsworker client. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static ps_shape shp(int rank, int64_t a, int64_t b) {
  ps_shape s = {.rank = rank, .dim = {a, b}};
  return s;
}

static ps_tensor *ftensor(int rank, int64_t a, int64_t b, const float *vals) {
  ps_shape s = shp(rank, a, b);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  if (vals) memcpy(ps_tensor_data(t), vals, ps_tensor_nbytes(t));
  return t;
}

static ps_tensor *itensor(int64_t n, const int64_t *vals) {
  ps_shape s = shp(1, n, 0);
  ps_tensor *t = ps_tensor_create(PS_DT_INT64, &s, true);
  memcpy(ps_tensor_data(t), vals, (size_t)n * 8);
  return t;
}

static void create(int task, const char *name, ps_dtype dt, ps_shape s,
                   const ps_init_spec *init) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = dt, .shape = s, .init = init};
  PS_ASSERT_OK(ps_client_create_vars(C, task, &v, 1, &st), st);
}

static ps_tensor *read1(int task, const char *name, ps_status *st) {
  ps_read r = {.name = name};
  if (ps_client_read(C, task, &r, 1, st) != 0) {
    ps_tensor_destroy(r.out);
    return NULL;
  }
  return r.out;
}

static float *fdata(ps_tensor *t) {
  return ps_tensor_data(t);
}

START_TEST(create_initialize_read_on_two_ps) {
  ps_init_spec z, o, k, rn;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_init_spec_default(&o, PS_INIT_ONES);
  ps_init_spec_default(&k, PS_INIT_CONSTANT);
  k.value = 3.5;
  ps_init_spec_default(&rn, PS_INIT_RANDOM_NORMAL);
  rn.seed = 42;
  create(0, "a", PS_DT_FLOAT, shp(2, 2, 3), &z);
  create(1, "b", PS_DT_FLOAT, shp(1, 4, 0), &o);
  create(1, "c", PS_DT_DOUBLE, shp(0, 0, 0), &k);
  create(0, "w", PS_DT_FLOAT, shp(2, 16, 8), &rn);
  ps_status st;
  size_t n0 = 0, n1 = 0;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, &n0, &st), st);
  PS_ASSERT_OK(ps_client_initialize(C, 1, NULL, 0, false, &n1, &st), st);
  ck_assert_uint_eq(n0, 2);
  ck_assert_uint_eq(n1, 2);
  ps_read r0[2] = {{.name = "a"}, {.name = "w"}};
  ps_read r1[2] = {{.name = "b"}, {.name = "c"}};
  ps_task_reads t[2] = {{.task = 0, .reads = r0, .n = 2},
                        {.task = 1, .reads = r1, .n = 2}};
  PS_ASSERT_OK(ps_client_read_many(C, t, 2, &st), st);
  ck_assert_int_eq(r0[0].out->shape.rank, 2);
  for (int i = 0; i < 6; i++)
    ck_assert(fdata(r0[0].out)[i] == 0.f);
  for (int i = 0; i < 4; i++)
    ck_assert(fdata(r1[0].out)[i] == 1.f);
  ck_assert(((double *)ps_tensor_data(r1[1].out))[0] == 3.5);
  /* The same variable on another ps draws the same values (one task at a
   * time: a name on two tasks would be twice in every checkpoint). */
  const char *wn[1] = {"w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, wn, 1, 0, NULL, &st), st);
  create(1, "w", PS_DT_FLOAT, shp(2, 16, 8), &rn);
  PS_ASSERT_OK(ps_client_initialize(C, 1, wn, 1, false, &n1, &st), st);
  ps_tensor *w1 = read1(1, "w", &st);
  ck_assert_msg(w1 != NULL, "%s", st.msg);
  ck_assert_int_eq(memcmp(ps_tensor_data(r0[1].out), ps_tensor_data(w1), 16 * 8 * 4), 0);
  double sum = 0;
  for (int i = 0; i < 128; i++)
    sum += fabsf(fdata(r0[1].out)[i]);
  ck_assert(sum > 10); /* not all zeros */
  ps_tensor_destroy(w1);
  ps_tensor_destroy(r0[0].out);
  ps_tensor_destroy(r0[1].out);
  for (int i = 0; i < 2; i++)
    ps_tensor_destroy(r1[i].out);
}
END_TEST

START_TEST(create_is_idempotent_and_conflicts_fail) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create(0, "v", PS_DT_FLOAT, shp(1, 3, 0), &z);
  create(0, "v", PS_DT_FLOAT, shp(1, 3, 0), &z);
  ps_status st;
  ps_var_spec bad = {
      .name = "v", .dtype = PS_DT_INT32, .shape = shp(1, 3, 0), .init = &z};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &bad, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable v already exists");
  ck_assert_ptr_nonnull(strstr(st.msg, "int32"));
  ps_var_spec bad2 = {
      .name = "v", .dtype = PS_DT_FLOAT, .shape = shp(1, 4, 0), .init = &z};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &bad2, 1, &st), st, PS_ALREADY_EXISTS,
                   "[4]");
}
END_TEST

START_TEST(assign_add_sub_and_validate_shape) {
  create(0, "v", PS_DT_FLOAT, shp(2, 2, 3), NULL);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {10, 10, 10, 10, 10, 10};
  ps_tensor *ta = ftensor(2, 2, 3, a), *tb = ftensor(2, 2, 3, b);
  ps_status st;
  ps_update u = {.name = "v", .op = PS_ASSIGN, .value = ta};
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_update add[2] = {{.name = "v", .op = PS_ASSIGN_ADD, .value = tb},
                      {.name = "v", .op = PS_ASSIGN_ADD, .value = tb}};
  PS_ASSERT_OK(ps_client_update(C, 0, add, 2, &st), st);
  ps_update sub = {.name = "v", .op = PS_ASSIGN_SUB, .value = ta};
  PS_ASSERT_OK(ps_client_update(C, 0, &sub, 1, &st), st);
  ps_tensor *r = read1(0, "v", &st);
  ck_assert_ptr_nonnull(r);
  for (int i = 0; i < 6; i++)
    ck_assert(fdata(r)[i] == 20.f);
  ps_tensor_destroy(r);
  /* validate_shape=False: the variable takes the new shape */
  float c[3] = {7, 8, 9};
  ps_tensor *tc = ftensor(1, 3, 0, c);
  ps_update nv = {.name = "v", .op = PS_ASSIGN, .value = tc, .no_validate_shape = true};
  PS_ASSERT_OK(ps_client_update(C, 0, &nv, 1, &st), st);
  r = read1(0, "v", &st);
  ck_assert_int_eq(r->shape.rank, 1);
  ck_assert_int_eq(r->shape.dim[0], 3);
  ck_assert(fdata(r)[2] == 9.f);
  ps_tensor_destroy(r);
  ps_tensor_destroy(ta);
  ps_tensor_destroy(tb);
  ps_tensor_destroy(tc);
}
END_TEST

START_TEST(scatter_and_gather) {
  float init[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  create(1, "e", PS_DT_FLOAT, shp(2, 4, 2), NULL);
  ps_tensor *t = ftensor(2, 4, 2, init);
  ps_status st;
  ps_update u = {.name = "e", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(C, 1, &u, 1, &st), st);
  int64_t idx[3] = {3, 0, 3};
  float upd[6] = {1, 1, 5, 5, 1, 1};
  ps_tensor *ti = itensor(3, idx), *tu = ftensor(2, 3, 2, upd);
  ps_update sa = {.name = "e", .op = PS_SCATTER_ADD, .value = tu, .indices = ti};
  PS_ASSERT_OK(ps_client_update(C, 1, &sa, 1, &st), st);
  int64_t i1[1] = {1};
  float u1[2] = {-1, -2};
  ps_tensor *ti1 = itensor(1, i1), *tu1 = ftensor(2, 1, 2, u1);
  ps_update su = {.name = "e", .op = PS_SCATTER_UPDATE, .value = tu1, .indices = ti1};
  PS_ASSERT_OK(ps_client_update(C, 1, &su, 1, &st), st);
  ps_update ss = {.name = "e", .op = PS_SCATTER_SUB, .value = tu1, .indices = ti1};
  PS_ASSERT_OK(ps_client_update(C, 1, &ss, 1, &st), st);
  /* rows: 0 -> 5,5 ; 1 -> 0,0 ; 2 -> 2,2 ; 3 -> 5,5 (duplicates accumulate) */
  int64_t g[4] = {3, 1, 0, 2};
  ps_tensor *tg = itensor(4, g);
  ps_read r = {.name = "e", .indices = tg};
  PS_ASSERT_OK(ps_client_read(C, 1, &r, 1, &st), st);
  float want[8] = {5, 5, 0, 0, 5, 5, 2, 2};
  ck_assert_int_eq(r.out->shape.dim[0], 4);
  ck_assert_int_eq(r.out->shape.dim[1], 2);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(fdata(r.out)[i] == want[i], "elem %d", i);
  ps_tensor_destroy(r.out);
  ps_tensor *objs[] = {t, ti, tu, ti1, tu1, tg};
  for (size_t i = 0; i < 6; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

/* A gather whose ids repeat (the client sends each distinct id once and
 * copies the rows back) returns every requested row in order, for int32
 * and int64 ids, into a new or a given output, beside a plain read in the
 * same call; an id out of range is named at the caller's position. */
START_TEST(gather_with_repeated_ids_returns_every_row) {
  enum { ROWS = 50, N = 1000 };
  float init[ROWS * 3];
  for (int r = 0; r < ROWS; r++)
    init[r * 3] = (float)r, init[r * 3 + 1] = (float)r + 0.5f,
             init[r * 3 + 2] = (float)-r;
  create(0, "tab", PS_DT_FLOAT, shp(2, ROWS, 3), NULL);
  create(0, "vec", PS_DT_FLOAT, shp(1, ROWS, 0), NULL);
  ps_tensor *t = ftensor(2, ROWS, 3, init), *tv = ftensor(1, ROWS, 0, NULL);
  for (int r = 0; r < ROWS; r++)
    fdata(tv)[r] = (float)(r * r);
  ps_status st;
  ps_update us[2] = {{.name = "tab", .op = PS_ASSIGN, .value = t},
                     {.name = "vec", .op = PS_ASSIGN, .value = tv}};
  PS_ASSERT_OK(ps_client_update(C, 0, us, 2, &st), st);
  int64_t id64[N];
  int32_t id32[N];
  for (int i = 0; i < N; i++)
    id64[i] = id32[i] = (i * 7 + i / 13) % ROWS;
  ps_tensor *i64 = itensor(N, id64), *i32 = ps_tensor_new(PS_DT_INT32, 1, (int64_t[]){N});
  memcpy(ps_tensor_data(i32), id32, sizeof id32);
  ps_tensor *given = ftensor(2, N, 3, NULL);
  for (int pass = 0; pass < 2; pass++) {
    ps_read r[3] = {
        {.name = "tab", .indices = pass ? i32 : i64, .out = pass ? given : NULL},
        {.name = "vec"},
        {.name = "vec", .indices = i64}};
    PS_ASSERT_OK(ps_client_read(C, 0, r, 3, &st), st);
    ck_assert_int_eq(r[0].out->shape.rank, 2);
    ck_assert_int_eq(r[0].out->shape.dim[0], N);
    ck_assert_int_eq(r[0].out->shape.dim[1], 3);
    ck_assert_int_eq(r[2].out->shape.dim[0], N);
    for (int i = 0; i < N; i++) {
      for (int k = 0; k < 3; k++)
        ck_assert_msg(fdata(r[0].out)[i * 3 + k] == init[id64[i] * 3 + k],
                      "pass %d row %d", pass, i);
      ck_assert(fdata(r[2].out)[i] == (float)(id64[i] * id64[i]));
    }
    ck_assert_int_eq(r[1].out->shape.dim[0], ROWS);
    if (pass == 0) ps_tensor_destroy(r[0].out);
    ps_tensor_destroy(r[1].out);
    ps_tensor_destroy(r[2].out);
  }
  id64[700] = 99;
  ps_tensor *bad = itensor(N, id64);
  ps_read rb = {.name = "tab", .indices = bad};
  PS_ASSERT_CODE(ps_client_read(C, 0, &rb, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "indices[700] = 99 is not in [0, 50)") == st.msg, "%s",
                st.msg);
  ck_assert_ptr_null(rb.out);
  ps_tensor *objs[] = {t, tv, i64, i32, given, bad};
  for (size_t i = 0; i < 6; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

/* A deduplicated gather of wide rows: rows of 70001 floats (not a
 * multiple of any slice or frame size) straddle the pieces the transport
 * hands over and the 1 MiB chunk messages of the answer, and the distinct
 * rows are not asked for in their own order. */
START_TEST(gather_with_repeated_wide_rows) {
  enum { ROWS = 12, COLS = 70001, N = 96 };
  create(0, "wide", PS_DT_FLOAT, shp(2, ROWS, COLS), NULL);
  ps_tensor *t = ftensor(2, ROWS, COLS, NULL);
  for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++)
    fdata(t)[i] = (float)(i % 100003);
  ps_status st;
  ps_update u = {.name = "wide", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  int64_t id[N];
  for (int i = 0; i < N; i++)
    id[i] = (i * 5 + i / 7) % ROWS;
  id[1] = id[0]; /* distinct row u is not first asked for at position u */
  ps_tensor *ix = itensor(N, id);
  ps_read r = {.name = "wide", .indices = ix};
  PS_ASSERT_OK(ps_client_read(C, 0, &r, 1, &st), st);
  ck_assert_int_eq(r.out->shape.dim[0], N);
  for (int i = 0; i < N; i++)
    ck_assert_msg(memcmp(fdata(r.out) + (size_t)i * COLS, fdata(t) + (size_t)id[i] * COLS,
                         COLS * sizeof(float)) == 0,
                  "row %d (id %lld) differs", i, (long long)id[i]);
  ps_tensor_destroy(r.out);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(t);
}
END_TEST

/* A scatter-add whose ids repeat goes with one summed row per distinct id
 * (as TensorFlow's optimizers sum them): every occurrence is added, for
 * float and int32 tables, add and sub.  An id out of range, or updates of
 * the wrong shape, fail with the caller's positions and shapes and change
 * nothing; in a two-task call, the task that applied is not applied twice
 * when the other is sent again. */
START_TEST(scatter_add_with_repeated_ids_adds_every_occurrence) {
  enum { ROWS = 40, N = 600 };
  create(0, "acc", PS_DT_FLOAT, shp(2, ROWS, 2), NULL);
  create(1, "acc1", PS_DT_FLOAT, shp(2, ROWS, 2), NULL);
  create(0, "cnt", PS_DT_INT32, shp(1, ROWS, 0), NULL);
  ps_tensor *z = ftensor(2, ROWS, 2, NULL),
            *zi = ps_tensor_new(PS_DT_INT32, 1, (int64_t[]){ROWS});
  memset(ps_tensor_data(z), 0, ps_tensor_nbytes(z));
  memset(ps_tensor_data(zi), 0, ps_tensor_nbytes(zi));
  ps_status st;
  ps_update zs[2] = {{.name = "acc", .op = PS_ASSIGN, .value = z},
                     {.name = "cnt", .op = PS_ASSIGN, .value = zi}};
  PS_ASSERT_OK(ps_client_update(C, 0, zs, 2, &st), st);
  ps_update z1 = {.name = "acc1", .op = PS_ASSIGN, .value = z};
  PS_ASSERT_OK(ps_client_update(C, 1, &z1, 1, &st), st);
  int64_t ids[N];
  float want[ROWS * 2] = {0};
  int32_t wantc[ROWS] = {0};
  ps_tensor *g = ftensor(2, N, 2, NULL),
            *gi = ps_tensor_new(PS_DT_INT32, 1, (int64_t[]){N});
  for (int i = 0; i < N; i++) {
    ids[i] = (i * 11 + i / 7) % ROWS;
    fdata(g)[i * 2] = (float)(i % 5) * 0.5f; /* exact in any order */
    fdata(g)[i * 2 + 1] = -1;
    ((int32_t *)ps_tensor_data(gi))[i] = i % 3;
    want[ids[i] * 2] += (float)(i % 5) * 0.5f;
    want[ids[i] * 2 + 1] -= 1;
    wantc[ids[i]] -= i % 3; /* applied with SCATTER_SUB below */
  }
  ps_tensor *ti = itensor(N, ids);
  ps_update us[2] = {{.name = "acc", .op = PS_SCATTER_ADD, .value = g, .indices = ti},
                     {.name = "cnt", .op = PS_SCATTER_SUB, .value = gi, .indices = ti}};
  PS_ASSERT_OK(ps_client_update(C, 0, us, 2, &st), st);
  ps_tensor *r = read1(0, "acc", &st), *rc = read1(0, "cnt", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert_ptr_nonnull(rc);
  for (int k = 0; k < ROWS * 2; k++)
    ck_assert_msg(fdata(r)[k] == want[k], "acc[%d] = %g, want %g", k, fdata(r)[k],
                  want[k]);
  for (int k = 0; k < ROWS; k++)
    ck_assert_int_eq(((int32_t *)ps_tensor_data(rc))[k], wantc[k]);
  ps_tensor_destroy(r);
  ps_tensor_destroy(rc);
  /* out of range at the caller's position 450, nothing changed */
  ids[450] = 77;
  ps_tensor *bad = itensor(N, ids);
  ps_update ub = {.name = "acc", .op = PS_SCATTER_ADD, .value = g, .indices = bad};
  PS_ASSERT_CODE(ps_client_update(C, 0, &ub, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "indices[450] = 77 is not in [0, 40)") == st.msg, "%s",
                st.msg);
  /* updates of the wrong shape: the caller's shapes in the message */
  ps_tensor *g3 = ftensor(2, N, 3, NULL);
  memset(ps_tensor_data(g3), 0, ps_tensor_nbytes(g3));
  ps_update us3 = {.name = "acc", .op = PS_SCATTER_ADD, .value = g3, .indices = ti};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &us3, 1, &st), st, PS_INVALID_ARGUMENT,
                   "got updates.shape [600,3], indices.shape [600], "
                   "params.shape [40,2]");
  /* two tasks: ps/1 applies, ps/0 refuses (and is sent again plainly) */
  ps_update ok1 = {.name = "acc1", .op = PS_SCATTER_ADD, .value = g, .indices = ti};
  ps_task_updates tu[2] = {{.task = 0, .updates = &ub, .n = 1},
                           {.task = 1, .updates = &ok1, .n = 1}};
  PS_ASSERT_CODE(ps_client_update_many(C, tu, 2, &st), st, PS_INVALID_ARGUMENT);
  PS_ASSERT_OK(tu[1].st.code, tu[1].st);
  ck_assert_ptr_nonnull(strstr(tu[0].st.msg, "indices[450] = 77"));
  r = read1(0, "acc", &st);
  ps_tensor *r1 = read1(1, "acc1", &st);
  for (int k = 0; k < ROWS * 2; k++) {
    ck_assert_msg(fdata(r)[k] == want[k], "acc changed at %d", k);
    ck_assert_msg(fdata(r1)[k] == want[k], "acc1[%d] = %g, want %g (once)", k,
                  fdata(r1)[k], want[k]);
  }
  ps_tensor_destroy(r);
  ps_tensor_destroy(r1);
  ps_tensor *objs[] = {z, zi, g, gi, ti, bad, g3};
  for (size_t i = 0; i < 7; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

/* The embedding step: a gather, then a scatter-add on the same ids (the
 * client reuses the gather's deduplication for it).  The ids are compared
 * by value, not by buffer: ids rewritten in the same tensor between the
 * two calls, and more id sets than the client remembers, still add each
 * occurrence to the right rows, on both tasks of a two-task call. */
START_TEST(scatter_after_gather_on_changing_ids_adds_the_new_ids) {
  enum { ROWS = 30, N = 400, SETS = 7 };
  create(0, "emb", PS_DT_FLOAT, shp(2, ROWS, 2), NULL);
  create(1, "emb1", PS_DT_FLOAT, shp(2, ROWS, 2), NULL);
  ps_tensor *z = ftensor(2, ROWS, 2, NULL);
  memset(ps_tensor_data(z), 0, ps_tensor_nbytes(z));
  ps_status st;
  ps_update za = {.name = "emb", .op = PS_ASSIGN, .value = z},
            zb = {.name = "emb1", .op = PS_ASSIGN, .value = z};
  PS_ASSERT_OK(ps_client_update(C, 0, &za, 1, &st), st);
  PS_ASSERT_OK(ps_client_update(C, 1, &zb, 1, &st), st);
  float want[ROWS * 2] = {0};
  int64_t zero_ids[N] = {0};
  ps_tensor *ti = itensor(N, zero_ids), *g = ftensor(2, N, 2, NULL);
  int64_t *ids = ps_tensor_data(ti);
  for (int i = 0; i < N * 2; i++)
    fdata(g)[i] = 1;
  for (int step = 0; step < 3 * SETS; step++) {
    int set = step % SETS;
    for (int i = 0; i < N; i++)
      ids[i] = (i * (set + 1) + set) % 17; /* repeats: deduplicated */
    ps_task_reads tr[2] = {
        {.task = 0, .reads = &(ps_read){.name = "emb", .indices = ti}, .n = 1},
        {.task = 1, .reads = &(ps_read){.name = "emb1", .indices = ti}, .n = 1}};
    PS_ASSERT_OK(ps_client_read_many(C, tr, 2, &st), st);
    for (int t = 0; t < 2; t++) {
      for (int i = 0; i < N; i++)
        ck_assert_msg(fdata(tr[t].reads->out)[i * 2] == want[ids[i] * 2],
                      "step %d task %d row %d", step, t, i);
      ps_tensor_destroy(tr[t].reads->out);
    }
    /* the ids change in place half the time between gather and scatter */
    if (step % 2)
      for (int i = 0; i < N; i++)
        ids[i] = (ids[i] + 13) % ROWS;
    ps_update ua = {.name = "emb", .op = PS_SCATTER_ADD, .value = g, .indices = ti},
              ub = {.name = "emb1", .op = PS_SCATTER_ADD, .value = g, .indices = ti};
    ps_task_updates tu[2] = {{.task = 0, .updates = &ua, .n = 1},
                             {.task = 1, .updates = &ub, .n = 1}};
    PS_ASSERT_OK(ps_client_update_many(C, tu, 2, &st), st);
    for (int i = 0; i < N; i++)
      want[ids[i] * 2] += 1, want[ids[i] * 2 + 1] += 1;
  }
  ps_tensor *r0 = read1(0, "emb", &st), *r1 = read1(1, "emb1", &st);
  ck_assert_ptr_nonnull(r0);
  ck_assert_ptr_nonnull(r1);
  for (int k = 0; k < ROWS * 2; k++) {
    ck_assert_msg(fdata(r0)[k] == want[k], "emb[%d] = %g, want %g", k, fdata(r0)[k],
                  want[k]);
    ck_assert_msg(fdata(r1)[k] == want[k], "emb1[%d] = %g, want %g", k, fdata(r1)[k],
                  want[k]);
  }
  ps_tensor *objs[] = {z, ti, g, r0, r1};
  for (size_t i = 0; i < 5; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

/* Each error leaves the daemon serving and the variable unchanged. */
static void assert_unchanged(void) {
  ps_status st;
  ps_tensor *r = read1(0, "w", &st);
  ck_assert_msg(r != NULL, "ps stopped serving: %s", st.msg);
  for (int i = 0; i < 6; i++)
    ck_assert(fdata(r)[i] == (float)i);
  ck_assert_int_eq(r->shape.dim[0], 2);
  ps_tensor_destroy(r);
}

static void errors_setup(void) {
  setup();
  create(0, "w", PS_DT_FLOAT, shp(2, 2, 3), NULL);
  create(0, "u", PS_DT_FLOAT, shp(2, 2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  ps_tensor *t = ftensor(2, 2, 3, v);
  ps_update u = {.name = "w", .op = PS_ASSIGN, .value = t};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_tensor_destroy(t);
}

START_TEST(error_uninitialized_read) {
  ps_status st;
  ck_assert_ptr_null(read1(0, "u", &st));
  PS_ASSERT_CODE(st.code, st, PS_FAILED_PRECONDITION);
  ck_assert_str_eq(st.msg, "Attempting to use uninitialized value u");
  ps_tensor *t = ftensor(2, 2, 3, NULL);
  ps_update u = {.name = "u", .op = PS_ASSIGN_ADD, .value = t};
  PS_ASSERT_CODE(ps_client_update(C, 0, &u, 1, &st), st, PS_FAILED_PRECONDITION);
  ck_assert_str_eq(st.msg, "Attempting to use uninitialized value u");
  ps_tensor_destroy(t);
  assert_unchanged();
}
END_TEST

START_TEST(error_assign_shape) {
  ps_status st;
  ps_tensor *t = ftensor(2, 3, 2, NULL);
  ps_update u = {.name = "w", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_CODE(ps_client_update(C, 0, &u, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "Assign requires shapes of both tensors to match. "
                               "lhs shape= [2,3] rhs shape= [3,2]") == st.msg,
                "%s", st.msg);
  ck_assert_ptr_nonnull(strstr(st.msg, "w/Assign"));
  ps_update a = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &a, 1, &st), st, PS_INVALID_ARGUMENT,
                   "Cannot update variable with shape [2,3] using "
                   "a Tensor with shape [3,2]");
  ps_tensor_destroy(t);
  assert_unchanged();
}
END_TEST

START_TEST(error_dtype_mismatch) {
  ps_status st;
  ps_shape s = shp(2, 2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_INT32, &s, true);
  ps_update u = {.name = "w", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &u, 1, &st), st, PS_INVALID_ARGUMENT,
                   "value has dtype int32 that does not match dtype float");
  ck_assert_ptr_nonnull(strstr(st.msg, "w"));
  ps_tensor_destroy(t);
  ps_read r = {.name = "w", .out = ps_tensor_create(PS_DT_DOUBLE, &s, true)};
  PS_ASSERT_STATUS(ps_client_read(C, 0, &r, 1, &st), st, PS_INVALID_ARGUMENT,
                   "read w: destination is double [2,3]");
  ps_tensor_destroy(r.out);
  assert_unchanged();
}
END_TEST

START_TEST(error_unknown_variable) {
  ps_status st;
  ck_assert_ptr_null(read1(0, "nope", &st));
  PS_ASSERT_CODE(st.code, st, PS_NOT_FOUND);
  ck_assert_str_eq(st.msg, "variable nope does not exist on ps/0");
  ps_tensor *t = ftensor(2, 2, 3, NULL);
  ps_update u[2] = {{.name = "w", .op = PS_ASSIGN, .value = t},
                    {.name = "ghost", .op = PS_ASSIGN, .value = t}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, u, 2, &st), st, PS_NOT_FOUND, "ghost");
  const char *names[] = {"ghost"};
  bool b;
  PS_ASSERT_CODE(ps_client_is_initialized(C, 0, names, 1, &b, &st), st, PS_NOT_FOUND);
  ps_tensor_destroy(t);
  assert_unchanged(); /* the valid first update did not apply */
}
END_TEST

START_TEST(error_index_out_of_range) {
  ps_status st;
  int64_t idx[2] = {1, 7};
  ps_tensor *ti = itensor(2, idx);
  ps_read r = {.name = "w", .indices = ti};
  PS_ASSERT_CODE(ps_client_read(C, 0, &r, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "indices[1] = 7 is not in [0, 2)") == st.msg, "%s",
                st.msg);
  ck_assert_ptr_nonnull(strstr(st.msg, "w/Gather"));
  ps_tensor_destroy(r.out);
  ps_tensor *tu = ftensor(2, 2, 3, NULL);
  ps_update u = {.name = "w", .op = PS_SCATTER_ADD, .value = tu, .indices = ti};
  PS_ASSERT_CODE(ps_client_update(C, 0, &u, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "indices[1] = 7 is not in [0, 2)") == st.msg, "%s",
                st.msg);
  int64_t neg[1] = {-1};
  ps_tensor *tn = itensor(1, neg), *tu1 = ftensor(2, 1, 3, NULL);
  ps_update u2 = {.name = "w", .op = PS_SCATTER_UPDATE, .value = tu1, .indices = tn};
  PS_ASSERT_CODE(ps_client_update(C, 0, &u2, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(st.msg, "indices[0] = -1 is not in [0, 2)"));
  /* updates shape must be indices.shape + params.shape[1:] */
  ps_update u3 = {.name = "w", .op = PS_SCATTER_ADD, .value = tu, .indices = tn};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &u3, 1, &st), st, PS_INVALID_ARGUMENT,
                   "Must have updates.shape = indices.shape + "
                   "params.shape[1:], got updates.shape [2,3], "
                   "indices.shape [1], params.shape [2,3]");
  ps_tensor_destroy(ti);
  ps_tensor_destroy(tu);
  ps_tensor_destroy(tn);
  ps_tensor_destroy(tu1);
  assert_unchanged();
}
END_TEST

static ps_rpc_channel *raw_channel(void) {
  return ps_rpc_channel_create(ps_client_address(C, 0));
}

START_TEST(error_request_does_not_parse) {
  ps_rpc_channel *ch = raw_channel();
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02};
  const char *methods[] = {"/paramserver.Ps/Update", "/paramserver.Ps/Read",
                           "/paramserver.Ps/Create", "/paramserver.Ps/Initialize"};
  for (size_t i = 0; i < 4; i++) {
    ps_rpc_req r = {.ch = ch,
                    .method = methods[i],
                    .raw_request = junk,
                    .raw_len = sizeof junk,
                    .unary_response = i != 1,
                    .timeout_ms = 10000};
    ps_rpc_run(&r, 1);
    PS_ASSERT_STATUS(r.st.code, r.st, PS_INVALID_ARGUMENT,
                     "request message does not parse");
  }
  ps_rpc_channel_destroy(ch);
  assert_unchanged();
}
END_TEST

START_TEST(error_unknown_method_is_unimplemented_at_once) {
  ps_rpc_channel *ch = raw_channel();
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/NoSuchMethod",
                  .raw_request = "",
                  .raw_len = 0,
                  .unary_response = true,
                  .timeout_ms = 20000};
  ps_rpc_run(&r, 1);
  clock_gettime(CLOCK_MONOTONIC, &b);
  PS_ASSERT_STATUS(r.st.code, r.st, PS_UNIMPLEMENTED, "NoSuchMethod");
  ck_assert_int_lt(b.tv_sec - a.tv_sec, 10); /* not the 20 s deadline */
  ps_rpc_channel_destroy(ch);
  assert_unchanged();
}
END_TEST

START_TEST(error_truncated_stream) {
  /* Header announces 1 MiB of data, the client sends 4 KiB then closes. */
  ps_rpc_channel *ch = raw_channel();
  uint8_t hdr[64];
  /* UpdateRequest{updates{name:"w" op:ASSIGN dtype:1 shape:[262144]}} */
  size_t n = 0;
  uint8_t upd[32];
  size_t k = 0;
  upd[k++] = 0x0a;
  upd[k++] = 1;
  upd[k++] = 'w';
  upd[k++] = 0x18;
  upd[k++] = 1;
  upd[k++] = 0x22;
  upd[k++] = 3;
  upd[k++] = 0x80;
  upd[k++] = 0x80;
  upd[k++] = 0x10;
  hdr[n++] = 0x0a;
  hdr[n++] = (uint8_t)k;
  memcpy(hdr + n, upd, k);
  n += k;
  ps_buf *data = ps_buf_create(4096, true);
  ps_rpc_segs send = {0};
  ps_rpc_segs_add(&send, data->data, 4096, data);
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Update",
                  .raw_request = hdr,
                  .raw_len = n,
                  .send = &send,
                  .unary_response = true,
                  .timeout_ms = 10000};
  ps_rpc_run(&r, 1);
  PS_ASSERT_STATUS(r.st.code, r.st, PS_INVALID_ARGUMENT,
                   "request data truncated: expected 1048576 bytes, got 4096");
  ps_rpc_segs_fini(&send);
  ps_buf_unref(data);
  ps_rpc_channel_destroy(ch);
  assert_unchanged();
}
END_TEST

START_TEST(batch_is_atomic) {
  ps_status st;
  float v[6] = {9, 9, 9, 9, 9, 9};
  ps_tensor *t = ftensor(2, 2, 3, v), *bad = ftensor(1, 5, 0, NULL);
  ps_update u[2] = {{.name = "w", .op = PS_ASSIGN_ADD, .value = t},
                    {.name = "w", .op = PS_ASSIGN, .value = bad}};
  PS_ASSERT_CODE(ps_client_update(C, 0, u, 2, &st), st, PS_INVALID_ARGUMENT);
  ps_tensor_destroy(t);
  ps_tensor_destroy(bad);
  assert_unchanged();
}
END_TEST

START_TEST(initialized_state_queries) {
  ps_status st;
  const char *names[] = {"w", "u"};
  bool out[2];
  PS_ASSERT_OK(ps_client_is_initialized(C, 0, names, 2, out, &st), st);
  ck_assert(out[0] && !out[1]);
  char **un;
  size_t nun;
  PS_ASSERT_OK(ps_client_report_uninitialized(C, 0, NULL, 0, &un, &nun, &st), st);
  ck_assert_uint_eq(nun, 1);
  ck_assert_str_eq(un[0], "u");
  ps_client_free_names(un, nun);
  /* u has no initializer: initializing it by name is an error */
  const char *u1[] = {"u"};
  PS_ASSERT_STATUS(ps_client_initialize(C, 0, u1, 1, false, NULL, &st), st,
                   PS_FAILED_PRECONDITION, "variable u has no initializer");
  ps_var_info *vi;
  size_t nv;
  PS_ASSERT_OK(ps_client_list(C, 0, &vi, &nv, &st), st);
  ck_assert_uint_eq(nv, 2);
  ck_assert_str_eq(vi[0].name, "u");
  ck_assert(!vi[0].initialized);
  ck_assert_str_eq(vi[1].name, "w");
  ck_assert(vi[1].initialized);
  ck_assert_int_eq(vi[1].bytes, 24);
  ps_client_free_var_info(vi, nv);
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  ck_assert_str_eq(ts.task, "ps/0");
  ck_assert_int_eq(ts.num_vars, 2);
  ck_assert_int_eq(ts.bytes, 24);
}
END_TEST

START_TEST(tensors_beyond_message_limits) {
  /* 96 MiB: far past gRPC's 4 MiB default, several chunks. */
  int64_t n = 24 << 20;
  ps_shape s = {.rank = 1, .dim = {n}};
  create(1, "big", PS_DT_FLOAT, s, NULL);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  float *p = ps_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(i % 1000003);
  ps_status st;
  ps_update u = {.name = "big", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(C, 1, &u, 1, &st), st);
  ps_update a = {.name = "big", .op = PS_ASSIGN_ADD, .value = t};
  PS_ASSERT_OK(ps_client_update(C, 1, &a, 1, &st), st);
  ps_tensor *r = read1(1, "big", &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  float *q = ps_tensor_data(r);
  for (int64_t i = 0; i < n; i += 4099)
    ck_assert(q[i] == 2.f * (float)(i % 1000003));
  ck_assert(q[n - 1] == 2.f * (float)((n - 1) % 1000003));
  ps_tensor_destroy(r);
  ps_tensor_destroy(t);
}
END_TEST

START_TEST(unavailable_ps_is_named) {
  harness_kill(&H, 1);
  ps_client_options o;
  ps_client_options_default(&o);
  o.max_retries = 2;
  ps_status st;
  ps_client *c = ps_client_create(H.cluster, "ps", &o, &st);
  ps_task_status ts;
  PS_ASSERT_CODE(ps_client_status(c, 1, &ts, &st), st, PS_UNAVAILABLE);
  ck_assert_msg(strstr(st.msg, "ps/1 at 127.0.0.1:") == st.msg, "%s", st.msg);
  PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  ps_client_destroy(c);
}
END_TEST

/* A safe call retries with backoff until the ps comes (back) up: the
 * channel has seen the ps refuse connections, the ps restarts on the same
 * address, and the next status call gets through by retrying. */
START_TEST(safe_calls_retry_until_ps_is_up) {
  char addr[64];
  snprintf(addr, sizeof addr, "%s", H.addrs[1]);
  harness_kill(&H, 1);
  ps_client_options o;
  ps_client_options_default(&o);
  o.max_retries = 0;
  ps_status st;
  ps_client *c = ps_client_create(H.cluster, "ps", &o, &st);
  ps_task_status ts;
  PS_ASSERT_CODE(ps_client_status(c, 1, &ts, &st), st, PS_UNAVAILABLE);
  char spec[400];
  snprintf(spec, sizeof spec, "%s/again.json", H.dir);
  FILE *f = fopen(spec, "w");
  fprintf(f, "{\"ps\": [\"%s\", \"%s\"]}\n", H.addrs[0], addr);
  fclose(f);
  const char *argv[] = {harness_prog("PS_SERVER", "build/ps/ps-server"),
                        "--cluster",
                        spec,
                        "--job",
                        "ps",
                        "--task",
                        "1",
                        NULL};
  int out = -1;
  pid_t pid = harness_spawn(&H, argv, &out); /* dies with the test */
  ck_assert_int_gt(pid, 0);
  H.pids[1] = pid; /* harness_stop stops it */
  char line[128] = "";
  ck_assert_int_gt(read(out, line, sizeof line - 1), 0);
  close(out);
  ck_assert_ptr_nonnull(strstr(line, addr));
  ps_client_destroy(c);
  o.max_retries = 12;
  o.retry_initial_ms = 50;
  o.retry_max_ms = 500;
  c = ps_client_create(H.cluster, "ps", &o, &st);
  PS_ASSERT_OK(ps_client_status(c, 1, &ts, &st), st);
  ck_assert_str_eq(ts.task, "ps/1");
  ps_client_destroy(c);
}
END_TEST

/* Random bytes as headers and as data chunks, to every method: the ps
 * answers each with an error or a result and keeps serving. */
START_TEST(random_garbage_never_crashes) {
  ps_rpc_channel *ch = raw_channel();
  const char *methods[] = {
      "/paramserver.Ps/Create",        "/paramserver.Ps/Initialize",
      "/paramserver.Ps/IsInitialized", "/paramserver.Ps/ReportUninitialized",
      "/paramserver.Ps/Update",        "/paramserver.Ps/Read",
      "/paramserver.Ps/List",          "/paramserver.Ps/Status"};
  unsigned seed = 12345;
  uint8_t buf[256];
  ps_buf *chunk = ps_buf_create(8192, false);
  for (int i = 0; i < 400; i++) {
    size_t n = (size_t)(rand_r(&seed) % 64);
    for (size_t k = 0; k < n; k++)
      buf[k] = (uint8_t)rand_r(&seed);
    if (i % 3 == 0 && n > 4) { /* plausible UpdateRequest / ReadRequest prefix */
      buf[0] = 0x0a;
      buf[1] = (uint8_t)(n - 2);
      buf[2] = 0x0a;
      buf[3] = 1;
      buf[4] = 'w';
    }
    for (size_t k = 0; k < 8192; k++)
      ((uint8_t *)chunk->data)[k] = (uint8_t)rand_r(&seed);
    ps_rpc_segs send = {0};
    if (i % 2)
      ps_rpc_segs_add(&send, chunk->data, 1 + (size_t)(rand_r(&seed) % 8191), chunk);
    const char *m = methods[i % 8];
    ps_rpc_req r = {.ch = ch,
                    .method = m,
                    .raw_request = buf,
                    .raw_len = n,
                    .send = &send,
                    .unary_response = strstr(m, "Read") == NULL,
                    .timeout_ms = 10000};
    ps_rpc_run(&r, 1);
    ck_assert_msg(r.st.code != PS_UNAVAILABLE && r.st.code != PS_DEADLINE_EXCEEDED,
                  "call %d to %s: %s", i, m, r.st.msg);
    ps_rpc_segs_fini(&send);
  }
  ps_buf_unref(chunk);
  ps_rpc_channel_destroy(ch);
  ps_status st;
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  /* w may have been assigned by a lucky random update; it must be readable */
  ps_tensor *r = read1(0, "w", &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ps_tensor_destroy(r);
}
END_TEST

typedef struct bg_read {
  ps_client *c;
  ps_read r;
  ps_status st;
  int rc;
} bg_read;

static void *bg_read_main(void *arg) {
  bg_read *b = arg;
  b->rc = ps_client_read(b->c, 1, &b->r, 1, &b->st);
  return NULL;
}

/* SIGTERM while a 512 MiB read streams out: the read completes, then the
 * ps exits 0. */
START_TEST(sigterm_lets_in_flight_calls_finish) {
  int64_t n = 128 << 20;
  ps_shape s = {.rank = 1, .dim = {n}};
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_CONSTANT);
  k.value = 1.5;
  create(1, "big", PS_DT_FLOAT, s, &k);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 1, NULL, 0, false, NULL, &st), st);
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(C, 1, &ts, &st), st);
  int64_t base = ts.rpcs;
  bg_read b = {.c = C, .r = {.name = "big"}};
  pthread_t th;
  pthread_create(&th, NULL, bg_read_main, &b);
  /* Wait until the ps has taken the read: the i-th Status after the first
   * counts itself, so base + i without the read, base + i + 1 with it. */
  bool taken = false;
  for (int i = 1; i <= 5000 && !taken; i++) {
    PS_ASSERT_OK(ps_client_status(C, 1, &ts, &st), st);
    taken = ts.rpcs >= base + i + 1;
    struct timespec d = {0, 1000000};
    if (!taken) nanosleep(&d, NULL);
  }
  ck_assert_msg(taken, "the ps never took the read");
  kill(H.pids[1], SIGTERM);
  pthread_join(th, NULL);
  PS_ASSERT_OK(b.rc, b.st);
  float *p = ps_tensor_data(b.r.out);
  ck_assert(p[0] == 1.5f && p[n - 1] == 1.5f);
  ps_tensor_destroy(b.r.out);
  int status;
  ck_assert_int_eq(waitpid(H.pids[1], &status, 0), H.pids[1]);
  H.pids[1] = 0;
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
END_TEST

/* Readers that keep calling while the ps stops: each call either
 * completes or fails UNAVAILABLE naming the ps (so a worker waits for the
 * ps to come back), never CANCELLED, which gRPC gives a call that reached
 * the ps as it began shutting down. */
typedef struct {
  ps_client *c;
  atomic_int ok;
  ps_status st;
} reader;

static void *reader_main(void *arg) {
  reader *r = arg;
  for (;;) {
    ps_read rd = {.name = "mid"};
    if (ps_client_read(r->c, 1, &rd, 1, &r->st) != 0) break;
    ps_tensor_destroy(rd.out);
    atomic_fetch_add(&r->ok, 1);
  }
  return NULL;
}

START_TEST(calls_meeting_a_sigterm_fail_unavailable) {
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_CONSTANT);
  create(1, "mid", PS_DT_FLOAT, shp(1, 1 << 18, 0), &k);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 1, NULL, 0, false, NULL, &st), st);
  enum { NR = 6 };
  reader rs[NR];
  pthread_t th[NR];
  ps_client_options o;
  ps_client_options_default(&o);
  o.max_retries = 0;
  for (int i = 0; i < NR; i++) {
    memset(&rs[i], 0, sizeof rs[i]);
    rs[i].c = ps_client_create(H.cluster, "ps", &o, &st);
    ck_assert_ptr_nonnull(rs[i].c);
    pthread_create(&th[i], NULL, reader_main, &rs[i]);
  }
  for (int i = 0; i < NR; i++)
    while (atomic_load(&rs[i].ok) < 3) {
      struct timespec d = {0, 1000000};
      nanosleep(&d, NULL);
    }
  kill(H.pids[1], SIGTERM);
  for (int i = 0; i < NR; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(rs[i].st.code == PS_UNAVAILABLE, "reader %d: %s (%s)", i,
                  ps_status_code_name(rs[i].st.code), rs[i].st.msg);
    ck_assert_msg(strstr(rs[i].st.msg, "ps/1 at ") == rs[i].st.msg, "%s", rs[i].st.msg);
    ps_client_destroy(rs[i].c);
  }
  int status;
  ck_assert_int_eq(waitpid(H.pids[1], &status, 0), H.pids[1]);
  H.pids[1] = 0;
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
END_TEST

/* A ps answers an unreplicated update once it is validated, and applies
 * it after the answer went out, still holding the variable's lock
 * (DESIGN.md "A training step").  With two RPC threads, a read sent the moment the
 * answer came is taken by the other thread while the first one may still
 * be adding: it must wait and see the whole update, its last row too (the
 * add runs from the first element to the last), and the answered version
 * must be the one the ps then lists. */
static void threads2_setup(void) {
  static const char *const extra[] = {"--threads", "2", NULL};
  C = harness_start_client(&H, 1, extra);
  ck_assert_ptr_nonnull(C);
}

START_TEST(answered_update_is_seen_by_the_next_read) {
  enum { ROWS = 1024, COLS = 4096, ROUNDS = 12 };
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create(0, "big", PS_DT_FLOAT, shp(2, ROWS, COLS), &z);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  ps_tensor *ones = ftensor(2, ROWS, COLS, NULL);
  for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++)
    fdata(ones)[i] = 1;
  int64_t last[2] = {ROWS - 1, 0};
  ps_tensor *ix = itensor(2, last);
  for (int r = 1; r <= ROUNDS; r++) {
    ps_update_result res;
    ps_update u = {.name = "big", .op = PS_ASSIGN_ADD, .value = ones, .result = &res};
    PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
    ps_read rd = {.name = "big", .indices = ix};
    PS_ASSERT_OK(ps_client_read(C, 0, &rd, 1, &st), st);
    const float *got = fdata(rd.out);
    ck_assert_msg(got[COLS - 1] == (float)r && got[0] == (float)r &&
                      got[2 * COLS - 1] == (float)r,
                  "round %d: the read right after the answer saw %g (the last "
                  "element) and %g (the first row's last)",
                  r, (double)got[COLS - 1], (double)got[2 * COLS - 1]);
    ps_tensor_destroy(rd.out);
    ps_var_info *vi = NULL;
    size_t nv = 0;
    PS_ASSERT_OK(ps_client_list(C, 0, &vi, &nv, &st), st);
    ck_assert_uint_eq(nv, 1);
    ck_assert_int_eq(vi[0].version, res.version);
    ps_client_free_var_info(vi, nv);
  }
  ps_tensor_destroy(ones);
  ps_tensor_destroy(ix);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ps");
  TCase *tc = tcase_create("ops");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, create_initialize_read_on_two_ps);
  tcase_add_test(tc, create_is_idempotent_and_conflicts_fail);
  tcase_add_test(tc, assign_add_sub_and_validate_shape);
  tcase_add_test(tc, scatter_and_gather);
  tcase_add_test(tc, gather_with_repeated_ids_returns_every_row);
  tcase_add_test(tc, gather_with_repeated_wide_rows);
  tcase_add_test(tc, scatter_add_with_repeated_ids_adds_every_occurrence);
  tcase_add_test(tc, scatter_after_gather_on_changing_ids_adds_the_new_ids);
  tcase_add_test(tc, tensors_beyond_message_limits);
  tcase_add_test(tc, unavailable_ps_is_named);
  tcase_add_test(tc, safe_calls_retry_until_ps_is_up);
  tcase_add_test(tc, sigterm_lets_in_flight_calls_finish);
  tcase_add_test(tc, calls_meeting_a_sigterm_fail_unavailable);
  suite_add_tcase(s, tc);
  TCase *tt = tcase_create("threads");
  tcase_add_checked_fixture(tt, threads2_setup, teardown);
  tcase_set_timeout(tt, 240);
  tcase_add_test(tt, answered_update_is_seen_by_the_next_read);
  suite_add_tcase(s, tt);

  TCase *te = tcase_create("errors");
  tcase_add_checked_fixture(te, errors_setup, teardown);
  tcase_set_timeout(te, 240);
  tcase_add_test(te, error_uninitialized_read);
  tcase_add_test(te, error_assign_shape);
  tcase_add_test(te, error_dtype_mismatch);
  tcase_add_test(te, error_unknown_variable);
  tcase_add_test(te, error_index_out_of_range);
  tcase_add_test(te, error_request_does_not_parse);
  tcase_add_test(te, error_unknown_method_is_unimplemented_at_once);
  tcase_add_test(te, error_truncated_stream);
  tcase_add_test(te, batch_is_atomic);
  tcase_add_test(te, initialized_state_queries);
  tcase_add_test(te, random_garbage_never_crashes);
  suite_add_tcase(s, te);
  return ps_test_run(s);
}
