/* Hardening of the ps against hostile requests (issue 9): sizes that do
 * not fit, limits, atomic Create/Initialize, the checkpoint key space,
 * Delete, parked updates and names with control characters.  Everything
 * goes through a real ps-server; requests the client library would refuse
 * to send go as raw bytes.  Every error is checked for its code and text,
 * and the state for being unchanged afterwards.
 *
 * Delete is tested in test_hardening_delete.c, the limits set by flags in
 * test_hardening_limits.c, saves in test_hardening_save.c (one program:
 * integration_hardening).
 */
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
#include "test_hardening_internal.h"
#include "tests/support/assert.h"

ps_harness H;
ps_client *C;

void start(const char *const *extra) {
  C = harness_start_client(&H, 1, extra);
  ck_assert_ptr_nonnull(C);
}

static void setup(void) {
  start(NULL);
}

void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

ps_shape shp1(int64_t a) {
  return (ps_shape){.rank = 1, .dim = {a}};
}
ps_shape shp2(int64_t a, int64_t b) {
  return (ps_shape){.rank = 2, .dim = {a, b}};
}

void create(const char *name, ps_dtype dt, ps_shape s, const ps_init_spec *init) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = dt, .shape = s, .init = init};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &v, 1, &st), st);
}

void assign_f(const char *name, ps_shape s, const float *vals) {
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  if (vals) memcpy(ps_tensor_data(t), vals, ps_tensor_nbytes(t));
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_tensor_destroy(t);
}

ps_tensor *read1(const char *name, ps_status *st) {
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

void assert_w_unchanged(void) {
  ps_status st;
  ps_tensor *r = read1("w", &st);
  ck_assert_msg(r != NULL, "ps stopped serving: %s", st.msg);
  ck_assert_int_eq(r->shape.rank, 2);
  ck_assert_int_eq(r->shape.dim[0], 2);
  for (int i = 0; i < 6; i++)
    ck_assert(((float *)ps_tensor_data(r))[i] == (float)i);
  ps_tensor_destroy(r);
}

bool exists(const char *name) {
  ps_status st;
  bool init;
  const char *names[1] = {name};
  int rc = ps_client_is_initialized(C, 0, names, 1, &init, &st);
  ck_assert_msg(rc == 0 || rc == PS_NOT_FOUND, "%s", st.msg);
  return rc == 0;
}

/* ---- raw calls ---- */

uint8_t *pack_msg(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*n + 1);
  ck_assert_ptr_nonnull(b);
  protobuf_c_message_pack(m, b);
  return b;
}

/* Replaces the first @from byte sequence in @b with @to (same length). */
void patch(uint8_t *b, size_t n, const char *from, const char *to, size_t len) {
  for (size_t i = 0; i + len <= n; i++)
    if (!memcmp(b + i, from, len)) {
      memcpy(b + i, to, len);
      return;
    }
  ck_abort_msg("pattern %s not in the request", from);
}

ps_status raw_call(const char *method, const void *req, size_t n, ps_rpc_segs *send,
                   bool unary, int64_t timeout_ms) {
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

ps_status raw_msg(const char *method, const ProtobufCMessage *m, bool unary) {
  size_t n;
  uint8_t *b = pack_msg(m, &n);
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
  uint8_t *b = pack_msg(&req.base, &n);
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
  uint8_t *b = pack_msg(&req.base, &n);
  ps_buf *data = ps_buf_create(chunk ? chunk : 1, true);
  ps_rpc_segs send = {0};
  if (chunk) ps_rpc_segs_add(&send, data->data, chunk, data);
  ps_status st = raw_call("/paramserver.Ps/Read", b, n, &send, false, 30000);
  ps_rpc_segs_fini(&send);
  ps_buf_unref(data);
  free(b);
  return st;
}

ps_status raw_snapshot(int64_t id, int64_t hold_ms) {
  Paramserver__SnapshotRequest r = PARAMSERVER__SNAPSHOT_REQUEST__INIT;
  r.id = id;
  r.hold_ms = hold_ms;
  return raw_msg("/paramserver.Ps/Snapshot", &r.base, true);
}

ps_status raw_release(int64_t id) {
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
void past_server_deadline(void) {
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
  PS_ASSERT_STATUS(a.rc, a.st, PS_UNAVAILABLE, "shutting down");
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

int create_part_on(int task, const char *name, const char *full, ps_shape shape,
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

int create_part(const char *name, const char *full, ps_shape shape, ps_shape fs,
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
  uint8_t *b = pack_msg(&cr.base, &n);
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
  b = pack_msg(&rr.base, &n);
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
  tcase_add_test(tc, names_with_control_characters_are_refused);
  tcase_add_test(tc, shutdown_reason_is_bounded);
  suite_add_tcase(s, tc);
  TCase *tl = tcase_create("limits");
  tcase_add_checked_fixture(tl, limits_setup, teardown);
  tcase_set_timeout(tl, 120);
  suite_add_tcase(s, tl);
  TCase *th = tcase_create("hold");
  tcase_add_checked_fixture(th, hold_setup, teardown);
  tcase_set_timeout(th, 120);
  hardening_limits_tests(tl, th);
  suite_add_tcase(s, th);
  TCase *t2 = tcase_create("two_ps");
  tcase_add_checked_fixture(t2, two_ps_setup, teardown);
  tcase_set_timeout(t2, 120);
  hardening_delete_tests(tc, t2);
  suite_add_tcase(s, t2);
  TCase *ts = tcase_create("save");
  tcase_add_checked_fixture(ts, save_setup, save_teardown);
  tcase_set_timeout(ts, 120);
  suite_add_tcase(s, ts);
  TCase *t2s = tcase_create("two_ps_save");
  tcase_add_checked_fixture(t2s, two_ps_save_setup, save_teardown);
  tcase_set_timeout(t2s, 120);
  hardening_save_tests(t2s, ts);
  suite_add_tcase(s, t2s);
  return ps_test_run(s);
}
