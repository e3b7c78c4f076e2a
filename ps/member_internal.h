/* Private to ps/member*.c: the membership state, shared by the view
 * thread (member.c) and the health checker (member_health.c). */
#ifndef PS_MEMBER_INTERNAL_H
#define PS_MEMBER_INTERNAL_H
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "member.h"

/* Health checks: every peer sharing a shard is asked every
 * PS_MEMBER_CHECK_MS; a Check that fails to connect (or says
 * NOT_SERVING) is asked once more on a fresh channel with a deadline of
 * PS_MEMBER_CONFIRM_MS before the peer is declared dead. */
#define PS_MEMBER_CHECK_MS 100
#define PS_MEMBER_CONFIRM_MS 300

typedef struct ps_member_insync {
  int s, task;
} ps_member_insync;

struct ps_member {
  int self, ntasks;
  char **addrs;
  char **hosts; /* NULL: one host */
  ps_repl_conf conf;
  const ps_rpc_channel_security *sec;
  void (*on_fenced)(void *arg, const char *reason);
  void *arg;
  char name[32]; /* "ps/N" */
  char key_view[300], key_task[300], prefix_tasks[300];

  ps_etcd *e;
  int64_t lease, ttl;
  ps_etcd_keeper *keeper;
  ps_etcd_watch *wview, *wtasks;
  ps_repl *repl;
  pthread_t thr, hthr;
  bool thr_started, hthr_started;

  /* under mu: work posted to the view thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop, leaving, lease_lost, view_dirty;
  bool lease_gone; /* the keeper said so: nothing to revoke */
  char lost_reason[256];
  int64_t *remove_ns; /* [ntasks]: when its failure was seen (0: none) */
  char (*remove_why)[160];
  ps_member_insync *insync;
  size_t ninsync, cap_insync;
  /* under mu: the health checker's peers (tasks sharing a shard with
   * this one, joined), and a generation bumped when one (re)enters */
  bool *peer;
  uint64_t *peer_gen;

  /* the view thread only */
  ps_view view;
  bool have_view, fenced, served;
  int64_t view_mod;
  bool *lost_logged, *degraded_logged;
};

/* member_health.c */
void *ps_member_health_main(void *arg);
/* Posts "task @t is gone" (from any thread). */
void ps_member_post_remove(ps_member *m, int t, int64_t seen_ns, const char *why);
int64_t ps_member_now_ns(void);

#endif
