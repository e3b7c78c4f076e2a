/* Dedup records of Update (client_id, seq), per shard (DESIGN.md
 * "Replication").  A record is kept per (shard, client): the highest seq
 * applied and a bitmap of the PS_REPL_DEDUP_WINDOW seqs up to it (a seq
 * is remembered by its value, whatever order the seqs arrived in).  At
 * most PS_REPL_DEDUP_CLIENTS clients per shard; the one recorded least
 * recently is evicted first.  Only recording touches the LRU order, and
 * the state copy dumps a shard's records oldest first, seqs ascending,
 * so a backup that replays the DEDUP entries holds the same records in
 * the same order as its primary: a retry is decided the same way on
 * every replica. */
#include <stdlib.h>
#include <string.h>

#include "repl_internal.h"

#define WORDS (PS_REPL_DEDUP_WINDOW / 64)

static ps_dedup_client *dedup_find(ps_repl *r, int shard, uint64_t cid) {
  for (size_t i = 0; i < r->nclients; i++)
    if (r->clients[i].id == cid && r->clients[i].shard == shard) return &r->clients[i];
  return NULL;
}

static ps_dedup_client *dedup_add(ps_repl *r, int shard, uint64_t cid) {
  size_t in_shard = 0;
  ps_dedup_client *lru = NULL;
  for (size_t i = 0; i < r->nclients; i++)
    if (r->clients[i].shard == shard) {
      in_shard++;
      if (lru == NULL || r->clients[i].last_use < lru->last_use) lru = &r->clients[i];
    }
  ps_dedup_client *c = lru;
  if (in_shard < PS_REPL_DEDUP_CLIENTS) {
    if (r->nclients == r->capclients) {
      size_t nc = r->capclients ? r->capclients * 2 : 16;
      ps_dedup_client *p = realloc(r->clients, nc * sizeof *p);
      if (p == NULL) return NULL;
      r->clients = p;
      r->capclients = nc;
    }
    c = &r->clients[r->nclients++];
  }
  memset(c, 0, sizeof *c);
  c->id = cid;
  c->shard = shard;
  return c;
}

static bool has_seq(const ps_dedup_client *c, uint64_t seq) {
  if (seq > c->max) return false;
  if (c->max - seq >= PS_REPL_DEDUP_WINDOW) return false;
  uint64_t b = seq % PS_REPL_DEDUP_WINDOW;
  return c->bits[b / 64] >> (b % 64) & 1;
}

int ps_repl_dedup_check(ps_repl *r, int shard, uint64_t cid, uint64_t seq, bool *dup,
                        ps_status *st) {
  *dup = false;
  int rc = 0;
  pthread_mutex_lock(&r->dmu);
  ps_dedup_client *c = dedup_find(r, shard, cid);
  if (c && seq <= c->max && c->max - seq >= PS_REPL_DEDUP_WINDOW)
    rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                       "Update: seq %llu of client %016llx is older than the %d seqs "
                       "shard %d remembers for it (newest %llu): it cannot tell whether "
                       "it was applied; not applied",
                       (unsigned long long)seq, (unsigned long long)cid,
                       PS_REPL_DEDUP_WINDOW, shard, (unsigned long long)c->max);
  else if (c)
    *dup = has_seq(c, seq);
  pthread_mutex_unlock(&r->dmu);
  return rc;
}

void ps_repl_dedup_record(ps_repl *r, int shard, uint64_t cid, uint64_t seq) {
  pthread_mutex_lock(&r->dmu);
  ps_dedup_client *c = dedup_find(r, shard, cid);
  if (c == NULL) c = dedup_add(r, shard, cid);
  if (c) {
    if (!c->any) {
      c->any = true;
      c->max = seq;
    } else if (seq > c->max) { /* the window moves up: forget what leaves it */
      uint64_t d = seq - c->max;
      if (d >= PS_REPL_DEDUP_WINDOW)
        memset(c->bits, 0, sizeof c->bits);
      else
        for (uint64_t s = c->max + 1; s <= seq; s++) {
          uint64_t b = s % PS_REPL_DEDUP_WINDOW;
          c->bits[b / 64] &= ~((uint64_t)1 << (b % 64));
        }
      c->max = seq;
    }
    if (c->max - seq < PS_REPL_DEDUP_WINDOW) {
      uint64_t b = seq % PS_REPL_DEDUP_WINDOW;
      c->bits[b / 64] |= (uint64_t)1 << (b % 64);
    }
    c->last_use = ++r->dclock;
  }
  pthread_mutex_unlock(&r->dmu);
}

void ps_repl_dedup_forget(ps_repl *r, int shard) {
  pthread_mutex_lock(&r->dmu);
  size_t k = 0;
  for (size_t i = 0; i < r->nclients; i++)
    if (r->clients[i].shard != shard) r->clients[k++] = r->clients[i];
  r->nclients = k;
  pthread_mutex_unlock(&r->dmu);
}

static int by_last_use(const void *a, const void *b) {
  uint64_t x = (*(ps_dedup_client *const *)a)->last_use,
           y = (*(ps_dedup_client *const *)b)->last_use;
  return (x > y) - (x < y);
}

size_t ps_repl_dedup_dump(ps_repl *r, int shard, uint64_t **cids, uint64_t **seqs) {
  pthread_mutex_lock(&r->dmu);
  size_t n = 0, nc = 0;
  ps_dedup_client **order = malloc((r->nclients + 1) * sizeof *order);
  for (size_t i = 0; order && i < r->nclients; i++)
    if (r->clients[i].shard == shard) {
      order[nc++] = &r->clients[i];
      for (int w = 0; w < WORDS; w++)
        n += (size_t)__builtin_popcountll(r->clients[i].bits[w]);
    }
  *cids = order ? malloc((n + 1) * sizeof **cids) : NULL;
  *seqs = order ? malloc((n + 1) * sizeof **seqs) : NULL;
  size_t k = 0;
  if (*cids && *seqs) {
    qsort(order, nc, sizeof *order, by_last_use); /* oldest first */
    for (size_t i = 0; i < nc; i++) {
      const ps_dedup_client *c = order[i];
      uint64_t lo =
          c->max >= PS_REPL_DEDUP_WINDOW - 1 ? c->max - (PS_REPL_DEDUP_WINDOW - 1) : 0;
      for (uint64_t s = lo;; s++) { /* ascending: the window replays the same */
        if (has_seq(c, s) && k < n) {
          (*cids)[k] = c->id;
          (*seqs)[k++] = s;
        }
        if (s == c->max) break;
      }
    }
  } else {
    free(*cids);
    free(*seqs);
    *cids = *seqs = NULL;
  }
  free(order);
  pthread_mutex_unlock(&r->dmu);
  return k;
}
