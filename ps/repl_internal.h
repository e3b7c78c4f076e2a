/* The replication data plane's insides (ps/repl.h), shared by repl.c (the
 * view, routing checks, dedup records, the hooks the service calls),
 * repl_send.c (one sender per backup task: its FIFO, batching, Replicate
 * calls, the state copy) and repl_apply.c (the backup's Replicate handler,
 * Digest).  Private to ps/.
 *
 * Locks: ps_repl.mu guards the view, the senders, their FIFOs and the
 * waits.  It is taken after variable locks (the hooks run while a request
 * holds its variables' write locks), never before them.  ps_repl.meta
 * serializes Create and Delete with the entries they enqueue, so a name
 * deleted and created again reaches every backup in that order. */
#ifndef PS_REPL_INTERNAL_H
#define PS_REPL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/view.h"
#include "repl.h"
#include "repl_frame.h"
#include "store.h"

/* Entry kinds (ReplicateEntry.Kind of proto/ps.proto). */
#define PS_REPL_VALUE 0
#define PS_REPL_ROWS 1
#define PS_REPL_CREATE 2
#define PS_REPL_DELETE 3
#define PS_REPL_DEDUP 4
#define PS_REPL_DONE 5

/* Entries and bytes of one Replicate call at most, unless one group (one
 * request's effects, one variable of a state copy) is larger: a batch ends
 * only at a group's end, so a backup never applies part of a request. */
#define PS_REPL_BATCH_ENTRIES 4096
#define PS_REPL_BATCH_BYTES ((int64_t)64 << 20)

/* Dedup records, per (shard, client): the highest seq applied and which of
 * the PS_REPL_DEDUP_WINDOW seqs up to it were; at most
 * PS_REPL_DEDUP_CLIENTS clients per shard (the one recorded least recently
 * is evicted first). */
#define PS_REPL_DEDUP_WINDOW 4096
#define PS_REPL_DEDUP_CLIENTS 1024

/* Called once the entries of a request were acknowledged by every in-sync
 * backup (@rc 0), or can never be (@rc UNAVAILABLE: fenced, shutting
 * down).  Runs on a sender's thread or the membership thread, with no
 * lock of the data plane held. */
typedef void (*ps_repl_done_fn)(void *arg, int rc, const ps_status *st);

typedef struct ps_repl_wait {
  int pending; /* backups still to acknowledge (under ps_repl.mu) */
  int lost;    /* >= 0: a view took shard `lost` from this primary first */
  /* its request's thread is sending it (ps_repl_send_inline) and holds one
   * count of `pending`: nobody else calls or frees it meanwhile; `failed`:
   * a fence or the shutdown released it then (that thread answers) */
  bool held, failed;
  ps_repl_done_fn fn;
  void *arg;
} ps_repl_wait;

/* Cut-through (repl_stage.c, DESIGN.md "The replication link"): the
 * bytes of a large assign forwarded to one backup in STAGE frames while
 * they still arrive from the client.  One per (request item, backup), in
 * its sender's list; references: the list's, the request's until it is
 * done with it (ps_repl_stage_end), each entry that may name it.  Fields
 * under r->mu. */
typedef struct ps_repl_stage {
  struct ps_repl_stage *next; /* in snd->stages */
  struct ps_repl_sender *snd; /* NULL once out of the list */
  atomic_int refs;
  ps_buf *buf;  /* the item's value (a reference) */
  uint64_t id;  /* the frames' stage id */
  size_t avail; /* bytes of buf the request has filled */
  size_t sent;  /* bytes written in STAGE frames */
  int64_t gen;  /* the link connection they went on */
  bool closed;  /* the request is done with it */
  bool used;    /* a BATCH named it: the backup took it */
  bool skip;    /* not forwarded (no link, or it broke) */
} ps_repl_stage;
/* At most this many stages per sender (and per link connection on a
 * backup); a value of fewer bytes is not staged. */
