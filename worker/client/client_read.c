/* Reads: ps_client_read_many() and ps_client_read(), with gathers of
 * repeated ids sent once per distinct id and expanded on arrival. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"
#include "common/wire.h"

void ps_cl_read_expand_(read_build *b) {
  for (size_t k = 0; k < b->t->n; k++)
    if (b->dd[k].uix && b->rows[k])
      ps_gather_dedup_expand(&b->dd[k], b->rows[k], b->row_bytes[k],
                             ps_tensor_data(b->t->reads[k].out));
}

int ps_cl_parse_read_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  read_build *b = user;
  /* A retried call parses a header again: what the last one gave goes. */
  for (size_t k = 0; k < b->t->n; k++) {
    free(b->rows[k]);
    b->rows[k] = NULL;
    b->row_bytes[k] = 0;
    if (b->allocated[k]) {
      ps_tensor_destroy(b->t->reads[k].out);
      b->t->reads[k].out = NULL;
      b->allocated[k] = false;
    }
  }
  /* counted on the wire: a flood of empty entries is never unpacked */
  size_t nt = ps_wire_count_field(p, n, 1);
  if (nt != b->t->n)
    return ps_cl_bad_answer_(st, M_READ, "%zu tensors for %zu variables (%s%s)", nt,
                             b->t->n, b->t->n ? b->t->reads[0].name : "",
                             b->t->n > 1 ? ", ..." : "");
  if (ps_cl_wire_ok_(&paramserver__read_response__descriptor, M_READ, p, n, st))
    return st->code;
  Paramserver__ReadResponse *r = paramserver__read_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_READ, "the answer does not parse");
  int rc = 0;
  if (r->n_tensors != b->t->n)
    rc = ps_cl_bad_answer_(st, M_READ, "%zu tensors for %zu variables", r->n_tensors,
                           b->t->n);
  for (size_t i = 0; i < r->n_tensors && rc == 0; i++) {
    Paramserver__TensorMeta *m = r->tensors[i];
    ps_read *rd = &b->t->reads[i];
    if (strcmp(m->name, rd->name) != 0) {
      rc = ps_cl_bad_answer_(st, M_READ, "tensor %zu is %s, the variable asked for is %s",
                             i, m->name, rd->name);
      break;
    }
    ps_shape shape;
    size_t need;
    if ((rc = ps_cl_answer_shape_(b->t->task, M_READ, rd->name, m->dtype, m->shape,
                                  m->n_shape, &shape, &need, st)) != 0)
      break;
    const ps_gather_dedup *dd = &b->dd[i];
    if (rd->indices && dd->uix == NULL &&
        (shape.rank < 1 || shape.dim[0] != rd->indices->shape.dim[0])) {
      rc = ps_cl_bad_answer_(st, M_READ, "variable %s: %lld rows for %lld ids", rd->name,
                             (long long)(shape.rank ? shape.dim[0] : 0),
                             (long long)rd->indices->shape.dim[0]);
      break;
    }
    if (dd->uix) { /* nu distinct rows come; the caller gets all n */
      if (shape.rank < 1 || shape.dim[0] != dd->nu || dd->nu <= 0) {
        rc = ps_cl_bad_answer_(st, M_READ, "variable %s: %lld rows for %lld ids",
                               rd->name, (long long)(shape.rank ? shape.dim[0] : 0),
                               (long long)dd->nu);
        break;
      }
      b->row_bytes[i] = need / (size_t)dd->nu;
      size_t all;
      if (ps_size_mul(b->row_bytes[i], (size_t)dd->n, &all) != 0 ||
          all > ps_cl_tensor_limit_()) {
        rc = ps_status_set(
            st, PS_RESOURCE_EXHAUSTED,
            "ps/%d: Read: variable %s: %lld rows of %zu bytes are more than "
            "this machine's memory",
            b->t->task, rd->name, (long long)dd->n, b->row_bytes[i]);
        break;
      }
      b->rows[i] = malloc(need ? need : 1);
      if (b->rows[i] == NULL || ps_rpc_segs_add(sink, b->rows[i], need, NULL) != 0) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "read %s: cannot allocate %zu bytes", rd->name, need);
        break;
      }
      shape.dim[0] = dd->n;
      need = all;
    }
    if (rd->out &&
        (rd->out->dtype != (ps_dtype)m->dtype || ps_tensor_nbytes(rd->out) != need)) {
      char a[128], bb[128];
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "read %s: destination is %s %s, the variable is %s %s", rd->name,
                         ps_dtype_name(rd->out->dtype),
                         ps_shape_format(&rd->out->shape, a, sizeof a),
                         ps_dtype_name(m->dtype), ps_shape_format(&shape, bb, sizeof bb));
      break;
    }
    if (rd->out == NULL) {
      rd->out = ps_tensor_create((ps_dtype)m->dtype, &shape, false);
      if (rd->out == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "read %s: cannot allocate %zu bytes", rd->name, need);
        break;
      }
      b->allocated[i] = true;
    }
    rd->out->shape = shape;
    if (dd->uix == NULL &&
        ps_rpc_segs_add(sink, ps_tensor_data(rd->out), need, NULL) != 0)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  paramserver__read_response__free_unpacked(r, NULL);
  return rc;
}

