/* What the test_hardening*.c files share: the ps under test (its harness
 * and client), variable helpers, raw calls, fixtures, and the functions that
 * add the other files' tests. */
#ifndef PS_TEST_HARDENING_INTERNAL_H
#define PS_TEST_HARDENING_INTERNAL_H

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

extern ps_harness H;
extern ps_client *C;
void start(const char *const *extra);
void teardown(void);
ps_shape shp1(int64_t a);
ps_shape shp2(int64_t a, int64_t b);
void create(const char *name, ps_dtype dt, ps_shape s, const ps_init_spec *init);
void assign_f(const char *name, ps_shape s, const float *vals);
ps_tensor *read1(const char *name, ps_status *st);
void assert_w_unchanged(void);
bool exists(const char *name);
uint8_t *pack_msg(const ProtobufCMessage *m, size_t *n);
void patch(uint8_t *b, size_t n, const char *from, const char *to, size_t len);
ps_status raw_call(const char *method, const void *req, size_t n, ps_rpc_segs *send,
                   bool unary, int64_t timeout_ms);
ps_status raw_msg(const char *method, const ProtobufCMessage *m, bool unary);
ps_status raw_snapshot(int64_t id, int64_t hold_ms);
ps_status raw_release(int64_t id);
void past_server_deadline(void);
int create_part_on(int task, const char *name, const char *full, ps_shape shape,
                   ps_shape fs, int64_t off, ps_dtype dt, ps_status *st);
int create_part(const char *name, const char *full, ps_shape shape, ps_shape fs,
                int64_t off, ps_dtype dt, ps_status *st);
void two_ps_setup(void);
void limits_setup(void);
void hold_setup(void);
void save_setup(void);
void save_teardown(void);
void two_ps_save_setup(void);
void hardening_delete_tests(TCase *tc, TCase *t2);
void hardening_limits_tests(TCase *tl, TCase *th);
void hardening_save_tests(TCase *t2s, TCase *ts);

#endif
