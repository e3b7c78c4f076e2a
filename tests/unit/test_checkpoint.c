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
 * directory, removed afterwards (even when the test fails). */
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

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

static void assert_file_text(const char *path, const char *want) {
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

static void assert_dir_has(const char *dir, const char *want) {
  char *got = list_dir(dir);
  ck_assert_msg(strcmp(got, want) == 0, "%s holds\n  %s\nwant\n  %s", dir, got, want);
  free(got);
}

/* Runs ps_ckpt_inspect into a string. */
static char *inspect(const char *prefix, bool values, ps_status *st) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  int rc = ps_ckpt_inspect(f, prefix, values, st);
  fclose(f);
  ck_assert_int_eq(rc, st->code);
  return buf;
}

static void assert_inspect(const char *prefix, bool values, const char *want) {
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

/* ---- Retention ------------------------------------------------------------ */

/* The files of a (fake) checkpoint: index, two data shards, meta. */
static void make_ckpt(const char *name) {
  write_text(tmp("%s.index", name), "i");
  write_text(tmp("%s.data-00000-of-00002", name), "d");
  write_text(tmp("%s.data-00001-of-00002", name), "d");
  write_text(tmp("%s.meta", name), "m");
}

static const char *ckpt_files(const char *name) {
  static char b[8][512];
  static int i;
  char *p = b[i++ & 7];
  snprintf(p, 512, "%s.data-00000-of-00002 %s.data-00001-of-00002 %s.index %s.meta", name,
           name, name, name);
  return p;
}

static void add_ok(ps_ckpt_manager *m, const char *name, double now) {
  make_ckpt(name);
  ps_status st = {0};
  ck_assert_msg(ps_ckpt_manager_add(m, tmp("%s", name), now, &st) == 0, "add %s: %s",
                name, st.msg);
}

START_TEST(retention_keeps_max_to_keep) {
  ps_ckpt_manager_options opt;
  ps_ckpt_manager_options_init(&opt);
  ck_assert_int_eq(opt.max_to_keep, 5);
  ck_assert(opt.keep_checkpoint_every_n_hours == 10000.0);
  opt.max_to_keep = 2;
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_ptr_null(ps_ckpt_manager_latest(m));
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 0);
  /* files that only look alike must survive */
  write_text(tmp("model.ckpt-10.index"), "x");
  write_text(tmp("model.ckpt-1.data-00000-of-00001.tempstate123"), "x");
  write_text(tmp("model.ckpt-1.data-0000-of-00001"), "x");
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  add_ok(m, "model.ckpt-2", 1e9 + 2);
  add_ok(m, "model.ckpt-3", 1e9 + 3.5);
  char want[4096];
  snprintf(want, sizeof want,
           "checkpoint model.ckpt-1.data-0000-of-00001 "
           "model.ckpt-1.data-00000-of-00001.tempstate123 model.ckpt-10.index %s %s",
           ckpt_files("model.ckpt-2"), ckpt_files("model.ckpt-3"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-3\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-2\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-3\"\n"
                                      "all_model_checkpoint_timestamps: 1000000002.0\n"
                                      "all_model_checkpoint_timestamps: 1000000003.5\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-3"));
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("model.ckpt-2"));
  ck_assert(ps_ckpt_manager_timestamp(m, 1) == 1e9 + 3.5);
  ck_assert_ptr_null(ps_ckpt_manager_path(m, 2));
  /* and TensorFlow's latest_checkpoint agrees */
  char *latest;
  PS_ASSERT_OK(ps_latest_checkpoint(tmpdir, &latest, &st), st);
  ck_assert_str_eq(latest, tmp("model.ckpt-3"));
  free(latest);
  ps_ckpt_manager_destroy(m);
  ps_ckpt_manager_destroy(NULL);
}
END_TEST

