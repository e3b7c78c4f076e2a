/* Unit tests for common/checkpoint_*.c: checkpoint directories as
 * TensorFlow's Saver keeps them.
 *
 * The `checkpoint` state file is compared byte for byte with what
 * TensorFlow writes and parsed in the forms TensorFlow writes it (TF1
 * Saver, TF2 CheckpointManager) and in the rest of the text format; its
 * atomic replacement is checked against a write that really fails
 * (RLIMIT_FSIZE) and a rename that fails.  Retention runs on a fake clock,
 * including a restart.  inspect output is compared with exact expected text
 * for the TensorFlow-written checkpoints in $PS_TESTDATA/tf-checkpoints and
 * for bundles written here.  Each test works in a fresh mkdtemp()
 * directory, removed afterwards (even when the test fails).
 *
 * Retention is tested in test_checkpoint_retention.c, inspect and path
 * confinement in test_checkpoint_inspect.c (one program: unit_checkpoint).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "paramserver/checkpoint.h"
#include "test_checkpoint_internal.h"
#include "testdir.h"
#include "tests/support/assert.h"

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = malloc((size_t)len + 1);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(fread(p, 1, (size_t)len, f), (size_t)len);
  p[len] = '\0';
  fclose(f);
  return p;
}

void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

void assert_file_text(const char *path, const char *want) {
  char *got = read_text(path);
  ck_assert_msg(strcmp(got, want) == 0, "%s is\n---\n%s---\nwant\n---\n%s---", path, got,
                want);
  free(got);
}

/* Names in @dir, sorted, joined by ' '. */
static char *list_dir(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  ck_assert_int_ge(n, 0);
  char *out = calloc(1, 8192);
  ck_assert_ptr_nonnull(out);
  for (int i = 0; i < n; i++) {
    if (names[i]->d_name[0] != '.') {
      if (out[0]) strcat(out, " ");
      strcat(out, names[i]->d_name);
    }
    free(names[i]);
  }
  free(names);
  return out;
}

void assert_dir_has(const char *dir, const char *want) {
  char *got = list_dir(dir);
  ck_assert_msg(strcmp(got, want) == 0, "%s holds\n  %s\nwant\n  %s", dir, got, want);
  free(got);
}

/* Runs ps_ckpt_inspect into a string. */
char *inspect(const char *prefix, bool values, ps_status *st) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  int rc = ps_ckpt_inspect(f, prefix, values, st);
  fclose(f);
  ck_assert_int_eq(rc, st->code);
  return buf;
}

void assert_inspect(const char *prefix, bool values, const char *want) {
  ps_status st = {0};
  char *got = inspect(prefix, values, &st);
  ck_assert_msg(st.code == 0, "inspect %s: %s", prefix, st.msg);
  ck_assert_msg(strcmp(got, want) == 0, "inspect %s gives\n---\n%s---\nwant\n---\n%s---",
                prefix, got, want);
  free(got);
}

/* ---- State file format ---------------------------------------------------- */

/* What TensorFlow 1.x's Saver writes (no timestamps). */
START_TEST(state_format_is_tensorflows_tf1) {
  char *paths[] = {"model.ckpt-900", "model.ckpt-1000"};
  ps_ckpt_state s = {.model_checkpoint_path = "model.ckpt-1000",
                     .num_paths = 2,
                     .all_model_checkpoint_paths = paths};
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_write(tmpdir, &s, &st), st);
  assert_file_text(tmp("checkpoint"),
                   "model_checkpoint_path: \"model.ckpt-1000\"\n"
                   "all_model_checkpoint_paths: \"model.ckpt-900\"\n"
                   "all_model_checkpoint_paths: \"model.ckpt-1000\"\n");
  assert_dir_has(tmpdir, "checkpoint");
}
END_TEST

