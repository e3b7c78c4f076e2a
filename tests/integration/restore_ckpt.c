/* restore-ckpt: writes the checkpoints of test_restore_recovery.sh that no
 * ps variable set saves (common/bundle.h's writer).
 *   restore-ckpt PREFIX strings   ack/c0..ack/c7 (float scalars, I + 1)
 *                                 and ack/vocab, a DT_STRING [2]
 *   restore-ckpt PREFIX slots     beta1_power, s/a, s/a/Momentum, s/b,
 *                                 s/b/Adam, s/b/Momentum, s/c (float [2];
 *                                 a slot holds 10, 11)
 *   restore-ckpt PREFIX grid      g, a float [2,2] saved in four 1x1
 *                                 slices (sliced across both dimensions)
 *   restore-ckpt PREFIX many      m/v0..m/v9 (float scalars)
 *   restore-ckpt PREFIX whole     p/w, a float [4,2] (0..7), unsliced
 * Exit 0, or 1 after printing the error. */
#include <stdio.h>
#include <string.h>

#include "common/bundle.h"

static int add(ps_bundle_writer *w, const char *key, const ps_shape *s, float base,
               ps_status *st) {
  float v[8];
  int64_t n = ps_shape_num_elements(s);
  for (int64_t i = 0; i < n; i++)
    v[i] = base + (float)i;
  return ps_bundle_writer_add(w, key, PS_DT_FLOAT, s, v, (size_t)n * sizeof *v, st);
}

static int write_mode(ps_bundle_writer *w, const char *mode, ps_status *st) {
  ps_shape scalar = {0, {0}}, two = {1, {2}}, grid = {2, {2, 2}}, whole = {2, {4, 2}};
  char name[32];
  int rc = 0;
  if (!strcmp(mode, "strings")) {
    for (int i = 0; i < 8 && rc == 0; i++) {
      snprintf(name, sizeof name, "ack/c%d", i);
      rc = add(w, name, &scalar, (float)(i + 1), st);
    }
    const char *words[2] = {"ack", "nak"};
    if (rc == 0) rc = ps_bundle_writer_add_strings(w, "ack/vocab", &two, words, NULL, st);
  } else if (!strcmp(mode, "slots")) {
    const char *keys[] = {"beta1_power",  "s/a",          "s/b", "s/b/Adam",
                          "s/a/Momentum", "s/b/Momentum", "s/c"};
    for (int i = 0; i < 7 && rc == 0; i++)
      rc = add(w, keys[i], &two, strchr(keys[i] + 2, '/') ? 10.0f : 0.0f, st);
  } else if (!strcmp(mode, "grid")) {
    for (int i = 0; i < 4 && rc == 0; i++) {
      int64_t start[2] = {i / 2, i % 2}, len[2] = {1, 1};
      float v = (float)i;
      rc = ps_bundle_writer_add_slice(w, "g", PS_DT_FLOAT, &grid, start, len, &v,
                                      sizeof v, st);
    }
  } else if (!strcmp(mode, "many")) {
    for (int i = 0; i < 10 && rc == 0; i++) {
      snprintf(name, sizeof name, "m/v%d", i);
      rc = add(w, name, &scalar, (float)i, st);
    }
  } else if (!strcmp(mode, "whole")) {
    rc = add(w, "p/w", &whole, 0.0f, st);
  } else {
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "unknown mode %s", mode);
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: restore-ckpt PREFIX strings|slots|grid|many|whole\n");
    return 2;
  }
  ps_status st;
  ps_status_clear(&st);
  ps_bundle_writer *w = ps_bundle_writer_create(argv[1], &st);
  int rc = w == NULL;
  if (w) rc = write_mode(w, argv[2], &st);
  if (w && rc == 0) rc = ps_bundle_writer_finish(w, &st);
  ps_bundle_writer_destroy(w);
  if (rc) fprintf(stderr, "restore-ckpt: %s\n", st.msg);
  return rc ? 1 : 0;
}
