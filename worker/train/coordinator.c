/* The coordinator (paramserver/coordinator.h): chief start-up (wait for
 * the ps, restore or initialize what is uninitialized, mark ready), the
 * other workers' wait for readiness with the placement check, and the
 * workers' heartbeats on ps/0 that tell the chief, at the end of the job,
 * which of them is still there. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/appendf.h"
#include "common/log.h"
#include "graph/node.h"
#include "paramserver/coordinator.h"

const char *ps_coordinator_outcome_name(ps_coordinator_outcome o) {
  switch (o) {
  case PS_COORD_INITIALIZED:
    return "initialized";
  case PS_COORD_RESTORED:
    return "restored";
  case PS_COORD_LIVE:
    return "live";
  case PS_COORD_JOINED:
    return "joined";
  }
  return "?";
}

static double now_secs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static atomic_int cancelled;

void ps_coordinator_cancel(void) {
  atomic_store(&cancelled, 1);
}

bool ps_coordinator_cancelled(void) {
  return atomic_load(&cancelled) != 0;
}

/* Sleeps @s seconds in slices of at most 50 ms, back early on a cancel. */
static void sleep_secs(double s) {
  while (s > 0 && !ps_coordinator_cancelled()) {
    double d = s > 0.05 ? 0.05 : s;
    struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
    nanosleep(&ts, NULL);
    s -= d;
  }
}

/* Backoff for polls: 50 ms doubling to 1 s. */
static double next_delay(double d) {
  return d <= 0 ? 0.05 : (d * 2 > 1.0 ? 1.0 : d * 2);
}

