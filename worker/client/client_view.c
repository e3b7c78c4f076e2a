/* The replication view as a client sees it (ps_client_options.replicas
 * >= 2; DESIGN.md "Replication"): read from etcd at the start, then kept
 * current by a watch on its key.  Calls for shard S go to S's primary in
 * it (client_call.c); a call that finds the view moved on waits here for
 * the next one.  Before the first ps wrote a view, the client routes by
 * the placement (ps_view_initial) with epoch 0.  The view text is outside
 * input: ps_view_decode checks it, and a view that does not decode, or is
 * older than the one held, is ignored with a warning. */
#include "client_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/cluster.h"
#include "common/etcd.h"
#include "common/log.h"
#include "common/view.h"

#define VIEW_ETCD_MIN_MS 10000

struct ps_cl_view {
  pthread_mutex_t mu;
  pthread_cond_t moved; /* the view's epoch went up */
  ps_view v;            /* current; epoch 0: the placement, no view in etcd yet */
  ps_etcd *etcd;
  ps_etcd_watch *watch;
  char key[200];
  int replicas;
  int ntasks;
};

/* Takes @text as the view when it is newer than the one held; one that
 * does not decode is refused (@st) and changes nothing. */
static int view_offer(ps_cl_view *w, int ntasks, const char *text, size_t len,
                      ps_status *st) {
  ps_view nv;
  if (ps_view_decode(text, len, ntasks, &nv, st) != 0) {
    ps_status_prefix(st, "replication view at %s in etcd", w->key);
    return st->code;
  }
  char desc[512] = "";
  pthread_mutex_lock(&w->mu);
  bool newer = nv.epoch > w->v.epoch, first = w->v.shard == NULL;
  if (newer) {
    ps_view old = w->v;
    w->v = nv;
    nv = old;
    pthread_cond_broadcast(&w->moved);
    ps_view_describe(&w->v, desc, sizeof desc);
  }
  pthread_mutex_unlock(&w->mu);
  ps_view_free(&nv);
  if (newer && !first) PS_INFO("replication view now %s", desc);
  return 0;
}

/* Reads the view key once; 0 with nothing changed when it is absent. */
static int view_read(ps_cl_view *w, int ntasks, int64_t *rev, bool *found,
                     ps_status *st) {
  char *val = NULL;
  size_t len = 0;
  int64_t mod = 0;
  if (ps_etcd_get(w->etcd, w->key, &val, &len, &mod, rev, st) != 0) return st->code;
  *found = val != NULL;
  int rc = val ? view_offer(w, ntasks, val, len, st) : 0;
  free(val);
  return rc;
}

/* Reads the key again outside the watch; a failure is logged only. */
static void view_reread(ps_cl_view *w, const char *why) {
  ps_status st;
  int64_t rev;
  bool found;
  ps_status_clear(&st);
  if (view_read(w, w->ntasks, &rev, &found, &st) != 0)
    PS_WARN("replication view: reading %s (%s): %s", w->key, why, st.msg);
}

static void on_watch(void *arg, const char *key, const char *val, size_t len,
                     int64_t mod_rev, bool deleted) {
  (void)mod_rev;
  ps_cl_view *w = arg;
  if (key == NULL) { /* compacted past: read it again */
    view_reread(w, "the watch lost its place");
    return;
  }
  if (deleted || val == NULL) return;
  ps_status st;
  ps_status_clear(&st);
  if (view_offer(w, w->ntasks, val, len, &st) != 0)
    PS_WARN("%s: ignored, the client keeps its view", st.msg);
}

/* ps_client_options' replication settings: the options, else the cluster
 * spec's "replication" section, else PS_ETCD. */
static void repl_settings(ps_client *c, const ps_cluster *cluster, const char **etcd,
                          const char **job, int *replicas) {
  *etcd = c->opt.etcd && c->opt.etcd[0] ? c->opt.etcd : NULL;
  *job = c->opt.repl_job && c->opt.repl_job[0] ? c->opt.repl_job : NULL;
  *replicas = c->opt.replicas;
  const ps_cluster_replication *r = ps_cluster_get_replication(cluster);
  if (r) {
    if (*etcd == NULL && r->etcd && r->etcd[0]) *etcd = r->etcd;
    if (*job == NULL && r->job && r->job[0]) *job = r->job;
    if (*replicas == 0) *replicas = r->replicas;
  }
  if (*etcd == NULL) {
    const char *e = getenv("PS_ETCD");
    if (e && *e) *etcd = e;
  }
  if (*job == NULL) *job = "default";
}

