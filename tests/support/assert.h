/* The assertion vocabulary of the C tests (Check): a status is checked by
 * its code and by a piece of its message, and a failure prints both. */
#ifndef PS_TEST_ASSERT_H
#define PS_TEST_ASSERT_H

#include <check.h>
#include <string.h>

#include "paramserver/status.h"

/* The message of @st contains @text. */
#define PS_ASSERT_MSG_HAS(st, text)                                                      \
  ck_assert_msg(strstr((st).msg, (text)) != NULL, "message \"%s\" lacks \"%s\"",         \
                (st).msg, (text))

/* @expr (returning 0 or a PS_* code, filling @st) succeeds. */
#define PS_ASSERT_OK(expr, st)                                                           \
  do {                                                                                   \
    int rc_ = (expr);                                                                    \
    ck_assert_msg(rc_ == 0, "%s: %s: %s", #expr, ps_status_code_name(rc_), (st).msg);    \
  } while (0)

/* @expr fails with @code and a message containing @text. */
#define PS_ASSERT_STATUS(expr, st, code, text)                                           \
  do {                                                                                   \
    int rc_ = (expr);                                                                    \
    ck_assert_msg(rc_ == (code), "%s: %s (\"%s\"), want %s", #expr,                      \
                  ps_status_code_name(rc_), (st).msg, ps_status_code_name(code));        \
    PS_ASSERT_MSG_HAS(st, text);                                                         \
  } while (0)

/* @expr fails with @code (for a failure whose message no test pins yet:
 * prefer PS_ASSERT_STATUS); a failure prints the status text. */
#define PS_ASSERT_CODE(expr, st, code)                                                   \
  do {                                                                                   \
    int rc_ = (expr);                                                                    \
    ck_assert_msg(rc_ == (code), "%s: %s (\"%s\"), want %s", #expr,                      \
                  ps_status_code_name(rc_), (st).msg, ps_status_code_name(code));        \
  } while (0)

/* Runs suite @s (forking each test, as Check does by default) and returns
 * the test program's exit status: 0 when every test passed. */
static inline int ps_test_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}

#endif
