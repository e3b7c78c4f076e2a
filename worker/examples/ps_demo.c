/* ps-demo: a client that uses every remote variable operation on a running
 * cluster and prints what it did.  It is the main job until the training
 * demo exists, and a compact example of the libpsworker client API: it
 * includes only the installed public header, so it also builds outside the
 * tree with `cc ps_demo.c $(pkg-config --cflags --libs paramserver)`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <paramserver/paramserver.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    if ((call) != 0) {                                                                   \
      fprintf(stderr, "ps-demo: %s: %s\n", ps_status_code_name(st.code), st.msg);        \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

static void show(const char *what, const ps_tensor *t) {
  char sh[64];
  printf("  %-28s %s %s:", what, ps_dtype_name(t->dtype),
         ps_shape_format(&t->shape, sh, sizeof sh));
  int64_t n = ps_tensor_num_elements(t);
  for (int64_t i = 0; i < n && i < 12; i++)
    printf(" %.4g", ps_elem_get(t->dtype, ps_tensor_data(t), i));
  printf("%s\n", n > 12 ? " ..." : "");
}

/* 1. Create: kernel and step on ps/0, bias and embedding on ps/@t1.
 * 2. Initialize on the ps (only what is not initialized yet). */
static int create_and_initialize(ps_client *c, int t1, ps_status *st) {
  ps_init_spec glorot, zeros, normal;
  ps_init_spec_default(&glorot, PS_INIT_GLOROT_UNIFORM);
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_init_spec_default(&normal, PS_INIT_RANDOM_NORMAL);
  normal.stddev = 0.1;
  normal.seed = 7;
  ps_var_spec on0[2] = {
      {.name = "dense/kernel",
       .dtype = PS_DT_FLOAT,
       .shape = {2, {4, 3}},
       .init = &glorot},
      {.name = "global_step", .dtype = PS_DT_INT64, .shape = {0, {0}}, .init = &zeros}};
  ps_var_spec on1[2] = {
      {.name = "dense/bias", .dtype = PS_DT_FLOAT, .shape = {1, {3}}, .init = &zeros},
      {.name = "embedding", .dtype = PS_DT_FLOAT, .shape = {2, {6, 2}}, .init = &normal}};
  if (ps_client_create_vars(c, 0, on0, 2, st) || ps_client_create_vars(c, t1, on1, 2, st))
    return -1;
  printf("created dense/kernel, global_step on ps/0; dense/bias, embedding on ps/%d\n",
         t1);
  size_t n0 = 0, n1 = 0;
  if (ps_client_initialize(c, 0, NULL, 0, true, &n0, st) ||
      ps_client_initialize(c, t1, NULL, 0, true, &n1, st))
    return -1;
  printf("initialized %zu variable(s) on ps/0 and %zu on ps/%d\n", n0, n1, t1);
  return 0;
}

/* 4. Update: bias -= 0.5 (assign_sub), rows 1 and 4 of the embedding += 1
 *    (scatter_add), global_step += 1 (assign_add): one RPC per ps. */
static int update(ps_client *c, int t1, const ps_tensor *idx, ps_status *st) {
  ps_shape s3 = {1, {3}}, s22 = {2, {2, 2}}, s0 = {0, {0}};
  ps_tensor *delta = ps_tensor_create(PS_DT_FLOAT, &s3, false);
  ps_tensor *rows = ps_tensor_create(PS_DT_FLOAT, &s22, false);
  ps_tensor *one = ps_tensor_create(PS_DT_INT64, &s0, false);
  int rc = -1;
  if (delta && rows && one) {
    for (int i = 0; i < 3; i++)
      ((float *)ps_tensor_data(delta))[i] = 0.5f;
    for (int i = 0; i < 4; i++)
      ((float *)ps_tensor_data(rows))[i] = 1.0f;
    *(int64_t *)ps_tensor_data(one) = 1;
    ps_update u0[1] = {{.name = "global_step", .op = PS_ASSIGN_ADD, .value = one}};
    ps_update u1[2] = {
        {.name = "dense/bias", .op = PS_ASSIGN_SUB, .value = delta},
        {.name = "embedding", .op = PS_SCATTER_ADD, .value = rows, .indices = idx}};
    ps_task_updates ups[2] = {{.task = 0, .updates = u0, .n = 1},
                              {.task = t1, .updates = u1, .n = 2}};
    rc = ps_client_update_many(c, ups, 2, st);
    if (rc == 0)
      printf("updated: global_step += 1; dense/bias -= 0.5; embedding[1,4] += 1\n");
  } else {
    st->code = PS_RESOURCE_EXHAUSTED;
    snprintf(st->msg, sizeof st->msg, "out of memory");
  }
  ps_tensor_destroy(delta);
  ps_tensor_destroy(rows);
  ps_tensor_destroy(one);
  return rc;
}

