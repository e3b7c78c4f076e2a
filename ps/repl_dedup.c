/* Dedup records of Update (client_id, seq), per ps (DESIGN.md
 * "Replication"): per client the last PS_REPL_DEDUP_SEQS seqs applied, at
 * most PS_REPL_DEDUP_CLIENTS clients, the least recently seen one evicted
 * first.  A backup keeps the same records (DEDUP entries), so a retry that
 * reaches it after a failover is recognized. */
#include <stdlib.h>
#include <string.h>

#include "repl_internal.h"

static ps_dedup_client *dedup_find(ps_repl *r, uint64_t cid, bool add) {
  for (size_t i = 0; i < r->nclients; i++)
    if (r->clients[i].id == cid) return &r->clients[i];
  if (!add) return NULL;
  if (r->clients == NULL &&
      (r->clients = calloc(PS_REPL_DEDUP_CLIENTS, sizeof *r->clients)) == NULL)
    return NULL;
  ps_dedup_client *c;
  if (r->nclients < PS_REPL_DEDUP_CLIENTS) {
    c = &r->clients[r->nclients++];
  } else { /* evict the least recently seen client */
    c = &r->clients[0];
    for (size_t i = 1; i < r->nclients; i++)
      if (r->clients[i].last_use < c->last_use) c = &r->clients[i];
  }
  memset(c, 0, sizeof *c);
  c->id = cid;
  return c;
}

int ps_repl_dedup_check(ps_repl *r, uint64_t cid, uint64_t seq, bool *dup,
                        ps_status *st) {
  *dup = false;
  int rc = 0;
  pthread_mutex_lock(&r->dmu);
  ps_dedup_client *c = dedup_find(r, cid, false);
  if (c) {
    c->last_use = ++r->dclock;
    uint64_t lo = UINT64_MAX;
    for (int i = 0; i < c->n; i++) {
      if (c->seqs[i] == seq) *dup = true;
      if (c->seqs[i] < lo) lo = c->seqs[i];
    }
    if (!*dup && c->n == PS_REPL_DEDUP_SEQS && seq < lo)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Update: seq %llu of client %016llx is older than the %d this "
                         "ps remembers for it: it cannot tell whether it was applied; "
                         "not applied",
                         (unsigned long long)seq, (unsigned long long)cid,
                         PS_REPL_DEDUP_SEQS);
  }
  pthread_mutex_unlock(&r->dmu);
  return rc;
}

void ps_repl_dedup_record(ps_repl *r, uint64_t cid, uint64_t seq) {
  pthread_mutex_lock(&r->dmu);
  ps_dedup_client *c = dedup_find(r, cid, true);
  if (c) {
    bool have = false;
    for (int i = 0; i < c->n && !have; i++)
      have = c->seqs[i] == seq;
    if (!have) {
      c->seqs[c->next] = seq;
      c->next = (c->next + 1) % PS_REPL_DEDUP_SEQS;
      if (c->n < PS_REPL_DEDUP_SEQS) c->n++;
    }
    c->last_use = ++r->dclock;
  }
  pthread_mutex_unlock(&r->dmu);
}

size_t ps_repl_dedup_dump(ps_repl *r, uint64_t **cids, uint64_t **seqs) {
  pthread_mutex_lock(&r->dmu);
  size_t n = 0;
  for (size_t i = 0; i < r->nclients; i++)
    n += (size_t)r->clients[i].n;
  *cids = malloc((n + 1) * sizeof **cids);
  *seqs = malloc((n + 1) * sizeof **seqs);
  size_t k = 0;
  if (*cids && *seqs)
    for (size_t i = 0; i < r->nclients; i++)
      for (int j = 0; j < r->clients[i].n; j++) {
        (*cids)[k] = r->clients[i].id;
        (*seqs)[k++] = r->clients[i].seqs[j];
      }
  pthread_mutex_unlock(&r->dmu);
  return k;
}
