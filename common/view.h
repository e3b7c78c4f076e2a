/* The replication view: which ps tasks hold each shard, which of them is
 * the primary, and which are still copying it.  One JSON value in etcd
 * (key "/paramserver/JOB/view"), changed only by a compare-and-swap on its
 * mod_revision, each change one epoch more (DESIGN.md "Replication").
 *
 * Shard S is the set of variables placed on ps/S (the device placement
 * users see is unchanged).  Placement (deterministic, documented in
 * DESIGN.md): shard S's replicas are ps/S (its primary at start) and the
 * next R-1 tasks after S in ring order (S+1, S+2, ... mod N), skipping a
 * task on a host that already holds a replica of S while another task on a
 * new host is left (hosts as the cluster spec names them; all on one host:
 * plain ring order).
 *
 * The functions here are pure: no I/O, no locks.  A transition returns a
 * new view with epoch + 1 (or the same view, *@changed = false, when it
 * changes nothing), so any ps may compute it from the view it read and
 * compare-and-swap it in: two ps computing the same transition from the
 * same view write the same value. */
#ifndef PS_VIEW_H
#define PS_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PS_VIEW_MAX_REPLICAS 3
#define PS_VIEW_MAX_TASKS 4096
/* A view's JSON text is at most this long (decoder refuses longer). */
#define PS_VIEW_MAX_BYTES (4u << 20)

/* A replica's state in a shard. */
#define PS_REPLICA_IN_SYNC 0 /* holds every acknowledged update */
#define PS_REPLICA_SYNCING 1 /* copying the shard: may not become primary */

typedef struct ps_view_shard {
  int n;                           /* replicas listed (0: shard lost) */
  int task[PS_VIEW_MAX_REPLICAS];  /* task[0] is the primary */
  int state[PS_VIEW_MAX_REPLICAS]; /* PS_REPLICA_*; task[0] is IN_SYNC */
  int64_t since;                   /* epoch at which task[0] became primary */
} ps_view_shard;

typedef struct ps_view {
  int64_t epoch;        /* >= 1 */
  int replicas;         /* R: 2 or 3 (the target; a shard may list fewer) */
  int ntasks;           /* ps tasks N = shards */
  ps_view_shard *shard; /* [ntasks], malloc'd */
  bool *joined;         /* [ntasks]: the task has started once (see ps_view_join) */
} ps_view;

/* Replication settings of a job (flags, or the cluster spec's
 * "replication" section: {"replicas": 2, "etcd": "h:p,h:p", "job": "x",
 * "lease_ttl": 2}). */
typedef struct ps_repl_conf {
  int replicas;        /* 1: unreplicated (nothing else is used) */
  char etcd[1024];     /* endpoints "HOST:PORT[,...]" */
  char job[128];       /* etcd key prefix /paramserver/JOB/ ([A-Za-z0-9_.-]) */
  int64_t lease_ttl_s; /* default 2 */
} ps_repl_conf;
/* (ps_repl_conf_from_cluster in cluster.h fills one from a cluster spec.) */

/* The first view (epoch 1): every shard at its placement, every replica
 * in sync, no task joined.  @hosts[i] is ps/i's host (NULL: all on one
 * host).  INVALID_ARGUMENT when R < 2, R > PS_VIEW_MAX_REPLICAS, or
 * R > N ("--replicas 3 needs at least 3 ps tasks, the cluster has 2"). */
int ps_view_initial(int ntasks, int replicas, const char *const *hosts, ps_view *out,
                    ps_status *st);
/* Shard @s's replica tasks at placement (what ps_view_initial lists), in
 * order; returns how many (R). */
int ps_view_placement(int ntasks, int replicas, const char *const *hosts, int s,
                      int *tasks);

void ps_view_free(ps_view *v);
int ps_view_copy(const ps_view *v, ps_view *out, ps_status *st);

/* JSON (malloc'd, NUL-terminated):
 * {"epoch":E,"replicas":R,"joined":[true,...],
 *  "shards":[{"replicas":[1,2],"syncing":[2],"since":E},...]}
 * ps_view_decode checks everything (sizes, ranges, a task at most once per
 * shard, the primary in sync, ntasks matching @ntasks; @ntasks 0 takes
 * any count) and refuses with INVALID_ARGUMENT "view: ..." naming what is
 * wrong; it never trusts the text (etcd is outside input). */
