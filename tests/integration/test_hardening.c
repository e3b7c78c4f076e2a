/* Hardening of the ps against hostile requests (issue 9): sizes that do
 * not fit, limits, atomic Create/Initialize, the checkpoint key space,
 * Delete, parked updates and names with control characters.  Everything
 * goes through a real ps-server; requests the client library would refuse
 * to send go as raw bytes.  Every error is checked for its code and text,
 * and the state for being unchanged afterwards. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "ps.pb-c.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void start(const char *const *extra) {
  C = harness_start_client(&H, 1, extra);
  ck_assert_ptr_nonnull(C);
}

static void setup(void) {
  start(NULL);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static ps_shape shp1(int64_t a) {
  return (ps_shape){.rank = 1, .dim = {a}};
}
static ps_shape shp2(int64_t a, int64_t b) {
  return (ps_shape){.rank = 2, .dim = {a, b}};
}

static void create(const char *name, ps_dtype dt, ps_shape s, const ps_init_spec *init) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = dt, .shape = s, .init = init};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &v, 1, &st), st);
}

static void assign_f(const char *name, ps_shape s, const float *vals) {
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  if (vals) memcpy(ps_tensor_data(t), vals, ps_tensor_nbytes(t));
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_tensor_destroy(t);
}

static ps_tensor *read1(const char *name, ps_status *st) {
  ps_read r = {.name = name};
  if (ps_client_read(C, 0, &r, 1, st) != 0) {
    ps_tensor_destroy(r.out);
    return NULL;
  }
  return r.out;
}

/* w is float [2,3] = 0..5 */
static void w_setup(void) {
  setup();
  create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  assign_f("w", shp2(2, 3), v);
}

static void assert_w_unchanged(void) {
  ps_status st;
  ps_tensor *r = read1("w", &st);
  ck_assert_msg(r != NULL, "ps stopped serving: %s", st.msg);
  ck_assert_int_eq(r->shape.rank, 2);
  ck_assert_int_eq(r->shape.dim[0], 2);
  for (int i = 0; i < 6; i++)
    ck_assert(((float *)ps_tensor_data(r))[i] == (float)i);
  ps_tensor_destroy(r);
}

static bool exists(const char *name) {
  ps_status st;
  bool init;
  const char *names[1] = {name};
  int rc = ps_client_is_initialized(C, 0, names, 1, &init, &st);
  ck_assert_msg(rc == 0 || rc == PS_NOT_FOUND, "%s", st.msg);
  return rc == 0;
}

/* ---- raw calls ---- */

static uint8_t *pack(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*n + 1);
  ck_assert_ptr_nonnull(b);
  protobuf_c_message_pack(m, b);
  return b;
}

/* Replaces the first @from byte sequence in @b with @to (same length). */
static void patch(uint8_t *b, size_t n, const char *from, const char *to, size_t len) {
  for (size_t i = 0; i + len <= n; i++)
    if (!memcmp(b + i, from, len)) {
      memcpy(b + i, to, len);
      return;
    }
  ck_abort_msg("pattern %s not in the request", from);
}

static ps_status raw_call(const char *method, const void *req, size_t n,
                          ps_rpc_segs *send, bool unary, int64_t timeout_ms) {
  ps_rpc_channel *ch = ps_rpc_channel_create(ps_client_address(C, 0));
  ps_rpc_req r = {.ch = ch,
                  .method = method,
                  .raw_request = req,
                  .raw_len = n,
                  .send = send,
                  .unary_response = unary,
                  .timeout_ms = timeout_ms};
  ps_rpc_run(&r, 1);
  ps_rpc_channel_destroy(ch);
  return r.st;
}

static ps_status raw_msg(const char *method, const ProtobufCMessage *m, bool unary) {
  size_t n;
  uint8_t *b = pack(m, &n);
  ps_status st = raw_call(method, b, n, NULL, unary, 10000);
  free(b);
  return st;
}

/* An Update of one item with @shape (the client library would refuse it)
 * followed by @chunk bytes of data. */
static ps_status raw_update(const char *name, int op, int dtype, const int64_t *shape,
                            size_t rank, int index_dtype, int64_t num_indices,
                            size_t chunk) {
  Paramserver__Update u = PARAMSERVER__UPDATE__INIT;
  u.name = (char *)name;
  u.op = (Paramserver__UpdateOp)op;
  u.dtype = dtype;
  u.shape = (int64_t *)shape;
  u.n_shape = rank;
  u.index_dtype = index_dtype;
  u.num_indices = num_indices;
  Paramserver__Update *up[1] = {&u};
  Paramserver__UpdateRequest req = PARAMSERVER__UPDATE_REQUEST__INIT;
  req.updates = up;
  req.n_updates = 1;
  size_t n;
  uint8_t *b = pack(&req.base, &n);
  ps_buf *data = ps_buf_create(chunk ? chunk : 1, true);
  ps_rpc_segs send = {0};
  if (chunk) ps_rpc_segs_add(&send, data->data, chunk, data);
  ps_status st = raw_call("/paramserver.Ps/Update", b, n, &send, true, 10000);
  ps_rpc_segs_fini(&send);
  ps_buf_unref(data);
  free(b);
  return st;
}

static ps_status raw_gather(const char *name, int index_dtype, int64_t num,
                            size_t chunk) {
  Paramserver__ReadItem it = PARAMSERVER__READ_ITEM__INIT;
  it.name = (char *)name;
  it.gather = true;
  it.index_dtype = index_dtype;
  it.num_indices = num;
  Paramserver__ReadItem *ip[1] = {&it};
  Paramserver__ReadRequest req = PARAMSERVER__READ_REQUEST__INIT;
  req.items = ip;
  req.n_items = 1;
  size_t n;
  uint8_t *b = pack(&req.base, &n);
  ps_buf *data = ps_buf_create(chunk ? chunk : 1, true);
  ps_rpc_segs send = {0};
  if (chunk) ps_rpc_segs_add(&send, data->data, chunk, data);
  ps_status st = raw_call("/paramserver.Ps/Read", b, n, &send, false, 30000);
  ps_rpc_segs_fini(&send);
  ps_buf_unref(data);
  free(b);
  return st;
}

static ps_status raw_snapshot(int64_t id, int64_t hold_ms) {
  Paramserver__SnapshotRequest r = PARAMSERVER__SNAPSHOT_REQUEST__INIT;
  r.id = id;
  r.hold_ms = hold_ms;
  return raw_msg("/paramserver.Ps/Snapshot", &r.base, true);
}

static ps_status raw_release(int64_t id) {
  Paramserver__ReleaseRequest r = PARAMSERVER__RELEASE_REQUEST__INIT;
  r.id = id;
  return raw_msg("/paramserver.Ps/Release", &r.base, true);
}

/* ---- sizes (items 1, 2) ---- */