START_TEST(retention_max_to_keep_0_keeps_every_file) {
  ps_ckpt_manager_options opt = {.max_to_keep = 0, .keep_checkpoint_every_n_hours = 1};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  for (int i = 1; i <= 4; i++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", i);
    add_ok(m, name, 1e9 + 10000 * i);
  }
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s %s %s", ckpt_files("model.ckpt-1"),
           ckpt_files("model.ckpt-2"), ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-4"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-4\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-4\"\n"
                                      "all_model_checkpoint_timestamps: 1000040000.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* Saving a path again moves it to the end: it is then the newest. */
START_TEST(retention_resaved_path_moves_to_the_end) {
  ps_ckpt_manager_options opt = {.max_to_keep = 2, .keep_checkpoint_every_n_hours = 0};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  add_ok(m, "a", 1e9 + 1);
  add_ok(m, "b", 1e9 + 2);
  /* the same checkpoint, spelled differently */
  PS_ASSERT_OK(ps_ckpt_manager_add(m, tmp("./a"), 1e9 + 3, &st), st);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"a\"\n"
                                      "all_model_checkpoint_paths: \"b\"\n"
                                      "all_model_checkpoint_paths: \"a\"\n"
                                      "all_model_checkpoint_timestamps: 1000000002.0\n"
                                      "all_model_checkpoint_timestamps: 1000000003.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  add_ok(m, "c", 1e9 + 4); /* evicts b, not a */
  char want[4096];
  /* "a.*" sorts before "c.*" which sorts before "checkpoint" */
  snprintf(want, sizeof want, "%s %s checkpoint", ckpt_files("a"), ckpt_files("c"));
  assert_dir_has(tmpdir, want);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("a"));
  ck_assert_str_eq(ps_ckpt_manager_path(m, 1), tmp("c"));
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* keep_checkpoint_every_n_hours = 1 with a checkpoint every 20 minutes and
 * max_to_keep 2; the policy survives a restart through the state file. */
START_TEST(retention_keep_every_n_hours_with_a_fake_clock) {
  const double T = 1e9;
  ps_ckpt_manager_options opt = {.max_to_keep = 2, .keep_checkpoint_every_n_hours = 1};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  for (int k = 1; k <= 8; k++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", k);
    add_ok(m, name, T + 1200 * k);
  }
  ps_ckpt_manager_destroy(m);
  /* 3 (T+1h) and 6 (T+2h) preserved; 7 and 8 listed */
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s %s %s", ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-6"), ckpt_files("model.ckpt-7"),
           ckpt_files("model.ckpt-8"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-8\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-7\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-8\"\n"
                                      "all_model_checkpoint_timestamps: 1000008400.0\n"
                                      "all_model_checkpoint_timestamps: 1000009600.0\n"
                                      "last_preserved_timestamp: 1000007200.0\n");
  /* A restarted process (one-shot records, each reading the state file):
   * 9 is preserved only because last_preserved_timestamp was kept. */
  for (int k = 9; k <= 11; k++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", k);
    make_ckpt(name);
    PS_ASSERT_OK(ps_ckpt_record(tmpdir, tmp("%s", name), &opt, T + 1200 * k, &st), st);
  }
  snprintf(want, sizeof want, "checkpoint %s %s %s %s %s", ckpt_files("model.ckpt-10"),
           ckpt_files("model.ckpt-11"), ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-6"), ckpt_files("model.ckpt-9"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-11\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-10\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-11\"\n"
                                      "all_model_checkpoint_timestamps: 1000012000.0\n"
                                      "all_model_checkpoint_timestamps: 1000013200.0\n"
                                      "last_preserved_timestamp: 1000010800.0\n");
  /* The clock went back: timestamps in the future are clamped to now. */
  m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert(ps_ckpt_manager_timestamp(m, 0) == T);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-11"));
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* A state file from TensorFlow 1.x (absolute paths, no timestamps): the
 * index mtimes stand in for the timestamps, paths are kept as written. */
START_TEST(retention_picks_up_a_tf1_state_file) {
  const double T = 1e9;
  make_ckpt("model.ckpt-1");
  struct timespec times[2] = {{.tv_sec = (time_t)T - 100}, {.tv_sec = (time_t)T - 100}};
  ck_assert_int_eq(utimensat(AT_FDCWD, tmp("model.ckpt-1.index"), times, 0), 0);
  char text[4096];
  snprintf(text, sizeof text,
           "model_checkpoint_path: \"%s/model.ckpt-1\"\n"
           "all_model_checkpoint_paths: \"%s/model.ckpt-1\"\n",
           tmpdir, tmpdir);
  write_text(tmp("checkpoint"), text);
  ps_ckpt_manager_options opt = {.max_to_keep = 2,
                                 .keep_checkpoint_every_n_hours = 10000};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ck_assert(ps_ckpt_manager_timestamp(m, 0) == T - 100);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-1"));
  add_ok(m, "model.ckpt-2", T + 10);
  snprintf(text, sizeof text,
           "model_checkpoint_path: \"model.ckpt-2\"\n"
           "all_model_checkpoint_paths: \"%s/model.ckpt-1\"\n"
           "all_model_checkpoint_paths: \"model.ckpt-2\"\n"
           "all_model_checkpoint_timestamps: 999999900.0\n"
           "all_model_checkpoint_timestamps: 1000000010.0\n"
           "last_preserved_timestamp: 1000000000.0\n",
           tmpdir);
  assert_file_text(tmp("checkpoint"), text);
  /* re-saving the absolutely-listed checkpoint by its full name */
  PS_ASSERT_OK(ps_ckpt_manager_add(m, tmp("model.ckpt-1"), T + 20, &st), st);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("model.ckpt-2"));
  add_ok(m, "model.ckpt-3", T + 30); /* evicts 2 */
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s", ckpt_files("model.ckpt-1"),
           ckpt_files("model.ckpt-3"));
  assert_dir_has(tmpdir, want);
  ps_ckpt_manager_destroy(m);
}
END_TEST

