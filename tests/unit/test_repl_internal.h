/* The cluster of tests/unit/test_repl.c: 2 or 3 real ps servers in one
 * process, each with the Ps handlers and a ps_repl, and raw RPC calls to
 * them (test_repl_cluster.c). */
#ifndef TEST_REPL_INTERNAL_H
#define TEST_REPL_INTERNAL_H

#include <check.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/security.h"
#include "ps.pb-c.h"
#include "repl.h"
#include "service.h"
#include "store.h"

#define MAXN 3

typedef struct node {
  ps_store *store;
  ps_service *svc;
  ps_rpc_server *srv;
  ps_repl *repl;
  char addr[64];
  ps_rpc_channel *ch;
  atomic_int stopped;
  bool down;
} node;

extern node rpt_nodes[MAXN];
extern int rpt_nnodes;
/* what the callbacks saw: backup_failed and synced */
extern atomic_int rpt_nfailed, rpt_nsynced;
extern atomic_int rpt_failed_task, rpt_failed_shard, rpt_synced_task, rpt_synced_shard;
extern char rpt_failed_reason[512];
/* tokens the servers check (NULL: none), and the one the ps tasks send */
extern ps_auth *rpt_auth;
extern const char *rpt_peer_token;
/* shard 0 on [0*, 1], shard 1 on [1*, 0] */
extern int rpt_reps2[MAXN][MAXN + 1];

void rpt_sleep_ms(long ms);
/* Waits (up to 10 s) for *@a to reach @want. */
void rpt_wait_for(atomic_int *a, int want);
void rpt_start(int n);
void rpt_stop_node(int i);
void rpt_stop_all(void);
/* A view of @n tasks: shard s on @reps[s][0..] (-1 ends), all in sync
 * but the tasks @syncing[s] (or -1), since @since; on node @node_i, or
 * on all. */
void rpt_set_view_on(int node_i, int64_t epoch, int n, int reps[][MAXN + 1],
                     const int *syncing, int64_t since);
void rpt_set_view(int64_t epoch, int n, int reps[][MAXN + 1], const int *syncing,
                  int64_t since);

typedef struct resp {
  uint8_t *p;
  size_t n;
} resp;
/* One call to node @i; the response header in *@out (malloc'd) if not NULL. */
ps_status rpt_call(int i, const char *method, const ProtobufCMessage *m, resp *out);
/* A Route (one static message: one per request). */
Paramserver__Route *rpt_route(int shard, int64_t epoch);
/* Creates float variable @name of shape [@d0, @d1] (0: fewer dimensions)
 * initialized to ones, in @shard on node @i. */
void rpt_create(int i, int shard, const char *name, int64_t d0, int64_t d1);
/* One Update of @n updates with inline bytes. */
ps_status rpt_update(int i, Paramserver__Route *rt, uint64_t cid, uint64_t seq,
                     Paramserver__Update **u, size_t n, const void *data, size_t len);
void rpt_upd_init(Paramserver__Update *u, const char *name, int op, int64_t d0,
                  int64_t d1);
/* "name:version:crc:bytes;..." of shard @s on node @i (malloc'd). */
char *rpt_digest(int i, int s);
/* Shard @s's digests on nodes @a and @b are equal and not empty. */
void rpt_assert_same(int a, int b, int s);
/* Health.Check's status on node @i. */
int rpt_health(int i);

/* w += 1 (w: [4,3], shard 0) on node @i, as (@cid, @seq), synchronous
 * with @r2a replicas to aggregate (local step 0) when @r2a > 0. */
ps_status rpt_add_ones(int i, Paramserver__Route *rt, uint64_t cid, uint64_t seq,
                       int r2a);
typedef struct rpt_bg_update {
  int node;
  ps_status st;
  atomic_int done;
} rpt_bg_update;
/* A thread: w += 1 on node @arg->node with a Route (0, 1). */
void *rpt_bg_assign_add(void *arg);

#endif