/* What TensorFlow 2's CheckpointManager writes (the notes' example). */
START_TEST(state_format_is_tensorflows_tf2) {
  char *paths[] = {"ckpt-11", "ckpt-12"};
  double ts[] = {1601612029.9504316, 1601613798.8340204};
  ps_ckpt_state s = {.model_checkpoint_path = "ckpt-12",
                     .num_paths = 2,
                     .all_model_checkpoint_paths = paths,
                     .num_timestamps = 2,
                     .all_model_checkpoint_timestamps = ts,
                     .last_preserved_timestamp = 1601611588.861176};
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_write(tmpdir, &s, &st), st);
  assert_file_text(tmp("checkpoint"),
                   "model_checkpoint_path: \"ckpt-12\"\n"
                   "all_model_checkpoint_paths: \"ckpt-11\"\n"
                   "all_model_checkpoint_paths: \"ckpt-12\"\n"
                   "all_model_checkpoint_timestamps: 1601612029.9504316\n"
                   "all_model_checkpoint_timestamps: 1601613798.8340204\n"
                   "last_preserved_timestamp: 1601611588.861176\n");
}
END_TEST

/* Doubles as Python's repr(), strings with Python's CEscape. */
START_TEST(state_format_python_reprs_and_escapes) {
  static const struct {
    double v;
    const char *want;
  } reprs[] = {
      {1672531200.0, "1672531200.0"},
      {0.5, "0.5"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {1.5e16, "1.5e+16"},
      {0.0001, "0.0001"},
      {1e-05, "1e-05"},
      {1.5e-07, "1.5e-07"},
      {-2.0, "-2.0"},
      {0.1, "0.1"},
      {123456789.125, "123456789.125"},
      {1e300, "1e+300"},
      {INFINITY, "inf"},
      {-INFINITY, "-inf"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
  };
  for (size_t i = 0; i < sizeof reprs / sizeof reprs[0]; i++) {
    char *paths[] = {"m"};
    double ts[] = {reprs[i].v};
    ps_ckpt_state s = {.model_checkpoint_path = "m",
                       .num_paths = 1,
                       .all_model_checkpoint_paths = paths,
                       .num_timestamps = 1,
                       .all_model_checkpoint_timestamps = ts};
    ps_status st = {0};
    char *text = ps_ckpt_state_format(&s, NULL, &st);
    ck_assert_ptr_nonnull(text);
    char want[256];
    snprintf(want, sizeof want,
             "model_checkpoint_path: \"m\"\nall_model_checkpoint_paths: \"m\"\n"
             "all_model_checkpoint_timestamps: %s\n",
             reprs[i].want);
    ck_assert_str_eq(text, want);
    free(text);
  }
  /* quote, backslash, newline, tab, CR, apostrophe, UTF-8, control, DEL */
  char *paths[] = {"we\"ird\\dir/it's\n\t\r\xc3\xa9\x01\x7f~"};
  ps_ckpt_state s = {.model_checkpoint_path = paths[0],
                     .num_paths = 1,
                     .all_model_checkpoint_paths = paths,
                     .last_preserved_timestamp = -0.5};
  ps_status st = {0};
  size_t len;
  char *text = ps_ckpt_state_format(&s, &len, &st);
  ck_assert_ptr_nonnull(text);
  ck_assert_str_eq(
      text,
      "model_checkpoint_path: \"we\\\"ird\\\\dir/it\\'s\\n\\t\\r\\303\\251\\001\\177~\"\n"
      "all_model_checkpoint_paths: "
      "\"we\\\"ird\\\\dir/it\\'s\\n\\t\\r\\303\\251\\001\\177~\"\n"
      "last_preserved_timestamp: -0.5\n");
  ck_assert_uint_eq(len, strlen(text));
  /* and back */
  ps_ckpt_state r;
  PS_ASSERT_OK(ps_ckpt_state_parse((const uint8_t *)text, len, &r, &st), st);
  ck_assert_str_eq(r.model_checkpoint_path, paths[0]);
  ck_assert_uint_eq(r.num_paths, 1);
  ck_assert_str_eq(r.all_model_checkpoint_paths[0], paths[0]);
  ck_assert(r.last_preserved_timestamp == -0.5);
  ps_ckpt_state_free(&r);
  free(text);
}
END_TEST

START_TEST(state_round_trips_through_the_directory) {
  char *paths[] = {"model.ckpt-1", "/elsewhere/model.ckpt-2", "sub dir/model \"3\""};
  double ts[] = {1700000000.25, 1700000100.5, 1700000200.125};
  ps_ckpt_state s = {.model_checkpoint_path = paths[2],
                     .num_paths = 3,
                     .all_model_checkpoint_paths = paths,
                     .num_timestamps = 3,
                     .all_model_checkpoint_timestamps = ts,
                     .last_preserved_timestamp = 1699999999.0};
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_write(tmpdir, &s, &st), st);
  ps_ckpt_state r;
  PS_ASSERT_OK(ps_ckpt_state_read(tmpdir, &r, &st), st);
  /* relative paths are joined with the directory, absolute ones kept */
  ck_assert_str_eq(r.model_checkpoint_path, tmp("sub dir/model \"3\""));
  ck_assert_uint_eq(r.num_paths, 3);
  ck_assert_str_eq(r.all_model_checkpoint_paths[0], tmp("model.ckpt-1"));
  ck_assert_str_eq(r.all_model_checkpoint_paths[1], "/elsewhere/model.ckpt-2");
  ck_assert_str_eq(r.all_model_checkpoint_paths[2], tmp("sub dir/model \"3\""));
  ck_assert_uint_eq(r.num_timestamps, 3);
  for (int i = 0; i < 3; i++)
    ck_assert(r.all_model_checkpoint_timestamps[i] == ts[i]);
  ck_assert(r.last_preserved_timestamp == 1699999999.0);
  ps_ckpt_state_free(&r);
  ps_ckpt_state_free(&r); /* twice is harmless */
  ps_ckpt_state_free(NULL);
  /* a directory given with a trailing slash is joined as os.path.join does */
  char dir_slash[1100];
  snprintf(dir_slash, sizeof dir_slash, "%s/", tmpdir);
  PS_ASSERT_OK(ps_ckpt_state_read(dir_slash, &r, &st), st);
  ck_assert_str_eq(r.all_model_checkpoint_paths[0], tmp("model.ckpt-1"));
  ps_ckpt_state_free(&r);
}
END_TEST

/* A TF1 Saver state file (absolute paths, as in tensorflow/serving's
 * bad_half_plus_two/00000123/checkpoint) and a TF2 one, made by hand. */
START_TEST(parses_tensorflow_written_state_files) {
  write_text(
      tmp("checkpoint"),
      "model_checkpoint_path: \"/tmp/saved_model_half_plus_two/00000123/export\"\n"
      "all_model_checkpoint_paths: \"/tmp/saved_model_half_plus_two/00000123/export\"\n");
  ps_ckpt_state r;
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_read(tmpdir, &r, &st), st);
  ck_assert_str_eq(r.model_checkpoint_path,
                   "/tmp/saved_model_half_plus_two/00000123/export");
  ck_assert_uint_eq(r.num_paths, 1);
  ck_assert_str_eq(r.all_model_checkpoint_paths[0],
                   "/tmp/saved_model_half_plus_two/00000123/export");
  ck_assert_uint_eq(r.num_timestamps, 0);
  ck_assert(r.last_preserved_timestamp == 0);
  ps_ckpt_state_free(&r);

  write_text(tmp("checkpoint"), "model_checkpoint_path: \"ckpt-12\"\n"
                                "all_model_checkpoint_paths: \"ckpt-11\"\n"
                                "all_model_checkpoint_paths: \"ckpt-12\"\n"
                                "all_model_checkpoint_timestamps: 1601612029.9504316\n"
                                "all_model_checkpoint_timestamps: 1601613798.8340204\n"
                                "last_preserved_timestamp: 1601611588.861176\n");
  PS_ASSERT_OK(ps_ckpt_state_read(tmpdir, &r, &st), st);
  ck_assert_str_eq(r.model_checkpoint_path, tmp("ckpt-12"));
  ck_assert_str_eq(r.all_model_checkpoint_paths[0], tmp("ckpt-11"));
  ck_assert_str_eq(r.all_model_checkpoint_paths[1], tmp("ckpt-12"));
  ck_assert_uint_eq(r.num_timestamps, 2);
  ck_assert(r.all_model_checkpoint_timestamps[0] == 1601612029.9504316);
  ck_assert(r.all_model_checkpoint_timestamps[1] == 1601613798.8340204);
  ck_assert(r.last_preserved_timestamp == 1601611588.861176);
  ps_ckpt_state_free(&r);
}
END_TEST

