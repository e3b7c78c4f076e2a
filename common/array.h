/* The one growable array of the tree: every array that grows as items
 * arrive (graph nodes, a session's per-variable state, the store's tables,
 * a chunk list, a MetaGraph arena...) grows through ps_array_grow, so that
 * the doubling, the overflow checks and the out-of-memory contract are
 * written once.
 *
 *   T *items = NULL; size_t n = 0, cap = 0;
 *   if (ps_array_grow(&items, &cap, n + 1, sizeof *items) != 0) return oom;
 *   items[n++] = x;
 */
#ifndef PS_COMMON_ARRAY_H
#define PS_COMMON_ARRAY_H

#include <stddef.h>

/* Makes room for @need elements of @elem bytes in the array *@arrp (the
 * address of any object pointer).  With @cap, the capacity doubles from 8
 * until it holds @need and *@cap is updated; without (NULL), the array is
 * sized to @need exactly.  Returns 0, or -1 with *@arrp and *@cap unchanged
 * when out of memory or when the size would overflow. */
int ps_array_grow(void *arrp, size_t *cap, size_t need, size_t elem);

#endif
