/* Replication's queries: the shards a ps holds (StatusResponse.shards)
 * and a replica's digest of one shard (Digest), for psctl status and
 * psctl verify.  Both answers are outside input: roles, counts and names
 * are checked before use. */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M_DIGEST "/paramserver.Ps/Digest"

static bool role_ok(const char *r) {
  return !strcmp(r, "primary") || !strcmp(r, "backup") || !strcmp(r, "syncing");
}

int ps_cl_parse_status_repl_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                             ps_status *st) {
  repl_out *ro = user;
  ps_task_repl *o = ro->o;
  ps_task_repl_fini(o); /* a retried call parses again */
  if (ps_cl_wire_ok_(&paramserver__status_response__descriptor, M_STATUS, p, n, st))
    return st->code;
  Paramserver__StatusResponse *r = paramserver__status_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_STATUS, "the answer does not parse");
  int rc = 0;
  if (r->replicas < 0 || r->replicas > 3 || r->view_epoch < 0 ||
      r->n_shards > (size_t)ro->nps)
    rc = ps_cl_bad_answer_(
        st, M_STATUS, "replicas %d, view epoch %lld, %zu shards (the cluster has %d)",
        r->replicas, (long long)r->view_epoch, r->n_shards, ro->nps);
  for (size_t i = 0; rc == 0 && i < r->n_shards; i++) {
    const Paramserver__ShardStatus *s = r->shards[i];
    if (s->shard < 0 || s->shard >= ro->nps || !role_ok(s->role) || s->num_vars < 0 ||
        s->bytes < 0 || s->n_lag_entries > 3 || s->n_lag_bytes != s->n_lag_entries ||
        s->synced_bytes < 0)
      rc = ps_cl_bad_answer_(st, M_STATUS,
                             "shard entry %zu: shard %d, role '%s', %zu lags, counts "
                             "%lld/%lld/%lld",
                             i, s->shard, s->role, s->n_lag_entries,
                             (long long)s->num_vars, (long long)s->bytes,
                             (long long)s->synced_bytes);
    for (size_t k = 0; rc == 0 && k < s->n_lag_entries; k++)
      if (s->lag_entries[k] < 0 || s->lag_bytes[k] < 0)
        rc = ps_cl_bad_answer_(st, M_STATUS, "shard %d: a negative lag", s->shard);
  }
  if (rc == 0 && r->n_shards > 0 &&
      (o->shards = calloc(r->n_shards, sizeof *o->shards)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Status: out of memory");
  if (rc == 0) {
    o->replicas = r->replicas;
    o->view_epoch = r->view_epoch;
    o->fenced = r->fenced;
    snprintf(o->fenced_reason, sizeof o->fenced_reason, "%s", r->fenced_reason);
    o->nshards = r->n_shards;
    for (size_t i = 0; i < r->n_shards; i++) {
      const Paramserver__ShardStatus *s = r->shards[i];
      ps_shard_status *d = &o->shards[i];
      d->shard = s->shard;
      snprintf(d->role, sizeof d->role, "%s", s->role);
      d->num_vars = s->num_vars;
      d->bytes = s->bytes;
      d->nlag = (int)s->n_lag_entries;
      for (size_t k = 0; k < s->n_lag_entries; k++) {
        d->lag_entries[k] = s->lag_entries[k];
        d->lag_bytes[k] = s->lag_bytes[k];
      }
      d->synced_bytes = s->synced_bytes;
    }
  }
  paramserver__status_response__free_unpacked(r, NULL);
  return rc;
}

void ps_task_repl_fini(ps_task_repl *r) {
  if (r == NULL) return;
  free(r->shards);
  memset(r, 0, sizeof *r);
}

int ps_client_status_repl(ps_client *c, int task, ps_task_repl *out, ps_status *st) {
  memset(out, 0, sizeof *out);
  Paramserver__StatusRequest req = PARAMSERVER__STATUS_REQUEST__INIT;
  repl_out ro = {.o = out, .nps = c->nps};
  int rc = ps_cl_control_call_(c, task, M_STATUS, &req.base, true,
                               ps_cl_parse_status_repl_, &ro, st);
  if (rc != 0) ps_task_repl_fini(out);
  return rc;
}

void ps_digest_fini(ps_digest *d) {
  if (d == NULL) return;
  for (size_t i = 0; i < d->n; i++)
    free(d->vars[i].name);
  free(d->vars);
  memset(d, 0, sizeof *d);
}

/* A retried call parses again: what an earlier answer left goes first. */
int ps_cl_parse_digest_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  digest_out *o = user;
  ps_digest_fini(o->d);
  if (ps_cl_wire_ok_(&paramserver__digest_response__descriptor, M_DIGEST, p, n, st))
    return st->code;
  Paramserver__DigestResponse *r = paramserver__digest_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_DIGEST, "the answer does not parse");
  int rc = 0;
  if (r->epoch < 0 || (r->role[0] && !role_ok(r->role)))
    rc = ps_cl_bad_answer_(st, M_DIGEST, "shard %d: epoch %lld, role '%s'", o->shard,
                           (long long)r->epoch, r->role);
  for (size_t i = 0; rc == 0 && i < r->n_vars; i++) {
    const Paramserver__VarDigest *v = r->vars[i];
    if (v->name[0] == '\0' || v->version < 0 || v->bytes < 0)
      rc = ps_cl_bad_answer_(st, M_DIGEST,
                             "shard %d: entry %zu: name '%s', version "
                             "%lld, bytes %lld",
                             o->shard, i, v->name, (long long)v->version,
                             (long long)v->bytes);
    else if (i > 0 && strcmp(r->vars[i - 1]->name, v->name) >= 0)
      rc = ps_cl_bad_answer_(st, M_DIGEST, "shard %d: %s after %s: not sorted", o->shard,
                             v->name, r->vars[i - 1]->name);
  }
  ps_digest *d = o->d;
  if (rc == 0 && (d->vars = calloc(r->n_vars + 1, sizeof *d->vars)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Digest: out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_vars; i++) {
    const Paramserver__VarDigest *v = r->vars[i];
    ps_var_digest *x = &d->vars[d->n];
    if ((x->name = strdup(v->name)) == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Digest: out of memory");
      break;
    }
    d->n++;
    x->version = v->version;
    x->crc32c = v->crc32c;
    x->initialized = v->initialized;
    x->bytes = v->bytes;
  }
  if (rc == 0) {
    d->epoch = r->epoch;
    snprintf(d->role, sizeof d->role, "%s", r->role);
  } else {
    ps_digest_fini(d);
  }
  paramserver__digest_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_digest(ps_client *c, int task, int shard, ps_digest *out, ps_status *st) {
  memset(out, 0, sizeof *out);
  if (shard < 0 || shard >= c->nps)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "shard %d does not exist (the cluster has %d)", shard, c->nps);
  Paramserver__DigestRequest req = PARAMSERVER__DIGEST_REQUEST__INIT;
  req.shard = shard;
  digest_out o = {.d = out, .shard = shard};
  int rc = ps_cl_control_call_(c, task, M_DIGEST, &req.base, true, ps_cl_parse_digest_,
                               &o, st);
  if (rc != 0) ps_digest_fini(out);
  return rc;
}