/* The rest of the text format TensorFlow's reader (text_format.Merge)
 * accepts. */
START_TEST(parses_the_whole_text_format) {
  static const char text[] =
      "# written by hand\n"
      "all_model_checkpoint_paths: ['a', \"b\\x41\\101\\u00e9\\303\\251\"] ;\n"
      "  all_model_checkpoint_paths :\"con\" 'cat' # comment\n"
      "   \"enated\",\n"
      "all_model_checkpoint_timestamps: [1e+16, -inf, 2.5f, 7, .5]\n"
      "all_model_checkpoint_paths: []\n"
      "model_checkpoint_path: \"first\" model_checkpoint_path: 'last wins'\n"
      "last_preserved_timestamp: 1.25\n"
      "last_preserved_timestamp: nan\n"
      "all_model_checkpoint_paths: \"tab\\tq\\\"\\'\\\\\\q\"\n";
  ps_ckpt_state r;
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_parse((const uint8_t *)text, sizeof text - 1, &r, &st), st);
  ck_assert_str_eq(r.model_checkpoint_path, "last wins");
  ck_assert_uint_eq(r.num_paths, 4);
  ck_assert_str_eq(r.all_model_checkpoint_paths[0], "a");
  ck_assert_str_eq(r.all_model_checkpoint_paths[1], "bAA\xc3\xa9\xc3\xa9");
  ck_assert_str_eq(r.all_model_checkpoint_paths[2], "concatenated");
  ck_assert_str_eq(r.all_model_checkpoint_paths[3], "tab\tq\"'\\\\q");
  ck_assert_uint_eq(r.num_timestamps, 5);
  ck_assert(r.all_model_checkpoint_timestamps[0] == 1e16);
  ck_assert(isinf(r.all_model_checkpoint_timestamps[1]) &&
            r.all_model_checkpoint_timestamps[1] < 0);
  ck_assert(r.all_model_checkpoint_timestamps[2] == 2.5);
  ck_assert(r.all_model_checkpoint_timestamps[3] == 7);
  ck_assert(r.all_model_checkpoint_timestamps[4] == 0.5);
  ck_assert(isnan(r.last_preserved_timestamp));
  ps_ckpt_state_free(&r);
  /* an empty file parses (and then has no model_checkpoint_path) */
  PS_ASSERT_OK(ps_ckpt_state_parse((const uint8_t *)"", 0, &r, &st), st);
  ck_assert_ptr_null(r.model_checkpoint_path);
  ps_ckpt_state_free(&r);
}
END_TEST

