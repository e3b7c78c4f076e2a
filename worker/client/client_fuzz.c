/* The answer decoders run on outside bytes, for the fuzz target
 * tests/fuzz/fuzz_client.c. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"

/* tests/fuzz/fuzz_client.c: decodes @p (@n bytes) as the answer header of
 * @method ("Read", "List", "IsInitialized", "Initialize",
 * "ReportUninitialized", "Delete", "Update", "Status", "Save", "Merge",
 * "Restore", "RestoreList" (the answer to RestoreRequest.list),
 * "Shutdown", "StatusRepl" (Status's replication fields), "Digest",
 * "Epoch" (an Update answer's view epoch, as a replicated client scans
 * it, then the answer), "TableCreate", "TableLookup" (5 keys),
 * "TableUpdate" (5 keys), "TableList") to a typical request of this client, fills the
 * bulk ranges it names from @data as the transport would (more or fewer
 * bytes fail as there), and frees everything.  0, or a code with @st set;
 * INVALID_ARGUMENT for an unknown @method.  Not public API: without the
 * ps_ prefix, libpsworker.so does not export it. */
int fuzz_client_answer(const char *method, const uint8_t *p, size_t n,
                       const uint8_t *data, size_t ndata, ps_status *st);

/* Read: a plain read, one into a given tensor, a deduplicated gather (80
 * ids, 20 distinct) and a plain one (2 ids). */
static int fuzz_read(const uint8_t *p, size_t n, const uint8_t *data, size_t ndata,
                     ps_status *st) {
  ps_shape s2 = {.rank = 1, .dim = {2}}, s80 = {.rank = 1, .dim = {80}};
  ps_tensor *given = ps_tensor_create(PS_DT_FLOAT, &s2, true);
  ps_tensor *ix = ps_tensor_create(PS_DT_INT64, &s80, true);
  ps_tensor *ix2 = ps_tensor_create(PS_DT_INT32, &s2, true);
  ps_read reads[4] = {
      {.name = "w"}, {.name = "b", .out = given}, {.name = "emb"}, {.name = "tab"}};
  ps_task_reads t = {.task = 0, .reads = reads, .n = 4};
  read_build b;
  ps_rpc_segs sink = {0};
  ps_dedup_memo memo;
  ps_dedup_memo_init(&memo);
  int rc;
  if (given == NULL || ix == NULL || ix2 == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    memset(&b, 0, sizeof b);
    goto out;
  }
  for (int64_t i = 0; i < 80; i++)
    ((int64_t *)ps_tensor_data(ix))[i] = i % 20;
  ((int32_t *)ps_tensor_data(ix2))[0] = 3;
  ((int32_t *)ps_tensor_data(ix2))[1] = 1;
  reads[2].indices = ix;
  reads[3].indices = ix2;
  if ((rc = ps_cl_read_build_init_(&b, &t, &memo, st)) != 0) goto out;
  /* a retried call (ps_cl_run_reqs_) parses its header a second time */
  ps_rpc_segs first = {0};
  ps_status st1;
  if (ps_cl_parse_read_(&b, p, n, &first, &st1) == 0) /* part of its data came */
    ps_rpc_segs_fill(&first, 0, data, (ndata < first.total ? ndata : first.total) / 2);
  ps_rpc_segs_fini(&first);
  rc = ps_cl_parse_read_(&b, p, n, &sink, st);
  if (rc == 0 && ndata != sink.total)
    rc = ps_status_set(st, ndata > sink.total ? PS_INTERNAL : PS_DATA_LOSS,
                       "Read: %zu bytes of data for %zu announced", ndata, sink.total);
  if (rc == 0) {
    /* in pieces, as gRPC's slices come */
    size_t piece = 1 + ndata % 13;
    for (size_t off = 0; off < ndata; off += piece)
      ps_rpc_segs_fill(&sink, off, data + off, ndata - off < piece ? ndata - off : piece);
    ps_cl_read_expand_(&b);
  }
out:
  for (size_t k = 0; k < t.n; k++)
    if (reads[k].out != given) ps_tensor_destroy(reads[k].out);
  ps_cl_read_build_fini_(&b);
  ps_rpc_segs_fini(&sink);
  ps_dedup_memo_fini(&memo);
  ps_tensor_destroy(given);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(ix2);
  return rc;
}

/* TableLookup: 5 keys of table "emb"; the rows come as bulk bytes. */
static int fuzz_table_lookup(const uint8_t *p, size_t n, const uint8_t *data,
                             size_t ndata, ps_status *st) {
  table_lookup_out o = {.name = "emb", .task = 0, .n = 5};
  ps_rpc_segs sink = {0};
  (void)ps_cl_parse_table_lookup_(&o, p, n, &sink, st); /* retried: parsed twice */
  ps_rpc_segs_fini(&sink);
  ps_status_clear(st);
  int rc = ps_cl_parse_table_lookup_(&o, p, n, &sink, st);
  if (rc == 0 && ndata != sink.total)
    rc = ps_status_set(st, ndata > sink.total ? PS_INTERNAL : PS_DATA_LOSS,
                       "TableLookup: %zu bytes of data for %zu announced", ndata,
                       sink.total);
  if (rc == 0) ps_rpc_segs_fill(&sink, 0, data, ndata);
  ps_rpc_segs_fini(&sink);
  free(o.rows);
  return rc;
}

/* Each header is parsed twice into the same outputs, as a call retried
 * after UNAVAILABLE does (ps_cl_run_reqs_): nothing of the first may leak. */
