/* Cut-through for large assigns (ps/repl_internal.h, DESIGN.md "The
 * replication link").  Without it an assign of B bytes reaches the
 * backups only after all B arrived from its client: two transfers one
 * after the other.  With it the primary forwards the bytes while they
 * arrive: the request registers its large values (ps_repl_stage_begin),
 * reports each message of bytes landed (ps_repl_stage_progress), and each
 * backup's sender thread writes what is there in STAGE frames on its link.
 * When the update's VALUE entry goes out, it names the stage instead of
 * carrying the bytes, when every byte went before on the same connection;
 * otherwise (no link, a reconnect, too many stages) the bytes go in the
 * batch as without cut-through.  A stage no entry named is dropped with an
 * UNSTAGE frame; a backup drops a connection's stages when it ends
 * (their table: repl_frame.c). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "repl_internal.h"

/* The most one STAGE frame carries: the sender thread gets back to its
 * batches between pieces. */
#define STAGE_PIECE ((size_t)4 << 20)

/* Guards each staging's `r` and r->stagings: a request may hold its
 * staging past ps_repl_destroy (then `r` is NULL).  Taken before r->mu. */
static pthread_mutex_t stagings_mu = PTHREAD_MUTEX_INITIALIZER;

struct ps_repl_staging {
  ps_repl *r;
  struct ps_repl_staging *next; /* in r->stagings */
  size_t n;
  struct {
    ps_repl_stage *s;
    size_t off; /* where its bytes start in the request's bulk bytes */
  } v[];
};

static void stage_free(ps_repl_stage *s) {
  ps_buf_unref(s->buf);
  free(s);
}

void ps_repl_stage_unref(ps_repl_stage *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) stage_free(s);
}

/* Under r->mu: @snd's live sender for backup @task, or NULL. */
static ps_repl_sender *sender_of(ps_repl *r, int task) {
  for (ps_repl_sender *s = r->senders; s; s = s->next)
    if (s->task == task && !s->retired) return s;
  return NULL;
}

ps_repl_staging *ps_repl_stage_begin(ps_repl *r, int shard, ps_buf *const *bufs,
                                     const size_t *offs, size_t n) {
  if (r == NULL || n == 0 || !r->link_asked || shard < 0 || shard >= r->ntasks)
    return NULL;
  ps_repl_staging *g = calloc(1, sizeof *g + n * PS_VIEW_MAX_REPLICAS * sizeof g->v[0]);
  if (g == NULL) return NULL; /* the bytes go in the batch */
  g->r = r;
  pthread_mutex_lock(&stagings_mu);
  pthread_mutex_lock(&r->mu);
  const ps_view_shard *vs =
      r->view.shard && !r->fenced && !r->stopping ? &r->view.shard[shard] : NULL;
  for (int k = 1; vs && vs->n > 1 && vs->task[0] == r->self && k < vs->n; k++) {
    ps_repl_sender *snd = sender_of(r, vs->task[k]);
    if (snd == NULL || snd->failed || snd->stale) continue;
    ps_repl_stage **tail = &snd->stages;
    while (*tail)
      tail = &(*tail)->next;
    for (size_t i = 0; i < n && snd->nstages < PS_REPL_MAX_STAGES; i++) {
      ps_repl_stage *s = calloc(1, sizeof *s);
      if (s == NULL) break;
      atomic_init(&s->refs, 2); /* the list's and the request's */
      s->buf = ps_buf_ref(bufs[i]);
      s->id = ++snd->stage_ids;
      s->snd = snd;
      *tail = s;
      tail = &s->next;
      snd->nstages++;
      g->v[g->n].s = s;
      g->v[g->n++].off = offs[i];
    }
  }
  pthread_mutex_unlock(&r->mu);
  if (g->n > 0) {
    g->next = r->stagings;
    r->stagings = g;
  }
  pthread_mutex_unlock(&stagings_mu);
  if (g->n > 0) return g;
  free(g);
  return NULL;
}

void ps_repl_stage_progress(ps_repl_staging *g, size_t received) {
  if (g == NULL) return;
  pthread_mutex_lock(&stagings_mu);
  if (g->r == NULL) { /* the data plane stopped */
    pthread_mutex_unlock(&stagings_mu);
    return;
  }
  pthread_mutex_lock(&g->r->mu);
  for (size_t i = 0; i < g->n; i++) {
    ps_repl_stage *s = g->v[i].s;
    size_t a = received > g->v[i].off ? received - g->v[i].off : 0;
    if (a > s->buf->size) a = s->buf->size;
    if (a <= s->avail) continue;
    s->avail = a;
    /* the sender wakes for a whole piece (or the end) */
    if (s->snd && (a - s->sent >= STAGE_PIECE || a == s->buf->size))
      pthread_cond_signal(&s->snd->cv);
  }
  pthread_mutex_unlock(&g->r->mu);
  pthread_mutex_unlock(&stagings_mu);
}

/* Under r->mu: the request lets go of its stages (@unref: and of its
 * references, so that a sender sees them free of it when it wakes). */
static void close_all(ps_repl_staging *g, bool unref) {
  for (size_t i = 0; i < g->n; i++) {
    ps_repl_stage *s = g->v[i].s;
    ps_repl_sender *snd = s->snd;
    s->closed = true;
    if (unref) {
      ps_repl_stage_unref(s);
      g->v[i].s = NULL;
    }
    if (snd) pthread_cond_signal(&snd->cv);
  }
}

