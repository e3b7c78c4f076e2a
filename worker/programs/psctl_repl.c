/* psctl's commands for replicated ps shards: status's lines per shard
 * (the replicas, their roles and lag, from the view the client follows and
 * each ps's own report), and verify (every replica's Digest of every
 * shard, compared). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cluster.h"
#include "common/view.h"
#include "psctl_internal.h"

static const char *role_name(int state) {
  return state == PS_SHARD_PRIMARY  ? "primary"
         : state == PS_SHARD_BACKUP ? "backup"
                                    : "syncing";
}

static const ps_shard_status *find_shard(const ps_task_repl *r, int shard) {
  for (size_t i = 0; r && i < r->nshards; i++)
    if (r->shards[i].shard == shard) return &r->shards[i];
  return NULL;
}

/* "replication: 2 replicas, view epoch 4", each ps's own view and fencing,
 * then per shard: "shard 0: ps/1 primary (since epoch 4), ps/2 syncing
 * (lag 3 entries, 300 bytes; copied 4096 bytes)". */
int psctl_status_shards(const psctl_args *a, ps_client *c, ps_status *st) {
  int nps = ps_client_num_ps(c), rc = 0;
  ps_task_repl *reps = calloc((size_t)nps, sizeof *reps);
  bool *up = calloc((size_t)nps, sizeof *up);
  if (reps == NULL || up == NULL) {
    free(reps);
    free(up);
    fprintf(stderr, "psctl: out of memory\n");
    return 1;
  }
  printf("replication: %d replicas per shard, view epoch %lld\n", ps_client_replicas(c),
         (long long)ps_client_view_epoch(c));
  /* the rule the view started from (DESIGN.md "Replication") */
  char **hosts = NULL, line[1024];
  int nh = 0;
  ps_status hs;
  if (a->cluster && ps_repl_hosts_from_cluster(a->cluster, &hosts, &nh, &hs) == 0) {
    ps_view_describe_placement(nps, ps_client_replicas(c),
                               nh == nps ? (const char *const *)hosts : NULL, line,
                               sizeof line);
    printf("%s\n", line);
  }
  ps_repl_hosts_free(hosts, nh);
  for (int t = 0; t < nps; t++) {
    if (ps_client_status_repl(c, t, &reps[t], st) != 0) continue; /* down: said above */
    up[t] = true;
    if (reps[t].fenced) {
      printf("%s/%d fenced (view epoch %lld): %s\n", a->job, t,
             (long long)reps[t].view_epoch, reps[t].fenced_reason);
      rc = 1;
    } else if (reps[t].view_epoch != ps_client_view_epoch(c)) {
      printf("%s/%d has view epoch %lld\n", a->job, t, (long long)reps[t].view_epoch);
    }
  }
  for (int s = 0; s < nps; s++) {
    ps_shard_replicas r;
    if (ps_client_shard_replicas(c, s, &r, st) != 0) {
      fprintf(stderr, "psctl: shard %d: %s\n", s, st->msg);
      rc = 1;
      continue;
    }
    printf("shard %d:", s);
    if (r.n == 0) {
      printf(" lost (no replica left): restore from the latest checkpoint\n");
      rc = 1;
      continue;
    }
    const ps_shard_status *prim = up[r.task[0]] ? find_shard(&reps[r.task[0]], s) : NULL;
    for (int j = 0; j < r.n; j++) {
      int t = r.task[j];
      printf("%s %s/%d %s", j ? "," : "", a->job, t, role_name(r.state[j]));
      if (j == 0) {
        printf(" (since epoch %lld", (long long)r.since);
        if (prim)
          printf(", %lld variables, %lld bytes", (long long)prim->num_vars,
                 (long long)prim->bytes);
        printf(")");
      } else {
        const ps_shard_status *mine = up[t] ? find_shard(&reps[t], s) : NULL;
        printf(" (");
        if (prim && j - 1 < prim->nlag)
          printf("lag %lld entries, %lld bytes", (long long)prim->lag_entries[j - 1],
                 (long long)prim->lag_bytes[j - 1]);
        else
          printf("lag unknown");
        if (r.state[j] == PS_SHARD_SYNCING && mine)
          printf("; copied %lld bytes", (long long)mine->synced_bytes);
        printf(")");
      }
      if (!up[t]) printf(" down");
    }
    printf("\n");
  }
  for (int t = 0; t < nps; t++)
    ps_task_repl_fini(&reps[t]);
  free(reps);
  free(up);
  return rc;
}

