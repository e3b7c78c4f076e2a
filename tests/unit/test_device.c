/* Unit tests for common/device.c: TF device strings.  The expected strings
 * are TensorFlow's own (tensorflow/python/framework/device_test.py and the
 * replica_device_setter examples). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "tests/support/assert.h"

/* Parses @in, which must succeed, and returns its to_string(). */
static const char *canon(const char *in) {
  static char buf[PS_DEVICE_STRING_MAX];
  ps_status st = {0};
  ps_device d;
  int rc = ps_device_parse(in, &d, &st);
  ck_assert_msg(rc == 0, "parse '%s': %s", in, st.msg);
  return ps_device_format(&d, buf, sizeof buf);
}

/* Parses @in, which must fail with INVALID_ARGUMENT and a message holding
 * @needle; the output must be left unset. */
static void parse_fails(const char *in, const char *needle) {
  ps_status st = {0};
  ps_device d;
  char buf[PS_DEVICE_STRING_MAX];
  memset(&d, 0x55, sizeof d);
  int rc = ps_device_parse(in, &d, &st);
  ck_assert_msg(rc == PS_INVALID_ARGUMENT, "parse '%s' gave %d", in, rc);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, needle);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "");
}

START_TEST(test_init_is_empty) {
  ps_device d;
  char buf[PS_DEVICE_STRING_MAX];
  ps_device_init(&d);
  ck_assert_str_eq(d.job, "");
  ck_assert_int_eq(d.replica, -1);
  ck_assert_int_eq(d.task, -1);
  ck_assert_str_eq(d.type, "");
  ck_assert_int_eq(d.index, -1);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "");
}
END_TEST

START_TEST(test_parse_fields) {
  ps_status st = {0};
  ps_device d;
  PS_ASSERT_OK(ps_device_parse("/job:ps/replica:0/task:3/device:CPU:1", &d, &st), st);
  ck_assert_str_eq(d.job, "ps");
  ck_assert_int_eq(d.replica, 0);
  ck_assert_int_eq(d.task, 3);
  ck_assert_str_eq(d.type, "CPU");
  ck_assert_int_eq(d.index, 1);

  PS_ASSERT_OK(ps_device_parse("/job:ps/task:7", &d, &st), st);
  ck_assert_str_eq(d.job, "ps");
  ck_assert_int_eq(d.replica, -1);
  ck_assert_int_eq(d.task, 7);
  ck_assert_str_eq(d.type, "");
  ck_assert_int_eq(d.index, -1);

  PS_ASSERT_OK(ps_device_parse("/device:GPU:*", &d, &st), st);
  ck_assert_str_eq(d.type, "GPU");
  ck_assert_int_eq(d.index, PS_DEVICE_ANY);

  PS_ASSERT_OK(ps_device_parse("/cpu", &d, &st), st);
  ck_assert_str_eq(d.type, "CPU");
  ck_assert_int_eq(d.index, -1);

  PS_ASSERT_OK(ps_device_parse("", &d, &st), st);
  ck_assert_str_eq(d.job, "");
  PS_ASSERT_OK(ps_device_parse(NULL, &d, &st), st);
  ck_assert_int_eq(d.task, -1);
}
END_TEST

START_TEST(test_round_trips) {
  /* device_test.py testParse */
  ck_assert_str_eq(canon("/job:foo/replica:0"), "/job:foo/replica:0");
  ck_assert_str_eq(canon("/replica:1/task:0/cpu:0"), "/replica:1/task:0/device:CPU:0");
  ck_assert_str_eq(canon("/replica:1/task:0/device:CPU:0"),
                   "/replica:1/task:0/device:CPU:0");
  ck_assert_str_eq(canon("/job:muu/device:GPU:2"), "/job:muu/device:GPU:2");
  /* the brief's forms */
  ck_assert_str_eq(canon("/job:ps/replica:0/task:0/device:CPU:0"),
                   "/job:ps/replica:0/task:0/device:CPU:0");
  ck_assert_str_eq(canon("/job:ps/task:7"), "/job:ps/task:7");
  ck_assert_str_eq(canon("/cpu:0"), "/device:CPU:0");
  ck_assert_str_eq(canon("/GPU:1"), "/device:GPU:1");
  ck_assert_str_eq(canon("/gpu:0"), "/device:GPU:0");
  ck_assert_str_eq(canon("/Gpu:0"), "/device:GPU:0");
  ck_assert_str_eq(canon("/device:GPU:*"), "/device:GPU:*");
  ck_assert_str_eq(canon("/gpu:*"), "/device:GPU:*");
  ck_assert_str_eq(canon("/cpu"), "/device:CPU:*");
  ck_assert_str_eq(canon("/job:worker"), "/job:worker");
  ck_assert_str_eq(canon(""), "");
  /* lower-case in the /device: form too */
  ck_assert_str_eq(canon("/device:cpu:1"), "/device:CPU:1");
  ck_assert_str_eq(canon("/device:gpu:0"), "/device:GPU:0");
  ck_assert_str_eq(canon("/device:XLA_CPU:0"), "/device:XLA_CPU:0");
  ck_assert_str_eq(canon("/epu:3"), "/device:EPU:3");
  /* order of parts does not matter on input; output is canonical */
  ck_assert_str_eq(canon("/device:CPU:0/task:2/job:ps/replica:1"),
                   "/job:ps/replica:1/task:2/device:CPU:0");
  /* empty parts are skipped; the leading '/' is optional (TF splits) */
  ck_assert_str_eq(canon("job:ps//task:1/"), "/job:ps/task:1");
  ck_assert_str_eq(canon("///"), "");
  /* a later job/task overrides an earlier one, as in TF */
  ck_assert_str_eq(canon("/job:a/task:1/job:b/task:2"), "/job:b/task:2");
  ck_assert_str_eq(canon("/task:2147483647"), "/task:2147483647");
}
END_TEST