static bool job_ok(const char *job) {
  size_t n = strlen(job);
  if (n == 0 || n > 127) return false;
  for (const char *p = job; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || *p == '_' || *p == '.' || *p == '-'))
      return false;
  return true;
}

int ps_cl_view_start_(ps_client *c, const ps_cluster *cluster, ps_status *st) {
  const char *etcd, *job;
  int replicas;
  repl_settings(c, cluster, &etcd, &job, &replicas);
  if (replicas < 0 || replicas > PS_VIEW_MAX_REPLICAS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replicas must be 1 to %d (--replicas), got %d",
                         PS_VIEW_MAX_REPLICAS, replicas);
  if (replicas == 1 || (replicas == 0 && etcd == NULL)) return 0; /* unreplicated */
  if (etcd == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "--replicas %d needs the etcd endpoints of the job (--etcd "
                         "HOST:PORT[,...], the cluster spec's \"replication\" section, "
                         "or PS_ETCD)",
                         replicas);
  if (!job_ok(job))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication job name '%s' must be 1 to 127 of [A-Za-z0-9_.-] "
                         "(--job)",
                         job);
  /* a random id per client: Update's dedup pair (client_id, seq) */
  uint64_t id = 0;
  while (id == 0)
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
      return ps_status_set(st, PS_INTERNAL, "getrandom: %s", strerror(errno));
  c->client_id = id;
  ps_cl_view *w = calloc(1, sizeof *w);
  if (w == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->moved, &ca);
  pthread_condattr_destroy(&ca);
  snprintf(w->key, sizeof w->key, "/paramserver/%s/view", job);
  w->ntasks = c->nps;
  c->view = w;
  /* the view's etcd calls: the control deadline, but never below
   * VIEW_ETCD_MIN_MS (a client made with a short deadline, as the chief's
   * heartbeat client of 2 s, failed a whole job on one slow etcd answer
   * under load), and never past the stall bound */
  int64_t tmo = c->opt.control_timeout_ms > 0 ? c->opt.control_timeout_ms : 30000;
  if (tmo < VIEW_ETCD_MIN_MS) tmo = VIEW_ETCD_MIN_MS;
  if (c->opt.rpc_timeout_ms > 0 && c->opt.rpc_timeout_ms < tmo)
    tmo = c->opt.rpc_timeout_ms;
  if ((w->etcd = ps_etcd_connect(etcd, tmo, st)) == NULL) return st->code;
  int64_t rev = 0;
  bool found = false;
  if (view_read(w, c->nps, &rev, &found, st) != 0) return st->code;
  if (!found) {
    if (replicas == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "no replication view at %s in etcd %s yet: give --replicas",
                           w->key, etcd);
    /* no ps wrote one yet: the placement, epoch 0 (SPEC: the ps accepts
     * it only while its own view is the first) */
    char **hosts = NULL;
    int nh = 0;
    if (ps_repl_hosts_from_cluster(cluster, &hosts, &nh, st) != 0) return st->code;
    ps_view v0;
    int rc = nh == c->nps
                 ? ps_view_initial(c->nps, replicas, (const char *const *)hosts, &v0, st)
                 : ps_view_initial(c->nps, replicas, NULL, &v0, st);
    ps_repl_hosts_free(hosts, nh);
    if (rc != 0) return rc;
    v0.epoch = 0;
    for (int s = 0; s < v0.ntasks; s++)
      v0.shard[s].since = 0;
    pthread_mutex_lock(&w->mu);
    if (w->v.epoch == 0 && w->v.shard == NULL) /* the watch did not bring one */
      w->v = v0;
    else
      ps_view_free(&v0);
    pthread_mutex_unlock(&w->mu);
  } else if (replicas >= 2 && w->v.replicas != replicas) {
    PS_WARN("replication view at %s has %d replicas per shard, --replicas says %d: "
            "following the view",
            w->key, w->v.replicas, replicas);
  }
  w->replicas = replicas ? replicas : w->v.replicas;
  if ((w->watch =
           ps_etcd_watch_start(w->etcd, w->key, false, rev + 1, on_watch, w, st)) == NULL)
    return st->code;
  char desc[512];
  ps_cl_view_describe_(c, desc, sizeof desc);
  PS_INFO("replicated ps shards (%d replicas), etcd %s, view %s", w->replicas, etcd,
          desc);
  return 0;
}

