/* train-linreg: a complete example of the graph API.  Linear regression
 * y = x·w + b on synthetic data, variables spread over the ps tasks of a
 * cluster by replica_device_setter, trained with gradient descent whose
 * update kernels run on the ps.  Prints the loss as it falls and the
 * learned weights next to the true ones.
 *
 *   train-linreg CLUSTER_FILE [STEPS] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/session.h"

#define NFEAT 4
#define BATCH 64

static const float true_w[NFEAT] = {2.0f, -3.0f, 0.5f, 1.5f};
static const float true_b = 0.7f;

static void make_batch(unsigned *seed, ps_tensor *x, ps_tensor *y) {
  float *xp = ps_tensor_data(x), *yp = ps_tensor_data(y);
  for (int i = 0; i < BATCH; i++) {
    float acc = true_b;
    for (int j = 0; j < NFEAT; j++) {
      float v = (float)rand_r(seed) / (float)RAND_MAX * 2.f - 1.f;
      xp[i * NFEAT + j] = v;
      acc += v * true_w[j];
    }
    yp[i] = acc;
  }
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help")) {
    printf("usage: train-linreg CLUSTER_FILE [STEPS]\n\nTrains linear regression on "
           "synthetic data with its variables on the cluster's ps tasks.\n");
    return argc < 2 ? 2 : 0;
  }
  int steps = argc > 2 ? atoi(argv[2]) : 300;
  ps_status st;
  ps_cluster *cluster = ps_cluster_load_file(argv[1], &st);
  if (cluster == NULL) {
    fprintf(stderr, "train-linreg: %s\n", st.msg);
    return 2;
  }
  ps_library_init();
  ps_client *client = ps_client_create(cluster, "ps", NULL, &st);
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(cluster, NULL));
  ps_variable *step = ps_create_global_step(g, &st);
  ps_shape xs = {2, {-1, NFEAT}}, ys = {2, {-1, 1}};
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &xs, "x");
  ps_node *y = ps_placeholder(g, PS_DT_FLOAT, &ys, "y");
  ps_shape ws = {2, {NFEAT, 1}}, bs = {1, {1}};
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_variable_scope_push(g, "linear", PS_REUSE_NONE, &st); /* checked below */
  ps_variable *w = ps_get_variable(g, "weights", PS_DT_FLOAT, &ws, &zeros, NULL, &st);
  ps_variable *b = ps_get_variable(g, "bias", PS_DT_FLOAT, &bs, &zeros, NULL, &st);
  ps_variable_scope_pop(g);
  ps_node *pred =
      ps_bias_add(ps_matmul(x, ps_variable_value(w), false, false), ps_variable_value(b));
  ps_node *loss = ps_mean_squared_error(y, pred);
  ps_optimizer *opt = ps_gradient_descent_optimizer(0.1);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, step, NULL, 0, &st);
  ps_node *init = ps_global_variables_initializer(g);
  int rc = 1;
  ps_session *sess = NULL;
  ps_tensor *bx = NULL, *by = NULL;
  if (train == NULL || ps_graph_status(g)->code != PS_OK) {
    fprintf(stderr, "train-linreg: building the graph: %s\n",
            st.code ? st.msg : ps_graph_status(g)->msg);
    goto out;
  }
  printf("weights on %s, bias on %s, global_step on %s\n", ps_variable_device(w),
         ps_variable_device(b), ps_variable_device(step));
  sess = ps_session_create(g, client, &st);
  if (sess == NULL || ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st) != 0) {
    fprintf(stderr, "train-linreg: %s\n", st.msg);
    goto out;
  }
  bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {BATCH, NFEAT}}, false);
  by = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {BATCH, 1}}, false);
  unsigned seed = 1;
  double last = 0;
  for (int i = 1; i <= steps; i++) {
    make_batch(&seed, bx, by);
    ps_feed feeds[2] = {{x, bx}, {y, by}};
    ps_tensor *out = NULL;
    if (ps_session_run(sess, feeds, 2, &loss, 1, &train, 1, &out, &st) != 0) {
      fprintf(stderr, "train-linreg: step %d: %s\n", i, st.msg);
      goto out;
    }
    last = *(float *)ps_tensor_data(out);
    ps_tensor_destroy(out);
    if (i == 1 || i % 50 == 0) printf("step %d loss %.6f\n", i, last);
  }
  ps_node *fetch[3] = {ps_variable_value(w), ps_variable_value(b),
                       ps_variable_value(step)};
  ps_tensor *vals[3];
  if (ps_session_run(sess, NULL, 0, fetch, 3, NULL, 0, vals, &st) != 0) {
    fprintf(stderr, "train-linreg: %s\n", st.msg);
    goto out;
  }
  printf("global_step %lld\n", (long long)*(int64_t *)ps_tensor_data(vals[2]));
  double err = fabs(((float *)ps_tensor_data(vals[1]))[0] - true_b);
  for (int j = 0; j < NFEAT; j++) {
    float wj = ((float *)ps_tensor_data(vals[0]))[j];
    printf("w[%d] = %.4f (true %.4f)\n", j, wj, true_w[j]);
    err = fmax(err, fabs(wj - true_w[j]));
  }
  printf("b = %.4f (true %.4f)\nmax error %.5f, final loss %.6f\n",
         ((float *)ps_tensor_data(vals[1]))[0], true_b, err, last);
  for (int k = 0; k < 3; k++)
    ps_tensor_destroy(vals[k]);
  rc = err < 0.01 ? 0 : 1;
out:
  ps_tensor_destroy(bx);
  ps_tensor_destroy(by);
  ps_session_destroy(sess);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
  ps_client_destroy(client);
  ps_cluster_destroy(cluster);
  ps_library_shutdown();
  return rc;
}