int ps_coordinator_wait_for_ps(ps_session *s, double timeout_secs, ps_status *st) {
  ps_client *c = ps_session_client(s);
  if (c == NULL) return 0;
  int nps = ps_client_num_ps(c);
  bool *up = calloc((size_t)nps + 1, sizeof *up);
  if (up == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  double t0 = now_secs(), last_log = t0, delay = 0;
  int rc = 0;
  for (;;) {
    int waiting = 0, first = -1;
    ps_status last = {0};
    for (int t = 0; t < nps; t++) {
      if (up[t]) continue;
      ps_status e;
      /* with a --ps-timeout, one probe may not outlast it */
      int64_t left_ms = 0;
      if (timeout_secs > 0) {
        left_ms = (int64_t)((timeout_secs - (now_secs() - t0)) * 1000);
        if (left_ms < 100) left_ms = 100;
      }
      if (ps_client_probe_within(c, t, left_ms, &e) == 0) {
        up[t] = true;
      } else if (ps_client_stalled(&e) &&
                 (timeout_secs <= 0 || now_secs() - t0 < timeout_secs)) {
        /* stopped, not starting: no end */
        rc = ps_status_set(st, e.code, "%s", e.msg);
        break;
      } else {
        if (ps_client_stalled(&e)) /* cut short by --ps-timeout */
          ps_status_set(&e, PS_DEADLINE_EXCEEDED,
                        "it accepts connections but does not answer (stopped or hung)");
        if (first < 0) {
          first = t;
          last = e;
        }
        waiting++;
      }
    }
    if (waiting == 0 || rc != 0) break;
    if (ps_coordinator_cancelled()) {
      rc = ps_status_set(st, PS_CANCELLED,
                         "stopped while waiting for ps/%d (%s) and %d other ps task(s)",
                         first, ps_client_address(c, first), waiting - 1);
      break;
    }
    double now = now_secs();
    if (timeout_secs > 0 && now - t0 > timeout_secs) {
      rc = ps_status_set(
          st, PS_DEADLINE_EXCEEDED,
          "ps/%d (%s) and %d other ps task(s) did not answer within %.0f s: %s", first,
          ps_client_address(c, first), waiting - 1, timeout_secs, last.msg);
      break;
    }
    if (delay == 0 || now - last_log >= 5.0) {
      char list[512] = "";
      size_t off = 0;
      for (int t = 0; t < nps; t++)
        if (!up[t])
          ps_appendf(list, sizeof list, &off, "%sps/%d (%s)", off ? ", " : "", t,
                     ps_client_address(c, t));
      PS_INFO("waiting for %d ps task(s): %s (ps/%d: %s)", waiting, list, first,
              last.msg);
      last_log = now;
    }
    delay = next_delay(delay);
    sleep_secs(delay);
  }
  if (rc == 0 && now_secs() - t0 > 0.5) PS_INFO("all %d ps tasks are up", nps);
  free(up);
  return rc;
}

/* The ps variables of the graph (global and local), by task. */
typedef struct var_set {
  ps_variable **v;
  size_t n;
} var_set;

static int ps_vars(ps_graph *g, var_set *out, ps_status *st) {
  size_t nvars = ps_graph_num_vars_(g);
  out->v = calloc(nvars + 1, sizeof *out->v);
  out->n = 0;
  if (out->v == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < nvars; i++)
    if (ps_graph_var_(g, i)->task >= 0) out->v[out->n++] = ps_graph_var_(g, i);
  return 0;
}

/* The names of @vs's variables on ps @task (only those marked in @want,
 * when not NULL) into @names; returns how many. */
static size_t names_on(const var_set *vs, const bool *want, int task,
                       const char **names) {
  size_t k = 0;
  for (size_t i = 0; i < vs->n; i++)
    if ((want == NULL || want[i]) && vs->v[i]->task == task) names[k++] = vs->v[i]->name;
  return k;
}

/* Marks in @uninit (per graph variable index of @vs) the ones without a
 * value on their ps.  Returns how many. */
static int find_uninitialized(ps_client *c, var_set *vs, bool *uninit, size_t *count,
                              ps_status *st) {
  int nps = ps_client_num_ps(c);
  *count = 0;
  const char **names = calloc(vs->n + 1, sizeof *names);
  if (names == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  int rc = 0;
  for (int t = 0; t < nps && rc == 0; t++) {
    size_t k = names_on(vs, NULL, t, names);
    if (k == 0) continue;
    char **out = NULL;
    size_t nout = 0;
    if ((rc = ps_client_report_uninitialized(c, t, names, k, &out, &nout, st)) != 0)
      break;
    for (size_t j = 0; j < nout; j++)
      for (size_t i = 0; i < vs->n; i++)
        if (vs->v[i]->task == t && !strcmp(vs->v[i]->name, out[j]) && !uninit[i]) {
          uninit[i] = true;
          (*count)++;
        }
    ps_client_free_names(out, nout);
  }
  free(names);
  return rc;
}

/* Restores the variables marked in @want, by their own names, from
 * @prefix ("" latest). */
static int restore_some(ps_client *c, var_set *vs, const bool *want, const char *prefix,
                        ps_status *st) {
  int nps = ps_client_num_ps(c);
  const char **names = calloc(vs->n + 1, sizeof *names);
  const char **all = calloc(vs->n + 1, sizeof *all);
  const char *const **per = calloc((size_t)nps + 1, sizeof *per);
  size_t *n = calloc((size_t)nps + 1, sizeof *n);
  char *checked = NULL;
  int rc = 0;
  if (names == NULL || all == NULL || per == NULL || n == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  /* every ps checks first, all at once: a restore that fails changes no
   * ps; then each restores the checkpoint they all checked, by its path
   * ("" the latest is resolved once) */
  if (nps > 1) {
    size_t k = 0;
    for (int t = 0; t < nps; t++) {
      per[t] = all + k;
      k += (n[t] = names_on(vs, want, t, all + k));
    }
    rc = ps_client_check_restore_all(c, prefix, per, NULL, n, &checked, st);
    if (rc == 0 && checked) prefix = checked;
  }
  for (int t = 0; t < nps && rc == 0; t++) {
    size_t k = names_on(vs, want, t, names);
    if (k) rc = ps_client_restore_vars(c, t, prefix, names, NULL, k, st);
  }
out:
  free(checked);
  free(n);
  free(per);
  free(all);
  free(names);
  return rc;
}

static void mark_reachable(ps_node *n, bool *seen) {
  if (seen[n->id]) return;
  seen[n->id] = true;
  for (int i = 0; i < n->nin; i++)
    mark_reachable(n->in[i], seen);
  for (int i = 0; i < n->nctrl; i++)
    mark_reachable(n->ctrl[i], seen);
}

/* Runs the initializers of the variables marked in @want.  Initializers of
 * other variables that their initial values reach (initialized_value())
 * are fed, so they do not run again: those variables hold values. */
static int init_some(ps_session *s, var_set *vs, const bool *want, size_t nwant,
                     ps_status *st) {
  ps_graph *g = ps_session_graph(s);
  ps_node **targets = calloc(nwant + 1, sizeof *targets);
  bool *seen = calloc(ps_graph_num_nodes(g) + 1, sizeof *seen);
  ps_feed *feeds = calloc(ps_graph_num_vars_(g) + 1, sizeof *feeds);
  size_t nt = 0, nf = 0;
  int rc = 0;
  if (targets == NULL || seen == NULL || feeds == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < vs->n; i++)
    if (want[i]) {
      targets[nt++] = vs->v[i]->initializer;
      mark_reachable(vs->v[i]->initializer, seen);
    }
  for (size_t i = 0; i < vs->n; i++) {
    ps_node *in = vs->v[i]->initializer;
    if (want[i] || !seen[in->id]) continue;
    /* already initialized on its ps: stands in for its initializer (zero
     * pages; never read, only ordered after) */
    ps_tensor *t = ps_tensor_create(in->dtype, &in->shape, true);
    if (t == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    feeds[nf].node = in;
    feeds[nf++].value = t;
  }
  rc = ps_session_run(s, feeds, nf, NULL, 0, targets, nt, NULL, st);
out:
  for (size_t i = 0; i < nf; i++)
    ps_tensor_destroy((ps_tensor *)feeds[i].value);
  free(feeds);
  free(seen);
  free(targets);
  return rc;
}

static int write_ready_mark(ps_client *c, ps_status *st) {
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  ps_var_spec spec = {.name = PS_COORDINATOR_READY,
                      .dtype = PS_DT_INT64,
                      .shape = {.rank = 0},
                      .init = &one};
  const char *name = PS_COORDINATOR_READY;
  if (ps_client_create_vars(c, 0, &spec, 1, st) != 0) return st->code;
  return ps_client_initialize(c, 0, &name, 1, false, NULL, st);
}

static int chief_prepare(ps_session *s, const ps_coordinator_options *o,
                         ps_coordinator_outcome *outcome, ps_status *st) {
  ps_client *c = ps_session_client(s);
  ps_graph *g = ps_session_graph(s);
  var_set vs = {0};
  bool *uninit = NULL;
  size_t nun = 0;
  int rc = 0;
  if ((rc = ps_session_create_variables(s, st)) != 0) return rc;
  if ((rc = ps_vars(g, &vs, st)) != 0) return rc;
  uninit = calloc(vs.n + 1, sizeof *uninit);
  if (uninit == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if ((rc = find_uninitialized(c, &vs, uninit, &nun, st)) != 0) goto out;
  if (nun == 0) {
    PS_INFO("all %zu variables already hold values on the ps: a live cluster, nothing "
            "initialized or restored",
            vs.n);
    *outcome = PS_COORD_LIVE;
  } else {
    bool restored = false;
    if (!o->no_restore) {
      const char *prefix = o->restore_prefix ? o->restore_prefix : "";
      ps_status e;
      if (o->saver && nun == vs.n) {
        rc = ps_saver_restore(o->saver, s, prefix, &e);
      } else {
        rc = restore_some(c, &vs, uninit, prefix, &e);
      }
      bool none =
          rc != 0 && o->restore_prefix == NULL &&
          ((e.code == PS_NOT_FOUND && strncmp(e.msg, "no checkpoint in", 16) == 0) ||
           e.code == PS_FAILED_PRECONDITION);
      if (rc != 0 && !none) {
        rc = ps_status_set(
            st, e.code, "restoring %s: %s",
            o->restore_prefix ? o->restore_prefix : "the latest checkpoint", e.msg);
        goto out;
      }
      if (rc == 0) {
        restored = true;
        PS_INFO("restored %zu of %zu variables from %s", nun, vs.n,
                o->restore_prefix ? o->restore_prefix : "the latest checkpoint");
        /* a saver narrower than the graph may leave some */
        memset(uninit, 0, vs.n * sizeof *uninit);
        if ((rc = find_uninitialized(c, &vs, uninit, &nun, st)) != 0) goto out;
      } else {
        PS_INFO("no checkpoint to restore (%s)", e.msg);
        rc = 0;
      }
    }
    if (nun > 0) {
      if (nun < vs.n && !restored)
        PS_INFO(
            "%zu of %zu variables already hold values: initializing only the other %zu",
            vs.n - nun, vs.n, nun);
      if ((rc = init_some(s, &vs, uninit, nun, st)) != 0) goto out;
      if (!restored) PS_INFO("initialized %zu variables", nun);
    }
    *outcome = restored ? PS_COORD_RESTORED : PS_COORD_INITIALIZED;
  }
  rc = write_ready_mark(c, st);
out:
  free(uninit);
  free(vs.v);
  return rc;
}

/* Compares the worker's placement with what the ps hold (the chief's). */
static int check_placement(ps_client *c, var_set *vs, char *missing, size_t nmissing,
                           ps_status *st) {
  int nps = ps_client_num_ps(c);
  ps_var_info **info = calloc((size_t)nps + 1, sizeof *info);
  size_t *ninfo = calloc((size_t)nps + 1, sizeof *ninfo);
  int rc = 0;
  if (info == NULL || ninfo == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (int t = 0; t < nps && rc == 0; t++)
    rc = ps_client_list(c, t, &info[t], &ninfo[t], st);
  for (size_t i = 0; i < vs->n && rc == 0; i++) {
    const ps_variable *v = vs->v[i];
    int where = -1;
    const ps_var_info *vi = NULL;
    for (int t = 0; t < nps && where < 0; t++)
      for (size_t k = 0; k < ninfo[t]; k++)
        if (!strcmp(info[t][k].name, v->name)) {
          where = t;
          vi = &info[t][k];
          break;
        }
    char a[128], b[128];
    if (where < 0) {
      /* not (yet) there: a ps that restarted and waits for the chief to
       * restore it, or a chief whose graph lacks it; keep waiting */
      if (missing[0] == '\0') snprintf(missing, nmissing, "%s", v->name);
    } else if (where != v->task)
      rc = ps_status_set(
          st, PS_FAILED_PRECONDITION,
          "this worker's placement differs from the chief's: variable %s is on "
          "/job:ps/task:%d in the chief's placement but on /job:ps/task:%d in "
          "this worker's",
          v->name, where, v->task);
    else if (vi->dtype != v->dtype || !ps_shape_equal(&vi->shape, &v->shape))
      rc = ps_status_set(
          st, PS_FAILED_PRECONDITION,
          "this worker's graph differs from the chief's: variable %s is %s %s "
          "on the ps but %s %s here",
          v->name, ps_dtype_name(vi->dtype), ps_shape_format(&vi->shape, a, sizeof a),
          ps_dtype_name(v->dtype), ps_shape_format(&v->shape, b, sizeof b));
  }
out:
  for (int t = 0; info && t < nps; t++)
    ps_client_free_var_info(info[t], ninfo[t]);
  free(info);
  free(ninfo);
  return rc;
}

/* Whether any ps task answers a probe (ps/0 has just failed a call). */
static bool any_ps_answers(ps_client *c) {
  for (int t = 1; t < ps_client_num_ps(c); t++) {
    ps_status e;
    if (ps_client_probe(c, t, &e) == 0) return true;
  }
  return false;
}

static int wait_ready(ps_session *s, const ps_coordinator_options *o, ps_status *st) {
  ps_client *c = ps_session_client(s);
  var_set vs = {0};
  int rc = ps_vars(ps_session_graph(s), &vs, st);
  if (rc) return rc;
  bool *uninit = calloc(vs.n + 1, sizeof *uninit);
  if (uninit == NULL) {
    free(vs.v);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  double t0 = now_secs(), last_log = -1, delay = 0, gone_since = -1;
  bool placement_checked = false;
  for (;;) {
    ps_status e;
    bool ready = false, done = false;
    const char *mark = PS_COORDINATOR_READY, *done_mark = PS_COORDINATOR_DONE;
    char why[400] = "the chief has not marked the cluster ready";
    double now = now_secs();
    /* (a mark not there yet is NOT_FOUND) */
    int code = ps_client_is_initialized(c, 0, &mark, 1, &ready, &e) == 0 ? 0 : e.code;
    if (code != 0) ready = false;
    if (code != 0 && ps_client_stalled(&e)) { /* ps/0 stopped answering: no end */
      rc = ps_status_set(st, e.code, "%s", e.msg);
      break;
    }
    if (code == 0 || code == PS_NOT_FOUND) {
      ps_status de;
      if (ps_client_is_initialized(c, 0, &done_mark, 1, &done, &de) != 0) done = false;
      gone_since = -1;
    } else {
      /* every ps gone at once (the chief shut the cluster down, or it
       * failed as a whole), not one ps restarting */
      if (code != PS_UNAVAILABLE || any_ps_answers(c)) {
        gone_since = -1;
      } else if (gone_since < 0) {
        gone_since = now;
      } else if (now - gone_since >= PS_COORDINATOR_GONE_SECS) {
        rc = ps_status_set(
            st, PS_UNAVAILABLE,
            "every ps task stopped answering while this worker waited for the chief to "
            "mark the cluster ready (ps/0 (%s) for %.0f s: %s): the chief shut the "
            "cluster down before this worker joined, or the job failed",
            ps_client_address(c, 0), PS_COORDINATOR_GONE_SECS, e.msg);
        break;
      }
      snprintf(why, sizeof why, "ps/0 (%s) does not answer: %s", ps_client_address(c, 0),
               e.msg);
    }
    if (done) {
      rc = ps_status_set(st, PS_OUT_OF_RANGE, "%s", PS_COORDINATOR_DONE_MSG);
      break;
    }
    if (ready && !placement_checked) {
      char missing[256] = "";
      if ((rc = check_placement(c, &vs, missing, sizeof missing, st)) != 0) break;
      if (missing[0]) {
        ready = false;
        snprintf(why, sizeof why,
                 "variable %s is on no ps (a restarted ps not restored yet, or a chief "
                 "whose graph lacks it)",
                 missing);
      } else {
        placement_checked = true;
      }
    }
    if (ready) {
      size_t nun = 0;
      memset(uninit, 0, vs.n * sizeof *uninit);
      if (find_uninitialized(c, &vs, uninit, &nun, &e) != 0) {
        ready = false;
        snprintf(why, sizeof why, "%s", e.msg);
      } else if (nun > 0) {
        ready = false;
        for (size_t i = 0; i < vs.n; i++)
          if (uninit[i]) {
            snprintf(why, sizeof why, "%zu variables uninitialized, e.g. %s", nun,
                     vs.v[i]->name);
            break;
          }
      }
    }
    if (ready) break;
    if (ps_coordinator_cancelled()) {
      rc =
          ps_status_set(st, PS_CANCELLED, "stopped while waiting for the chief: %s", why);
      break;
    }
    if (o->ready_timeout_secs > 0 && now - t0 > o->ready_timeout_secs) {
      rc = ps_status_set(st, PS_DEADLINE_EXCEEDED,
                         "the cluster was not ready within %.0f s: %s",
                         o->ready_timeout_secs, why);
      break;
    }
    if (last_log < 0 || now - last_log >= 5.0) {
      PS_INFO("waiting for the chief: %s", why);
      last_log = now;
    }
    delay = next_delay(delay);
    sleep_secs(delay);
  }
  free(uninit);
  free(vs.v);
  return rc;
}

int ps_coordinator_mark_done(ps_client *c, ps_status *st) {
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  ps_var_spec spec = {.name = PS_COORDINATOR_DONE,
                      .dtype = PS_DT_INT64,
                      .shape = {.rank = 0},
                      .init = &one};
  const char *name = PS_COORDINATOR_DONE;
  if (ps_client_create_vars(c, 0, &spec, 1, st) != 0 ||
      ps_client_initialize(c, 0, &name, 1, false, NULL, st) != 0)
    return ps_status_prefix(st, "marking the job done on ps/0 (%s)",
                            ps_client_address(c, 0));
  return 0;
}

bool ps_coordinator_job_done(const ps_status *st) {
  return st->code == PS_OUT_OF_RANGE && !strcmp(st->msg, PS_COORDINATOR_DONE_MSG);
}

/* Variables the session holds itself (no ps device): every worker
 * initializes its own. */
static int init_session_vars(ps_session *s, ps_status *st) {
  ps_graph *g = ps_session_graph(s);
  var_set all;
  all.v = ps_graph_vars_(g, &all.n);
  bool *want = calloc(all.n + 1, sizeof *want);
  if (want == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t n = 0;
  for (size_t i = 0; i < all.n; i++)
    if (all.v[i]->task < 0) want[i] = true, n++;
  int rc = n ? init_some(s, &all, want, n, st) : 0;
  free(want);
  return rc;
}

int ps_coordinator_prepare(ps_session *s, const ps_coordinator_options *o,
                           ps_coordinator_outcome *outcome, ps_status *st) {
  ps_coordinator_options def = {0};
  ps_coordinator_outcome tmp;
  if (o == NULL) o = &def;
  if (outcome == NULL) outcome = &tmp;
  if (ps_session_client(s) == NULL) {
    *outcome = PS_COORD_INITIALIZED;
    ps_node *init = ps_global_variables_initializer(ps_session_graph(s));
    return ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, st);
  }
  int rc = ps_coordinator_wait_for_ps(s, o->ps_timeout_secs, st);
  if (rc) return rc;
  if (o->is_chief) {
    rc = chief_prepare(s, o, outcome, st);
  } else {
    rc = wait_ready(s, o, st);
    if (rc == 0) *outcome = PS_COORD_JOINED;
  }
  return rc ? rc : init_session_vars(s, st);
}

/* ---- heartbeats --------------------------------------------------------- */

struct ps_coordinator_heartbeat {
  ps_client *c;
  char name[256]; /* PS_COORDINATOR_HEARTBEAT_PREFIX + task */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC */
  bool stop;         /* under mu */
  bool failing;      /* the thread's: the last beat failed (logged once) */
};

static int heartbeat_name(char *buf, size_t n, const char *task, ps_status *st) {
  int w = snprintf(buf, n, "%s%s", PS_COORDINATOR_HEARTBEAT_PREFIX, task);
  if (w < 0 || (size_t)w >= n)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "task name %s is too long for a heartbeat", task);
  return 0;
}

/* @name on ps/0: created if missing, 0 if uninitialized. */
static int heartbeat_create(ps_client *c, const char *name, ps_status *st) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_var_spec spec = {
      .name = name, .dtype = PS_DT_INT64, .shape = {.rank = 0}, .init = &z};
  if (ps_client_create_vars(c, 0, &spec, 1, st) != 0) return st->code;
  return ps_client_initialize(c, 0, &name, 1, true, NULL, st);
}

/* @op (assign or add) @v to @name on ps/0, creating it when missing (a
 * worker's first beat, a ps/0 that restarted empty) if @create. */
static int heartbeat_update(ps_client *c, const char *name, ps_update_op op, int64_t v,
                            bool create, ps_status *st) {
  ps_tensor *t = ps_tensor_new(PS_DT_INT64, 0, NULL);
  if (t == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  *(int64_t *)ps_tensor_data(t) = v;
  ps_update u = {.name = name, .op = op, .value = t};
  int rc = ps_client_update(c, 0, &u, 1, st);
  if (rc == PS_NOT_FOUND || rc == PS_FAILED_PRECONDITION) {
    if (!create)
      rc = 0;
    else if ((rc = heartbeat_create(c, name, st)) == 0)
      rc = ps_client_update(c, 0, &u, 1, st);
  }
  ps_tensor_destroy(t);
  return rc;
}

static void *heartbeat_main(void *arg) {
  ps_coordinator_heartbeat *h = arg;
  pthread_mutex_lock(&h->mu);
  while (!h->stop) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)PS_COORDINATOR_HEARTBEAT_SECS;
    while (!h->stop && pthread_cond_timedwait(&h->cv, &h->mu, &dl) != ETIMEDOUT) {
    }
    if (h->stop) break;
    pthread_mutex_unlock(&h->mu);
    ps_status e;
    if (heartbeat_update(h->c, h->name, PS_ASSIGN_ADD, 1, true, &e) != 0) {
      if (!h->failing)
        PS_WARN("heartbeat %s on ps/0 failed (tried again every %.0f s): %s", h->name,
                PS_COORDINATOR_HEARTBEAT_SECS, e.msg);
      h->failing = true;
    } else {
      h->failing = false;
    }
    pthread_mutex_lock(&h->mu);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

ps_coordinator_heartbeat *ps_coordinator_heartbeat_start(ps_client *c, const char *task,
                                                         ps_status *st) {
  ps_coordinator_heartbeat *h = calloc(1, sizeof *h);
  if (h == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  h->c = c;
  if (heartbeat_name(h->name, sizeof h->name, task, st) != 0) goto fail_free;
  /* 1, not + 1: the value a worker's earlier life or an earlier job left
   * (a count, or DONE) must read as a change */
  ps_status e;
  if (heartbeat_update(c, h->name, PS_ASSIGN, 1, true, &e) != 0) {
    if (e.code != PS_DEADLINE_EXCEEDED && e.code != PS_UNAVAILABLE) {
      *st = e;
      ps_status_prefix(st, "heartbeat %s on ps/0", h->name);
      goto fail_free;
    }
    /* ps/0 busy or away for a moment: the thread beats again */
    PS_WARN("heartbeat %s on ps/0 failed (tried again every %.0f s): %s", h->name,
            PS_COORDINATOR_HEARTBEAT_SECS, e.msg);
    h->failing = true;
  }
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) goto fail_sys;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) goto fail_sys;
  if (pthread_mutex_init(&h->mu, NULL) != 0) goto fail_cv;
  /* the thread takes no signals: SIGTERM stays with the program's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&h->thread, NULL, heartbeat_main, h);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) goto fail_mu;
  return h;
fail_mu:
  pthread_mutex_destroy(&h->mu);
fail_cv:
  pthread_cond_destroy(&h->cv);
fail_sys:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "heartbeat %s: cannot start its thread",
                h->name);
fail_free:
  free(h);
  return NULL;
}

int ps_coordinator_heartbeat_stop(ps_coordinator_heartbeat *h, bool done, ps_status *st) {
  if (h == NULL) return 0;
  pthread_mutex_lock(&h->mu);
  h->stop = true;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->thread, NULL);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  int rc = 0;
  if (done && (rc = heartbeat_update(h->c, h->name, PS_ASSIGN,
                                     PS_COORDINATOR_HEARTBEAT_DONE, true, st)) != 0)
    ps_status_prefix(st, "marking %s done on ps/0", h->name);
  free(h);
  return rc;
}

int ps_coordinator_heartbeat_mark_done(ps_client *c, const char *task, ps_status *st) {
  char name[256];
  if (heartbeat_name(name, sizeof name, task, st) != 0) return st->code;
  int rc = heartbeat_update(c, name, PS_ASSIGN, PS_COORDINATOR_HEARTBEAT_DONE, true, st);
  if (rc != 0) ps_status_prefix(st, "marking %s done on ps/0", name);
  return rc;
}

int ps_coordinator_heartbeat_read(ps_client *c, const char *task, int64_t *value,
                                  ps_status *st) {
  char name[256];
  *value = 0;
  if (heartbeat_name(name, sizeof name, task, st) != 0) return st->code;
  ps_read r = {.name = name};
  int rc = ps_client_read(c, 0, &r, 1, st);
  if (rc == PS_NOT_FOUND || rc == PS_FAILED_PRECONDITION) return 0; /* none */
  if (rc != 0) return rc;
  if (r.out == NULL || r.out->dtype != PS_DT_INT64 || ps_tensor_num_elements(r.out) != 1)
    rc = ps_status_set(st, PS_INTERNAL, "ps/0 answered a read of %s with no int64 scalar",
                       name);
  else
    *value = *(int64_t *)ps_tensor_data(r.out);
  ps_tensor_destroy(r.out);
  return rc;
}

int ps_coordinator_heartbeat_read_many(ps_client *c, const char *const *tasks, size_t n,
                                       int64_t *values, ps_status *st) {
  if (n == 0) return 0;
  char(*names)[256] = calloc(n, sizeof *names);
  ps_read *r = calloc(n, sizeof *r);
  int rc = 0;
  if (names == NULL || r == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n && rc == 0; i++) {
    values[i] = 0;
    rc = heartbeat_name(names[i], sizeof names[i], tasks[i], st);
    r[i].name = names[i];
  }
  if (rc != 0) goto out;
  rc = ps_client_read(c, 0, r, n, st);
  if (rc == PS_NOT_FOUND || rc == PS_FAILED_PRECONDITION) {
    /* one of them has no heartbeat (yet, or since ps/0 restarted): one by
     * one, so that the others still count */
    rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
      rc = ps_coordinator_heartbeat_read(c, tasks[i], &values[i], st);
    goto out;
  }
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (r[i].out == NULL || r[i].out->dtype != PS_DT_INT64 ||
        ps_tensor_num_elements(r[i].out) != 1)
      rc = ps_status_set(st, PS_INTERNAL,
                         "ps/0 answered a read of %s with no int64 scalar", names[i]);
    else
      values[i] = *(int64_t *)ps_tensor_data(r[i].out);
  }
  for (size_t i = 0; i < n; i++)
    ps_tensor_destroy(r[i].out);
out:
  free(names);
  free(r);
  return rc;
}

int ps_coordinator_heartbeat_clear(ps_client *c, const char *task, ps_status *st) {
  char name[256];
  if (heartbeat_name(name, sizeof name, task, st) != 0) return st->code;
  return heartbeat_update(c, name, PS_ASSIGN, 0, false, st);
}