START_TEST(retention_errors) {
  ps_status st = {0};
  ps_ckpt_manager_options opt = {.max_to_keep = -1};
  ck_assert_ptr_null(ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, "max_to_keep -1 must be >= 0");
  ck_assert_ptr_null(ps_ckpt_manager_create("", NULL, 1e9, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  /* not in the managed directory */
  PS_ASSERT_STATUS(ps_ckpt_manager_add(m, "/elsewhere/model.ckpt-1", 1e9, &st), st,
                   PS_INVALID_ARGUMENT,
                   "checkpoint /elsewhere/model.ckpt-1 is not in the managed directory");
  PS_ASSERT_CODE(ps_ckpt_manager_add(m, tmp("sub/model.ckpt-1"), 1e9, &st), st,
                 PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(ps_ckpt_manager_add(m, "", 1e9, &st), st, PS_INVALID_ARGUMENT);
  /* the state file's own name */
  PS_ASSERT_STATUS(ps_ckpt_manager_add(m, tmp("checkpoint"), 1e9, &st), st,
                   PS_INVALID_ARGUMENT, "conflicts with path used for checkpoint state");
  assert_dir_has(tmpdir, "");
  /* a failed state write changes nothing */
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  ck_assert_int_eq(mkdir(tmp("checkpoint.d"), 0755), 0);
  ck_assert_int_eq(rename(tmp("checkpoint"), tmp("checkpoint.d/checkpoint")), 0);
  ck_assert_int_eq(mkdir(tmp("checkpoint"), 0755), 0); /* in the way of the rename */
  write_text(tmp("checkpoint/x"), "x");
  make_ckpt("model.ckpt-2");
  ck_assert_int_ne(ps_ckpt_manager_add(m, tmp("model.ckpt-2"), 1e9 + 2, &st), 0);
  PS_ASSERT_MSG_HAS(st, "renaming");
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-1"));
  ps_ckpt_manager_destroy(m);
  /* a state file that is a directory cannot be read */
  ck_assert_ptr_null(ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st));
  PS_ASSERT_MSG_HAS(st, tmp("checkpoint"));
}
END_TEST

/* An unparsable state file is replaced (TensorFlow ignores it too). */
START_TEST(retention_replaces_a_corrupt_state_file) {
  write_text(tmp("checkpoint"), "garbage garbage\n");
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st);
  ck_assert_msg(m != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 0);
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-1\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-1\"\n"
                                      "all_model_checkpoint_timestamps: 1000000001.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ps_ckpt_manager_destroy(m);
}
END_TEST

START_TEST(remove_deletes_every_file_of_a_checkpoint) {
  make_ckpt("m-1");
  make_ckpt("m-10");
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_remove(tmp("m-1"), &st), st);
  assert_dir_has(tmpdir, ckpt_files("m-10"));
  PS_ASSERT_OK(ps_ckpt_remove(tmp("m-1"), &st), st); /* nothing left: fine */
  PS_ASSERT_OK(ps_ckpt_remove(tmp("nodir/m-1"), &st), st);
}
END_TEST

/* ---- inspect -------------------------------------------------------------- */

