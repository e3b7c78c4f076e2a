/* The growable array (array.h). */
#include "common/array.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int ps_array_grow(void *arrp, size_t *cap, size_t need, size_t elem) {
  size_t c = cap ? *cap : 0;
  if (cap && need <= c) return 0;
  size_t nc = cap ? (c ? c : 8) : need;
  while (nc < need) {
    if (nc > SIZE_MAX / 2) return -1;
    nc *= 2;
  }
  if (elem && nc > SIZE_MAX / elem) return -1;
  void *old;
  memcpy(&old, arrp, sizeof old);
  size_t bytes = nc * elem;
  void *p = realloc(old, bytes > 0 ? bytes : 1);
  if (p == NULL) return -1;
  memcpy(arrp, &p, sizeof p);
  if (cap) *cap = nc;
  return 0;
}