START_TEST(update_of_a_size_that_does_not_fit_is_refused) {
  /* float [2^62 - 1]: just under 2^64 bytes, with a 100-byte chunk */
  int64_t huge[1] = {4611686018427387903LL};
  ps_status st =
      raw_update("w", PARAMSERVER__UPDATE_OP__ASSIGN, PS_DT_FLOAT, huge, 1, 0, 0, 100);
  PS_ASSERT_STATUS(
      st.code, st, PS_INVALID_ARGUMENT,
      "Assign w: float of shape [4611686018427387903] does not fit in memory");
  st = raw_update("w", PARAMSERVER__UPDATE_OP__ASSIGN, PS_DT_FLOAT, huge, 1, 0, 0,
                  1 << 20);
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  /* 4 TiB fits a size_t but not the default --max-tensor-bytes (memory) */
  int64_t big[1] = {1LL << 40};
  st =
      raw_update("w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, PS_DT_FLOAT, big, 1, 0, 0, 100);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "AssignAdd w: float of shape [1099511627776] is 4398046511104 bytes, "
                   "above the limit of ");
  PS_ASSERT_MSG_HAS(st, "bytes (--max-tensor-bytes)");
  /* 2^61 int64 indices: 2^64 bytes */
  int64_t rows[2] = {1, 3};
  st = raw_update("w", PARAMSERVER__UPDATE_OP__SCATTER_UPDATE, PS_DT_FLOAT, rows, 2,
                  PS_DT_INT64, 1LL << 61, 100);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "ScatterUpdate w: int64 of shape [2305843009213693952] does not fit "
                   "in memory");
  assert_w_unchanged();
}
END_TEST

START_TEST(create_of_a_size_that_does_not_fit_is_refused) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_var_spec v = {
      .name = "big", .dtype = PS_DT_FLOAT, .shape = shp1(1LL << 62), .init = &z};
  ps_status st;
  PS_ASSERT_STATUS(
      ps_client_create_vars(C, 0, &v, 1, &st), st, PS_INVALID_ARGUMENT,
      "Create big: float of shape [4611686018427387904] does not fit in memory");
  v.shape = shp2(1LL << 31, 1LL << 31);
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &v, 1, &st), st, PS_INVALID_ARGUMENT,
                   "Create big: float of shape [2147483648,2147483648] does not fit");
  v.shape = shp1(1LL << 50);
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &v, 1, &st), st, PS_RESOURCE_EXHAUSTED,
                   "Create big: float of shape [1125899906842624] is 4503599627370496 "
                   "bytes, above the limit of ");
  PS_ASSERT_MSG_HAS(st, "(--max-tensor-bytes)");
  ck_assert(!exists("big"));
  /* nothing to initialize: Initialize of everything still works */
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  assert_w_unchanged();
}
END_TEST

START_TEST(huge_gather_is_refused_before_allocating) {
  ps_status st = raw_gather("w", PS_DT_INT64, (1LL << 61) - 1, 100);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Gather w: 2305843009213693951 rows, above the limit of 1048576 per "
                   "gather (--max-gather-rows)");
  st = raw_gather("w", PS_DT_INT32, -5, 0);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, "Gather w: negative index count -5");
  assert_w_unchanged();
}
END_TEST

START_TEST(read_with_too_many_names_is_refused) {
  size_t n = 100001;
  Paramserver__ReadItem *items = calloc(n, sizeof *items);
  Paramserver__ReadItem **ip = calloc(n, sizeof *ip);
  for (size_t i = 0; i < n; i++) {
    paramserver__read_item__init(&items[i]);
    items[i].name = "w";
    ip[i] = &items[i];
  }
  Paramserver__ReadRequest req = PARAMSERVER__READ_REQUEST__INIT;
  req.items = ip;
  req.n_items = n;
  ps_status st = raw_msg("/paramserver.Ps/Read", &req.base, false);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Read: 100001 items, above the limit of 100000 per call "
                   "(--max-read-names)");
  free(ip);
  free(items);
  assert_w_unchanged();
}
END_TEST

START_TEST(integer_arithmetic_wraps) {
  create("i32", PS_DT_INT32, shp1(2), NULL);
  create("i64", PS_DT_INT64, shp1(2), NULL);
  ps_shape s = shp1(2);
  ps_tensor *a = ps_tensor_create(PS_DT_INT32, &s, true);
  ps_tensor *d = ps_tensor_create(PS_DT_INT32, &s, true);
  ps_tensor *b = ps_tensor_create(PS_DT_INT64, &s, true);
  ps_tensor *e = ps_tensor_create(PS_DT_INT64, &s, true);
  int32_t *ap = ps_tensor_data(a), *dp = ps_tensor_data(d);
  int64_t *bp = ps_tensor_data(b), *ep = ps_tensor_data(e);
  ap[0] = INT32_MAX, ap[1] = INT32_MIN, dp[0] = 1, dp[1] = -1;
  bp[0] = INT64_MIN, bp[1] = INT64_MAX, ep[0] = 1, ep[1] = -1;
  ps_update u[4] = {{.name = "i32", .op = PS_ASSIGN, .value = a},
                    {.name = "i32", .op = PS_ASSIGN_ADD, .value = d},
                    {.name = "i64", .op = PS_ASSIGN, .value = b},
                    {.name = "i64", .op = PS_ASSIGN_SUB, .value = e}};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, u, 4, &st), st);
  ps_tensor *r = read1("i32", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(((int32_t *)ps_tensor_data(r))[0], INT32_MIN);
  ck_assert_int_eq(((int32_t *)ps_tensor_data(r))[1], INT32_MAX);
  ps_tensor_destroy(r);
  r = read1("i64", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((int64_t *)ps_tensor_data(r))[0] == INT64_MAX);
  ck_assert(((int64_t *)ps_tensor_data(r))[1] == INT64_MIN);
  ps_tensor_destroy(r);
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_tensor_destroy(d);
  ps_tensor_destroy(e);
}
END_TEST

/* ---- Create / Initialize all or nothing (item 4) ---- */

START_TEST(bad_initializers_are_refused_at_create) {
  ps_init_spec z, bad, neg, cst, lst;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_init_spec_default(&bad, PS_INIT_RANDOM_UNIFORM);
  bad.minval = 2;
  bad.maxval = 1;
  ps_init_spec_default(&neg, PS_INIT_TRUNCATED_NORMAL);
  neg.stddev = -1;
  ps_init_spec_default(&cst, PS_INIT_CONSTANT);
  cst.value = 300;
  double vals[5] = {1, 2, 3, 4, 5};
  ps_init_spec_default(&lst, PS_INIT_CONSTANT);
  lst.values = vals;
  lst.nvalues = 5;
  ps_var_spec v[2] = {
      {.name = "a", .dtype = PS_DT_FLOAT, .shape = shp1(3), .init = &z},
      {.name = "m", .dtype = PS_DT_FLOAT, .shape = shp1(3), .init = &bad}};
  ps_status st;
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, v, 2, &st), st, PS_INVALID_ARGUMENT,
                   "variable m: random_uniform needs minval <= maxval, got minval=2 "
                   "maxval=1");
  v[1].init = &neg;
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, v, 2, &st), st, PS_INVALID_ARGUMENT,
                   "variable m: truncated_normal needs stddev >= 0, got -1");
  v[1].dtype = PS_DT_INT8;
  v[1].init = &cst;
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, v, 2, &st), st, PS_INVALID_ARGUMENT,
                   "variable m: constant 300 is not representable as int8");
  v[1].dtype = PS_DT_FLOAT;
  v[1].init = &lst;
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, v, 2, &st), st, PS_INVALID_ARGUMENT,
                   "variable m: Too many elements provided. Needed at most 3, but "
                   "received 5");
  /* nothing was created, and Initialize of everything keeps working */
  ck_assert(!exists("a"));
  ck_assert(!exists("m"));
  size_t ninit = 0;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, &ninit, &st), st);
  v[1].init = &z;
  PS_ASSERT_OK(ps_client_create_vars(C, 0, v, 2, &st), st);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, &ninit, &st), st);
  ck_assert_uint_eq(ninit, 2);
  assert_w_unchanged();
}
END_TEST