void ps_cl_view_stop_(ps_client *c) {
  ps_cl_view *w = c->view;
  if (w == NULL) return;
  if (w->watch) ps_etcd_watch_stop(w->watch);
  if (w->etcd) ps_etcd_close(w->etcd);
  ps_view_free(&w->v);
  pthread_cond_destroy(&w->moved);
  pthread_mutex_destroy(&w->mu);
  free(w);
  c->view = NULL;
}

int ps_cl_view_route_(ps_client *c, int shard, int64_t *epoch) {
  ps_cl_view *w = c->view;
  pthread_mutex_lock(&w->mu);
  *epoch = w->v.epoch;
  int p = shard >= 0 && shard < w->v.ntasks ? ps_view_primary(&w->v, shard) : -1;
  pthread_mutex_unlock(&w->mu);
  return p;
}

int64_t ps_cl_view_epoch_(ps_client *c) {
  ps_cl_view *w = c->view;
  pthread_mutex_lock(&w->mu);
  int64_t e = w->v.epoch;
  pthread_mutex_unlock(&w->mu);
  return e;
}

bool ps_cl_view_stale_(ps_client *c, int shard, int64_t answer_epoch, int64_t *since,
                       int *primary) {
  ps_cl_view *w = c->view;
  pthread_mutex_lock(&w->mu);
  bool stale = false;
  *since = 0;
  *primary = -1;
  if (shard >= 0 && shard < w->v.ntasks) {
    *since = w->v.shard[shard].since;
    *primary = ps_view_primary(&w->v, shard);
    stale = answer_epoch < *since;
  }
  pthread_mutex_unlock(&w->mu);
  return stale;
}

void ps_cl_view_wait_(ps_client *c, int64_t epoch, int64_t ms) {
  ps_cl_view *w = c->view;
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (w->v.epoch <= epoch && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&w->moved, &w->mu, &until);
  bool moved = w->v.epoch > epoch;
  pthread_mutex_unlock(&w->mu);
  if (moved) return;
  /* nothing came through the watch: read the key (the watch may be
   * reconnecting) */
  view_reread(w, "a call waits for a newer view");
}

void ps_cl_view_describe_(ps_client *c, char *buf, size_t n) {
  ps_cl_view *w = c->view;
  pthread_mutex_lock(&w->mu);
  ps_view_describe(&w->v, buf, n);
  pthread_mutex_unlock(&w->mu);
}

/* ---- public ---- */

int ps_client_replicas(const ps_client *c) {
  return c && c->view ? c->view->replicas : 1;
}

int64_t ps_client_view_epoch(ps_client *c) {
  return c && c->view ? ps_cl_view_epoch_(c) : 0;
}

int ps_client_shard_replicas(ps_client *c, int shard, ps_shard_replicas *out,
                             ps_status *st) {
  memset(out, 0, sizeof *out);
  if (shard < 0 || shard >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ps task %d does not exist (the cluster has %d)", shard, c->nps);
  if (c->view == NULL) { /* unreplicated: the shard is its task */
    out->n = 1;
    out->task[0] = shard;
    out->state[0] = PS_SHARD_PRIMARY;
    return 0;
  }
  ps_cl_view *w = c->view;
  pthread_mutex_lock(&w->mu);
  const ps_view_shard *s = &w->v.shard[shard];
  out->epoch = w->v.epoch;
  out->since = s->since;
  out->n = s->n;
  for (int i = 0; i < s->n && i < PS_VIEW_MAX_REPLICAS; i++) {
    out->task[i] = s->task[i];
    out->state[i] = i == 0                              ? PS_SHARD_PRIMARY
                    : s->state[i] == PS_REPLICA_SYNCING ? PS_SHARD_SYNCING
                                                        : PS_SHARD_BACKUP;
  }
  pthread_mutex_unlock(&w->mu);
  return 0;
}
