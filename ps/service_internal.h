/* Shared by the files of the Ps service: service.c (the service object,
 * Create, Initialize, the queries, Delete), service_check.c (the request
 * checks every handler makes), service_update.c (Update, synchronous
 * updates), service_read.c (Read) and service_handlers.c (the handler
 * table, gathered from the tables the handler files export).  Private to
 * ps/. */
#ifndef PS_SERVICE_INTERNAL_H
#define PS_SERVICE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/init.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/tensor.h"
#include "service.h"

struct ps_service {
  ps_store *store;
  char *ckpt_dir;
  char task[64];
  char address[256];
  struct timespec start;
  atomic_llong rpcs;
  atomic_bool sync_closed; /* shutting down: no call may start waiting */
  ps_service_limits limits;
  /* the last shard this ps saved (metrics): wall-clock end, seconds, bytes */
  pthread_mutex_t ckpt_mu;
  double ckpt_time, ckpt_secs;
  long long ckpt_bytes, ckpt_count;
  void (*on_shutdown)(void *); /* the daemon's stop, for Shutdown calls */
  void *shutdown_arg;
  struct ps_repl *repl;          /* replication (NULL: R = 1, no hook runs) */
  struct ps_embed_store *tables; /* embedding tables (service_embed.c) */
};

/* The request's list (field 1) and strings are checked on the wire before
 * anything is unpacked (see ps_svc_check_items_ and common/wire.h). */
#define CHECK_WIRE(desc, method)                                                         \
  do {                                                                                   \
    int rc_ = ps_wire_check_strings(&(desc), p, n, method, st);                          \
    if (rc_ == 0) rc_ = ps_svc_check_items_(s, p, n, method, st);                        \
    if (rc_ != 0) return rc_;                                                            \
  } while (0)

/* service_check.c: the service of a call (and one more RPC counted),
 * request checks and sizes held to the limits before anything is
 * allocated. */
ps_service *ps_svc_of_(ps_rpc_call *c);
int ps_svc_bad_request_(ps_status *st, const char *method);
int ps_svc_check_items_(ps_service *s, const uint8_t *p, size_t n, const char *method,
                        ps_status *st);
int ps_svc_tensor_bytes_(ps_service *s, int dtype, const ps_shape *shape,
                         const char *what, const char *var, size_t *out, ps_status *st);
int ps_svc_add_staged_(ps_service *s, size_t *total, size_t add, const char *method,
                       ps_status *st);
int ps_svc_elems_bytes_(ps_service *s, int dtype, int64_t count, const char *what,
                        const char *var, size_t *out, ps_status *st);
int ps_svc_shape_from_(ps_shape *s, const int64_t *dims, size_t n, const char *var,
                       ps_status *st);
const char *ps_svc_fmt_shape_(const ps_shape *s, char *buf, size_t n);
struct Paramserver__Initializer;
/* An Initializer message as a spec for variable @var of @dtype
 * (INVALID_ARGUMENT naming @var); @out borrows @p's values. */
int ps_svc_init_from_proto_(const struct Paramserver__Initializer *p, const char *var,
                            int dtype, ps_init_spec *out, ps_status *st);
/* A request's bulk bytes (unless @rc already failed it): from its
 * @inl inline data when there is any (exactly @sink's total, else
 * INVALID_ARGUMENT "METHOD: inline data has N bytes, the ITEMS need M"),
 * else as Chunks into @sink (ps_rpc_call_expect).  Frees @sink.  Returns
 * the outcome. */
int ps_svc_expect_(ps_rpc_call *c, int rc, const ProtobufCBinaryData *inl,
                   ps_rpc_segs *sink, const char *method, const char *items,
                   ps_status *st);
/* Update.fill: an asynchronous Assign's initializer checked against the
 * value's @shape (or the part's place in its full shape), and run into
 * @out (the values the client's ps_init_fill_draw() would compute). */
struct Paramserver__Update;
int ps_svc_check_fill_(const struct Paramserver__Update *u, const ps_shape *shape,
                       bool sync, const char *op, ps_status *st);
int ps_svc_run_fill_(const struct Paramserver__Update *u, const ps_shape *shape,
                     void *out, ps_status *st);
