/* Fuzz target for the click-log reader (worker/data/dataset.c,
 * ps_dataset_criteo_tsv): a file in Criteo's TSV layout is outside input
 * to ps-worker --model ctr --data.  The input is written to an anonymous
 * file (memfd) and read through its /proc/self/fd path.  Besides "no crash,
 * no leak, no UB" it checks: a failure is DATA_LOSS naming a line inside
 * the file, and leaves no dataset; a success gives tensors of 26 ids, 13
 * finite dense features and 0/1 labels per example, one example per line.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target;
 * otherwise the shared driver (driver.c) replays corpus_criteo/ and
 * PS_FUZZ_RUNS (default 4000) deterministic mutations of it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver.h"
#include "paramserver/dataset.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_criteo: " __VA_ARGS__);                                        \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("criteo", 0);
  if (fd < 0) FAIL("memfd_create failed");
  if (size && write(fd, data, size) != (ssize_t)size) FAIL("write failed");
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  size_t lines = 0;
  for (size_t i = 0; i < size; i++)
    lines += data[i] == '\n';
  lines += size && data[size - 1] != '\n';
  ps_dataset d = {0};
  ps_status st;
  int rc = ps_dataset_criteo_tsv(path, 0, &d, &st);
  if (rc != 0) {
    if (rc != PS_DATA_LOSS) FAIL("code %d: %s", rc, st.msg);
    if (strncmp(st.msg, path, strlen(path)) != 0 || st.msg[strlen(path)] != ':')
      FAIL("the message does not name the file: %s", st.msg);
    if (d.ids || d.dense || d.y) FAIL("a failure left a dataset");
  } else {
    if (d.n < 0 || (size_t)d.n > lines)
      FAIL("%lld examples from %zu lines", (long long)d.n, lines);
    if (d.ids->shape.dim[1] != PS_DATASET_CRITEO_FIELDS ||
        d.dense->shape.dim[1] != PS_DATASET_CRITEO_DENSE)
      FAIL("shapes");
    const float *x = ps_tensor_data(d.dense);
    const int64_t *y = ps_tensor_data(d.y);
    for (int64_t i = 0; i < d.n; i++) {
      if (y[i] != 0 && y[i] != 1) FAIL("label %lld", (long long)y[i]);
      for (int k = 0; k < PS_DATASET_CRITEO_DENSE; k++)
        if (!isfinite(x[i * PS_DATASET_CRITEO_DENSE + k]) ||
            x[i * PS_DATASET_CRITEO_DENSE + k] < 0)
          FAIL("dense feature %g", x[i * PS_DATASET_CRITEO_DENSE + k]);
    }
  }
  ps_dataset_free(&d);
  close(fd);
  return 0;
}

#ifndef PS_LIBFUZZER
/* Byte changes, tabs and newlines put in or taken out, digits, and pieces
 * of other seeds. */
size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  static const char *const pieces[] = {
      "\t", "\n", "\r\n", "0", "1", "-", "9999999999999999999999", "ff", "\t\t\t", "2"};
  switch (fuzz_rnd(5)) {
  case 0:
    if (n) buf[fuzz_rnd(n)] = (uint8_t)fuzz_rng();
    return n;
  case 1: {
    const char *p = pieces[fuzz_rnd(sizeof pieces / sizeof pieces[0])];
    return fuzz_insert(buf, n, cap, fuzz_rnd(n + 1), p, strlen(p));
  }
  case 2:
    return fuzz_erase(buf, n, fuzz_rnd(n + 1));
  case 3:
    return fuzz_duplicate(buf, n, cap, fuzz_rnd(n + 1), 200);
  default:
    return fuzz_splice(buf, n, cap, fuzz_rnd(n + 1));
  }
}
#endif