START_TEST(test_merge) {
  /* device_test.py testMerge */
  ps_status st = {0};
  ps_device d, s;
  char buf[PS_DEVICE_STRING_MAX];
  PS_ASSERT_OK(ps_device_parse("/job:foo/replica:0", &d, &st), st);
  PS_ASSERT_OK(ps_device_parse("/task:1/device:GPU:2", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf),
                   "/job:foo/replica:0/task:1/device:GPU:2");

  ps_device_init(&d);
  PS_ASSERT_OK(ps_device_parse("/task:1/cpu:0", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/task:1/device:CPU:0");
  PS_ASSERT_OK(ps_device_parse("/job:boo/device:GPU:0", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/job:boo/task:1/device:GPU:0");
  PS_ASSERT_OK(ps_device_parse("/job:muu/cpu:2", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/job:muu/task:1/device:CPU:2");
  PS_ASSERT_OK(ps_device_parse("/job:muu/device:MyFunnyDevice:2", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf),
                   "/job:muu/task:1/device:MyFunnyDevice:2");

  /* '*' is TF's None: it does not overwrite an index */
  PS_ASSERT_OK(ps_device_parse("/device:GPU:1", &d, &st), st);
  PS_ASSERT_OK(ps_device_parse("/device:GPU:*", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/device:GPU:1");
  PS_ASSERT_OK(ps_device_parse("/cpu:0", &d, &st), st);
  PS_ASSERT_OK(ps_device_parse("/gpu", &s, &st), st);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/device:GPU:0");

  /* merging the empty device changes nothing */
  ps_device_init(&s);
  ps_device_merge(&d, &s);
  ck_assert_str_eq(ps_device_format(&d, buf, sizeof buf), "/device:GPU:0");
}
END_TEST

/* replica_device_setter's device function, on TF's documented examples. */
static const char *setter(const char *ps_dev, int task, const char *op_device) {
  static char buf[PS_DEVICE_STRING_MAX];
  ps_status st = {0};
  ps_device ps, cur;
  PS_ASSERT_OK(ps_device_parse(op_device, &cur, &st), st);
  PS_ASSERT_OK(ps_device_parse(ps_dev, &ps, &st), st);
  if (ps.job[0] != '\0' && (cur.job[0] == '\0' || strcmp(cur.job, ps.job) == 0))
    ps.task = task;
  ps_device_merge(&ps, &cur);
  return ps_device_format(&ps, buf, sizeof buf);
}

START_TEST(test_replica_device_setter_examples) {
  ck_assert_str_eq(setter("/job:ps", 0, ""), "/job:ps/task:0");
  ck_assert_str_eq(setter("/job:ps", 1, "/cpu:0"), "/job:ps/task:1/device:CPU:0");
  ck_assert_str_eq(setter("/job:ps", 2, "/job:ps/task:3"), "/job:ps/task:3");
  ck_assert_str_eq(setter("/job:ps", 0, "/gpu:0"), "/job:ps/task:0/device:GPU:0");
  ck_assert_str_eq(setter("/job:ps", 1, "/job:worker/task:1"), "/job:worker/task:1");
  /* a non-ps op: worker_device merged with the op's device */
  ps_status st = {0};
  ps_device w, cur;
  char buf[PS_DEVICE_STRING_MAX];
  PS_ASSERT_OK(ps_device_parse("/job:worker/task:3", &w, &st), st);
  PS_ASSERT_OK(ps_device_parse("", &cur, &st), st);
  ps_device_merge(&w, &cur);
  ck_assert_str_eq(ps_device_format(&w, buf, sizeof buf), "/job:worker/task:3");
  PS_ASSERT_OK(ps_device_parse("/gpu:0", &cur, &st), st);
  PS_ASSERT_OK(ps_device_parse("/job:worker", &w, &st), st);
  ps_device_merge(&w, &cur);
  ck_assert_str_eq(ps_device_format(&w, buf, sizeof buf), "/job:worker/device:GPU:0");
}
END_TEST

START_TEST(test_equal) {
  ps_status st = {0};
  ps_device a, b;
  PS_ASSERT_OK(ps_device_parse("/job:ps/task:0/cpu:0", &a, &st), st);
  PS_ASSERT_OK(ps_device_parse("/task:0/device:CPU:0/job:ps", &b, &st), st);
  ck_assert(ps_device_equal(&a, &b));
  PS_ASSERT_OK(ps_device_parse("/job:ps/task:1/cpu:0", &b, &st), st);
  ck_assert(!ps_device_equal(&a, &b));
  PS_ASSERT_OK(ps_device_parse("/device:GPU:*", &a, &st), st);
  PS_ASSERT_OK(ps_device_parse("/gpu", &b, &st), st);
  ck_assert(ps_device_equal(&a, &b));
  PS_ASSERT_OK(ps_device_parse("/gpu:0", &b, &st), st);
  ck_assert(!ps_device_equal(&a, &b));
  PS_ASSERT_OK(ps_device_parse("/job:ps", &a, &st), st);
  PS_ASSERT_OK(ps_device_parse("/job:worker", &b, &st), st);
  ck_assert(!ps_device_equal(&a, &b));
  ps_device_init(&a);
  ps_device_init(&b);
  ck_assert(ps_device_equal(&a, &b));
}
END_TEST

START_TEST(test_errors) {
  parse_fails("/foo:bar", "Unknown attribute: 'foo' in '/foo:bar'");
  parse_fails("/job:ps/bogus", "Unknown attribute: 'bogus' in '/job:ps/bogus'");
  parse_fails("/job:ps:1", "Unknown attribute: 'job' in '/job:ps:1'");
  parse_fails("/device:CPU", "Unknown attribute: 'device' in '/device:CPU'");
  parse_fails("/cpu:0:1", "Unknown attribute: 'cpu' in '/cpu:0:1'");
  parse_fails("/a:b:c:d:e", "Unknown attribute: 'a' in '/a:b:c:d:e'");
  parse_fails("/:0", "Unknown attribute: '' in '/:0'");
  parse_fails("/job:muu/device:GPU:2/cpu:0", "Cannot specify multiple device types: "
                                             "/job:muu/device:GPU:2/cpu:0");
  parse_fails("/cpu:0/device:GPU:0", "Cannot specify multiple device types");
  parse_fails("/task:x", "device '/task:x': bad task 'x'");
  parse_fails("/task:-1", "bad task '-1'");
  parse_fails("/task:+1", "bad task '+1'");
  parse_fails("/task:", "bad task ''");
  parse_fails("/replica:99999999999", "bad replica '99999999999'");
  parse_fails("/task:2147483648", "bad task '2147483648'");
  parse_fails("/device:GPU:x", "bad device index 'x'");
  parse_fails("/gpu:-1", "bad device index '-1'");
  parse_fails("/job:", "device '/job:': bad job name ''");
  parse_fails("/job:my-job", "bad job name 'my-job'");
  parse_fails("/job:"
              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
              "job name is too long (max 63 characters)");
  parse_fails("/device:ABCDEFGHIJKLMNOPQ:0",
              "device type is too long (max 15 characters)");
  parse_fails("/device::0", "bad device type ''");
  parse_fails("/device:G-PU:0", "bad device type 'G-PU'");

  /* a 63-character job name is the longest that fits */
  const char *j63 =
      "/job:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  ck_assert_str_eq(canon(j63), j63);
}
END_TEST

START_TEST(test_error_keeps_status_code) {
  ps_status st = {0};
  ps_device d;
  ck_assert_int_eq(ps_device_parse("/foo:bar", &d, NULL), PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(ps_device_parse("/foo:bar", &d, &st), st, PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_format_truncates) {
  ps_status st = {0};
  ps_device d;
  char big[PS_DEVICE_STRING_MAX], small[6];
  PS_ASSERT_OK(ps_device_parse("/job:ps/replica:0/task:0/device:CPU:0", &d, &st), st);
  ck_assert_ptr_eq(ps_device_format(&d, small, sizeof small), small);
  ck_assert_str_eq(small, "/job:");
  memset(small, 'x', sizeof small);
  ps_device_format(&d, small, 0);
  ck_assert_int_eq(small[0], 'x');
  /* the largest possible device fits PS_DEVICE_STRING_MAX */
  memset(&d, 0, sizeof d);
  memset(d.job, 'j', sizeof d.job - 1);
  d.replica = d.task = d.index = 2147483647;
  memset(d.type, 'T', sizeof d.type - 1);
  ps_device_format(&d, big, sizeof big);
  ck_assert_uint_eq(strlen(big), 5 + 63 + 9 + 10 + 6 + 10 + 8 + 15 + 1 + 10);
  ck_assert_uint_lt(strlen(big), PS_DEVICE_STRING_MAX);
}
END_TEST

static Suite *device_suite(void) {
  Suite *s = suite_create("device");
  TCase *tc = tcase_create("device");
  tcase_add_test(tc, test_init_is_empty);
  tcase_add_test(tc, test_parse_fields);
  tcase_add_test(tc, test_round_trips);
  tcase_add_test(tc, test_merge);
  tcase_add_test(tc, test_replica_device_setter_examples);
  tcase_add_test(tc, test_equal);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_error_keeps_status_code);
  tcase_add_test(tc, test_format_truncates);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(device_suite());
}
