/* Shared by the files of the client (worker/client/), each of one job:
 *   client.c         the library's start and stop, the client object, its
 *                    channels and the notes added to a failed call's status;
 *   client_view.c    the replication view: read from etcd, watched, routes
 *                    (calls nothing of the files here);
 *   client_wire.c    checks of a ps's answers (strings, shapes, names);
 *   client_list.c    the List answer's decoder;
 *   client_call.c    running calls: answers, retries, control calls;
 *   client_control.c Create, Initialize, the queries, Delete, Shutdown,
 *                    List, Status;
 *   client_update.c  updates;  client_read.c  reads;
 *   client_ckpt.c    cluster save and restore;
 *   client_recover.c psctl restore's checks: what the checkpoint holds
 *                    that no ps has, created on request;
 *   client_digest.c  replication's queries: a ps's shards, Digest;
 *   client_embed.c   embedding tables (paramserver/embedding.h);
 *   client_fuzz.c    the answer decoders for the fuzz target.
 * Each file calls only files listed above it (no circles).  Private to
 * worker/client/. */
#ifndef PS_CLIENT_INTERNAL_H
#define PS_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/rpc.h"
#include "common/status.h"
#include "dedup.h"
#include "paramserver/client.h"
#include "paramserver/embedding.h"
#include "ps.pb-c.h"

#define M_CREATE "/paramserver.Ps/Create"
#define M_INITIALIZE "/paramserver.Ps/Initialize"
#define M_IS_INIT "/paramserver.Ps/IsInitialized"
#define M_REPORT "/paramserver.Ps/ReportUninitialized"
#define M_UPDATE "/paramserver.Ps/Update"
#define M_READ "/paramserver.Ps/Read"
#define M_LIST "/paramserver.Ps/List"
#define M_STATUS "/paramserver.Ps/Status"
#define M_DELETE "/paramserver.Ps/Delete"
#define M_SHUTDOWN "/paramserver.Ps/Shutdown"
#define M_RESTORE "/paramserver.Ps/Restore"

/* A table call's keys deduplicated and split by task (client_embed.c), and
 * the last one kept: an update of the keys a lookup just used (a training
 * step) takes a copy instead of hashing them again. */
typedef struct ps_cl_keyset {
  int64_t *u;     /* distinct keys, grouped by task */
  int64_t *from;  /* [n]: the position in u of each key asked */
  int64_t *start; /* [ntasks + 1]: task t's keys are u[start[t]..start[t+1]) */
  int64_t n, nu;
} ps_cl_keyset;
typedef struct ps_cl_table_memo {
  pthread_mutex_t mu;
  int64_t *keys; /* a copy of the keys, n of them */
  int nps;
  ps_cl_keyset ks;
  bool valid;
} ps_cl_table_memo;
/* Frees what the memo holds (client.c, at ps_client_destroy). */
static inline void ps_cl_keyset_fini_(ps_cl_keyset *k) {
  free(k->u);
  free(k->from);
  free(k->start);
  k->u = k->from = k->start = NULL;
}

struct ps_client {
  ps_client_options opt;
  int nps;
  char **addrs;
  ps_rpc_channel **ch;
  /* per task: calls and the microseconds callers waited for them */
  atomic_ullong *calls, *wait_us;
  /* per task: since when (CLOCK_MONOTONIC ns) waiting calls heard nothing */
  atomic_llong *silent_since;
  ps_dedup_memo memo;     /* a gather's ids deduplicated, for the scatter after it */
  ps_cl_table_memo tmemo; /* a table lookup's keys, for the update after it */
  bool tls, client_cert;  /* the channels' security, for hints in errors */
  /* replication (client_view.c): NULL when unreplicated */
  struct ps_cl_view *view;
  uint64_t client_id; /* Update's dedup id (random, never 0) */
  atomic_ullong seq;  /* the last Update seq sent */
};

/* client_view.c */
typedef struct ps_cl_view ps_cl_view;
/* Starts following the view when the options ask for replication (else 0
 * and c->view stays NULL). */
int ps_cl_view_start_(ps_client *c, const ps_cluster *cluster, ps_status *st);
void ps_cl_view_stop_(ps_client *c);
/* Shard @shard's primary (-1: lost) and the view's epoch. */
int ps_cl_view_route_(ps_client *c, int shard, int64_t *epoch);
int64_t ps_cl_view_epoch_(ps_client *c);
/* Whether an answer for @shard stamped @answer_epoch comes from a stale
 * primary: older than the since of the shard's primary in the view. */