#define PS_REPL_MAX_STAGES PS_LINK_MAX_STAGES

typedef struct ps_repl_entry {
  struct ps_repl_entry *next;
  int kind, shard;
  char *name;
  int dtype;
  ps_shape shape;
  int64_t version, base_version, var_epoch;
  bool initialized;
  ps_buf *val; /* VALUE: the variable's buffer (a reference); ROWS: the rows */
  ps_buf *idx; /* ROWS: the indices */
  int index_dtype;
  int64_t num_indices;
  uint8_t *spec; /* CREATE: a packed VariableSpec */
  size_t spec_len;
  uint64_t client_id, seq;
  ps_repl_wait *wait;   /* the last entry of a waited group for this backup */
  int64_t bytes;        /* bulk bytes */
  bool group_end;       /* the last entry of its group for this backup: a batch
                           is cut only after such an entry */
  bool dropped;         /* inflight, of a shard this ps no longer sends to that
                           backup: left out of the batch when it is re-sent */
  ps_repl_stage *stage; /* VALUE: the stage of its buffer (a reference) */
} ps_repl_entry;

/* The effects of one request, gathered while it holds its locks and
 * enqueued at once by ps_repl_commit. */
typedef struct ps_repl_group {
  ps_repl_entry *e;
  size_t n, cap;
  bool oom;
} ps_repl_group;

typedef struct ps_repl_sender {
  struct ps_repl_sender *next;
  struct ps_repl *r;
  int task;
  ps_rpc_channel *ch;
  pthread_t th;
  pthread_cond_t cv;
  /* under r->mu */
  ps_repl_entry *head, *tail; /* queued, not yet in a call */
  ps_repl_entry *inflight;    /* the batch of the call running */
  int64_t lag_entries, lag_bytes;
  bool failed;      /* a Replicate failed: nothing more is sent */
  bool stale;       /* the backup refused a batch as stale: nothing is sent
                       until the next view */
  bool retired;     /* no longer a backup of any shard: the thread ends */
  bool exited;      /* the thread ended (ps_repl_senders_reap joins it) */
  bool *caught_up;  /* [ntasks]: it acknowledged the DONE of that shard's
                       copy: waited for from then on, SYNCING or not */
  int *copy_shards; /* shards to copy (SYNCING), FIFO */
  size_t ncopy, capcopy;
  int64_t copied_bytes;
  /* the sender thread's own: the link to the backup (repl_link.c) */
  int link_fd;             /* -1: none (batches go as Replicate calls) */
  int64_t link_retry_ms;   /* when to ask for a link again (ps_repl_now_ms) */
  int64_t link_backoff_ms; /* after one offered but out of reach: doubles */
  /* a request's thread sends its batch over the link itself (under
   * r->mu): the sender thread waits, and does not end, meanwhile */
  bool inline_busy;
  /* cut-through: its stages (in order), how many, the last id given; the
   * thread writes a STAGE or UNSTAGE frame (no inline send meanwhile);
   * the link connection's number (the thread's own: +1 at each open) */
  ps_repl_stage *stages;
  int nstages;
  uint64_t stage_ids;
  bool stage_io;
  int64_t link_gen;
  int inline_rc; /* != 0: the in-flight batch failed so on a request's thread */
  ps_status inline_st;
} ps_repl_sender;

typedef struct ps_link_conn ps_link_conn;

typedef struct ps_dedup_client {
  uint64_t id;
  int shard;
  bool any; /* a seq was recorded: max is valid */
  uint64_t last_use;
  uint64_t max;                             /* the highest seq recorded */
  uint64_t bits[PS_REPL_DEDUP_WINDOW / 64]; /* bit seq % WINDOW: seq applied */
} ps_dedup_client;

