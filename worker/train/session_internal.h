/* Shared by the files of the session: session.c (the session object and
 * the variables it holds), session_local.c (nodes run on the worker),
 * session_remote.c (waves of ps RPCs) and session_run.c (ps_session_run:
 * what a run needs, in waves).  Each calls only the ones listed before it.
 * Private to worker/train/. */
#ifndef PS_SESSION_INTERNAL_H
#define PS_SESSION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/node.h"
#include "paramserver/session.h"

typedef struct local_var {
  ps_tensor *value; /* NULL until initialized */
} local_var;

struct ps_session {
  ps_graph *g;
  ps_client *client;
  bool *created; /* per graph variable index */
  size_t ncreated;
  uint64_t *draws; /* per graph variable index: its initializer's runs */
  size_t ndraws;
  uint64_t *kruns; /* per node id: its kernel's runs (ps_kernel_runs_) */
  size_t nkruns;
  local_var *locals;
  size_t nlocals;
  int last_reads, last_updates;
  int last_sync_applied, last_sync_stale;
  bool soft_placement;
  ps_device self;        /* this process's device (ps_session_options) */
  unsigned char *placed; /* per node: its device was checked */
  size_t nplaced;
};

/* ---- run state ---- */

typedef struct run run;

enum { N_UNNEEDED = 0, N_NEEDED, N_DONE };

struct run {
  ps_session *s;
  size_t n;
  char *state;     /* per node */
  ps_tensor **val; /* per node */
  bool *fed;
  bool *remote_gather; /* GatherV2 executed as a ps row read */
  bool *skip_read;     /* a read only gathers use: not read whole */
  bool *want_value;    /* fetched, or a data input of a needed node */
  ps_status *st;
};

/* session.c */
int ps_session_oom_(ps_status *st);
size_t ps_session_var_index_(ps_graph *g, ps_variable *v);
int ps_session_not_in_graph_(ps_variable *v, ps_status *st);
int ps_session_local_err_(ps_session *s, ps_variable *v, ps_status *st);
local_var *ps_session_local_of_(ps_session *s, ps_variable *v);
ps_tensor *ps_session_share_(const ps_tensor *t);
ps_tensor *ps_session_empty_tensor_(void);
ps_tensor *ps_session_update_output_(run *r, ps_node *n, const ps_tensor *value);

/* session_local.c */
int ps_session_init_draw_(ps_session *s, ps_variable *v, uint64_t *seedp, uint64_t *drawp,
                          ps_status *st);
bool ps_session_falls_back_(const ps_node *n);
int ps_session_run_fallback_reads_(run *r, ps_node **wave, size_t nw);
int ps_session_run_local_(run *r, ps_node *n);

/* session_remote.c */
int ps_session_run_remote_(run *r, ps_node **wave, size_t nw);

#endif