START_TEST(inspect_tensorflow_checkpoints) {
  assert_inspect(tfdata("counter/variables"), false, "counter (DT_FLOAT) []\n");
  assert_inspect(tfdata("counter/variables"), true, "tensor_name:  counter\n0.0\n");
  assert_inspect(tfdata("half_plus_two_cpu/variables"), false,
                 "a (DT_FLOAT) []\n"
                 "a2 (DT_FLOAT) []\n"
                 "b (DT_FLOAT) []\n"
                 "c (DT_FLOAT) []\n"
                 "c2 (DT_FLOAT) []\n");
  assert_inspect(tfdata("half_plus_two_cpu/variables"), true,
                 "tensor_name:  a\n0.5\n"
                 "tensor_name:  a2\n0.5\n"
                 "tensor_name:  b\n2.0\n"
                 "tensor_name:  c\n3.0\n"
                 "tensor_name:  c2\n3.0\n");
  assert_inspect(tfdata("half_plus_two_gpu/variables"), true,
                 "tensor_name:  a\n0.5\n"
                 "tensor_name:  b\n2.0\n"
                 "tensor_name:  c\n3.0\n");
  /* a directory: its latest checkpoint */
  char text[2200];
  snprintf(text, sizeof text, "model_checkpoint_path: \"%s\"\n",
           tfdata("half_plus_two_gpu/variables"));
  write_text(tmp("checkpoint"), text);
  assert_inspect(tmpdir, false, "a (DT_FLOAT) []\nb (DT_FLOAT) []\nc (DT_FLOAT) []\n");
}
END_TEST