struct ps_repl {
  struct ps_service *svc;
  ps_store *store;
  int self, ntasks;
  char **addrs;
  ps_rpc_channel_security sec;
  char *sec_strs[5];
  ps_repl_callbacks cb;
  pthread_mutex_t mu;
  pthread_cond_t view_cv;
  ps_view view; /* epoch 0: none yet */
  bool fenced, stopping;
  char fence_reason[256];
  ps_repl_sender *senders; /* live and retiring */
  int *last_holders;       /* [ntasks * PS_VIEW_MAX_REPLICAS]: for lost shards */
  int64_t *shard_applied;  /* [ntasks]: bytes applied per shard (a copy's progress) */
  long long failovers, sent_bytes, applied_bytes;
  long long cut_through_bytes; /* values named by stage (repl_stage.c) */
  /* requests forwarding bytes (repl_stage.c: under its own lock) */
  struct ps_repl_staging *stagings;
  pthread_mutex_t meta;
  /* Replicate holds it (read) from its fencing check through the last
   * entry applied; ps_repl_set_view holds it (write) while it installs a
   * view, so no batch checked under an old view applies under a new one
   * (a stale primary's VALUE never lands on top of the new primary's
   * updates).  Taken before variable locks and r->mu. */
  pthread_rwlock_t apply_rw;
  /* the replication link's listener (repl_link.c; -1: none) and its
   * connections (under mu) */
  int link_fd, link_port;
  uint8_t link_key[32];
  pthread_t link_th;
  ps_link_conn *link_conns;
  int nlink_conns;
  bool link_asked; /* primaries may ask for the link (ps_repl_link_start) */
  /* request threads inside ps_repl_commit or between meta_lock and
   * meta_unlock: ps_repl_destroy waits for them */
  atomic_int users;
  int64_t max_batch_bytes; /* --max-tensor-bytes: what a backup takes at once */
  /* dedup records */
  pthread_mutex_t dmu;
  ps_dedup_client *clients;
  size_t nclients, capclients;
  uint64_t dclock;
};

/* ---- repl.c: the hooks of the service ---- */

/* A request's Route: 0 when this ps serves shard @shard as its primary
 * (@shard -1: any; then only fencing and the epoch are checked);
 * FAILED_PRECONDITION "ps/1 is not the primary of shard 0 (view epoch 5;
 * primary ps/2)"; UNAVAILABLE when fenced or the shard is lost.  @epoch
 * is the client's (0: routed by the placement before any view). */
int ps_repl_check_route(ps_repl *r, int shard, int64_t epoch, const char *method,
                        ps_status *st);
/* Every variable of @vars (locked) is of a shard this ps is primary of,
 * and it is not fenced. */
int ps_repl_check_vars(ps_repl *r, ps_var *const *vars, size_t n, const char *method,
                       ps_status *st);
/* Shards this ps is primary of (bitmap of @n bytes; false beyond). */
int64_t ps_repl_primary_set(ps_repl *r, bool *is_primary, size_t n);

/* ---- repl_dedup.c ---- */

/* Dedup of shard @shard: *@dup true when (@cid, @seq) was applied
 * already; FAILED_PRECONDITION when @seq is below the window remembered
 * for @cid (it cannot tell). */
int ps_repl_dedup_check(ps_repl *r, int shard, uint64_t cid, uint64_t seq, bool *dup,
                        ps_status *st);
void ps_repl_dedup_record(ps_repl *r, int shard, uint64_t cid, uint64_t seq);
/* Forgets shard @shard's records (its copy is dropped). */
void ps_repl_dedup_forget(ps_repl *r, int shard);
/* Shard @shard's records for a state copy, in the order that rebuilds
 * them (clients least recently recorded first, seqs ascending): *@cids,
 * *@seqs malloc'd, returns how many. */
size_t ps_repl_dedup_dump(ps_repl *r, int shard, uint64_t **cids, uint64_t **seqs);

/* ---- repl_entry.c ---- */

/* Group building (caller holds the variables' locks). */
void ps_repl_add_value(ps_repl_group *g, const ps_var *v);
void ps_repl_add_rows(ps_repl_group *g, const ps_var *v, int64_t base_version,
                      ps_buf *idx, int index_dtype, int64_t nidx);
