/* Membership of one replicated ps (ps-server --replicas R >= 2; DESIGN.md
 * "Replication"): its lease and task key in etcd, the view (created,
 * joined and changed only by compare-and-swap), the watch that hands each
 * new view to the data plane (ps/repl.h), failure detection, and fencing.
 *
 * Order in ps-server: ps_member_create (its callbacks go to
 * ps_repl_create), ps_repl_create, the server started, ps_member_start
 * (joins: peers may replicate to it from then on), serve;
 * ps_member_leave at SIGTERM (hands its shards over at once), then
 * ps_member_stop, ps_repl_destroy, then ps_member_destroy. */
#ifndef PS_MEMBER_H
#define PS_MEMBER_H

#include <stdbool.h>

#include "common/rpc.h"
#include "common/status.h"
#include "common/view.h"
#include "repl.h"

typedef struct ps_member ps_member;

/* @hosts: the placement's hosts (cluster.h ps_repl_hosts_from_cluster);
 * @addr: this ps's address (the value of its task key).  @on_fenced runs
 * once, on a thread of the member, when this ps is fenced: the caller
 * stops the server and exits 75 (EX_TEMPFAIL) after its grace. */
ps_member *ps_member_create(const ps_repl_conf *conf, int self, int ntasks,
                            const char *const *hosts, const char *addr,
                            void (*on_fenced)(void *arg), void *arg, ps_status *st);
/* The callbacks ps_repl_create takes (arg: the member). */
void ps_member_callbacks(ps_member *m, ps_repl_callbacks *cb);
/* Lease, task key, view create/join, set_view, watches, detection.
 * UNAVAILABLE naming etcd when it does not answer. */
int ps_member_start(ps_member *m, ps_repl *repl, const char *const *addrs,
                    const ps_rpc_channel_security *sec, ps_status *st);
/* A clean stop: removes this ps from the view (its backups take over
 * now, not after the lease TTL) and revokes its lease. */
void ps_member_leave(ps_member *m);
/* Stops its threads and watches (no more ps_repl calls from it); its
 * callbacks stay valid until ps_member_destroy.  ps-server: stop, then
 * ps_repl_destroy (whose threads may still call the callbacks), then
 * destroy. */
void ps_member_stop(ps_member *m);
void ps_member_destroy(ps_member *m);

#endif