START_TEST(state_errors_are_named) {
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"model_checkpoint_path: \"a\"\nfoo: 1\n",
       "line 2: message type \"tensorflow.CheckpointState\" has no field named \"foo\""},
      {"model_checkpoint_path \"a\"\n",
       "line 1: expected ':' after model_checkpoint_path, found '\"'"},
      {"model_checkpoint_path: \"a\n\"\n", "line 1: unterminated string"},
      {"model_checkpoint_path: a\n",
       "line 1: expected a string for field model_checkpoint_path, "
       "found 'a'"},
      {"\n\nlast_preserved_timestamp: 12x\n",
       "line 3: couldn't parse number '12x' for field last_preserved_timestamp"},
      {"last_preserved_timestamp: 0x10\n", "couldn't parse number '0x10'"},
      {"last_preserved_timestamp: \"1\"\n",
       "expected a number for field last_preserved_timestamp"},
      {"all_model_checkpoint_paths: [\"a\" \"b\"; ]\n", "expected ',' or ']'"},
      {"model_checkpoint_path: [\"a\"]\n", "expected a string"},
      {"model_checkpoint_path: \"a\\000b\"\n",
       "line 1: NUL byte in model_checkpoint_path"},
      {"model_checkpoint_path: \"a\\xzz\"\n", "invalid \\x escape"},
      {"model_checkpoint_path: \"\\777\"\n", "octal escape \\777 out of range"},
      {"{}\n", "line 1: expected a field name, found '{'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ps_ckpt_state r;
    ps_status st = {0};
    PS_ASSERT_STATUS(
        ps_ckpt_state_parse((const uint8_t *)bad[i].text, strlen(bad[i].text), &r, &st),
        st, PS_DATA_LOSS, bad[i].msg);
    ck_assert_ptr_null(r.model_checkpoint_path);
    ck_assert_uint_eq(r.num_paths, 0);
    /* read names the file */
    write_text(tmp("checkpoint"), bad[i].text);
    PS_ASSERT_STATUS(ps_ckpt_state_read(tmpdir, &r, &st), st, PS_DATA_LOSS,
                     tmp("checkpoint"));
    PS_ASSERT_MSG_HAS(st, bad[i].msg);
  }
  ps_ckpt_state r;
  ps_status st = {0};
  /* no model_checkpoint_path: TensorFlow's ValueError */
  write_text(tmp("checkpoint"), "all_model_checkpoint_paths: \"a\"\n");
  PS_ASSERT_STATUS(ps_ckpt_state_read(tmpdir, &r, &st), st, PS_DATA_LOSS,
                   "Invalid checkpoint state loaded from");
  /* no state file */
  TMP(empty, "empty");
  ck_assert_int_eq(mkdir(empty, 0755), 0);
  PS_ASSERT_STATUS(ps_ckpt_state_read(empty, &r, &st), st, PS_NOT_FOUND,
                   tmp("empty/checkpoint"));
  PS_ASSERT_MSG_HAS(st, "No such file");

  /* bad states are not written */
  char *paths[] = {"a", "b"};
  double ts[] = {1};
  ps_ckpt_state s = {.model_checkpoint_path = "b",
                     .num_paths = 2,
                     .all_model_checkpoint_paths = paths,
                     .num_timestamps = 1,
                     .all_model_checkpoint_timestamps = ts};
  PS_ASSERT_STATUS(ps_ckpt_state_write(empty, &s, &st), st, PS_INVALID_ARGUMENT,
                   "got 2 paths and 1 timestamps");
  ck_assert_ptr_null(ps_ckpt_state_format(&s, NULL, &st));
  s.num_timestamps = 0;
  s.model_checkpoint_path = "";
  PS_ASSERT_STATUS(ps_ckpt_state_write(empty, &s, &st), st, PS_INVALID_ARGUMENT,
                   "empty model_checkpoint_path");
  s.model_checkpoint_path = "./checkpoint";
  PS_ASSERT_STATUS(
      ps_ckpt_state_write(empty, &s, &st), st, PS_INVALID_ARGUMENT,
      "Save path './checkpoint' conflicts with path used for checkpoint state");
  assert_dir_has(empty, "");
  /* a directory that does not exist */
  s.model_checkpoint_path = "b";
  PS_ASSERT_STATUS(ps_ckpt_state_write(tmp("nonexistent"), &s, &st), st, PS_NOT_FOUND,
                   tmp("nonexistent/checkpoint.tmp"));
}
END_TEST