void ps_repl_stage_end(ps_repl_staging *g) {
  if (g == NULL) return;
  pthread_mutex_lock(&stagings_mu);
  ps_repl *r = g->r;
  if (r) {
    pthread_mutex_lock(&r->mu);
    close_all(g, true);
    pthread_mutex_unlock(&r->mu);
    for (ps_repl_staging **pp = &r->stagings; *pp; pp = &(*pp)->next)
      if (*pp == g) {
        *pp = g->next;
        break;
      }
  }
  pthread_mutex_unlock(&stagings_mu);
  for (size_t i = 0; i < g->n; i++) /* orphaned: closed already */
    ps_repl_stage_unref(g->v[i].s);
  free(g);
}

void ps_repl_stage_orphan_all(ps_repl *r) {
  pthread_mutex_lock(&stagings_mu);
  pthread_mutex_lock(&r->mu);
  for (ps_repl_staging *g = r->stagings; g; g = g->next) {
    close_all(g, false);
    g->r = NULL;
  }
  r->stagings = NULL;
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&stagings_mu);
}

void ps_repl_stage_claim(ps_repl_sender *snd, ps_repl_entry *c) {
  if (c->kind != PS_REPL_VALUE || c->val == NULL) return;
  for (ps_repl_stage *s = snd->stages; s; s = s->next)
    if (s->buf == c->val && !s->closed && !s->used && !s->skip) {
      atomic_fetch_add(&s->refs, 1);
      c->stage = s;
      return;
    }
}

/* Under r->mu: takes @s out of @snd's list; the caller drops the list's
 * reference (the last one frees a buffer of up to --max-tensor-bytes:
 * better not under r->mu). */
static void stage_unlink(ps_repl_sender *snd, ps_repl_stage *s) {
  for (ps_repl_stage **pp = &snd->stages; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  snd->nstages--;
  s->snd = NULL;
}

/* Under r->mu: writes a frame with r->mu released (inline sends wait). */
static int stage_io(ps_repl_sender *snd, ps_repl_stage *s, uint64_t id, size_t off,
                    size_t n) {
  ps_repl *r = snd->r;
  ps_status st;
  snd->stage_io = true;
  pthread_mutex_unlock(&r->mu);
  int rc = s ? ps_repl_link_stage(snd, id, s->buf, off, n, &st)
             : ps_repl_link_unstage(snd, id, &st);
  pthread_mutex_lock(&r->mu);
  snd->stage_io = false;
  if (rc != 0)
    PS_DEBUG("replication to ps/%d: stage %llu not forwarded: %s", snd->task,
             (unsigned long long)id, st.msg);
  return rc;
}

bool ps_repl_stage_work(ps_repl_sender *snd) {
  for (ps_repl_stage *s = snd->stages; s; s = s->next) {
    /* let go: the request is done and no entry may name it */
    if (s->closed && atomic_load(&s->refs) == 1) {
      bool drop = s->sent > 0 && !s->used && !s->skip && s->gen == snd->link_gen &&
                  snd->link_fd >= 0;
      uint64_t id = s->id;
      stage_unlink(snd, s);
      if (drop) stage_io(snd, NULL, id, 0, 0);
      pthread_mutex_unlock(&snd->r->mu);
      ps_repl_stage_unref(s);
      pthread_mutex_lock(&snd->r->mu);
      return true;
    }
    if (s->skip || s->used || s->avail <= s->sent) continue;
    if (snd->link_fd < 0 || snd->failed || snd->stale ||
        (s->gen != 0 && s->gen != snd->link_gen)) {
      s->skip = true; /* its bytes go in the batch */
      continue;
    }
    size_t off = s->sent, n = s->avail - off;
    if (n > STAGE_PIECE) n = STAGE_PIECE;
    s->gen = snd->link_gen;
    /* (s stays: only this thread takes it out of the list) */
    if (stage_io(snd, s, s->id, off, n) == 0)
      s->sent = off + n;
    else
      s->skip = true;
    return true;
  }
  return false;
}

uint64_t ps_repl_stage_use(ps_repl_sender *snd, const ps_repl_entry *e) {
  ps_repl_stage *s = e->stage;
  if (s == NULL || snd->link_fd < 0) return 0;
  ps_repl *r = snd->r;
  pthread_mutex_lock(&r->mu);
  /* every byte went before on this connection (the sender thread does its
   * stage work before it takes a batch, and the entry exists only once
   * the request had all its bytes; otherwise they go in the batch) */
  bool ok = s->snd == snd && !s->used && !s->skip && s->buf == e->val &&
            s->sent == s->buf->size && s->gen == snd->link_gen;
  if (ok) {
    s->used = true;
    r->cut_through_bytes += (long long)s->buf->size;
  }
  pthread_mutex_unlock(&r->mu);
  return ok ? s->id : 0;
}

void ps_repl_stage_release_all(ps_repl_sender *snd) {
  while (snd->stages) {
    ps_repl_stage *s = snd->stages;
    stage_unlink(snd, s);
    ps_repl_stage_unref(s); /* (the thread is ending) */
  }
}