int ps_cl_read_build_init_(read_build *b, ps_task_reads *t, ps_dedup_memo *dedup,
                           ps_status *st) {
  memset(b, 0, sizeof *b);
  paramserver__read_request__init(&b->req);
  b->t = t;
  b->items = calloc(t->n + 1, sizeof *b->items);
  b->ip = calloc(t->n + 1, sizeof *b->ip);
  b->allocated = calloc(t->n + 1, sizeof *b->allocated);
  b->dd = calloc(t->n + 1, sizeof *b->dd);
  b->rows = calloc(t->n + 1, sizeof *b->rows);
  b->row_bytes = calloc(t->n + 1, sizeof *b->row_bytes);
  if (!b->items || !b->ip || !b->allocated || !b->dd || !b->rows || !b->row_bytes)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < t->n; i++) {
    Paramserver__ReadItem *it = &b->items[i];
    paramserver__read_item__init(it);
    it->name = (char *)t->reads[i].name;
    const ps_tensor *ix = t->reads[i].indices;
    if (ix) {
      if (ix->shape.rank != 1 || (ix->dtype != PS_DT_INT32 && ix->dtype != PS_DT_INT64))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "gather from %s: indices must be a 1-D int32 or "
                             "int64 tensor",
                             t->reads[i].name);
      it->gather = true;
      it->index_dtype = ix->dtype;
      it->num_indices = ix->shape.dim[0];
      int r = dedup ? ps_gather_dedup_init_memo(dedup, &b->dd[i], ix) : 0;
      if (r < 0) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      if (r > 0) {
        ix = b->dd[i].uix;
        it->num_indices = b->dd[i].nu;
      }
      ps_rpc_segs_add(&b->segs, ps_tensor_data(ix), ps_tensor_nbytes(ix), ix->buf);
    }
    b->ip[i] = it;
  }
  b->req.items = b->ip;
  b->req.n_items = t->n;
  return 0;
}

void ps_cl_read_build_fini_(read_build *b) {
  for (size_t k = 0; b->t && k < b->t->n; k++) {
    if (b->dd) ps_gather_dedup_fini(&b->dd[k]);
    if (b->rows) free(b->rows[k]);
  }
  free(b->allocated);
  free(b->items);
  free(b->ip);
  free(b->dd);
  free(b->rows);
  free(b->row_bytes);
  ps_rpc_segs_fini(&b->segs);
}

/* Gathers with repeated ids go deduplicated (@dedup): each distinct row
 * comes once and is copied to every position that asked for it.
 * *@refused_dedup: a deduplicated request was refused INVALID_ARGUMENT. */
static int read_many(ps_client *c, ps_task_reads *t, size_t n, bool dedup,
                     bool *refused_dedup, ps_status *st) {
  read_build *bs = calloc(n + 1, sizeof *bs);
  ps_rpc_req *reqs = calloc(n + 1, sizeof *reqs);
  int *tasks = calloc(n + 1, sizeof *tasks);
  int rc = 0;
  if (!bs || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ps_status_clear(&t[i].st);
    if ((rc = ps_cl_check_task_(c, t[i].task, st)) != 0) goto out;
    if ((rc = ps_cl_read_build_init_(&bs[i], &t[i], dedup ? &c->memo : NULL, st)) != 0)
      goto out;
    ps_cl_req_init_(c, &reqs[i], t[i].task, M_READ, &bs[i].req.base, false, true);
    reqs[i].send = &bs[i].segs;
    ps_cl_answer_init_(c, t[i].task, &reqs[i], &bs[i].ans, ps_cl_parse_read_, &bs[i],
                       t[i].n ? t[i].reads[0].name : NULL);
    tasks[i] = t[i].task;
  }
  ps_cl_run_reqs_(c, reqs, tasks, n, true);
  for (size_t i = 0; i < n; i++) {
    t[i].st = reqs[i].st;
    if (reqs[i].st.code == PS_OK) ps_cl_read_expand_(&bs[i]);
    if (reqs[i].st.code != PS_OK)
      for (size_t k = 0; k < t[i].n; k++)
        if (bs[i].allocated[k]) {
          ps_tensor_destroy(t[i].reads[k].out);
          t[i].reads[k].out = NULL;
        }
    if (reqs[i].st.code == PS_INVALID_ARGUMENT)
      for (size_t k = 0; k < t[i].n; k++)
        *refused_dedup |= bs[i].dd[k].uix != NULL;
    if (rc == 0 && reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      if (st) *st = reqs[i].st;
    }
  }
out:
  if (bs)
    for (size_t i = 0; i < n; i++)
      ps_cl_read_build_fini_(&bs[i]);
  free(bs);
  free(reqs);
  free(tasks);
  return rc;
}

int ps_client_read_many(ps_client *c, ps_task_reads *t, size_t n, ps_status *st) {
  bool refused = false;
  int rc = read_many(c, t, n, true, &refused, st);
  /* An id out of range is named by its position: ask again as the caller
   * asked, so that the error is TensorFlow's "indices[i] = ..." for the
   * caller's i.  A read changes nothing, so asking again is safe. */
  if (rc == PS_INVALID_ARGUMENT && refused) rc = read_many(c, t, n, false, &refused, st);
  return rc;
}

int ps_client_read(ps_client *c, int task, ps_read *r, size_t n, ps_status *st) {
  ps_task_reads t = {.task = task, .reads = r, .n = n};
  return ps_client_read_many(c, &t, 1, st);
}
