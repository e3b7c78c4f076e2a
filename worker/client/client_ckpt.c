/* Cluster checkpoints: ps_client_save() (snapshot, save the shards,
 * merge) and the restores, all or nothing across the ps tasks (what
 * psctl restore adds on top is in client_recover.c). */
#include "client_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/tensor.h"

#define M_SNAPSHOT "/paramserver.Ps/Snapshot"
#define M_RELEASE "/paramserver.Ps/Release"
#define M_SAVE "/paramserver.Ps/Save"
#define M_MERGE "/paramserver.Ps/Merge"

void ps_ckpt_list_fini(ps_ckpt_list *l) {
  if (l == NULL) return;
  for (size_t i = 0; i < l->n; i++)
    free(l->paths[i]);
  free(l->paths);
  l->paths = NULL;
  l->n = 0;
}

int ps_cl_parse_save_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  Paramserver__SaveResponse *r = paramserver__save_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_SAVE, "the answer does not parse");
  int rc = 0;
  if (r->bytes < 0 || r->tensors < 0)
    rc = ps_cl_bad_answer_(st, M_SAVE, "%lld tensors, %lld bytes written",
                           (long long)r->tensors, (long long)r->bytes);
  else
    ((save_out *)user)->bytes = r->bytes;
  paramserver__save_response__free_unpacked(r, NULL);
  return rc;
}

