/* A training loop's record of its steps, for the save-pause measurements
 * (bench_ckpt (c), bench_table): each step's start and latency. */
#ifndef PS_BENCH_STEPS_H
#define PS_BENCH_STEPS_H

#include <errno.h>
#include <stdlib.h>
#include <time.h>

typedef struct step_log {
  double *start, *lat;
  size_t n, cap;
} step_log;

/* Records a step that began at @t0 and took @lat seconds; -1: no memory. */
static inline int step_log_add(step_log *g, double t0, double lat) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 65536;
    double *s = (double *)realloc(g->start, cap * sizeof *s);
    if (s) g->start = s;
    double *l = (double *)realloc(g->lat, cap * sizeof *l);
    if (l) g->lat = l;
    if (s == NULL || l == NULL) return -1;
    g->cap = cap;
  }
  g->start[g->n] = t0;
  g->lat[g->n++] = lat;
  return 0;
}

/* The steps around a save that ran from @s0 to @s1: of those that
 * overlapped it, the longest (*@max_ms, began *@max_at_ms after @s0) and
 * their count (returned); the others' latencies in ms into @outside (room
 * for g->n), *@nout of them. */
static inline size_t step_log_split(const step_log *g, double s0, double s1,
                                    double *max_ms, double *max_at_ms, double *outside,
                                    size_t *nout) {
  size_t during = 0;
  *max_ms = *max_at_ms = 0;
  *nout = 0;
  for (size_t i = 0; i < g->n; i++) {
    double b = g->start[i], e = b + g->lat[i];
    if (b < s1 && e > s0) {
      during++;
      if (g->lat[i] * 1e3 > *max_ms) {
        *max_ms = g->lat[i] * 1e3;
        *max_at_ms = (b - s0) * 1e3;
      }
    } else {
      outside[(*nout)++] = g->lat[i] * 1e3;
    }
  }
  return during;
}

static inline void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline void step_log_free(step_log *g) {
  free(g->start);
  free(g->lat);
}

#endif