START_TEST(initialize_changes_nothing_when_one_name_fails) {
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  create("a", PS_DT_FLOAT, shp1(3), &one);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  float v[3] = {7, 7, 7};
  assign_f("a", shp1(3), v);
  const char *names[3] = {"a", "w", "nosuch"};
  PS_ASSERT_STATUS(ps_client_initialize(C, 0, names, 3, false, NULL, &st), st,
                   PS_NOT_FOUND, "variable nosuch does not exist on ps/0");
  /* w has no initializer: FAILED_PRECONDITION, a keeps its value */
  PS_ASSERT_STATUS(ps_client_initialize(C, 0, names, 2, false, NULL, &st), st,
                   PS_FAILED_PRECONDITION, "variable w has no initializer on ps/0");
  ps_tensor *r = read1("a", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((float *)ps_tensor_data(r))[0] == 7);
  ps_tensor_destroy(r);
  assert_w_unchanged();
}
END_TEST

/* ---- snapshot gates (item 6) ---- */

/* The ps computes a call's deadline from the timeout the client sent when
 * the call arrived, so it passes there a little after the client gave up:
 * wait that much before opening the gate (not a readiness wait). */
static void past_server_deadline(void) {
  struct timespec d = {0, 500 * 1000000};
  nanosleep(&d, NULL);
}

START_TEST(parked_update_past_its_deadline_is_dropped) {
  ps_status st = raw_snapshot(7, 30000);
  PS_ASSERT_OK(st.code, st);
  ps_client_options o;
  ps_client_options_default(&o);
  o.data_timeout_ms = 1500; /* long enough to arrive and park, also under ASan */
  ps_client *fast = ps_client_create(H.cluster, "ps", &o, &st);
  ck_assert_ptr_nonnull(fast);
  float one[6] = {1, 1, 1, 1, 1, 1};
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  memcpy(ps_tensor_data(t), one, sizeof one);
  ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
  PS_ASSERT_CODE(ps_client_update(fast, 0, &u, 1, &st), st, PS_DEADLINE_EXCEEDED);
  ps_client_destroy(fast);
  ps_tensor_destroy(t);
  past_server_deadline();
  st = raw_release(7);
  PS_ASSERT_OK(st.code, st);
  /* the parked update ran (and was dropped) when the gate opened */
  assert_w_unchanged();
}
END_TEST

typedef struct parked_arg {
  int rc;
  ps_status st;
} parked_arg;

static void *parked_updater(void *arg) {
  parked_arg *a = arg;
  ps_client *c = ps_client_create(H.cluster, "ps", NULL, &a->st);
  if (c == NULL) {
    a->rc = -1;
    return NULL;
  }
  float one[6] = {1, 1, 1, 1, 1, 1};
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  memcpy(ps_tensor_data(t), one, sizeof one);
  ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
  a->rc = ps_client_update(c, 0, &u, 1, &a->st);
  ps_tensor_destroy(t);
  ps_client_destroy(c);
  return NULL;
}

/* SIGTERM while an update waits at a closed snapshot gate: the update is
 * answered UNAVAILABLE at once (not applied when the 30 s hold runs out)
 * and the ps exits 0 well inside its grace period. */
START_TEST(sigterm_answers_updates_parked_at_a_closed_gate) {
  ps_status st;
  ps_task_status ts0;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts0, &st), st);
  st = raw_snapshot(21, 30000);
  PS_ASSERT_OK(st.code, st);
  parked_arg a = {0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, parked_updater, &a), 0);
  /* the Update's header reached the ps (its RPC count went up by 2:
   * Snapshot and Update); its few data bytes follow in the same flight */
  for (int k = 0; k < 1000; k++) {
    ps_task_status ts;
    PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
    if (ts.rpcs >= ts0.rpcs + 3) break; /* + this Status call */
    struct timespec d = {0, 10000000};
    nanosleep(&d, NULL);
  }
  struct timespec b, e;
  clock_gettime(CLOCK_MONOTONIC, &b);
  ck_assert_int_eq(harness_stop(&H), 0); /* SIGTERM; exit status 0 */
  clock_gettime(CLOCK_MONOTONIC, &e);
  pthread_join(t, NULL);
  double secs = (double)(e.tv_sec - b.tv_sec) + (double)(e.tv_nsec - b.tv_nsec) / 1e9;
  ck_assert_msg(secs < 8, "the ps took %.1f s to stop (grace 10 s, hold 30 s)", secs);
  ck_assert_int_eq(a.rc, PS_UNAVAILABLE);
  PS_ASSERT_MSG_HAS(a.st, "shutting down");
}
END_TEST

/* A synchronous local step of 2^63-1 would overflow the accumulator's
 * step when it completes (found by fuzz_rpc_Update). */
START_TEST(sync_local_step_at_int64_max_is_refused) {
  Paramserver__Update u = PARAMSERVER__UPDATE__INIT;
  u.name = "w";
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN_ADD;
  u.dtype = PS_DT_FLOAT;
  int64_t shape[2] = {2, 3};
  u.shape = shape;
  u.n_shape = 2;
  u.replicas_to_aggregate = 1;
  u.sync_local_step = INT64_MAX;
  Paramserver__Update *up[1] = {&u};
  Paramserver__UpdateRequest req = PARAMSERVER__UPDATE_REQUEST__INIT;
  req.updates = up;
  req.n_updates = 1;
  float one[6] = {1, 1, 1, 1, 1, 1};
  req.inline_data.data = (uint8_t *)one;
  req.inline_data.len = sizeof one;
  ps_status st = raw_msg("/paramserver.Ps/Update", &req.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "AssignAdd w: sync_local_step must be in [0, 9223372036854775807), "
                   "got 9223372036854775807");
  assert_w_unchanged();
}
END_TEST

/* ---- the checkpoint key space (item 9) ---- */

static int create_part_on(int task, const char *name, const char *full, ps_shape shape,
                          ps_shape fs, int64_t off, ps_dtype dt, ps_status *st) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_var_spec v = {.name = name,
                   .dtype = dt,
                   .shape = shape,
                   .init = &z,
                   .full_name = full,
                   .full_shape = &fs,
                   .offset = off};
  return ps_client_create_vars(C, task, &v, 1, st);
}

