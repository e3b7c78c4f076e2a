/* Membership of a replicated ps (ps-server --replicas R >= 2; DESIGN.md
 * "Replication", "Membership"): the etcd lease and task key, the view
 * (join, failure detection, promotion by remove_task, in_sync), and
 * fencing.  It drives the data plane (ps/repl.h) with ps_repl_set_view.
 *
 * Every etcd change runs on membership's own thread; the data plane's
 * callbacks, the etcd watches, the lease keeper and the health checker
 * only post work to it. */
#ifndef PS_MEMBER_H
#define PS_MEMBER_H
#include <stdint.h>

#include "common/etcd.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/view.h"
#include "repl.h"

typedef struct ps_member ps_member;

typedef struct ps_member_options {
  int self, ntasks;
  const char *const *addrs;           /* [ntasks]: ps/i's address */
  const char *const *hosts;           /* [ntasks] or NULL: placement hosts */
  const ps_repl_conf *conf;           /* replicas >= 2, etcd, job, lease TTL */
  const ps_rpc_channel_security *sec; /* how to reach the other ps (may be NULL) */
  /* Runs once (on membership's thread) when this ps was fenced: the
   * daemon then stops and exits 75 (EX_TEMPFAIL) so that its supervisor
   * restarts it and it rejoins. */
  void (*on_fenced)(void *arg, const char *reason);
  void *arg;
} ps_member_options;

/* Checks @o and connects to etcd (no call yet).  NULL with @st set. */
ps_member *ps_member_create(const ps_member_options *o, ps_status *st);

/* The callbacks to give ps_repl_create (they post to @m's thread). */
ps_repl_callbacks ps_member_repl_callbacks(ps_member *m);

/* Grants the lease and starts its keeper, puts
 * /paramserver/JOB/tasks/ps/SELF under it, joins the view (creating it
 * when absent), gives it to @repl, then starts the watches, the health
 * checker and membership's thread.  -1 with @st set (UNAVAILABLE naming
 * etcd, or the view's error) when a step fails. */
int ps_member_start(ps_member *m, ps_repl *repl, ps_status *st);

/* SIGTERM: revokes the lease (the task key goes at once, so the peers
 * promote this ps's backups now); the removal from the view that follows
 * fences this ps quietly (no exit 75). */
void ps_member_leave(ps_member *m);

/* Stops every thread and frees @m; call before ps_repl_destroy.  NULL is
 * a no-op. */
void ps_member_destroy(ps_member *m);

#endif