bool ps_cl_view_stale_(ps_client *c, int shard, int64_t answer_epoch, int64_t *since,
                       int *primary);
/* Waits up to @ms for a view newer than @epoch (then reads etcd once). */
void ps_cl_view_wait_(ps_client *c, int64_t epoch, int64_t ms);
void ps_cl_view_describe_(ps_client *c, char *buf, size_t n);

/* client.c */
int ps_cl_check_task_(ps_client *c, int task, ps_status *st);
void ps_cl_sleep_ms_(int64_t ms);
/* Adds the task, its address and hints (TLS, limits) to a failed @st. */
void ps_cl_annotate_(ps_client *c, int task, ps_status *st);

/* client_wire.c: checks of answers */
const char *ps_cl_method_name_(const char *method);
int ps_cl_bad_answer_(ps_status *st, const char *method, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int ps_cl_wire_ok_(const ProtobufCMessageDescriptor *d, const char *method,
                   const uint8_t *p, size_t n, ps_status *st);
size_t ps_cl_tensor_limit_(void);
int ps_cl_wire_next_(const uint8_t **q, const uint8_t *end, uint64_t *field,
                     const uint8_t **val, size_t *len);
int ps_cl_answer_shape_(int task, const char *method, const char *name, int dtype,
                        const int64_t *dims, size_t rank, ps_shape *out, size_t *bytes,
                        ps_status *st);
int ps_cl_names_ok_(const char *method, const char *what, char **v, size_t n,
                    ps_status *st);

/* A decoder of an answer's header message into its call's output. */
typedef int (*parse_fn)(void *, const uint8_t *, size_t, ps_rpc_segs *, ps_status *);

/* client_list.c */
typedef struct list_out {
  ps_var_info *v;
  size_t n;
  int task;
  int64_t max_message_bytes; /* the client's receive limit */
  const char *addr;          /* the ps's address, for errors */
} list_out;

int ps_cl_parse_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st);

/* client_call.c */
typedef struct answer {
  parse_fn parse;
  void *user;
  const char *about; /* a variable the call is about, for errors (or NULL) */
  bool seen;         /* the header arrived */
  const char *method;
  int64_t max_message_bytes; /* the client's receive limit */
  int task;
  const char *addr;
  /* replication: the client and the shard the call is for (-1: none),
   * whose answers' epochs are checked against the view */
  ps_client *cl;
  int shard;
} answer;

/* An answer header's top-level fields: how many, and its field 100 (the
 * view epoch of Update/Read/List answers) when that is a varint. */
size_t ps_cl_answer_scan_(const uint8_t *p, size_t n, bool *has_epoch, uint64_t *epoch);
void ps_cl_answer_init_(const ps_client *c, int task, ps_rpc_req *r, answer *a,
                        parse_fn parse, void *user, const char *about);
/* Runs @reqs (one per task in @tasks); retries UNAVAILABLE ones if @safe. */
void ps_cl_run_reqs_(ps_client *c, ps_rpc_req *reqs, const int *tasks, size_t n,
                     bool safe);
void ps_cl_req_init_(ps_client *c, ps_rpc_req *r, int task, const char *method,
                     const ProtobufCMessage *msg, bool unary, bool data);
/* One control call with a unary response parsed by @parse. */
int ps_cl_control_call_(ps_client *c, int task, const char *method,
                        const ProtobufCMessage *msg, bool safe, parse_fn parse,
                        void *user, ps_status *st);
void ps_cl_init_to_proto_(const ps_init_spec *in, Paramserver__Initializer *p);

/* client_control.c */
typedef struct init_out {
  size_t n;
  size_t asked; /* names in the request (0: every variable) */
} init_out;

typedef struct bools_out {
  bool *out;
  size_t n;
  const char *first; /* the first name asked, for errors */
} bools_out;

typedef struct names_out {
  char **names;
  size_t n;
  size_t asked; /* names in the request (0: every variable) */
} names_out;

typedef struct delete_out {
  ps_delete_result *out;
  size_t asked;
} delete_out;

int ps_cl_parse_initialize_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                            ps_status *st);
int ps_cl_parse_is_init_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st);
int ps_cl_parse_report_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st);
int ps_cl_parse_delete_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st);
int ps_cl_parse_shutdown_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                          ps_status *st);
int ps_cl_parse_status_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st);

/* client_update.c */
int ps_cl_parse_update_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st);

