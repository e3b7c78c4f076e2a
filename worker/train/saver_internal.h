/* Shared by the files of the Saver and its MetaGraph codec: saver.c (the
 * Saver object), metagraph_export.c and metagraph_import.c (the codec)
 * and saver_ckpt.c (save and restore).  Private to worker/train/. */
#ifndef PS_SAVER_INTERNAL_H
#define PS_SAVER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "graph/node.h"
#include "paramserver/saver.h"

/* The format written; /1 (no checksum) is still read.  See proto/meta.proto
 * for the checksum: the last 5 bytes of the file. */
#define META_FORMAT "paramserver.meta/2"
#define META_FORMAT_V1 "paramserver.meta/1"
#define META_CHECKSUM_TAG 0x7d /* field 15, wire type 5 (fixed32) */

struct ps_saver {
  ps_graph *g;
  bool all; /* every global variable, resolved at restore time */
  size_t n;
  char **vars;
  char **keys; /* entries may be NULL: the variable's own name */
  int max_to_keep;
  double keep_hours;
  bool dir_retention;
  bool no_meta_graph;
  ps_ckpt_list own; /* the checkpoints it wrote that are still listed */
};

/* saver.c: an empty Saver of @g (NULL: out of memory), and one more
 * variable @var with checkpoint key @key (NULL: its own name); -1 when out
 * of memory, the Saver unchanged. */
ps_saver *ps_saver_new_(ps_graph *g);
int ps_saver_add_(ps_saver *s, const char *var, const char *key);

/* metagraph_export.c: whether @n is an op of a part of a partitioned
 * variable. */
bool ps_meta_is_part_op_(const ps_node *n);

#endif