static int create_part(const char *name, const char *full, ps_shape shape, ps_shape fs,
                       int64_t off, ps_dtype dt, ps_status *st) {
  return create_part_on(0, name, full, shape, fs, off, dt, st);
}

START_TEST(key_space_conflicts_are_refused) {
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  PS_ASSERT_OK(create_part("P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
               st);
  /* a plain P beside parts of P */
  ps_var_spec plain = {
      .name = "P", .dtype = PS_DT_FLOAT, .shape = shp2(4, 2), .init = &z};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &plain, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable P: P is the full name of the partitioned variable whose "
                   "part P/part_0 is on ps/0");
  /* the other order: parts of the plain variable w */
  PS_ASSERT_STATUS(
      create_part("w/part_0", "w", shp2(1, 3), shp2(2, 3), 0, PS_DT_FLOAT, &st), st,
      PS_ALREADY_EXISTS, "variable w/part_0: its full name w is a variable on ps/0");
  /* overlapping parts: rows [1, 3) overlap rows [0, 2) */
  PS_ASSERT_STATUS(
      create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 2, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: its elements [2, 6) of P overlap those of part "
      "P/part_0 [0, 4)");
  /* disagreeing full shape, dtype */
  PS_ASSERT_STATUS(
      create_part("P/part_1", "P", shp2(2, 2), shp2(6, 2), 4, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: part of P with dtype float and full shape [6,2], "
      "but its part P/part_0 has dtype float and full shape [4,2]");
  PS_ASSERT_STATUS(
      create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_DOUBLE, &st), st,
      PS_INVALID_ARGUMENT, "but its part P/part_0 has dtype float");
  /* a part outside its full shape */
  PS_ASSERT_STATUS(
      create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 6, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: variable P: elements [6, 6 + 4) are outside shape "
      "[4,2]");
  ck_assert(!exists("P/part_1"));
  ck_assert(!exists("P"));
  /* the right second part works, and a batch with a conflict creates nothing */
  ps_var_spec two[2] = {
      {.name = "Q", .dtype = PS_DT_FLOAT, .shape = shp1(2), .init = &z},
      {.name = "P", .dtype = PS_DT_FLOAT, .shape = shp1(2), .init = &z}};
  PS_ASSERT_CODE(ps_client_create_vars(C, 0, two, 2, &st), st, PS_ALREADY_EXISTS);
  ck_assert(!exists("Q"));
  PS_ASSERT_OK(create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
               st);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  /* a part's shape cannot change, even with validate_shape off */
  ps_shape s3 = shp2(3, 2);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s3, true);
  ps_update u = {
      .name = "P/part_1", .op = PS_ASSIGN, .value = t, .no_validate_shape = true};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &u, 1, &st), st, PS_INVALID_ARGUMENT,
                   "Assign P/part_1: a part of partitioned variable P cannot change its "
                   "shape ([2,2] to [3,2], validate_shape off)");
  ps_tensor_destroy(t);
  ps_tensor *r = read1("P/part_1", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->shape.dim[0], 2);
  ps_tensor_destroy(r);
  assert_w_unchanged();
}
END_TEST

/* ---- Delete ---- */

START_TEST(delete_removes_variables_and_their_slots) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("w/Momentum", PS_DT_FLOAT, shp2(2, 3), &z);
  create("w/Adam_1", PS_DT_FLOAT, shp2(2, 3), &z);
  create("w/dense/kernel", PS_DT_FLOAT, shp1(1), &z);
  create("u", PS_DT_FLOAT, shp1(1), &z);
  ps_status st;
  /* a name that matches nothing: NOT_FOUND, nothing deleted */
  const char *bad[2] = {"w", "nosuch"};
  PS_ASSERT_STATUS(ps_client_delete(C, 0, bad, 2, PS_DELETE_SLOTS, NULL, &st), st,
                   PS_NOT_FOUND, "variable nosuch does not exist on ps/0");
  assert_w_unchanged();
  /* control characters are refused before anything is looked up */
  Paramserver__DeleteRequest dr = PARAMSERVER__DELETE_REQUEST__INIT;
  char *nm[1] = {"wXu"};
  dr.names = nm;
  dr.n_names = 1;
  size_t n;
  uint8_t *b = pack(&dr.base, &n);
  patch(b, n, "wXu", "w\nu", 3);
  st = raw_call("/paramserver.Ps/Delete", b, n, NULL, true, 10000);
  free(b);
  PS_ASSERT_STATUS(
      st.code, st, PS_INVALID_ARGUMENT,
      "Delete: DeleteRequest.names \"w\\x0au\" contains a control character");
  PS_ASSERT_STATUS(ps_client_delete(C, 0, NULL, 0, 0, NULL, &st), st, PS_INVALID_ARGUMENT,
                   "Delete: no variable names given");
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  ck_assert_int_eq(ts.num_vars, 5);
  ck_assert_int_eq(ts.bytes, 24); /* w; the others are not initialized */
  ps_delete_result res;
  const char *w[1] = {"w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, PS_DELETE_SLOTS, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 3);
  ck_assert_str_eq(res.deleted[0], "w");
  ck_assert_str_eq(res.deleted[1], "w/Adam_1");
  ck_assert_str_eq(res.deleted[2], "w/Momentum");
  ps_delete_result_free(&res);
  ck_assert(!exists("w"));
  ck_assert(!exists("w/Momentum"));
  ck_assert(exists("w/dense/kernel")); /* not a slot: two more path parts */
  ck_assert(exists("u"));
  ck_assert_ptr_null(read1("w", &st));
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "variable w does not exist on ps/0");
  ps_var_info *vi;
  PS_ASSERT_OK(ps_client_list(C, 0, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 2);
  ps_client_free_var_info(vi, n);
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  ck_assert_int_eq(ts.num_vars, 2);
  ck_assert_int_eq(ts.bytes, 0); /* w's value was freed */
  /* missing_ok reports what matched nothing */
  const char *two[2] = {"u", "w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, two, 2, PS_DELETE_MISSING_OK, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 1);
  ck_assert_uint_eq(res.nmissing, 1);
  ck_assert_str_eq(res.missing[0], "w");
  ps_delete_result_free(&res);
  /* a deleted name can be created again, with another shape */
  create("w", PS_DT_DOUBLE, shp1(4), &z);
  PS_ASSERT_OK(ps_client_initialize(C, 0, w, 1, false, NULL, &st), st);
  ps_tensor *r = read1("w", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->dtype, PS_DT_DOUBLE);
  ps_tensor_destroy(r);
}
END_TEST

START_TEST(delete_removes_the_parts_of_a_partitioned_variable) {
  ps_status st;
  PS_ASSERT_OK(create_part("P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
               st);
  PS_ASSERT_OK(create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
               st);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("P/part_0/Momentum", PS_DT_FLOAT, shp2(2, 2), &z);
  ps_delete_result res;
  const char *p[1] = {"P"};
  PS_ASSERT_OK(ps_client_delete(C, 0, p, 1, PS_DELETE_SLOTS, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 3);
  ck_assert_str_eq(res.deleted[0], "P/part_0");
  ck_assert_str_eq(res.deleted[1], "P/part_0/Momentum");
  ck_assert_str_eq(res.deleted[2], "P/part_1");
  ps_delete_result_free(&res);
  /* now a plain P is fine */
  create("P", PS_DT_FLOAT, shp2(4, 2), &z);
  assert_w_unchanged();
}
END_TEST

typedef struct churn {
  ps_client *c;
  pthread_mutex_t mu;
  int errors_other; /* codes other than 0 and NOT_FOUND (under mu) */
  char last[PS_STATUS_MSG_MAX];
  atomic_int stop;
} churn;

static void *churn_main(void *arg) {
  churn *ch = arg;
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  while (!atomic_load(&ch->stop)) {
    ps_status st;
    ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
    int rc = ps_client_update(ch->c, 0, &u, 1, &st);
    ps_read r = {.name = "w"};
    int rc2 = ps_client_read(ch->c, 0, &r, 1, &st);
    ps_tensor_destroy(r.out);
    if ((rc && rc != PS_NOT_FOUND && rc != PS_FAILED_PRECONDITION) ||
        (rc2 && rc2 != PS_NOT_FOUND && rc2 != PS_FAILED_PRECONDITION)) {
      pthread_mutex_lock(&ch->mu);
      ch->errors_other++;
      snprintf(ch->last, sizeof ch->last, "%s", st.msg);
      pthread_mutex_unlock(&ch->mu);
    }
  }
  ps_tensor_destroy(t);
  return NULL;
}

START_TEST(delete_is_safe_while_other_calls_use_the_variable) {
  ps_status st;
  churn ch = {.mu = PTHREAD_MUTEX_INITIALIZER};
  ch.c = ps_client_create(H.cluster, "ps", NULL, &st);
  ck_assert_ptr_nonnull(ch.c);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, churn_main, &ch);
  const char *w[1] = {"w"};
  for (int k = 0; k < 40; k++) {
    PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, 0, NULL, &st), st);
    create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
    assign_f("w", shp2(2, 3), NULL);
  }
  atomic_store(&ch.stop, 1);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  ps_client_destroy(ch.c);
  ck_assert_msg(ch.errors_other == 0, "%d unexpected errors, last: %s", ch.errors_other,
                ch.last);
  PS_ASSERT_OK(ps_client_status(C, 0, &(ps_task_status){0}, &st), st);
}
END_TEST