/* ---- Atomic replacement --------------------------------------------------- */

static const char *state_a = "model_checkpoint_path: \"model.ckpt-1\"\n"
                             "all_model_checkpoint_paths: \"model.ckpt-1\"\n";

static void write_state_a(const char *dir) {
  char *paths[] = {"model.ckpt-1"};
  ps_ckpt_state s = {.model_checkpoint_path = "model.ckpt-1",
                     .num_paths = 1,
                     .all_model_checkpoint_paths = paths};
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_state_write(dir, &s, &st), st);
}

/* A state long enough to cross the file size limit set below. */
static int write_state_b(const char *dir, ps_status *st) {
  char *paths[64];
  char names[64][64];
  for (int i = 0; i < 64; i++) {
    snprintf(names[i], sizeof names[i], "model.ckpt-%d", 1000 + i);
    paths[i] = names[i];
  }
  ps_ckpt_state s = {.model_checkpoint_path = paths[63],
                     .num_paths = 64,
                     .all_model_checkpoint_paths = paths};
  return ps_ckpt_state_write(dir, &s, st);
}

/* The write of the temporary file really fails (the process may not
 * write files beyond 100 bytes): the old file stays, nothing else is
 * left behind. */
START_TEST(failed_write_keeps_the_previous_state) {
  write_state_a(tmpdir);
  struct rlimit old, small = {.rlim_cur = 100};
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  small.rlim_max = old.rlim_max;
  signal(SIGXFSZ, SIG_IGN);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
  ps_status st = {0};
  int rc = write_state_b(tmpdir, &st);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  PS_ASSERT_STATUS(rc, st, PS_OUT_OF_RANGE, "writing");
  PS_ASSERT_MSG_HAS(st, tmp("checkpoint.tmp"));
  PS_ASSERT_MSG_HAS(st, "File too large");
  assert_file_text(tmp("checkpoint"), state_a);
  assert_dir_has(tmpdir, "checkpoint");
  /* and a later write succeeds */
  PS_ASSERT_OK(write_state_b(tmpdir, &st), st);
  char *text = read_text(tmp("checkpoint"));
  const char *head = "model_checkpoint_path: \"model.ckpt-1063\"\n";
  ck_assert(strncmp(text, head, strlen(head)) == 0);
  free(text);
}
END_TEST

