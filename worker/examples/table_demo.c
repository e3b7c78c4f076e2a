/* table-demo: an embedding table from the C client, the README's worked
 * example ("Embedding tables").  It makes a table of 8 floats per key with
 * Adagrad's accumulator and a capacity on every ps of the cluster, looks up
 * a batch of 64-bit keys (a repeated one among them), trains them one
 * Adagrad step towards zero, looks them up again, and prints what each ps
 * holds.  Only the installed public header: it builds outside the tree
 * with `cc table_demo.c $(pkg-config --cflags --libs paramserver)`.
 *
 *   table-demo CLUSTER.json */
#include <stdio.h>
#include <string.h>

#include <paramserver/paramserver.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    if ((call) != 0) {                                                                   \
      fprintf(stderr, "table-demo: %s: %s\n", ps_status_code_name(st.code), st.msg);     \
      goto out;                                                                          \
    }                                                                                    \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: table-demo CLUSTER.json\n");
    return 2;
  }
  ps_library_init();
  ps_status st;
  int rc = 1;
  ps_cluster *cl = ps_cluster_load_file(argv[1], &st);
  ps_client *c = cl ? ps_client_create(cl, "ps", NULL, &st) : NULL;
  ps_tensor *keys = NULL, *rows = NULL, *grads = NULL;
  if (c == NULL) {
    fprintf(stderr, "table-demo: %s\n", st.msg);
    goto out;
  }
  /* 1. the table, on every ps: 8 floats a key, Adagrad, 1M rows per ps */
  ps_table_spec spec;
  ps_table_spec_default(&spec, "user_emb", 8);
  spec.init.seed = 42;
  spec.optimizer = PS_TABLE_ADAGRAD;
  spec.policy.max_rows = 1000000;
  CHECK(ps_client_table_create(c, &spec, &st));

  /* 2. a batch of keys, any int64 values */
  int64_t ids[] = {7, -1, 1LL << 60, 7, 2, 123456789};
  keys = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {6}}, false);
  memcpy(ps_tensor_data(keys), ids, sizeof ids);
  ps_table_counts n;
  CHECK(ps_client_table_lookup(c, "user_emb", keys, true, 1, &rows, &n, &st));
  printf("lookup: %lld rows made, key 7 twice: %s\n", (long long)n.created,
         memcmp(ps_tensor_data(rows), (float *)ps_tensor_data(rows) + 3 * 8,
                8 * sizeof(float)) == 0
             ? "the same row"
             : "different rows");

  /* 3. one Adagrad step: the gradient of 0.5 * |row|^2 is the row itself */
  grads = ps_tensor_create(PS_DT_FLOAT, &rows->shape, false);
  memcpy(ps_tensor_data(grads), ps_tensor_data(rows), ps_tensor_nbytes(rows));
  double lr = 0.1;
  CHECK(ps_client_table_update(c, "user_emb", PS_TABLE_OP_ADAGRAD, keys, grads, &lr, 1, 1,
                               NULL, &st));
  float before = ((float *)ps_tensor_data(rows))[8];
  CHECK(ps_client_table_lookup(c, "user_emb", keys, false, 1, &rows, NULL, &st));
  printf("key -1, element 0: %.4f before the step, %.4f after\n", before,
         ((float *)ps_tensor_data(rows))[8]);

  /* 4. where the rows are: each key's ps is ps_table_key_task(key, tasks) */
  for (int t = 0; t < ps_client_num_ps(c); t++) {
    ps_table_info *info;
    size_t k;
    CHECK(ps_client_table_list(c, t, &info, &k, &st));
    for (size_t i = 0; i < k; i++)
      printf("ps/%d: table %s dim %lld (%s): %lld rows, %lld bytes\n", t, info[i].name,
             (long long)info[i].dim, info[i].optimizer, (long long)info[i].rows,
             (long long)info[i].bytes);
    ps_client_free_table_info(info, k);
  }
  rc = 0;
out:
  ps_tensor_destroy(keys);
  ps_tensor_destroy(rows);
  ps_tensor_destroy(grads);
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc;
}
