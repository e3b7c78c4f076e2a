/* What the test_ckpt_hardening*.c files share: the ps under test (its
 * harness and client), scratch paths, raw calls, and the functions that add
 * the other files' tests. */
#ifndef PS_TEST_CKPT_HARDENING_INTERNAL_H
#define PS_TEST_CKPT_HARDENING_INTERNAL_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/cluster.h"
#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "tests/support/assert.h"

/* One test case per test, named after it: CK_RUN_CASE=<name> runs one. */
void add(Suite *s, const char *name, const TTest *t);
#define ADD(s, t) add(s, #t, t)

/* What a thread that saves returns. */
typedef struct saver_arg {
  int rc;
  ps_status st;
} saver_arg;

extern char dir[256];
extern char ck[300];
extern char out[300];
extern ps_harness H;
extern ps_client *client;
double now_s(void);
void ps_up(const char *env, const char *grace);
int ps_term(double limit);
char *slurp(const char *path, size_t *n);
char *server_log(void);
bool exists(const char *fmt, const char *a, const char *b);
void put_vars(int n, int64_t elems, float val);
float get_var(const char *name);
int raw(const char *method, const uint8_t *p, size_t n, ps_status *st);
size_t save_req(uint8_t *b, const char *prefix, size_t plen);
bool log_has(const char *what, double limit);
bool all_are(const char *name, int64_t n, float val);
void ckpt_hardening_links_tests(Suite *s);
void ckpt_hardening_merge_tests(Suite *s);

#endif