/* The rename fails (a directory is in the way): the temporary is removed. */
START_TEST(failed_rename_leaves_no_temporary) {
  TMP(sub, "sub");
  ck_assert_int_eq(mkdir(sub, 0755), 0);
  ck_assert_int_eq(mkdir(tmp("sub/checkpoint"), 0755), 0);
  write_text(tmp("sub/checkpoint/x"), "x");
  ps_status st = {0};
  ck_assert_int_ne(write_state_b(sub, &st), 0);
  PS_ASSERT_MSG_HAS(st, "renaming");
  PS_ASSERT_MSG_HAS(st, tmp("sub/checkpoint.tmp"));
  assert_dir_has(sub, "checkpoint");
  assert_dir_has(tmp("sub/checkpoint"), "x");
}
END_TEST

/* A read-only directory (only meaningful when not running as root). */
START_TEST(read_only_directory_keeps_the_previous_state) {
  write_state_a(tmpdir);
  ck_assert_int_eq(chmod(tmpdir, 0555), 0);
  int probe = open(tmp("probe"), O_WRONLY | O_CREAT, 0644);
  if (probe >= 0) { /* root ignores permissions: nothing to test */
    close(probe);
    unlink(tmp("probe"));
    chmod(tmpdir, 0755);
    return;
  }
  ps_status st = {0};
  PS_ASSERT_STATUS(write_state_b(tmpdir, &st), st, PS_PERMISSION_DENIED,
                   "Permission denied");
  chmod(tmpdir, 0755);
  assert_file_text(tmp("checkpoint"), state_a);
  assert_dir_has(tmpdir, "checkpoint");
}
END_TEST