int ps_cl_parse_merge_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st) {
  if (ps_cl_wire_ok_(&paramserver__merge_response__descriptor, M_MERGE, p, n, st))
    return st->code;
  Paramserver__MergeResponse *r = paramserver__merge_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_MERGE, "the answer does not parse");
  save_out *o = user;
  free(o->prefix);
  o->prefix = NULL;
  ps_ckpt_list_fini(&o->listed);
  int rc = 0;
  if (r->prefix[0] == '\0')
    rc = ps_cl_bad_answer_(st, M_MERGE, "the answer names no checkpoint");
  else
    rc = ps_cl_names_ok_(M_MERGE, "listed checkpoint", r->listed, r->n_listed, st);
  if (rc == 0 && (o->prefix = strdup(r->prefix)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  if (rc == 0 && (o->listed.paths = calloc(r->n_listed + 1, sizeof(char *))) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_listed; i++)
    if ((o->listed.paths[o->listed.n++] = strdup(r->listed[i])) == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  paramserver__merge_response__free_unpacked(r, NULL);
  return rc;
}

int ps_cl_parse_restore_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st) {
  save_out *o = user;
  if (ps_cl_wire_ok_(&paramserver__restore_response__descriptor, M_RESTORE, p, n, st))
    return st->code;
  Paramserver__RestoreResponse *r = paramserver__restore_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_RESTORE, "the answer does not parse");
  int rc = ps_cl_names_ok_(M_RESTORE, "restored name", r->restored, r->n_restored, st);
  if (rc == 0 && o->asked > 0 && r->n_restored > o->asked)
    rc = ps_cl_bad_answer_(st, M_RESTORE, "%zu variables restored for %zu asked",
                           r->n_restored, o->asked);
  if (rc == 0) {
    o->n = r->n_restored;
    o->checked = r->checked;
    free(o->prefix); /* the checkpoint the ps resolved */
    o->prefix = r->prefix && r->prefix[0] ? strdup(r->prefix) : NULL;
    if (r->prefix && r->prefix[0] && o->prefix == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  paramserver__restore_response__free_unpacked(r, NULL);
  return rc;
}

/* The ps a cluster-wide checkpoint call goes to: every task, or under
 * replication each distinct primary once (k of them), each call for
 * every shard it is the primary of (Route{-1, epoch}). */
typedef struct ckpt_plan {
  int k;
  int *dst;      /* [k] the tasks */
  int *slot;     /* [nps] shard -> its index in dst */
  int64_t epoch; /* the view's */
  Paramserver__Route route;
} ckpt_plan;

static void plan_fini(ckpt_plan *p) {
  free(p->dst);
  free(p->slot);
  memset(p, 0, sizeof *p);
}

static int plan_make(ps_client *c, ckpt_plan *p, ps_status *st) {
  memset(p, 0, sizeof *p);
  p->dst = calloc((size_t)c->nps, sizeof *p->dst);
  p->slot = calloc((size_t)c->nps, sizeof *p->slot);
  if (p->dst == NULL || p->slot == NULL) {
    plan_fini(p);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int s = 0; s < c->nps; s++) {
    int to = s;
    if (c->view) {
      ps_shard_replicas r;
      if (ps_client_shard_replicas(c, s, &r, st) != 0) {
        plan_fini(p);
        return st->code;
      }
      p->epoch = r.epoch;
      if (r.n == 0) {
        plan_fini(p);
        return ps_status_set(st, PS_UNAVAILABLE,
                             "shard %d is lost (no replica left in view epoch %lld): "
                             "restore from the latest checkpoint",
                             s, (long long)r.epoch);
      }
      to = r.task[0];
    }
    int j = 0;
    while (j < p->k && p->dst[j] != to)
      j++;
    if (j == p->k) p->dst[p->k++] = to;
    p->slot[s] = j;
  }
  paramserver__route__init(&p->route);
  p->route.shard = -1;
  p->route.epoch = p->epoch;
  return 0;
}

/* The same unary call to each planned ps at once; the first failure wins. */
static int all_ps(ps_client *c, const ckpt_plan *p, const char *method,
                  const ProtobufCMessage *const *msgs, parse_fn parse, save_out *outs,
                  int64_t timeout_ms, ps_status *st) {
  size_t n = (size_t)p->k;
  ps_rpc_req *reqs = calloc(n + 1, sizeof *reqs);
  answer *as = calloc(n + 1, sizeof *as);
  if (reqs == NULL || as == NULL) {
    free(reqs);
    free(as);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t j = 0; j < n; j++) {
    int t = p->dst[j];
    ps_cl_req_init_(c, &reqs[j], t, method, msgs[j], true, false);
    reqs[j].timeout_ms = timeout_ms;
    ps_cl_answer_init_(c, t, &reqs[j], &as[j], parse, outs ? &outs[j] : NULL, NULL);
  }
  ps_cl_run_reqs_(c, reqs, p->dst, n, false);
  int rc = 0;
  for (size_t j = 0; j < n && rc == 0; j++)
    if (reqs[j].st.code != PS_OK) {
      rc = reqs[j].st.code;
      if (st) *st = reqs[j].st;
    }
  free(reqs);
  free(as);
  return rc;
}

/* ps_client_save's step: a scalar integer variable read between Snapshot
 * and Release, so its value is the one the checkpoint holds. */
static int snapshot_step(ps_client *c, const ps_save_options *o, int64_t *step,
                         ps_status *st) {
  if (o->step_task < 0 || o->step_task >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "save: step variable %s is on ps task %d, which does not exist "
                         "(the cluster has %d)",
                         o->step_name, o->step_task, c->nps);
  ps_read r = {.name = o->step_name};
  if (ps_client_read(c, o->step_task, &r, 1, st) != 0) return st->code;
  int64_t v = -1;
  if (ps_tensor_num_elements(r.out) == 1 && r.out->dtype == PS_DT_INT64)
    memcpy(&v, ps_tensor_data(r.out), sizeof v);
  else if (ps_tensor_num_elements(r.out) == 1 && r.out->dtype == PS_DT_INT32) {
    int32_t v32;
    memcpy(&v32, ps_tensor_data(r.out), sizeof v32);
    v = v32;
  }
  ps_tensor_destroy(r.out);
  if (v < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "save: step variable %s is not a non-negative integer scalar",
                         o->step_name);
  *step = v;
  return 0;
}

static int save_once(ps_client *c, const char *prefix, const ps_save_options *o,
                     char **written, int64_t *bytes, ps_status *st) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t id = ((int64_t)now.tv_sec << 20) ^ (now.tv_nsec & 0xfffff) ^ (int64_t)getpid();
  if (id == 0 || id == -1) id = 7;
  for (size_t i = 0; o->select && i < o->nitems; i++)
    if (o->items[i].task < 0 || o->items[i].task >= c->nps)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "save: %s is on ps task %d, which does not exist (the cluster "
                           "has %d)",
                           o->items[i].name ? o->items[i].name : "(null)",
                           o->items[i].task, c->nps);
  /* one part per ps, or under replication per distinct primary */
  ckpt_plan plan;
  int rc = plan_make(c, &plan, st);
  if (rc != 0) return rc;
  int n = plan.k;
  Paramserver__SnapshotRequest *snaps = calloc((size_t)n + 1, sizeof *snaps);
  Paramserver__SnapshotItem *sitems = calloc(o->nitems + 1, sizeof *sitems);
  Paramserver__SnapshotItem **sptr = calloc(o->nitems + 1, sizeof *sptr);
  if (snaps == NULL || sitems == NULL || sptr == NULL) {
    free(snaps);
    free(sitems);
    free(sptr);
    plan_fini(&plan);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* each ps gets its own items, grouped by task (its shards') */
  size_t k = 0;
  for (int t = 0; t < n; t++) {
    paramserver__snapshot_request__init(&snaps[t]);
    snaps[t].id = id;
    snaps[t].hold_ms = o->hold_ms > 0 ? o->hold_ms : 10000;
    snaps[t].skip_uninitialized = o->skip_uninitialized;
    snaps[t].select = o->select;
    snaps[t].tables = o->select && o->tables;
    snaps[t].items = &sptr[k];
    if (c->view) snaps[t].route = &plan.route;
    for (size_t i = 0; o->select && i < o->nitems; i++) {
      if (plan.slot[o->items[i].task] != t) continue;
      paramserver__snapshot_item__init(&sitems[k]);
      sitems[k].name = (char *)o->items[i].name;
      sitems[k].key = (char *)(o->items[i].key ? o->items[i].key : "");
      sptr[k] = &sitems[k];
      k++;
      snaps[t].n_items++;
    }
  }
  Paramserver__ReleaseRequest rel = PARAMSERVER__RELEASE_REQUEST__INIT;
  rel.id = id;
  const ProtobufCMessage **msgs = calloc((size_t)n, sizeof *msgs);
  Paramserver__SaveRequest *saves = calloc((size_t)n, sizeof *saves);
  save_out *outs = calloc((size_t)n, sizeof *outs);
  if (msgs == NULL || saves == NULL || outs == NULL) {
    free(msgs);
    free(saves);
    free(outs);
    free(snaps);
    free(sitems);
    free(sptr);
    plan_fini(&plan);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* 1. every ps closes its gate and captures its variables */
  for (int t = 0; t < n; t++)
    msgs[t] = &snaps[t].base;
  rc = all_ps(c, &plan, M_SNAPSHOT, msgs, NULL, NULL, c->opt.control_timeout_ms, st);
  /* the step as the snapshot has it: no update passes a closed gate */
  char named[1100];
  int64_t step = -1;
  if (rc == 0 && o->step_name) rc = snapshot_step(c, o, &step, st);
  /* 2. every gate reopens, whatever happened */
  ps_status rst;
  for (int t = 0; t < n; t++)
    msgs[t] = &rel.base;
  all_ps(c, &plan, M_RELEASE, msgs, NULL, NULL, c->opt.control_timeout_ms, &rst);
  if (rc) goto out;
  if (o->step_name) {
    if (snprintf(named, sizeof named, "%s-%lld", prefix, (long long)step) >=
        (int)sizeof named) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "save: prefix %s is too long", prefix);
      goto out;
    }
    prefix = named;
    if (o->step) *o->step = step;
  }
  if (o->on_name && (rc = o->on_name(o->on_name_arg, prefix, st)) != 0) goto out;
  /* 3. every ps writes its shard */
  for (int t = 0; t < n; t++) {
    paramserver__save_request__init(&saves[t]);
    saves[t].snapshot_id = id;
    saves[t].prefix = (char *)prefix;
    saves[t].shard = t;
    saves[t].num_shards = n;
    if (c->view) saves[t].route = &plan.route;
    msgs[t] = &saves[t].base;
  }
  rc =
      all_ps(c, &plan, M_SAVE, msgs, ps_cl_parse_save_, outs, c->opt.data_timeout_ms, st);
  if (rc) goto out;
  int64_t total = 0;
  for (int t = 0; t < n; t++)
    total = outs[t].bytes > INT64_MAX - total ? INT64_MAX : total + outs[t].bytes;
  if (bytes) *bytes = total;
  /* 4. the last ps merges them and replaces the state file */
  Paramserver__MergeRequest mr = PARAMSERVER__MERGE_REQUEST__INIT;
  mr.prefix = (char *)prefix;
  mr.num_shards = n;
  mr.max_to_keep = o->max_to_keep;
  mr.keep_every_n_hours = o->keep_every_n_hours;
  if (o->own) {
    mr.own_list = true;
    mr.own_paths = o->own->paths;
    mr.n_own_paths = o->own->n;
  }
  if (o->meta_graph) {
    mr.meta_graph.data = (uint8_t *)o->meta_graph;
    mr.meta_graph.len = o->meta_graph_len;
  }
  rc = ps_cl_control_call_(c, plan.dst[n - 1], M_MERGE, &mr.base, false,
                           ps_cl_parse_merge_, &outs[0], st);
  if (rc == 0 && written) {
    *written = outs[0].prefix;
    outs[0].prefix = NULL;
  }
  if (rc == 0 && o->own) {
    ps_ckpt_list_fini(o->own);
    *o->own = outs[0].listed;
    outs[0].listed = (ps_ckpt_list){0};
  }
out:
  free(snaps);
  free(sitems);
  free(sptr);
  ps_ckpt_list_fini(&outs[0].listed);
  free(outs[0].prefix);
  free(outs);
  free(saves);
  free(msgs);
  plan_fini(&plan);
  return rc;
}

/* Under replication a save that met a failover (a ps gone, or one whose
 * view differs from the client's: FAILED_PRECONDITION) is made again,
 * whole, by the newer view, until the rpc timeout. */
static bool save_again(const ps_status *st) {
  return st->code == PS_UNAVAILABLE
             ? strstr(st->msg, " is lost") == NULL
             : st->code == PS_FAILED_PRECONDITION &&
                   (strstr(st->msg, "stale") || strstr(st->msg, "is not the primary") ||
                    strstr(st->msg, "epoch"));
}

int ps_client_save(ps_client *c, const char *prefix, const ps_save_options *o,
                   char **written, int64_t *bytes, ps_status *st) {
  ps_save_options def = {0};
  if (o == NULL) o = &def;
  ps_status mine;
  if (st == NULL) st = &mine;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int64_t backoff = c->opt.retry_initial_ms;
  for (;;) {
    int64_t epoch = ps_client_view_epoch(c);
    int rc = save_once(c, prefix, o, written, bytes, st);
    if (rc == 0 || c->view == NULL || !save_again(st)) return rc;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t spent = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                    (now.tv_nsec - t0.tv_nsec) / 1000000,
            left = c->opt.rpc_timeout_ms - spent;
    if (left <= 0) return rc;
    PS_WARN("save %s made again by a newer replication view: %s", prefix, st->msg);
    ps_cl_view_wait_(c, epoch, backoff < left ? backoff : left);
    backoff = backoff * 2 > c->opt.retry_max_ms ? c->opt.retry_max_ms : backoff * 2;
  }
}

/* Checks the answers of a check_only Restore sent to @tasks[0..@n): each
 * ps must have answered it as a check (an older ps-server ignores
 * check_only and restores instead), and all must name one checkpoint,
 * which *@resolved receives (to free). */
static int checked_answers(ps_client *c, const ps_rpc_req *reqs, const int *tasks,
                           size_t n, const save_out *outs, char **resolved,
                           ps_status *st) {
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++)
    if (reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      *st = reqs[i].st;
    }
  for (size_t i = 0; i < n && rc == 0; i++)
    if (!outs[i].checked)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Restore: /job:ps/task:%d (%s) did not answer the check before "
                         "the restore as a check: an older ps-server, which ignores "
                         "check_only and restores at once; its variables may have "
                         "changed. Upgrade every ps-server to restore across several ps",
                         tasks[i], c->addrs[tasks[i]]);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (outs[i].prefix == NULL || strcmp(outs[i].prefix, outs[0].prefix) != 0)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Restore: the ps disagree on the checkpoint: /job:ps/task:%d "
                         "checked %s, /job:ps/task:%d checked %s (a save in between, or "
                         "ps with different checkpoint directories); nothing restored",
                         tasks[0], outs[0].prefix ? outs[0].prefix : "(none)", tasks[i],
                         outs[i].prefix ? outs[i].prefix : "(none)");
  if (rc == 0 && n > 0 && (*resolved = strdup(outs[0].prefix)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  return rc;
}

int ps_client_check_restore_all(ps_client *c, const char *prefix,
                                const char *const *const *names,
                                const char *const *const *keys, const size_t *n,
                                char **resolved, ps_status *st) {
  int nps = c->nps;
  *resolved = NULL;
  size_t total = 0;
  for (int t = 0; names && t < nps; t++)
    total += n[t];
  Paramserver__RestoreRequest *rq = calloc((size_t)nps, sizeof *rq);
  Paramserver__RestoreItem *items = calloc(total + 1, sizeof *items);
  Paramserver__RestoreItem **ip = calloc(total + 1, sizeof *ip);
  ps_rpc_req *reqs = calloc((size_t)nps, sizeof *reqs);
  int *tasks = calloc((size_t)nps, sizeof *tasks);
  save_out *outs = calloc((size_t)nps, sizeof *outs);
  int rc = 0;
  ckpt_plan plan = {0};
  if (rq == NULL || items == NULL || ip == NULL || reqs == NULL || tasks == NULL ||
      outs == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    goto out;
  }
  size_t k = 0, nr = 0;
  if (c->view && names == NULL && (rc = plan_make(c, &plan, st)) != 0) goto out;
  int emitted = 0;
  for (int t = 0; t < nps; t++) {
    if (names && n[t] == 0) continue;
    /* replicated, the whole checkpoint: each primary once (it checks
     * every shard it holds) */
    if (plan.slot && plan.slot[t] != emitted) continue;
    if (plan.slot) emitted++;
    paramserver__restore_request__init(&rq[t]);
    rq[t].prefix = (char *)(prefix ? prefix : "");
    rq[t].check_only = true;
    rq[t].table_task = t; /* embedding tables: the rows of this ps */
    rq[t].table_tasks = nps;
    if (names) {
      rq[t].items = &ip[k];
      rq[t].n_items = n[t];
      for (size_t i = 0; i < n[t]; i++, k++) {
        paramserver__restore_item__init(&items[k]);
        items[k].name = (char *)names[t][i];
        items[k].key = (char *)(keys && keys[t] && keys[t][i] ? keys[t][i] : "");
        ip[k] = &items[k];
      }
    }
    ps_cl_req_init_(c, &reqs[nr], t, M_RESTORE, &rq[t].base, true, false);
    reqs[nr].timeout_ms = c->opt.data_timeout_ms;
    reqs[nr].on_header = ps_cl_parse_restore_;
    reqs[nr].user = &outs[nr];
    tasks[nr++] = t;
  }
  ps_cl_run_reqs_(c, reqs, tasks, nr, false);
  rc = checked_answers(c, reqs, tasks, nr, outs, resolved, st);
out:
  plan_fini(&plan);
  for (int t = 0; outs && t < nps; t++)
    free(outs[t].prefix);
  free(outs);
  free(tasks);
  free(reqs);
  free(ip);
  free(items);
  free(rq);
  return rc;
}

int ps_cl_restore_all_(ps_client *c, const char *prefix, size_t *nrestored,
                       ps_status *st) {
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = (char *)(prefix ? prefix : "");
  ckpt_plan plan;
  int rc = plan_make(c, &plan, st);
  if (rc != 0) return rc;
  /* under replication each primary restores every shard it holds and
   * fills their backups */
  if (c->view) rq.route = &plan.route;
  const ProtobufCMessage **msgs = calloc((size_t)c->nps, sizeof *msgs);
  save_out *outs = calloc((size_t)c->nps, sizeof *outs);
  if (msgs == NULL || outs == NULL) {
    free(msgs);
    free(outs);
    plan_fini(&plan);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  /* per ps: which embedding table rows are its (RestoreRequest.table_task) */
  Paramserver__RestoreRequest *per = calloc((size_t)c->nps + 1, sizeof *per);
  if (per == NULL) {
    free(msgs);
    free(outs);
    plan_fini(&plan);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  for (int t = 0; t < plan.k; t++)
    msgs[t] = &per[t].base;
  /* all or nothing across the ps: every ps checks first (all at once),
   * none changes anything unless every one would succeed; then every ps
   * restores the checkpoint they checked, by its path ("the latest" is
   * resolved once: not one a save made since) */
  char *checked = NULL;
  if (plan.k > 1) {
    rc = ps_client_check_restore_all(c, prefix, NULL, NULL, NULL, &checked, st);
    if (rc == 0) rq.prefix = checked;
  }
  for (int t = 0; t < plan.k; t++) {
    per[t] = rq;
    if (!c->view) {
      per[t].table_task = plan.dst[t];
      per[t].table_tasks = c->nps;
    }
  }
  if (rc == 0)
    rc = all_ps(c, &plan, M_RESTORE, msgs, ps_cl_parse_restore_, outs,
                c->opt.data_timeout_ms, st);
  free(per);
  if (nrestored) {
    *nrestored = 0;
    for (int t = 0; t < plan.k; t++)
      *nrestored += outs[t].n;
  }
  for (int t = 0; t < plan.k; t++)
    free(outs[t].prefix);
  free(checked);
  free(msgs);
  free(outs);
  plan_fini(&plan);
  return rc;
}

int ps_cl_restore_vars_(ps_client *c, int task, const char *prefix,
                        const char *const *names, const char *const *keys, size_t n,
                        bool check_only, size_t *nrestored, ps_status *st) {
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = (char *)(prefix ? prefix : "");
  rq.check_only = check_only;
  Paramserver__RestoreItem *items = calloc(n + 1, sizeof *items);
  Paramserver__RestoreItem **ip = calloc(n + 1, sizeof *ip);
  if (items == NULL || ip == NULL) {
    free(items);
    free(ip);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    paramserver__restore_item__init(&items[i]);
    items[i].name = (char *)names[i];
    items[i].key = (char *)(keys && keys[i] ? keys[i] : "");
    ip[i] = &items[i];
  }
  rq.items = ip;
  rq.n_items = n;
  rq.table_task = task;
  rq.table_tasks = c->nps;
  save_out out = {.asked = n};
  int rc = ps_cl_control_call_(c, task, M_RESTORE, &rq.base, false, ps_cl_parse_restore_,
                               &out, st);
  if (rc == 0 && check_only && !out.checked)
    rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                       "Restore: /job:ps/task:%d (%s) did not answer the check before "
                       "the restore as a check: an older ps-server, which ignores "
                       "check_only and restores at once; its variables may have "
                       "changed. Upgrade every ps-server to restore across several ps",
                       task, c->addrs[task]);
  if (nrestored) *nrestored = rc == 0 ? out.n : 0;
  free(out.prefix);
  free(items);
  free(ip);
  return rc;
}

int ps_client_restore_vars(ps_client *c, int task, const char *prefix,
                           const char *const *names, const char *const *keys, size_t n,
                           ps_status *st) {
  return ps_cl_restore_vars_(c, task, prefix, names, keys, n, false, NULL, st);
}

int ps_client_check_restore_vars(ps_client *c, int task, const char *prefix,
                                 const char *const *names, const char *const *keys,
                                 size_t n, ps_status *st) {
  return ps_cl_restore_vars_(c, task, prefix, names, keys, n, true, NULL, st);
}
