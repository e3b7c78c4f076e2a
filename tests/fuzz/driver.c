/* Replay driver for the fuzz targets (see driver.h). */
#ifndef PS_LIBFUZZER
#include "driver.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_MUTANT 65536

static fuzz_input *inputs;
static size_t ninputs;

size_t fuzz_ninputs(void) {
  return ninputs;
}
const fuzz_input *fuzz_input_at(size_t i) {
  return &inputs[i];
}

static void add_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    exit(2);
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 4096;
      uint8_t *nb = realloc(buf, cap);
      if (nb == NULL) exit(2);
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    if (r == 0) break;
    n += r;
  }
  fclose(f);
  fuzz_input *ni = realloc(inputs, (ninputs + 1) * sizeof *ni);
  if (ni == NULL) exit(2);
  inputs = ni;
  inputs[ninputs++] = (fuzz_input){buf, n};
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, or every regular file in a directory (sorted, so runs repeat). */
static void add_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    perror(path);
    exit(2);
  }
  if (!S_ISDIR(sb.st_mode)) {
    add_file(path);
    return;
  }
  DIR *d = opendir(path);
  if (d == NULL) {
    perror(path);
    exit(2);
  }
  char **names = NULL;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char **nn = realloc(names, (n + 1) * sizeof *nn);
    if (nn == NULL) exit(2);
    names = nn;
    size_t len = strlen(path) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (names[n] == NULL) exit(2);
    snprintf(names[n], len, "%s/%s", path, e->d_name);
    n++;
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) add_file(names[i]);
    free(names[i]);
  }
  free(names);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

uint64_t fuzz_rng(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1du;
}

size_t fuzz_rnd(size_t n) {
  return n ? (size_t)(fuzz_rng() % n) : 0;
}

int main(int argc, char **argv) {
  const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|DIR...  (PS_FUZZ_RUNS=n mutations)\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++)
    add_path(argv[i]);
  if (ninputs == 0) {
    fprintf(stderr, "%s: no input files\n", name);
    return 2;
  }
  const char *env = getenv("PS_FUZZ_RUNS");
  long runs = env ? strtol(env, NULL, 10) : 4000;
  for (size_t i = 0; i < ninputs; i++)
    LLVMFuzzerTestOneInput(inputs[i].data, inputs[i].size);
  uint8_t *buf = malloc(MAX_MUTANT);
  if (buf == NULL) return 2;
  size_t n = 0;
  for (long r = 0; r < runs; r++) {
    /* mostly fresh from a seed, sometimes keep mutating the last one */
    if (r == 0 || fuzz_rnd(4) != 0) {
      const fuzz_input *in = &inputs[fuzz_rnd(ninputs)];
      n = in->size < MAX_MUTANT ? in->size : MAX_MUTANT;
      memcpy(buf, in->data, n);
    }
    n = fuzz_mutate(buf, n, MAX_MUTANT);
    LLVMFuzzerTestOneInput(buf, n);
  }
  free(buf);
  for (size_t i = 0; i < ninputs; i++)
    free(inputs[i].data);
  free(inputs);
  printf("%s: %zu inputs and %ld mutations passed\n", name, ninputs, runs);
  return 0;
}
size_t fuzz_insert(uint8_t *buf, size_t n, size_t cap, size_t pos, const void *data,
                   size_t len) {
  if (n + len > cap) return n;
  memmove(buf + pos + len, buf + pos, n - pos);
  memcpy(buf + pos, data, len);
  return n + len;
}

size_t fuzz_erase(uint8_t *buf, size_t n, size_t pos) {
  size_t len = fuzz_rnd(n - pos + 1);
  if (len > 16 && fuzz_rnd(2)) len = fuzz_rnd(17);
  memmove(buf + pos, buf + pos + len, n - pos - len);
  return n - len;
}

size_t fuzz_duplicate(uint8_t *buf, size_t n, size_t cap, size_t pos, size_t max) {
  size_t len = fuzz_rnd(n - pos + 1);
  if (len > max) len = fuzz_rnd(max + 1);
  if (n + len > cap) return n;
  /* shifting the tail right leaves the range in place twice */
  memmove(buf + pos + len, buf + pos, n - pos);
  return n + len;
}

size_t fuzz_splice(uint8_t *buf, size_t n, size_t cap, size_t pos) {
  const fuzz_input *o = fuzz_input_at(fuzz_rnd(fuzz_ninputs()));
  size_t from = fuzz_rnd(o->size + 1), len = fuzz_rnd(o->size - from + 1);
  return fuzz_insert(buf, n, cap, pos, o->data + from, len);
}

#endif
