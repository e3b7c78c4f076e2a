/* bench_train: steps/s of a 784-256-10 MLP (batch 128, gradient descent)
 * with its variables on 2 real ps processes, against the same graph with
 * its variables held in-process by the session (no RPC), measured in the
 * same run.  The two alternate in blocks so machine noise hits both; the
 * median block rate of each is reported.  Both run the same kernels, so
 * the ratio is what the parameter server costs per step (two Read and two
 * Update RPCs carrying ~0.8 MB each way). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/session.h"

enum { BATCH = 128, IN = 784, HID = 256, OUT = 10 };

typedef struct model {
  ps_graph *g;
  ps_session *s;
  ps_optimizer *opt;
  ps_node *x, *labels, *loss, *train;
} model;

static int build(model *m, ps_client *client, const ps_cluster *cluster) {
  ps_status st;
  memset(m, 0, sizeof *m);
  m->g = ps_graph_create();
  if (cluster) ps_device_push_fn(m->g, ps_replica_device_setter(cluster, NULL));
  m->x = ps_placeholder(m->g, PS_DT_FLOAT, &(ps_shape){2, {-1, IN}}, "x");
  m->labels = ps_placeholder(m->g, PS_DT_INT64, &(ps_shape){1, {-1}}, "labels");
  ps_variable *w1 = ps_get_variable(m->g, "w1", PS_DT_FLOAT, &(ps_shape){2, {IN, HID}},
                                    NULL, NULL, &st);
  ps_variable *b1 =
      ps_get_variable(m->g, "b1", PS_DT_FLOAT, &(ps_shape){1, {HID}}, NULL, NULL, &st);
  ps_variable *w2 = ps_get_variable(m->g, "w2", PS_DT_FLOAT, &(ps_shape){2, {HID, OUT}},
                                    NULL, NULL, &st);
  ps_variable *b2 =
      ps_get_variable(m->g, "b2", PS_DT_FLOAT, &(ps_shape){1, {OUT}}, NULL, NULL, &st);
  if (!w1 || !b1 || !w2 || !b2) return -1;
  ps_node *h = ps_relu(ps_bias_add(ps_matmul(m->x, ps_variable_value(w1), false, false),
                                   ps_variable_value(b1)));
  ps_node *logits = ps_bias_add(ps_matmul(h, ps_variable_value(w2), false, false),
                                ps_variable_value(b2));
  m->loss = ps_reduce_mean(ps_sparse_softmax_cross_entropy_with_logits(m->labels, logits),
                           PS_ALL_AXES, false);
  m->opt = ps_gradient_descent_optimizer(0.05);
  m->train = ps_optimizer_minimize(m->opt, m->g, m->loss, NULL, NULL, 0, &st);
  if (m->train == NULL) {
    fprintf(stderr, "bench_train: %s\n", st.msg);
    return -1;
  }
  ps_node *init = ps_global_variables_initializer(m->g);
  m->s = ps_session_create(m->g, client, &st);
  if (m->s == NULL || ps_session_run(m->s, NULL, 0, NULL, 0, &init, 1, NULL, &st) != 0) {
    fprintf(stderr, "bench_train: %s\n", st.msg);
    return -1;
  }
  return 0;
}

static void destroy(model *m) {
  ps_session_destroy(m->s);
  ps_optimizer_destroy(m->opt);
  ps_graph_destroy(m->g);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* steps/s over @n steps, or -1 on error */
static double run_steps(model *m, ps_tensor *bx, ps_tensor *bl, int n) {
  ps_feed f[2] = {{m->x, bx}, {m->labels, bl}};
  ps_status st;
  double t0 = now();
  for (int i = 0; i < n; i++)
    if (ps_session_run(m->s, f, 2, NULL, 0, &m->train, 1, NULL, &st) != 0) {
      fprintf(stderr, "bench_train: step: %s\n", st.msg);
      return -1;
    }
  return n / (now() - t0);
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int blocks = argc > 1 ? atoi(argv[1]) : 5, steps = 20;
  ps_harness h;
  if (harness_start(&h, 2, NULL) != 0) return 1;
  ps_rpc_global_init();
  ps_status st;
  ps_client *c = ps_client_create(h.cluster, "ps", NULL, &st);
  model remote, local;
  int rc = 1;
  ps_tensor *bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {BATCH, IN}}, false);
  ps_tensor *bl = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {BATCH}}, false);
  unsigned seed = 1;
  for (int i = 0; i < BATCH * IN; i++)
    ((float *)ps_tensor_data(bx))[i] = (float)rand_r(&seed) / (float)RAND_MAX;
  for (int i = 0; i < BATCH; i++)
    ((int64_t *)ps_tensor_data(bl))[i] = rand_r(&seed) % OUT;
  double *rr = calloc((size_t)blocks, sizeof *rr),
         *lr = calloc((size_t)blocks, sizeof *lr);
  if (c == NULL || build(&remote, c, h.cluster) != 0 || build(&local, NULL, NULL) != 0)
    goto out;
  if (run_steps(&remote, bx, bl, 5) < 0 || run_steps(&local, bx, bl, 5) < 0) goto out;
  for (int b = 0; b < blocks; b++) {
    if ((rr[b] = run_steps(&remote, bx, bl, steps)) < 0) goto out;
    if ((lr[b] = run_steps(&local, bx, bl, steps)) < 0) goto out;
    fprintf(stderr, "block %d: 2 ps %.1f steps/s, in-process %.1f steps/s\n", b, rr[b],
            lr[b]);
  }
  qsort(rr, (size_t)blocks, sizeof *rr, cmp);
  qsort(lr, (size_t)blocks, sizeof *lr, cmp);
  double r = rr[blocks / 2], l = lr[blocks / 2];
  printf("bench: mlp_784_256_10_steps 2ps=%.1f steps/s baseline=%.1f ratio=%.2f "
         "target=>= 0.7\n",
         r, l, r / l);
  rc = 0;
out:
  destroy(&remote);
  destroy(&local);
  free(rr);
  free(lr);
  ps_tensor_destroy(bx);
  ps_tensor_destroy(bl);
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  if (harness_stop(&h) != 0) rc = 1;
  return rc;
}