/* client_read.c */
typedef struct read_build {
  answer ans;
  bool *allocated; /* outputs this call allocated (freed again on failure) */
  Paramserver__ReadRequest req;
  Paramserver__ReadItem *items;
  Paramserver__ReadItem **ip;
  ps_rpc_segs segs;
  ps_task_reads *t;
  /* gathers sent deduplicated: the ids, and the distinct rows received */
  ps_gather_dedup *dd;
  void **rows;
  size_t *row_bytes;
} read_build;

int ps_cl_parse_read_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st);
/* After a successful call: the deduplicated gathers' rows to every
 * position that asked for them. */
void ps_cl_read_expand_(read_build *b);
int ps_cl_read_build_init_(read_build *b, ps_task_reads *t, ps_dedup_memo *dedup,
                           ps_status *st);
void ps_cl_read_build_fini_(read_build *b);

/* client_digest.c */
typedef struct repl_out {
  ps_task_repl *o;
  int nps;
} repl_out;
typedef struct digest_out {
  ps_digest *d;
  int shard;
} digest_out;
int ps_cl_parse_status_repl_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                             ps_status *st);
int ps_cl_parse_digest_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st);

/* client_embed.c: one ps task's part of a table call, and the answers'
 * decoders */
typedef struct table_lookup_out {
  answer ans;
  Paramserver__TableLookupRequest req;
  ps_rpc_segs segs;
  const char *name;
  int task;
  int64_t n;
  int64_t dim;
  float *rows;
  int64_t created, missing;
} table_lookup_out;
typedef struct table_update_out {
  answer ans;
  Paramserver__TableUpdateRequest req;
  ps_rpc_segs segs;
  const char *name;
  int64_t n;
  uint8_t *buf; /* n keys, then n rows of gradients */
  int64_t applied, missing;
} table_update_out;
typedef struct table_list_out {
  ps_table_info *v;
  size_t n;
} table_list_out;
int ps_cl_parse_table_create_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st);
int ps_cl_parse_table_lookup_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st);
int ps_cl_parse_table_update_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st);
int ps_cl_parse_table_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                            ps_status *st);

/* client_ckpt.c */
typedef struct save_out {
  int64_t bytes;
  char *prefix;
  size_t n;
  size_t asked;        /* Restore: the variables asked for (0: all) */
  ps_ckpt_list listed; /* Merge: the state file's list afterwards */
  bool checked;        /* Restore: the ps answered a check_only as one */
} save_out;

int ps_cl_parse_save_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st);
int ps_cl_parse_merge_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st);
int ps_cl_parse_restore_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st);
/* The restore of every variable of every ps from @prefix (ps_client_restore
 * before psctl restore's checks); *@nrestored: how many. */
int ps_cl_restore_all_(ps_client *c, const char *prefix, size_t *nrestored,
                       ps_status *st);
/* ps_client_restore_vars (or its check), and how many the ps restored. */
int ps_cl_restore_vars_(ps_client *c, int task, const char *prefix,
                        const char *const *names, const char *const *keys, size_t n,
                        bool check_only, size_t *nrestored, ps_status *st);

/* client_recover.c: a checkpoint's variables as RestoreRequest.list gives
 * them, each part of a partitioned one a variable of its own */
typedef struct ckpt_var {
  char *name; /* the variable: its key, or "KEY/part_I" for part I */
  char *key;  /* its checkpoint key */
  int dtype;
  ps_shape shape;      /* a part: its rows */
  ps_shape full_shape; /* a part: the full tensor's */
  int64_t offset;      /* a part: its first element in the full tensor */
  bool part;
  bool rows;    /* a part along dimension 0 (else no ps variable can hold it) */
  bool present; /* a ps holds it */
  int where;    /* the ps task it is created on (--create) */
} ckpt_var;

typedef struct ckpt_vars {
  ckpt_var *v;
  size_t n;
  char *prefix;   /* the checkpoint the ps resolved */
  bool listed;    /* the ps answered the list as one */
  bool checked;   /* an older ps-server that answered as a check */
  size_t skipped; /* tensors of dtypes no ps holds: not ps variables */
  /* set by the caller, kept by the parser: the cap on the answer's
   * tensors and slices, and the ps named in its errors */
  int64_t max_message_bytes;
  int task;
  const char *addr;
  bool prefix_only; /* keeps the answer's prefix alone, not its tensors */
} ckpt_vars;

void ps_cl_ckpt_vars_fini_(ckpt_vars *cv);
int ps_cl_parse_restore_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st);

#endif