char *ps_view_encode(const ps_view *v);
int ps_view_decode(const char *text, size_t len, int ntasks, ps_view *out, ps_status *st);

/* Queries. */
int ps_view_primary(const ps_view *v, int s); /* -1 when the shard is lost */
/* @task's role in shard @s: -1 none, else PS_REPLICA_*; *@is_primary. */
int ps_view_role(const ps_view *v, int s, int task, bool *is_primary);
bool ps_view_equal(const ps_view *a, const ps_view *b);

/* Transitions (new epoch in @out; *@changed false and @out a copy when
 * nothing changes):
 *
 * remove_task: @task is gone (killed, cut off, restarting).  It leaves
 * every shard; where it was the primary, the first IN_SYNC backup becomes
 * primary (since = new epoch) and, R = 3, the other backups become
 * SYNCING (they may hold an update the new primary lacks).  A shard left
 * with no replica, or whose primary had no IN_SYNC backup, is lost
 * (n = 0): *@lost (may be NULL) gets how many this removal lost.
 *
 * leave: @task stops cleanly (SIGTERM): remove_task, and joined becomes
 * false, so that a shard it leaves with no replica reads as stopped, not
 * failed, and its next start is a first start.
 *
 * join: @task (re)starts.  First start (joined false): marked joined, its
 * places kept as they are (nothing was acknowledged without it, or it
 * would have been removed; where a removal took it out before it started,
 * it comes back SYNCING as in rejoin).  A restart (joined true): it leaves
 * every shard as remove_task does (its copies are gone), then comes back
 * as SYNCING to every shard whose placement names it and that has fewer
 * than R replicas and is not lost.
 *
 * rejoin: as join's second half: @task is added as SYNCING to every
 * shard of its placement that is not lost, lacks it and has < R replicas.
 *
 * in_sync: @task finished copying shard @s: SYNCING -> IN_SYNC (no change
 * when it is not listed there any more).
 *
 * drop_backup: the primary of shard @s could not replicate to its backup
 * @task: @task leaves shard @s alone.  It stays wherever else it is, and
 * stays the primary of its own shards: a link down between two ps is no
 * proof that either is dead (removing the whole task, as remove_task
 * does, could take a shard's last replica when two ps cut off from each
 * other each drop the other).  A no-op when @task is @s's primary or not
 * listed there.  The dropped task comes back with ps_view_rejoin.
 *
 * Errors (INVALID_ARGUMENT, nothing written to @out): a task or shard
 * outside the view, a view at its last epoch.  @out must not be @v. */
int ps_view_remove_task(const ps_view *v, int task, ps_view *out, bool *changed,
                        int *lost, ps_status *st);
int ps_view_leave(const ps_view *v, int task, ps_view *out, bool *changed, int *lost,
                  ps_status *st);
int ps_view_join(const ps_view *v, int task, const char *const *hosts, ps_view *out,
                 bool *changed, ps_status *st);
int ps_view_rejoin(const ps_view *v, int task, const char *const *hosts, ps_view *out,
                   bool *changed, ps_status *st);
int ps_view_in_sync(const ps_view *v, int s, int task, ps_view *out, bool *changed,
                    ps_status *st);
int ps_view_drop_backup(const ps_view *v, int s, int task, ps_view *out, bool *changed,
                        ps_status *st);

/* A line for logs and psctl: "epoch 4: 0=[1*,2] 1=[2*] 2=[0*,1~]" (* the
 * primary, ~ syncing).  Writes at most @n bytes. */
void ps_view_describe(const ps_view *v, char *buf, size_t n);
/* The placement as a line, for psctl status: "placement (R=2, ring order,
 * a new host first): 0=[0,2] 1=[1,2] 2=[2,0] 3=[3,0]" ("ring order" alone
 * when @hosts is NULL or all equal). */
void ps_view_describe_placement(int ntasks, int replicas, const char *const *hosts,
                                char *buf, size_t n);

#endif