/* One shard's comparison; 0 identical, 1 differ or failed.  @verbose:
 * print what differs. */
static int verify_shard(const psctl_args *a, ps_client *c, int s, bool verbose,
                        ps_status *st) {
  ps_shard_replicas r;
  if (ps_client_shard_replicas(c, s, &r, st) != 0) {
    if (verbose) fprintf(stderr, "psctl: verify: shard %d: %s\n", s, st->msg);
    return 1;
  }
  if (r.n == 0) {
    if (verbose)
      printf("shard %d: lost (no replica left): restore from the latest checkpoint\n", s);
    return 1;
  }
  ps_digest d[3];
  int tasks[3], nd = 0, rc = 0;
  memset(d, 0, sizeof d);
  for (int j = 0; j < r.n; j++) {
    if (r.state[j] == PS_SHARD_SYNCING) {
      if (verbose)
        printf("shard %d: %s/%d syncing (not compared)\n", s, a->job, r.task[j]);
      continue;
    }
    if (ps_client_digest(c, r.task[j], s, &d[nd], st) != 0) {
      if (verbose)
        printf("shard %d: %s/%d: no digest (%s: %s)\n", s, a->job, r.task[j],
               ps_status_code_name(st->code), st->msg);
      rc = 1;
      continue;
    }
    tasks[nd++] = r.task[j];
  }
  if (nd == 0) return 1;
  size_t differ = 0;
  /* every variable of the first replica against the others, then the
   * ones the first lacks */
  for (int j = 1; j < nd; j++) {
    size_t x = 0, y = 0;
    while (x < d[0].n || y < d[j].n) {
      int cmp = x == d[0].n   ? 1
                : y == d[j].n ? -1
                              : strcmp(d[0].vars[x].name, d[j].vars[y].name);
      if (cmp < 0) {
        if (verbose)
          printf("shard %d: variable %s missing on %s/%d (%s/%d has it)\n", s,
                 d[0].vars[x].name, a->job, tasks[j], a->job, tasks[0]);
        differ++;
        x++;
      } else if (cmp > 0) {
        if (verbose)
          printf("shard %d: variable %s missing on %s/%d (%s/%d has it)\n", s,
                 d[j].vars[y].name, a->job, tasks[0], a->job, tasks[j]);
        differ++;
        y++;
      } else {
        const ps_var_digest *p = &d[0].vars[x], *q = &d[j].vars[y];
        if (p->version != q->version || p->crc32c != q->crc32c ||
            p->initialized != q->initialized || p->bytes != q->bytes) {
          if (verbose)
            printf("shard %d: variable %s differs on %s/%d: version %lld crc32c "
                   "0x%08x %lld bytes%s, %s/%d: version %lld crc32c 0x%08x %lld "
                   "bytes%s\n",
                   s, p->name, a->job, tasks[0], (long long)p->version, p->crc32c,
                   (long long)p->bytes, p->initialized ? "" : " uninitialized", a->job,
                   tasks[j], (long long)q->version, q->crc32c, (long long)q->bytes,
                   q->initialized ? "" : " uninitialized");
          differ++;
        }
        x++;
        y++;
      }
    }
  }
  if (verbose) {
    printf("shard %d:", s);
    for (int j = 0; j < nd; j++)
      printf(" %s/%d", a->job, tasks[j]);
    if (differ == 0)
      printf(" identical (%zu variables)\n", d[0].n);
    else
      printf(" differ (%zu differences)\n", differ);
  }
  for (int j = 0; j < nd; j++)
    ps_digest_fini(&d[j]);
  return rc || differ ? 1 : 0;
}

/* A backup applies what its primary sent a moment later: a shard that
 * differs is looked at again for up to a second before it is reported. */
int psctl_verify(const psctl_args *a, ps_client *c, ps_status *st) {
  int nps = ps_client_num_ps(c), rc = 0;
  for (int s = 0; s < nps; s++) {
    int r = 1;
    for (int tries = 0; tries < 10 && r != 0; tries++) {
      if (tries) {
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
      }
      r = verify_shard(a, c, s, false, st);
    }
    if (verify_shard(a, c, s, true, st) != 0) rc = 1;
  }
  return rc;
}