START_TEST(inspect_errors_name_the_file) {
  ps_status st = {0};
  char *out = inspect(tmp("missing"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, tmp("missing.index"));
  ck_assert_str_eq(out, "");
  free(out);
  /* given the index file instead of the prefix */
  out = inspect(tfdata("counter/variables.index"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "variables.index.index");
  PS_ASSERT_MSG_HAS(st, "give the checkpoint prefix");
  free(out);
  /* a directory without checkpoints */
  out = inspect(tmpdir, false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "no checkpoint in");
  free(out);
  /* a corrupt index */
  write_text(tmp("bad.index"), "not a table");
  out = inspect(tmp("bad"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_DATA_LOSS, tmp("bad.index"));
  free(out);
  /* a missing data file: the lines before the failing value stay */
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("nodata"), &st);
  ck_assert_ptr_nonnull(w);
  float v = 1;
  ps_shape scalar = {0};
  PS_ASSERT_OK(ps_bundle_writer_add(w, "v", PS_DT_FLOAT, &scalar, &v, 4, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ck_assert_int_eq(unlink(tmp("nodata.data-00000-of-00001")), 0);
  assert_inspect(tmp("nodata"), false, "v (DT_FLOAT) []\n");
  out = inspect(tmp("nodata"), true, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, tmp("nodata.data-00000-of-00001"));
  ck_assert_str_eq(out, "tensor_name:  v\n");
  free(out);
}
END_TEST

static void add_tensor(ps_bundle_writer *w, const char *key, int dtype, ps_shape shape,
                       const void *data) {
  ps_status st = {0};
  size_t n = (size_t)ps_shape_num_elements(&shape) * ps_dtype_size(dtype);
  PS_ASSERT_OK(ps_bundle_writer_add(w, key, dtype, &shape, data, n, &st), st);
}

START_TEST(inspect_values_like_numpy) {
  ps_status st = {0};
  TMP(prefix, "model.ckpt-7");
  ps_bundle_writer *w = ps_bundle_writer_create(prefix, &st);
  ck_assert_ptr_nonnull(w);
  uint8_t bools[3] = {1, 0, 1};
  add_tensor(w, "bools", PS_DT_BOOL, (ps_shape){1, {3}}, bools);
  /* a partitioned [4,2] variable in two slices */
  float emb[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ps_shape full = {2, {4, 2}};
  int64_t start0[2] = {0, 0}, start1[2] = {2, 0}, len[2] = {2, -1};
  PS_ASSERT_OK(ps_bundle_writer_add_slice(w, "emb", PS_DT_FLOAT, &full, start1, len,
                                          emb + 4, 16, &st),
               st);
  PS_ASSERT_OK(
      ps_bundle_writer_add_slice(w, "emb", PS_DT_FLOAT, &full, start0, len, emb, 16, &st),
      st);
  int64_t step = 1000;
  add_tensor(w, "global_step", PS_DT_INT64, (ps_shape){0, {0}}, &step);
  uint16_t half[2] = {ps_float_to_half(0.5f), ps_float_to_half(0.1f)};
  add_tensor(w, "half", PS_DT_HALF, (ps_shape){1, {2}}, half);
  int32_t i3[8] = {0, 1, 2, 3, 4, 5, 6, -7};
  add_tensor(w, "int3", PS_DT_INT32, (ps_shape){3, {2, 2, 2}}, i3);
  int32_t *lng = malloc(2000 * sizeof *lng);
  for (int i = 0; i < 2000; i++)
    lng[i] = i;
  add_tensor(w, "long", PS_DT_INT32, (ps_shape){1, {2000}}, lng);
  free(lng);
  double mat[6] = {1, 2.5, -3, 1e-5, 1e16, 0.1};
  add_tensor(w, "matrix", PS_DT_DOUBLE, (ps_shape){2, {2, 3}}, mat);
  float cplx[2] = {1.5f, -2};
  add_tensor(w, "cplx", PS_DT_COMPLEX64, (ps_shape){0, {0}}, cplx);
  const char *strs[3] = {"a", "it's", "x\n\x01\xff"};
  ps_shape sshape = {1, {3}};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "names", &sshape, strs, NULL, &st), st);
  float *table = malloc(2000 * sizeof *table);
  for (int i = 0; i < 2000; i++)
    table[i] = (float)i;
  add_tensor(w, "table", PS_DT_FLOAT, (ps_shape){2, {100, 20}}, table);
  free(table);
  uint64_t big = UINT64_MAX;
  add_tensor(w, "u64", PS_DT_UINT64, (ps_shape){1, {1}}, &big);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  assert_inspect(prefix, false,
                 "bools (DT_BOOL) [3]\n"
                 "cplx (DT_COMPLEX64) []\n"
                 "emb (DT_FLOAT) [4,2]\n"
                 "global_step (DT_INT64) []\n"
                 "half (DT_HALF) [2]\n"
                 "int3 (DT_INT32) [2,2,2]\n"
                 "long (DT_INT32) [2000]\n"
                 "matrix (DT_DOUBLE) [2,3]\n"
                 "names (DT_STRING) [3]\n"
                 "table (DT_FLOAT) [100,20]\n"
                 "u64 (DT_UINT64) [1]\n");
  assert_inspect(prefix, true,
                 "tensor_name:  bools\n"
                 "[True False True]\n"
                 "tensor_name:  cplx\n"
                 "(1.5-2j)\n"
                 "tensor_name:  emb\n"
                 "[[0.0 1.0]\n"
                 " [2.0 3.0]\n"
                 " [4.0 5.0]\n"
                 " [6.0 7.0]]\n"
                 "tensor_name:  global_step\n"
                 "1000\n"
                 "tensor_name:  half\n"
                 "[0.5 0.1]\n"
                 "tensor_name:  int3\n"
                 "[[[0 1]\n"
                 "  [2 3]]\n"
                 "\n"
                 " [[4 5]\n"
                 "  [6 -7]]]\n"
                 "tensor_name:  long\n"
                 "[0 1 2 ... 1997 1998 1999]\n"
                 "tensor_name:  matrix\n"
                 "[[1.0 2.5 -3.0]\n"
                 " [1e-05 1e+16 0.1]]\n"
                 "tensor_name:  names\n"
                 "[b'a' b\"it's\" b'x\\n\\x01\\xff']\n"
                 "tensor_name:  table\n"
                 "[[0.0 1.0 2.0 ... 17.0 18.0 19.0]\n"
                 " [20.0 21.0 22.0 ... 37.0 38.0 39.0]\n"
                 " [40.0 41.0 42.0 ... 57.0 58.0 59.0]\n"
                 " ...\n"
                 " [1940.0 1941.0 1942.0 ... 1957.0 1958.0 1959.0]\n"
                 " [1960.0 1961.0 1962.0 ... 1977.0 1978.0 1979.0]\n"
                 " [1980.0 1981.0 1982.0 ... 1997.0 1998.0 1999.0]]\n"
                 "tensor_name:  u64\n"
                 "[18446744073709551615]\n");
}
END_TEST

/* ---- Path confinement ----------------------------------------------------- */

static void assert_confined(const char *root, const char *prefix, const char *want) {
  char out[1024];
  ps_status st = {0};
  ck_assert_msg(ps_ckpt_path_confined(root, prefix, out, sizeof out, &st) == 0,
                "%s under %s: %s", prefix, root, st.msg);
  ck_assert_str_eq(out, want);
}

static void assert_refused(const char *root, const char *prefix, int code,
                           const char *msg) {
  char out[1024] = "untouched";
  ps_status st = {0};
  PS_ASSERT_CODE(ps_ckpt_path_confined(root, prefix, out, sizeof out, &st), st, code);
  PS_ASSERT_STATUS(st.code, st, code, msg);
  if (prefix[0]) PS_ASSERT_MSG_HAS(st, prefix);
  if (root[0]) PS_ASSERT_MSG_HAS(st, root);
  ck_assert_str_eq(out, "untouched");
}

START_TEST(path_confinement) {
  const char *root = tmpdir;
  assert_confined(root, "model.ckpt-1", tmp("model.ckpt-1"));
  assert_confined(root, "sub/./model", tmp("sub/model"));
  assert_confined(root, "a//b/../model/", tmp("a/model"));
  assert_confined(root, tmp("x/model"), tmp("x/model"));
  char root_slash[1100];
  snprintf(root_slash, sizeof root_slash, "%s/", tmpdir);
  assert_confined(root_slash, "m", tmp("m"));
  /* leaving the root */
  assert_refused(root, "../evil", PS_PERMISSION_DENIED,
                 "is outside the checkpoint directory");
  assert_refused(root, "a/../../evil", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, "..", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, "/etc/passwd", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, tmp("../x"), PS_PERMISSION_DENIED, "is outside");
  char sibling[1100];
  snprintf(sibling, sizeof sibling, "%s-other/model", tmpdir);
  assert_refused(root, sibling, PS_PERMISSION_DENIED, "is outside");
  /* the root itself: its files would sit beside it */
  assert_refused(root, ".", PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, "a/..", PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, root, PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, "", PS_INVALID_ARGUMENT, "empty checkpoint path");
  assert_refused("", "m", PS_INVALID_ARGUMENT, "empty checkpoint directory");
  /* symbolic links inside the root */
  TMP(outside, "outside");
  TMP(inroot, "root");
  ck_assert_int_eq(mkdir(outside, 0755), 0);
  ck_assert_int_eq(mkdir(inroot, 0755), 0);
  ck_assert_int_eq(mkdir(tmp("root/sub"), 0755), 0);
  ck_assert_int_eq(symlink(outside, tmp("root/out")), 0);
  ck_assert_int_eq(symlink("sub", tmp("root/in")), 0);
  assert_refused(inroot, "out/model", PS_PERMISSION_DENIED, "through a symbolic link");
  assert_refused(inroot, "out/new/deeper/model", PS_PERMISSION_DENIED, "symbolic link");
  assert_confined(inroot, "in/model", tmp("root/in/model"));
  assert_confined(inroot, "new/dir/model", tmp("root/new/dir/model"));
  /* a relative root stays relative */
  assert_confined("ckpt", "model", "ckpt/model");
  assert_confined("./ckpt/", "a/../model", "ckpt/model");
  assert_confined(".", "model", "model");
  assert_refused("ckpt", "../model", PS_PERMISSION_DENIED, "is outside");
  /* too small a buffer */
  char small[8];
  ps_status st = {0};
  PS_ASSERT_STATUS(ps_ckpt_path_confined(root, "model", small, sizeof small, &st), st,
                   PS_INVALID_ARGUMENT, "more than the 7 allowed");
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
  tcase_add_test(tc, retention_keeps_max_to_keep);
  tcase_add_test(tc, retention_max_to_keep_0_keeps_every_file);
  tcase_add_test(tc, retention_resaved_path_moves_to_the_end);
  tcase_add_test(tc, retention_keep_every_n_hours_with_a_fake_clock);
  tcase_add_test(tc, retention_picks_up_a_tf1_state_file);
  tcase_add_test(tc, retention_errors);
  tcase_add_test(tc, retention_replaces_a_corrupt_state_file);
  tcase_add_test(tc, remove_deletes_every_file_of_a_checkpoint);
  tcase_add_test(tc, inspect_tensorflow_checkpoints);
  tcase_add_test(tc, inspect_errors_name_the_file);
  tcase_add_test(tc, inspect_values_like_numpy);
  tcase_add_test(tc, path_confinement);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