typedef struct sync_call {
  ps_client *c;
  int rc;
  ps_status st;
} sync_call;

static void *sync_main(void *arg) {
  sync_call *sc = arg;
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  ps_update u = {
      .name = "w", .op = PS_ASSIGN_ADD, .value = t, .replicas_to_aggregate = 2};
  sc->rc = ps_client_update(sc->c, 0, &u, 1, &sc->st);
  ps_tensor_destroy(t);
  return NULL;
}

START_TEST(delete_fails_waiting_synchronous_updates) {
  sync_call sc = {0};
  ps_status st;
  sc.c = ps_client_create(H.cluster, "ps", NULL, &st);
  pthread_t th;
  pthread_create(&th, NULL, sync_main, &sc);
  /* wait until the update waits in w's accumulator: the value stays the
   * same, so poll the ps's call counter instead (bounded) */
  ps_task_status ts0, ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts0, &st), st);
  for (int i = 0; i < 500; i++) {
    PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
    if (ts.rpcs >= ts0.rpcs + 2) break; /* this Status and the Update */
    struct timespec d = {0, 10000000};
    nanosleep(&d, NULL);
  }
  const char *w[1] = {"w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, 0, NULL, &st), st);
  pthread_join(th, NULL);
  ck_assert_int_eq(sc.rc, PS_NOT_FOUND);
  ck_assert(strstr(sc.st.msg, "variable w does not exist on ps/0") ||
            strstr(sc.st.msg, "variable w was deleted on ps/0: synchronous step"));
  ps_client_destroy(sc.c);
}
END_TEST

START_TEST(psctl_rm) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("w/Momentum", PS_DT_FLOAT, shp2(2, 3), &z);
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm w", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  ck_assert_msg(strstr(out, "deleted w on ps/0\ndeleted w/Momentum on ps/0\n"), "%s",
                out);
  free(out);
  ck_assert(!exists("w"));
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm nosuch", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 1);
  ck_assert_msg(strstr(out, "psctl: rm: variable nosuch not found on any ps task"), "%s",
                out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm", harness_prog("PSCTL", "psctl"), H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 2);
  ck_assert_msg(strstr(out, "psctl: rm needs at least one variable name"), "%s", out);
  free(out);
}
END_TEST

static void two_ps_setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

START_TEST(psctl_rm_on_every_ps_task) {
  ps_status st;
  ps_var_spec a = {.name = "a", .dtype = PS_DT_FLOAT, .shape = shp1(1)};
  ps_var_spec b = {.name = "b", .dtype = PS_DT_FLOAT, .shape = shp1(1)};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &a, 1, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(C, 1, &b, 1, &st), st);
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm a b", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  ck_assert_msg(strstr(out, "deleted a on ps/0\n") && strstr(out, "deleted b on ps/1\n"),
                "%s", out);
  free(out);
  ps_var_info *vi;
  size_t n;
  for (int t = 0; t < 2; t++) {
    PS_ASSERT_OK(ps_client_list(C, t, &vi, &n, &st), st);
    ck_assert_uint_eq(n, 0);
    ps_client_free_var_info(vi, n);
  }
  ck_assert_int_eq(harness_run(cmd, &out), 1);
  ck_assert_msg(strstr(out, "psctl: rm: variable a not found on any ps task") &&
                    strstr(out, "psctl: rm: variable b not found on any ps task"),
                "%s", out);
  free(out);
}
END_TEST

/* ---- names (item 10) ---- */

