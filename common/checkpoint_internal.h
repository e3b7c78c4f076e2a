/* What the checkpoint-directory files (checkpoint_*.c) share; private to
 * common/ (checkpoint_util.c defines it). */
#ifndef PS_COMMON_CHECKPOINT_INTERNAL_H
#define PS_COMMON_CHECKPOINT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "paramserver/checkpoint.h"
#include "paramserver/status.h"

/* A growable string; on allocation failure it stays NULL-terminated and
 * remembers the failure. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

/* Appends to @b; on allocation failure @b stays as it was and b->oom is
 * set. */
void ps_sb_putn_(sbuf *b, const char *s, size_t n);
void ps_sb_puts_(sbuf *b, const char *s);
void ps_sb_putc_(sbuf *b, char c);
/* a + b + c, malloc'd; NULL when out of memory. */
char *ps_str_cat3_(const char *a, const char *b, const char *c);
/* RESOURCE_EXHAUSTED "out of memory"; returns the code. */
int ps_ckpt_oom_(ps_status *st);

/* os.path.join(dir, p): an absolute @p wins.  malloc'd, NULL if out of
 * memory (as every path function here). */
char *ps_path_join_(const char *dir, const char *p);
/* os.path.normpath */
char *ps_path_normalize_(const char *path);
/* os.path.abspath (normalized, against the working directory) */
char *ps_path_abs_normalize_(const char *path);
/* @p is @dir or below it (both normalized). */
bool ps_path_within_(const char *p, const char *dir);

/* The kinds of floating values ps_repr_float_ prints. */
enum { K_DOUBLE, K_FLOAT, K_HALF, K_BF16 };
/* Python's repr() of @v as the given kind would print it (the shortest
 * digits that read back exactly); with @strip_zero, "2.0" becomes "2"
 * (complex parts). */
void ps_repr_float_(sbuf *b, double v, int kind, bool strip_zero);

/* The state file of @dir as it is (paths not made absolute); an absent
 * file is an empty state. */
int ps_ckpt_state_read_raw_(const char *dir, ps_ckpt_state *s, ps_status *st);
/* The same, and ps_ckpt_state_write, through the directory @dirfd opened
 * (AT_FDCWD: by the path @dir): the state file is read, created, renamed
 * and synced there, a link at its name never followed; @dir names it in
 * messages. */
int ps_ckpt_state_read_raw_at_(int dirfd, const char *dir, ps_ckpt_state *s,
                               ps_status *st);
int ps_ckpt_state_write_at_(int dirfd, const char *dir, const ps_ckpt_state *s,
                            ps_status *st);

#endif