void ps_repl_add_create(ps_repl_group *g, const ps_var *v);
void ps_repl_add_delete(ps_repl_group *g, int shard, const char *name);
void ps_repl_add_dedup(ps_repl_group *g, int shard, uint64_t cid, uint64_t seq);
void ps_repl_group_fini(ps_repl_group *g);
void ps_repl_entry_fini(ps_repl_entry *e);
ps_repl_entry *ps_repl_entry_clone(const ps_repl_entry *e);
void ps_repl_entry_free(ps_repl_entry *e);

/* ---- repl.c ---- */
/* Enqueues @g's entries into the FIFO of every backup of their shards,
 * atomically.  0: nothing to wait for (@fn is not called);
 * PS_RPC_PENDING: @fn(@arg) will be called once; else an error (fenced,
 * out of memory) with @st.  Frees @g's entries in every case. */
int ps_repl_commit(ps_repl *r, ps_repl_group *g, ps_repl_done_fn fn, void *arg,
                   ps_status *st);

/* For Create and Delete. */
void ps_repl_meta_lock(ps_repl *r);
void ps_repl_meta_unlock(ps_repl *r);

/* Status's replication fields (the strings point into static tables). */
struct Paramserver__StatusResponse;
struct Paramserver__ShardStatus;
/* Fills @resp (shards malloc'd: free with ps_repl_status_free). */
void ps_repl_status(ps_repl *r, struct Paramserver__StatusResponse *resp);
void ps_repl_status_free(struct Paramserver__StatusResponse *resp);

/* ---- repl_apply.c: one batch on the backup, from a Replicate call or
 * the link ---- */
typedef struct ps_repl_batch ps_repl_batch;
struct Paramserver__ReplicateRequest;
struct Paramserver__ReplicateResponse;
/* Decodes a packed ReplicateRequest and checks its entries against the
 * limits: *@out (freed by ps_repl_batch_free, also on error) gets the
 * batch, @sink the buffers its bulk bytes go into, in order. */
int ps_repl_batch_decode(struct ps_service *s, const uint8_t *p, size_t n,
                         ps_repl_batch **out, ps_rpc_segs *sink, ps_status *st);
/* The staged values of @b's entries (the decode left them out of @sink)
 * from the link connection's stages @t; INVALID_ARGUMENT naming the stage
 * when one is missing, or for any with @t NULL (a Replicate call). */
int ps_repl_batch_take_staged(ps_repl_batch *b, ps_link_stages *t, ps_status *st);
/* Fencing, then the entries applied in order: *@applied, *@epoch (the
 * view's). */
int ps_repl_batch_apply(struct ps_service *s, ps_repl_batch *b, int64_t *applied,
                        int64_t *epoch, ps_status *st);
void ps_repl_batch_free(ps_repl_batch *b);
/* The batch's inline_data (bulk bytes inside the message). */
const ProtobufCBinaryData *ps_repl_batch_inline(const ps_repl_batch *b);

/* ---- repl_link.c: batches over a plain TCP connection ---- */

/* (the frames: ps/repl_frame.h) */

/* Backup: stops the listener and every connection (in ps_repl_destroy). */
void ps_repl_link_stop(ps_repl *r);
/* Primary, on sender @snd's thread: asks backup @snd->task for its link
 * and connects; 0, or an error (batches then go as Replicate calls). */
int ps_repl_link_open(ps_repl_sender *snd, int64_t epoch, ps_status *st);
/* Primary: one batch over the link (@req packed, @segs its bulk bytes);
 * 0 and *@applied, the backup's error, or UNAVAILABLE when the link broke
 * (it is closed). */
int ps_repl_link_send(ps_repl_sender *snd,
                      const struct Paramserver__ReplicateRequest *req,
                      const ps_rpc_segs *segs, int64_t *applied, ps_status *st);