START_TEST(names_with_control_characters_are_refused) {
  /* Create "w\0evil": protobuf-c would hand the ps "w" */
  Paramserver__VariableSpec v = PARAMSERVER__VARIABLE_SPEC__INIT;
  v.name = "wXevil";
  v.dtype = PS_DT_FLOAT;
  int64_t dims[1] = {3};
  v.shape = dims;
  v.n_shape = 1;
  Paramserver__VariableSpec *vp[1] = {&v};
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = vp;
  cr.n_vars = 1;
  size_t n;
  uint8_t *b = pack(&cr.base, &n);
  patch(b, n, "wXevil", "w\0evil", 6);
  ps_status st = raw_call("/paramserver.Ps/Create", b, n, NULL, true, 10000);
  free(b);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Create: VariableSpec.name \"w\\x00evil\" contains a control "
                   "character (NUL or 0x01-0x1f, 0x7f)");
  /* Read of "w\0evil" must not read w */
  Paramserver__ReadItem it = PARAMSERVER__READ_ITEM__INIT;
  it.name = "wXevil";
  Paramserver__ReadItem *ip[1] = {&it};
  Paramserver__ReadRequest rr = PARAMSERVER__READ_REQUEST__INIT;
  rr.items = ip;
  rr.n_items = 1;
  b = pack(&rr.base, &n);
  patch(b, n, "wXevil", "w\0evil", 6);
  st = raw_call("/paramserver.Ps/Read", b, n, NULL, false, 10000);
  free(b);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Read: ReadItem.name \"w\\x00evil\" contains a control character");
  /* a slot name with an escape character, nested in an Update */
  st = raw_update("w\x1b[31m", PARAMSERVER__UPDATE_OP__ASSIGN, PS_DT_FLOAT,
                  (int64_t[]){2, 3}, 2, 0, 0, 24);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Update: Update.name \"w\\x1b[31m\" contains a control character");
  /* Initialize, IsInitialized with DEL */
  Paramserver__NamesRequest nr = PARAMSERVER__NAMES_REQUEST__INIT;
  char *names[1] = {"w\x7f"};
  nr.names = names;
  nr.n_names = 1;
  st = raw_msg("/paramserver.Ps/IsInitialized", &nr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "IsInitialized: NamesRequest.names \"w\\x7f\" contains a control");
  /* over-long names */
  char *longname = malloc(5001);
  memset(longname, 'a', 5000);
  longname[5000] = '\0';
  v.name = longname;
  ps_var_spec spec = {.name = longname, .dtype = PS_DT_FLOAT, .shape = shp1(1)};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 0, &spec, 1, &st), st, PS_INVALID_ARGUMENT,
                   "Create: VariableSpec.name is 5000 bytes; the limit is 4096");
  longname[4096] = '\0'; /* 4096 is fine */
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &spec, 1, &st), st);
  free(longname);
  assert_w_unchanged();
  ps_var_info *vi;
  PS_ASSERT_OK(ps_client_list(C, 0, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 2);
  ps_client_free_var_info(vi, n);
}
END_TEST

/* ---- limits set by flags ---- */

static void limits_setup(void) {
  static const char *const extra[] = {"--max-tensor-bytes",
                                      "65536",
                                      "--max-read-names",
                                      "4",
                                      "--max-gather-rows",
                                      "8",
                                      NULL};
  start(extra);
  create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  assign_f("w", shp2(2, 3), v);
}