/* ---- latest_checkpoint ---------------------------------------------------- */

START_TEST(latest_checkpoint_like_tensorflow) {
  char *p = (char *)"unchanged";
  ps_status st = {0};
  /* no state file */
  PS_ASSERT_CODE(ps_latest_checkpoint(tmpdir, &p, &st), st, PS_NOT_FOUND);
  ck_assert_ptr_null(p);
  char want[1200];
  snprintf(want, sizeof want, "no checkpoint in %s", tmpdir);
  PS_ASSERT_MSG_HAS(st, want);
  /* a directory that does not exist */
  PS_ASSERT_STATUS(ps_latest_checkpoint(tmp("nope"), &p, &st), st, PS_NOT_FOUND,
                   "no checkpoint in");
  /* a state naming a checkpoint whose index is gone */
  write_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-5\"\n"
                                "all_model_checkpoint_paths: \"model.ckpt-5\"\n");
  write_text(tmp("model.ckpt-5.data-00000-of-00001"), "");
  PS_ASSERT_CODE(ps_latest_checkpoint(tmpdir, &p, &st), st, PS_NOT_FOUND);
  snprintf(want, sizeof want, "Couldn't match files for checkpoint %s/model.ckpt-5",
           tmpdir);
  ck_assert_str_eq(st.msg, want);
  /* relative: joined with the directory */
  write_text(tmp("model.ckpt-5.index"), "");
  PS_ASSERT_OK(ps_latest_checkpoint(tmpdir, &p, &st), st);
  ck_assert_str_eq(p, tmp("model.ckpt-5"));
  free(p);
  /* relative with a subdirectory */
  ck_assert_int_eq(mkdir(tmp("sub"), 0755), 0);
  write_text(tmp("sub/m-1.index"), "");
  write_text(tmp("checkpoint"), "model_checkpoint_path: \"sub/m-1\"\n");
  PS_ASSERT_OK(ps_latest_checkpoint(tmpdir, &p, &st), st);
  ck_assert_str_eq(p, tmp("sub/m-1"));
  free(p);
  /* absolute: as written */
  char text[2200];
  snprintf(text, sizeof text, "model_checkpoint_path: \"%s\"\n",
           tfdata("counter/variables"));
  write_text(tmp("checkpoint"), text);
  PS_ASSERT_OK(ps_latest_checkpoint(tmpdir, &p, &st), st);
  ck_assert_str_eq(p, tfdata("counter/variables"));
  free(p);
  /* unparsable */
  write_text(tmp("checkpoint"), "model_checkpoint_path: \"x");
  PS_ASSERT_STATUS(ps_latest_checkpoint(tmpdir, &p, &st), st, PS_DATA_LOSS,
                   "unterminated string");
  ck_assert_ptr_null(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("core");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 100);
  tcase_add_test(tc, state_format_is_tensorflows_tf1);
  tcase_add_test(tc, state_format_is_tensorflows_tf2);
  tcase_add_test(tc, state_format_python_reprs_and_escapes);
  tcase_add_test(tc, state_round_trips_through_the_directory);
  tcase_add_test(tc, parses_tensorflow_written_state_files);
  tcase_add_test(tc, parses_the_whole_text_format);
  tcase_add_test(tc, state_errors_are_named);
  tcase_add_test(tc, failed_write_keeps_the_previous_state);
  tcase_add_test(tc, failed_rename_leaves_no_temporary);
  tcase_add_test(tc, read_only_directory_keeps_the_previous_state);
  tcase_add_test(tc, latest_checkpoint_like_tensorflow);
  checkpoint_retention_tests(tc);
  checkpoint_inspect_tests(tc);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