/* Update's and Read's indices: each in [0, @bound). */
int ps_svc_check_indices_(const void *idx, size_t isize, int64_t n, int64_t bound,
                          const char *var, const char *op, ps_status *st);
/* The handler tables of the files, for service_handlers.c (ckpt.h has
 * ckpt.c's). */
extern const ps_rpc_handler ps_svc_handlers[10];       /* service.c */
extern const ps_rpc_handler ps_svc_update_handlers[1]; /* service_update.c */
extern const ps_rpc_handler ps_svc_read_handlers[1];   /* service_read.c */
extern const ps_rpc_handler ps_repl_handlers[2];       /* repl_apply.c */
extern const ps_rpc_handler ps_svc_embed_handlers[4];  /* service_embed.c */
/* service_repl.c: a request's Route (NULL: none) checked: 0, or
 * FAILED_PRECONDITION / UNAVAILABLE as ps_repl_check_route says. */
struct Paramserver__Route;
int ps_svc_route_(ps_service *s, const struct Paramserver__Route *route,
                  const char *method, ps_status *st);
/* The shard a Route limits a request to (-1: every variable). */
int ps_svc_route_shard_(ps_service *s, const struct Paramserver__Route *route);
/* ps_store_find, and NOT_FOUND for a variable of another shard (@shard >= 0). */
ps_var *ps_svc_find_(ps_service *s, int shard, const char *name, ps_status *st);
/* ps_store_list of @shard's variables (@shard -1: all). */
ps_var **ps_svc_list_(ps_service *s, int shard, size_t *n);
/* Enqueues @g for the backups and holds the call's answer until they
 * acknowledged: the handler sets its reply, then returns this; its
 * on_data is ps_svc_held_data_ and its on_free ps_svc_held_free_ (the
 * call's ctx is the hold). */
struct ps_repl_group;
int ps_svc_commit_(ps_rpc_call *c, struct ps_repl_group *g, ps_status *st);
int ps_svc_held_data_(ps_rpc_call *c, ps_status *st);
void ps_svc_held_free_(ps_rpc_call *c);
/* Update: every variable of @vars (locked) is of a shard this ps is
 * primary of, and (@cid != 0) whether (@cid, @seq) was applied already
 * (*@dup); @before[i] gets vars[i]'s version. */
int ps_svc_update_check_(ps_service *s, ps_var *const *vars, size_t n, uint64_t cid,
                         uint64_t seq, bool *dup, int64_t *before, ps_status *st);
/* A scatter or sparse optimizer update of @v's rows @idx (ROWS entries). */
typedef struct ps_svc_rows {
  ps_var *v;
  ps_buf *idx;
  int index_dtype;
  int64_t n;
} ps_svc_rows;
/* The effects of an applied Update (still locked): the variables whose
 * version moved, as ROWS or VALUE entries, and its dedup record; then
 * ps_repl_commit (its return: 0, PS_RPC_PENDING (@fn called later) or an
 * error). */
typedef void (*ps_svc_done_fn)(void *arg, int rc, const ps_status *st);
int ps_svc_update_effects_(ps_service *s, ps_var *const *vars, size_t n,
                           const int64_t *before, const ps_svc_rows *rows, size_t nrows,
                           uint64_t cid, uint64_t seq, ps_svc_done_fn fn, void *arg,
                           ps_status *st);
/* The shards this ps is primary of (malloc'd, *@n of them); NULL when
 * unreplicated (or out of memory: *@n is 0 then too). */
bool *ps_svc_primary_shards_(ps_service *s, size_t *n);
/* Restore: its effects enqueued under its locks (ps_svc_blocking_commit_),
 * then, the locks dropped, waited for (ps_svc_blocking_wait_ with the
 * commit's return; returns the outcome). */
typedef struct ps_svc_blocking {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int rc;
  ps_status st;
} ps_svc_blocking;
int ps_svc_blocking_commit_(ps_service *s, struct ps_repl_group *g, ps_svc_blocking *b,
                            ps_status *st);
int ps_svc_blocking_wait_(ps_svc_blocking *b, int rc, ps_status *st);
/* service_update.c: answers the calls whose synchronous updates @w were
 * waiting on (Delete fails them). */
struct ps_sync_waiter;
void ps_svc_sync_release_all_(struct ps_sync_waiter *w);

#endif