/* 6. What each ps holds. */
static int show_status(ps_client *c, ps_status *st) {
  for (int t = 0; t < ps_client_num_ps(c); t++) {
    ps_task_status ts;
    if (ps_client_status(c, t, &ts, st)) return -1;
    printf("ps/%d at %s: %lld variables, %lld bytes, %lld RPCs served\n", t, ts.address,
           (long long)ts.num_vars, (long long)ts.bytes, (long long)ts.rpcs);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2 || !strcmp(argv[1], "--help")) {
    printf("usage: ps-demo CLUSTER_FILE\n\nCreates, initializes, updates and reads "
           "variables on every ps task of the cluster and prints what it did.\n");
    return argc == 2 ? 0 : 2;
  }
  ps_status st;
  ps_cluster *cluster = ps_cluster_load_file(argv[1], &st);
  if (cluster == NULL) {
    fprintf(stderr, "ps-demo: %s\n", st.msg);
    return 2;
  }
  ps_library_init();
  ps_client *c = ps_client_create(cluster, "ps", NULL, &st);
  ps_read r0[2] = {{.name = "dense/kernel"}, {.name = "global_step"}};
  ps_read r1[2] = {{.name = "dense/bias"}, {.name = "embedding"}};
  ps_shape s2 = {1, {2}};
  ps_tensor *idx = ps_tensor_create(PS_DT_INT64, &s2, false);
  int rc = 1;
  if (c == NULL || idx == NULL) goto fail;
  ((int64_t *)ps_tensor_data(idx))[0] = 1;
  ((int64_t *)ps_tensor_data(idx))[1] = 4;
  int nps = ps_client_num_ps(c);
  int t1 = nps > 1 ? 1 : 0;
  printf("cluster: %d ps task(s)\n", nps);
  CHECK(create_and_initialize(c, t1, &st));

  /* 3. Read everything: one RPC per ps, both ps at once. */
  ps_task_reads reads[2] = {{.task = 0, .reads = r0, .n = 2},
                            {.task = t1, .reads = r1, .n = 2}};
  CHECK(ps_client_read_many(c, reads, 2, &st));
  printf("read (one RPC per ps, in parallel):\n");
  show("dense/kernel", r0[0].out);
  show("global_step", r0[1].out);
  show("dense/bias", r1[0].out);
  show("embedding", r1[1].out);

  CHECK(update(c, t1, idx, &st));

  /* 5. Read again, into the same tensors, and gather two embedding rows. */
  CHECK(ps_client_read_many(c, reads, 2, &st));
  ps_read g = {.name = "embedding", .indices = idx};
  CHECK(ps_client_read(c, t1, &g, 1, &st));
  printf("read after the updates:\n");
  show("global_step", r0[1].out);
  show("dense/bias", r1[0].out);
  show("embedding", r1[1].out);
  show("gather(embedding, [1,4])", g.out);
  ps_tensor_destroy(g.out);

  CHECK(show_status(c, &st));
  rc = 0;
fail:
  for (int i = 0; i < 2; i++) {
    ps_tensor_destroy(r0[i].out);
    ps_tensor_destroy(r1[i].out);
  }
  ps_tensor_destroy(idx);
  ps_client_destroy(c);
  ps_cluster_destroy(cluster);
  ps_library_shutdown();
  return rc;
}
