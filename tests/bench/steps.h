/* A training loop's record of its steps, for the save-pause measurements
 * (bench_ckpt (c), bench_table): each step's start and latency. */
#ifndef PS_BENCH_STEPS_H
#define PS_BENCH_STEPS_H

#include <stdlib.h>

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

static inline void step_log_free(step_log *g) {
  free(g->start);
  free(g->lat);
}

#endif