void ps_repl_link_close(ps_repl_sender *snd);
/* CLOCK_MONOTONIC in ms (the link's timeouts, its retries). */
int64_t ps_repl_now_ms(void);

/* Primary, on the link's owner thread: one STAGE frame (@n bytes of
 * @buf from @off) or UNSTAGE; 0, or UNAVAILABLE (the link is closed). */
int ps_repl_link_stage(ps_repl_sender *snd, uint64_t id, const ps_buf *buf, size_t off,
                       size_t n, ps_status *st);
int ps_repl_link_unstage(ps_repl_sender *snd, uint64_t id, ps_status *st);

/* ---- repl_stage.c: cut-through ---- */

void ps_repl_stage_unref(ps_repl_stage *s);
/* ps_repl_destroy (before the senders stop): the requests still holding
 * stages let go of @r (they may outlive it: a client that stopped sending
 * halfway must not hold up the shutdown). */
void ps_repl_stage_orphan_all(ps_repl *r);
/* Commit (under r->mu): entry @c, just queued for @snd, names the stage of
 * its value buffer when there is one. */
void ps_repl_stage_claim(ps_repl_sender *snd, ps_repl_entry *c);
/* The sender's thread (under r->mu, released meanwhile): one step of
 * stage work (a STAGE piece, an UNSTAGE, a stage let go); false: none. */
bool ps_repl_stage_work(ps_repl_sender *snd);
/* The link's owner (r->mu not held), building a batch: the stage id entry
 * @e may name (the rest of its bytes written first), or 0 (its bytes go
 * in the batch). */
uint64_t ps_repl_stage_use(ps_repl_sender *snd, const ps_repl_entry *e);
/* The sender's thread ends (under r->mu): it lets go of its stages. */
void ps_repl_stage_release_all(ps_repl_sender *snd);

/* ---- repl_send.c ---- */

/* The sender of backup @task (under r->mu), created and started if new. */
ps_repl_sender *ps_repl_sender_get(ps_repl *r, int task);
/* Appends @e to @snd's FIFO (under r->mu). */
void ps_repl_sender_push(ps_repl_sender *snd, ps_repl_entry *e);
/* Drops @snd's entries for which @keep (shard, backup task) says
 * PS_REPL_DROP_*, releasing their waits into *@done (under r->mu); NULL:
 * every wait is released (fence, shutdown). */
#define PS_REPL_DROP_ACK 0  /* the backup left the shard: no longer waited for */
#define PS_REPL_KEEP 1      /* still to be sent */
#define PS_REPL_DROP_LOST 2 /* this ps is no longer the shard's primary */
void ps_repl_sender_drop(ps_repl_sender *snd, int (*keep)(ps_repl *, int, int),
                         ps_repl_wait ***done, size_t *ndone, size_t *cap);
/* Asks @snd to copy shard @s (under r->mu). */
void ps_repl_sender_copy(ps_repl_sender *snd, int s);
/* Whether the group just pushed to @snd (its whole FIFO, none in flight)
 * may go over the link on the request's own thread (under r->mu). */
bool ps_repl_sender_inline_ok(const ps_repl_sender *snd);
/* Sends the FIFOs of @snds (each ps_repl_sender_inline_ok) over their
 * links on this thread: under r->mu, which it releases meanwhile (@w held
 * meanwhile).  0: every backup acknowledged (@w is not called; the caller
 * frees it); PS_RPC_PENDING: @w waits on (what failed is left in flight
 * for the sender threads, which call it); else the update fails with @st
 * (fenced, shutting down, or the shard taken from this ps meanwhile). */
int ps_repl_send_inline(ps_repl *r, ps_repl_sender *const *snds, size_t n,
                        ps_repl_wait *w, ps_status *st);
/* Joins every sender's thread and frees them (r->stopping set). */
void ps_repl_senders_join(ps_repl *r);
/* Joins and frees the retired senders whose thread ended (no lock held). */
void ps_repl_senders_reap(ps_repl *r);

#endif