START_TEST(limits_from_flags) {
  ps_status st;
  /* a variable of 65540 bytes */
  ps_var_spec v = {.name = "big", .dtype = PS_DT_FLOAT, .shape = shp1(16385)};
  PS_ASSERT_STATUS(
      ps_client_create_vars(C, 0, &v, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Create big: float of shape [16385] is 65540 bytes, above the limit of "
      "65536 bytes (--max-tensor-bytes)");
  ck_assert(!exists("big"));
  /* 5 names */
  ps_read r[5] = {
      {.name = "w"}, {.name = "w"}, {.name = "w"}, {.name = "w"}, {.name = "w"}};
  PS_ASSERT_STATUS(ps_client_read(C, 0, r, 5, &st), st, PS_RESOURCE_EXHAUSTED,
                   "Read: 5 items, above the limit of 4 per call (--max-read-names)");
  PS_ASSERT_OK(ps_client_read(C, 0, r, 4, &st), st);
  for (int i = 0; i < 4; i++)
    ps_tensor_destroy(r[i].out);
  /* 9 rows */
  ps_shape s9 = shp1(9);
  ps_tensor *idx = ps_tensor_create(PS_DT_INT64, &s9, true);
  ps_read g = {.name = "w", .indices = idx};
  PS_ASSERT_STATUS(
      ps_client_read(C, 0, &g, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Gather w: 9 rows, above the limit of 8 per gather (--max-gather-rows)");
  ps_tensor_destroy(idx);
  /* 8 rows of 16 KiB: a 128 KiB response */
  create("wide", PS_DT_FLOAT, shp2(4, 4096), NULL);
  assign_f("wide", shp2(4, 4096), NULL);
  ps_shape s8 = shp1(8);
  idx = ps_tensor_create(PS_DT_INT64, &s8, true);
  ps_read g8 = {.name = "wide", .indices = idx};
  PS_ASSERT_STATUS(
      ps_client_read(C, 0, &g8, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Gather wide: float of shape [8,4096] is 131072 bytes, above the limit "
      "of 65536 bytes (--max-tensor-bytes)");
  ps_tensor_destroy(idx);
  /* two values of 40000 bytes: each fits, together they do not */
  create("a", PS_DT_FLOAT, shp1(10000), NULL);
  create("b", PS_DT_FLOAT, shp1(10000), NULL);
  ps_shape s1 = shp1(10000);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s1, true);
  ps_update u2[2] = {{.name = "a", .op = PS_ASSIGN, .value = t},
                     {.name = "b", .op = PS_ASSIGN, .value = t}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, u2, 2, &st), st, PS_RESOURCE_EXHAUSTED,
                   "Update: the tensors of the request total more than the limit of "
                   "65536 bytes (--max-tensor-bytes)");
  PS_ASSERT_OK(ps_client_update(C, 0, u2, 1, &st), st);
  ps_tensor_destroy(t);
  const char *ab[2] = {"a", "b"};
  bool init[2];
  PS_ASSERT_OK(ps_client_is_initialized(C, 0, ab, 2, init, &st), st);
  ck_assert(init[0] && !init[1]);
  assert_w_unchanged();
}
END_TEST

typedef struct parked_call {
  ps_client *c;
  const char *name;
  int rc;
  ps_status st;
} parked_call;

static void *parked_main(void *arg) {
  parked_call *pc = arg;
  ps_shape s = shp1(16000); /* 64000 bytes */
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  ps_update u = {.name = pc->name, .op = PS_ASSIGN_ADD, .value = t};
  pc->rc = ps_client_update(pc->c, 0, &u, 1, &pc->st);
  ps_tensor_destroy(t);
  return NULL;
}

/* Every request's list is bounded by --max-read-names before it is
 * unpacked (a 32 MiB header could hold millions of items). */
START_TEST(every_request_list_is_bounded) {
  char *names[5] = {"a", "b", "c", "d", "e"};
  Paramserver__NamesRequest nr = PARAMSERVER__NAMES_REQUEST__INIT;
  nr.names = names;
  nr.n_names = 5;
  ps_status st = raw_msg("/paramserver.Ps/IsInitialized", &nr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "IsInitialized: 5 items, above the limit of 4 per call "
                   "(--max-read-names)");
  Paramserver__DeleteRequest dr = PARAMSERVER__DELETE_REQUEST__INIT;
  dr.names = names;
  dr.n_names = 5;
  st = raw_msg("/paramserver.Ps/Delete", &dr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Delete: 5 items, above the limit of 4");
  Paramserver__VariableSpec vs[5];
  Paramserver__VariableSpec *vp[5];
  int64_t dim = 1;
  for (int i = 0; i < 5; i++) {
    paramserver__variable_spec__init(&vs[i]);
    vs[i].name = names[i];
    vs[i].dtype = PS_DT_FLOAT;
    vs[i].shape = &dim;
    vs[i].n_shape = 1;
    vp[i] = &vs[i];
  }
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = vp;
  cr.n_vars = 5;
  st = raw_msg("/paramserver.Ps/Create", &cr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Create: 5 items, above the limit of 4 per call");
  /* nothing was created; four are fine */
  ck_assert(!exists("a"));
  cr.n_vars = 4;
  st = raw_msg("/paramserver.Ps/Create", &cr.base, true);
  PS_ASSERT_OK(st.code, st);
  ck_assert(exists("a"));
}
END_TEST

START_TEST(parked_updates_are_bounded) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("a", PS_DT_FLOAT, shp1(16000), &z);
  create("b", PS_DT_FLOAT, shp1(16000), &z);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  PS_ASSERT_OK((st = raw_snapshot(9, 60000)).code, st);
  ps_client_options o;
  ps_client_options_default(&o);
  o.data_timeout_ms = 1500;
  parked_call pc[2] = {{.name = "a"}, {.name = "b"}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    pc[i].c = ps_client_create(H.cluster, "ps", &o, &st);
    pthread_create(&th[i], NULL, parked_main, &pc[i]);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  /* one parked (then missed its deadline), one refused: 128000 bytes > 65536 */
  int refused = pc[0].rc == PS_RESOURCE_EXHAUSTED ? 0 : 1;
  ck_assert_int_eq(pc[refused].rc, PS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(pc[refused].st.msg,
                       "ps/0: updates waiting for snapshot 9 to end hold "
                       "64000 bytes; this one (64000 bytes) would pass the "
                       "limit of 65536 bytes (--max-tensor-bytes)"),
                "%s", pc[refused].st.msg);
  ck_assert_int_eq(pc[1 - refused].rc, PS_DEADLINE_EXCEEDED);
  past_server_deadline();
  PS_ASSERT_OK((st = raw_release(9)).code, st);
  for (int i = 0; i < 2; i++) {
    ps_client_destroy(pc[i].c);
    ps_tensor *r = read1(pc[i].name, &st);
    ck_assert_ptr_nonnull(r);
    ck_assert(((float *)ps_tensor_data(r))[0] == 0); /* neither applied */
    ps_tensor_destroy(r);
  }
}
END_TEST

static void hold_setup(void) {
  static const char *const extra[] = {"--max-hold-ms", "300", NULL};
  start(extra);
  create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  assign_f("w", shp2(2, 3), v);
}

START_TEST(hold_is_capped_by_max_hold_ms) {
  ps_status st = raw_snapshot(11, 1000000000000LL);
  PS_ASSERT_OK(st.code, st);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  float one[6] = {1, 1, 1, 1, 1, 1};
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  memcpy(ps_tensor_data(t), one, sizeof one);
  ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
  /* parks, and runs when the gate reopens after 300 ms, not 10^12 */
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  ck_assert_msg(secs < 20, "the update waited %.1f s", secs);
  ps_tensor_destroy(t);
  ps_tensor *r = read1("w", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((float *)ps_tensor_data(r))[5] == 6);
  ps_tensor_destroy(r);
}
END_TEST

/* ---- saves keep working (item 9) ---- */

static char ckdir[64];

static void save_setup(void) {
  snprintf(ckdir, sizeof ckdir, "/tmp/ps-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(ckdir));
  const char *extra[] = {"--checkpoint-dir", ckdir, NULL};
  start(extra);
}

static void save_teardown(void) {
  char cmd[128], *out = NULL;
  snprintf(cmd, sizeof cmd, "rm -rf %s", ckdir);
  harness_run(cmd, &out);
  free(out);
  teardown();
}

static void two_ps_save_setup(void) {
  snprintf(ckdir, sizeof ckdir, "/tmp/ps-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(ckdir));
  const char *extra[] = {"--checkpoint-dir", ckdir, NULL};
  C = harness_start_client(&H, 2, extra);
  ck_assert_ptr_nonnull(C);
}

/* The checkpoint key space spans the ps tasks: one merged checkpoint holds
 * the shards of all of them, so a key on two tasks broke every save. */
START_TEST(key_space_conflicts_across_tasks_are_refused) {
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  PS_ASSERT_OK(
      create_part_on(0, "P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
      st);
  ps_var_spec w = {.name = "w", .dtype = PS_DT_FLOAT, .shape = shp2(2, 3), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &w, 1, &st), st);
  /* a plain P on ps/1 beside the part of P on ps/0 */
  ps_var_spec plain = {
      .name = "P", .dtype = PS_DT_FLOAT, .shape = shp2(4, 2), .init = &z};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 1, &plain, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable P: P is the full name of the partitioned variable whose "
                   "part P/part_0 is on ps/0");
  /* parts of the plain w of ps/0 */
  PS_ASSERT_STATUS(
      create_part_on(1, "w/part_0", "w", shp2(1, 3), shp2(2, 3), 0, PS_DT_FLOAT, &st), st,
      PS_ALREADY_EXISTS, "variable w/part_0: its full name w is a variable on ps/0");
  /* the same name on both */
  PS_ASSERT_STATUS(ps_client_create_vars(C, 1, &w, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable w: a variable of that name is on ps/0; creating it on "
                   "ps/1 too would put it twice in every checkpoint");
  /* overlapping parts, disagreeing full shape or dtype */
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 2, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: its elements [2, 6) of P overlap those of "
      "part P/part_0 [0, 4) on ps/0");
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(6, 2), 4, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: part of P with dtype float and full shape "
      "[6,2], but its part P/part_0 on ps/0 has dtype float and full "
      "shape [4,2]");
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_INT32, &st), st,
      PS_INVALID_ARGUMENT, "but its part P/part_0 on ps/0 has dtype float");
  /* nothing reached ps/1 */
  ps_var_info *vi;
  size_t n;
  PS_ASSERT_OK(ps_client_list(C, 1, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 0);
  ps_client_free_var_info(vi, n);
  /* the right second part: List tells whose part it is */
  PS_ASSERT_OK(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
      st);
  PS_ASSERT_OK(ps_client_list(C, 1, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(vi[0].full_name, "P");
  ck_assert_int_eq(vi[0].offset, 4);
  ck_assert_int_eq(vi[0].full_shape.rank, 2);
  ck_assert_int_eq(vi[0].full_shape.dim[0], 4);
  ps_client_free_var_info(vi, n);
  /* and the cluster saves and restores */
  for (int t = 0; t < 2; t++)
    PS_ASSERT_OK(ps_client_initialize(C, t, NULL, 0, false, NULL, &st), st);
  char *written = NULL;
  PS_ASSERT_OK(ps_client_save(C, "both", NULL, &written, NULL, &st), st);
  free(written);
  size_t nr = 0;
  PS_ASSERT_OK(ps_client_restore(C, "both", &nr, &st), st);
  ck_assert_uint_eq(nr, 3);
  /* a raw Create bypasses the client: R on ps/1, a part of R on ps/0.
   * Merge then names the duplicate key, and removing the part mends it. */
  ps_var_spec r = {.name = "R", .dtype = PS_DT_FLOAT, .shape = shp1(4), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 1, &r, 1, &st), st);
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  in.type = "zeros";
  in.full_name = "R";
  int64_t full[1] = {4}, part[1] = {2};
  in.full_shape = full;
  in.n_full_shape = 1;
  Paramserver__VariableSpec vs = PARAMSERVER__VARIABLE_SPEC__INIT;
  vs.name = "R/part_0";
  vs.dtype = PS_DT_FLOAT;
  vs.shape = part;
  vs.n_shape = 1;
  vs.initializer = &in;
  Paramserver__VariableSpec *vp[1] = {&vs};
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = vp;
  cr.n_vars = 1;
  uint8_t *b = pack(&cr.base, &n);
  st = raw_call("/paramserver.Ps/Create", b, n, NULL, true, 10000);
  free(b);
  PS_ASSERT_OK(st.code, st);
  for (int t = 0; t < 2; t++)
    PS_ASSERT_OK(ps_client_initialize(C, t, NULL, 0, true, NULL, &st), st);
  PS_ASSERT_STATUS(ps_client_save(C, "dup", NULL, NULL, NULL, &st), st,
                   PS_INVALID_ARGUMENT,
                   "Duplicate tensor keyed by R encountered, when merging prefix: ");
  PS_ASSERT_MSG_HAS(st, "dup_temp/part-0000");
  const char *rp[1] = {"R/part_0"};
  PS_ASSERT_OK(ps_client_delete(C, 0, rp, 1, 0, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(C, "dup", NULL, NULL, NULL, &st), st);
  /* a task that is down is not checked, and creating goes on */
  harness_kill(&H, 1);
  ps_var_spec u = {.name = "u", .dtype = PS_DT_FLOAT, .shape = shp1(1), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &u, 1, &st), st);
}
END_TEST

START_TEST(save_works_after_refused_conflicts_and_deletes) {
  ps_status st;
  PS_ASSERT_OK(create_part("P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
               st);
  PS_ASSERT_OK(create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
               st);
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  ps_var_spec plain = {
      .name = "P", .dtype = PS_DT_FLOAT, .shape = shp2(4, 2), .init = &one};
  PS_ASSERT_CODE(ps_client_create_vars(C, 0, &plain, 1, &st), st, PS_ALREADY_EXISTS);
  PS_ASSERT_CODE(
      create_part("P/part_2", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  ps_save_options so = {0};
  char *written = NULL;
  PS_ASSERT_OK(ps_client_save(C, "one", &so, &written, NULL, &st), st);
  free(written);
  /* P as parts is gone; a plain P of ones replaces it and saves too */
  const char *p[1] = {"P"};
  PS_ASSERT_OK(ps_client_delete(C, 0, p, 1, PS_DELETE_SLOTS, NULL, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &plain, 1, &st), st);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, true, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(C, "two", &so, &written, NULL, &st), st);
  free(written);
  /* the first checkpoint's P (zeros, from the parts) restores into it */
  size_t n = 0;
  PS_ASSERT_OK(ps_client_restore(C, "one", &n, &st), st);
  ck_assert_uint_eq(n, 1);
  ps_tensor *r = read1("P", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((float *)ps_tensor_data(r))[7] == 0);
  ps_tensor_destroy(r);
}
END_TEST

/* Shutdown with an over-long reason is refused and the ps keeps serving;
 * a good one is answered, then the ps stops and exits 0 (teardown). */
START_TEST(shutdown_reason_is_bounded) {
  char reason[300];
  memset(reason, 'r', sizeof reason - 1);
  reason[sizeof reason - 1] = '\0';
  Paramserver__ShutdownRequest r = PARAMSERVER__SHUTDOWN_REQUEST__INIT;
  r.reason = reason;
  ps_status st = raw_msg("/paramserver.Ps/Shutdown", &r.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Shutdown: the reason is 299 bytes, more than 256");
  Paramserver__StatusRequest sr = PARAMSERVER__STATUS_REQUEST__INIT;
  st = raw_msg("/paramserver.Ps/Status", &sr.base, true);
  PS_ASSERT_OK(st.code, st);
  r.reason = "test";
  st = raw_msg("/paramserver.Ps/Shutdown", &r.base, true);
  PS_ASSERT_OK(st.code, st);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hardening");
  TCase *tc = tcase_create("requests");
  tcase_add_checked_fixture(tc, w_setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, update_of_a_size_that_does_not_fit_is_refused);
  tcase_add_test(tc, create_of_a_size_that_does_not_fit_is_refused);
  tcase_add_test(tc, huge_gather_is_refused_before_allocating);
  tcase_add_test(tc, read_with_too_many_names_is_refused);
  tcase_add_test(tc, integer_arithmetic_wraps);
  tcase_add_test(tc, bad_initializers_are_refused_at_create);
  tcase_add_test(tc, initialize_changes_nothing_when_one_name_fails);
  tcase_add_test(tc, parked_update_past_its_deadline_is_dropped);
  tcase_add_test(tc, sync_local_step_at_int64_max_is_refused);
  tcase_add_test(tc, sigterm_answers_updates_parked_at_a_closed_gate);
  tcase_add_test(tc, key_space_conflicts_are_refused);
  tcase_add_test(tc, delete_removes_variables_and_their_slots);
  tcase_add_test(tc, delete_removes_the_parts_of_a_partitioned_variable);
  tcase_add_test(tc, delete_is_safe_while_other_calls_use_the_variable);
  tcase_add_test(tc, delete_fails_waiting_synchronous_updates);
  tcase_add_test(tc, psctl_rm);
  tcase_add_test(tc, names_with_control_characters_are_refused);
  tcase_add_test(tc, shutdown_reason_is_bounded);
  suite_add_tcase(s, tc);
  TCase *tl = tcase_create("limits");
  tcase_add_checked_fixture(tl, limits_setup, teardown);
  tcase_set_timeout(tl, 120);
  tcase_add_test(tl, limits_from_flags);
  tcase_add_test(tl, parked_updates_are_bounded);
  tcase_add_test(tl, every_request_list_is_bounded);
  suite_add_tcase(s, tl);
  TCase *th = tcase_create("hold");
  tcase_add_checked_fixture(th, hold_setup, teardown);
  tcase_set_timeout(th, 120);
  tcase_add_test(th, hold_is_capped_by_max_hold_ms);
  suite_add_tcase(s, th);
  TCase *t2 = tcase_create("two_ps");
  tcase_add_checked_fixture(t2, two_ps_setup, teardown);
  tcase_set_timeout(t2, 120);
  tcase_add_test(t2, psctl_rm_on_every_ps_task);
  suite_add_tcase(s, t2);
  TCase *ts = tcase_create("save");
  tcase_add_checked_fixture(ts, save_setup, save_teardown);
  tcase_set_timeout(ts, 120);
  tcase_add_test(ts, save_works_after_refused_conflicts_and_deletes);
  suite_add_tcase(s, ts);
  TCase *t2s = tcase_create("two_ps_save");
  tcase_add_checked_fixture(t2s, two_ps_save_setup, save_teardown);
  tcase_set_timeout(t2s, 120);
  tcase_add_test(t2s, key_space_conflicts_across_tasks_are_refused);
  suite_add_tcase(s, t2s);
  return ps_test_run(s);
}
