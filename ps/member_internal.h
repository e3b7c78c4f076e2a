/* Private to ps/member*.c: the member's state and the view transitions
 * (member_view.c) its threads (member.c) run. */
#ifndef PS_MEMBER_INTERNAL_H
#define PS_MEMBER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/etcd.h"
#include "common/rpc.h"
#include "member.h"

struct ps_member {
  ps_repl_conf conf;
  int self, ntasks;
  char **hosts, **addrs, *addr;
  const ps_rpc_channel_security *sec;
  void (*on_fenced)(void *arg);
  void *arg;
  ps_etcd *etcd;
  int64_t lease;
  ps_etcd_keeper *keeper;
  ps_etcd_watch *wview, *wtasks;
  ps_repl *repl;
  char key_view[200], prefix_tasks[200], key_task[260];
  pthread_mutex_t mu; /* guards what follows */
  pthread_cond_t cv;
  bool stop, view_dirty, fenced, leaving;
  bool *dead;         /* [ntasks]: to remove from the view */
  int64_t detect_ns;  /* when the first pending failure was seen (0: none) */
  int detect_task;    /* whose failure that was (-1: none) */
  int *syn_s, *syn_t; /* (shard, task) pairs to mark in sync */
  int nsyn, capsyn;
  int *drp_s, *drp_t; /* (shard, backup) pairs to drop, capsyn of them */
  int ndrp;
  int64_t rejoin_ns;     /* when the last rejoin was tried (CLOCK_MONOTONIC) */
  int64_t rejoin_gap_ms; /* the wait before the next one (REJOIN_MS, doubling) */
  ps_view cur;           /* the newest view applied (epoch 0: none) */
  bool *lone;            /* [ntasks]: shard down to one replica, warned */
  int *fails;            /* [ntasks]: the prober's refusals in a row */
  int64_t *warned_ns;    /* [ntasks]: when a Check it could not make was last logged */
  pthread_t worker, prober;
  bool worker_on, prober_on;
};

enum {
  PS_MEMBER_REMOVE,
  PS_MEMBER_IN_SYNC,
  PS_MEMBER_DROP,
  PS_MEMBER_REJOIN,
  PS_MEMBER_LEAVE
};

int64_t ps_member_now_ns(void);
int ps_member_check(const char *addr, const ps_rpc_channel_security *sec, int deadline_ms,
                    char *why, size_t why_n);
void ps_member_mark_dead(ps_member *m, int task, const char *why);
/* The failure detected last led to no view change of this ps: the next
 * failover is timed from its own detection. */
void ps_member_end_detection(ps_member *m);
void ps_member_fence(ps_member *m, const char *reason);
void *ps_member_worker(void *arg);
void *ps_member_prober(void *arg);

/* member_view.c (below member.c: it calls nothing there).  Each reads the view from etcd
 * (decoded as outside input), computes the next one, compare-and-swaps it (a loser reads
 * again and recomputes) and applies the result.  0 or -1 (logged). */
int ps_member_join(ps_member *m, int64_t *rev, ps_status *st);
int ps_member_transition(ps_member *m, int kind, int task, int shard);
/* True when the newest view lacks this ps in a shard of its placement
 * that it could rejoin (not lost, fewer than R replicas). */
bool ps_member_wants_rejoin(ps_member *m);
void ps_member_refresh(ps_member *m);

#endif