#define TWICE(call)                                                                      \
  do {                                                                                   \
    (void)(call);                                                                        \
    ps_rpc_segs_fini(&sink);                                                             \
    ps_status_clear(st);                                                                 \
    rc = (call);                                                                         \
  } while (0)

int fuzz_client_answer(const char *method, const uint8_t *p, size_t n,
                       const uint8_t *data, size_t ndata, ps_status *st) {
  ps_status_clear(st);
  ps_rpc_segs sink = {0};
  int rc;
  if (!strcmp(method, "Read")) return fuzz_read(p, n, data, ndata, st);
  if (!strcmp(method, "TableLookup")) return fuzz_table_lookup(p, n, data, ndata, st);
  if (!strcmp(method, "List")) {
    list_out o = {NULL, 0, 0, PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES, "fuzz"};
    TWICE(ps_cl_parse_list_(&o, p, n, &sink, st));
    ps_client_free_var_info(o.v, o.n);
  } else if (!strcmp(method, "IsInitialized")) {
    bool out[2];
    const char *names[2] = {"w", "b"};
    bools_out o = {out, 2, names[0]};
    TWICE(ps_cl_parse_is_init_(&o, p, n, &sink, st));
  } else if (!strcmp(method, "Initialize")) {
    init_out o = {0, 2};
    TWICE(ps_cl_parse_initialize_(&o, p, n, &sink, st));
  } else if (!strcmp(method, "ReportUninitialized")) {
    names_out o = {NULL, 0, 2};
    TWICE(ps_cl_parse_report_(&o, p, n, &sink, st));
    ps_client_free_names(o.names, o.n);
  } else if (!strcmp(method, "Delete")) {
    ps_delete_result r = {0};
    delete_out o = {&r, 2};
    TWICE(ps_cl_parse_delete_(&o, p, n, &sink, st));
    ps_delete_result_free(&r);
  } else if (!strcmp(method, "Update")) {
    ps_update_result res[2];
    ps_update u[2] = {{.name = "w", .result = &res[0]}, {.name = "b", .result = &res[1]}};
    ps_task_updates t = {.task = 0, .updates = u, .n = 2};
    TWICE(ps_cl_parse_update_(&t, p, n, &sink, st));
  } else if (!strcmp(method, "Status")) {
    ps_task_status o;
    TWICE(ps_cl_parse_status_(&o, p, n, &sink, st));
  } else if (!strcmp(method, "Save") || !strcmp(method, "Merge") ||
             !strcmp(method, "Restore")) {
    save_out o = {.asked = 2};
    parse_fn parse = method[1] == 'a'   ? ps_cl_parse_save_
                     : method[0] == 'M' ? ps_cl_parse_merge_
                                        : ps_cl_parse_restore_;
    TWICE(parse(&o, p, n, &sink, st));
    free(o.prefix);
    ps_ckpt_list_fini(&o.listed);
  } else if (!strcmp(method, "RestoreList")) {
    ckpt_vars o = {0};
    TWICE(ps_cl_parse_restore_list_(&o, p, n, &sink, st));
    ps_cl_ckpt_vars_fini_(&o);
  } else if (!strcmp(method, "StatusRepl")) {
    ps_task_repl r = {0};
    repl_out o = {&r, 3};
    TWICE(ps_cl_parse_status_repl_(&o, p, n, &sink, st));
    ps_task_repl_fini(&r);
  } else if (!strcmp(method, "Digest")) {
    ps_digest d = {0};
    digest_out o = {&d, 1};
    TWICE(ps_cl_parse_digest_(&o, p, n, &sink, st));
    ps_digest_fini(&d);
  } else if (!strcmp(method, "Epoch")) {
    bool has;
    uint64_t epoch;
    ps_cl_answer_scan_(p, n, &has, &epoch);
    if (has && (int64_t)epoch < 0)
      return ps_status_set(st, PS_INTERNAL, "negative epoch");
    ps_update_result res[2];
    ps_update u[2] = {{.name = "w", .result = &res[0]}, {.name = "b", .result = &res[1]}};
    ps_task_updates t = {.task = 0, .updates = u, .n = 2};
    TWICE(ps_cl_parse_update_(&t, p, n, &sink, st));
  } else if (!strcmp(method, "TableCreate")) {
    bool created;
    TWICE(ps_cl_parse_table_create_(&created, p, n, &sink, st));
  } else if (!strcmp(method, "TableUpdate")) {
    table_update_out o = {.name = "emb", .n = 5};
    TWICE(ps_cl_parse_table_update_(&o, p, n, &sink, st));
  } else if (!strcmp(method, "TableList")) {
    table_list_out o = {0};
    TWICE(ps_cl_parse_table_list_(&o, p, n, &sink, st));
    ps_client_free_table_info(o.v, o.n);
  } else if (!strcmp(method, "Shutdown")) {
    TWICE(ps_cl_parse_shutdown_(NULL, p, n, &sink, st));
  } else {
    return ps_status_set(st, PS_INVALID_ARGUMENT, "no decoder for %s", method);
  }
  /* a unary answer names no bulk bytes; any that come are an error */
  if (rc == 0 && (sink.total != 0 || ndata != 0))
    rc = ps_status_set(st, PS_INTERNAL, "%s: more data than announced (%zu bytes)",
                       method, sink.total);
  ps_rpc_segs_fini(&sink);
  return rc;
}
#undef TWICE
