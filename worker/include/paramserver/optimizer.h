/* Optimizers whose update kernels run on the ps that owns each variable.
 *
 * minimize() differentiates the loss, creates the slots TensorFlow creates
 * (named "var/Momentum", "var/Adagrad", "var/Adam", "var/Adam_1", placed
 * with their variable; Adam's beta1_power and beta2_power with the first
 * variable by name) and returns a train op whose run sends, per ps, one
 * Update RPC with every variable's gradient (sparse gradients as rows,
 * duplicate indices summed first, as TensorFlow's Optimizer does) and
 * increments global_step (see ps_sync_replicas_optimizer for synchronous
 * training). */
#ifndef PARAMSERVER_OPTIMIZER_H
#define PARAMSERVER_OPTIMIZER_H

#include "paramserver/api.h"
#include "paramserver/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_optimizer ps_optimizer;

PS_API ps_optimizer *ps_gradient_descent_optimizer(double learning_rate);
PS_API ps_optimizer *ps_momentum_optimizer(double learning_rate, double momentum,
                                           bool use_nesterov);
/* initial_accumulator_value: TensorFlow's default is 0.1 */
PS_API ps_optimizer *ps_adagrad_optimizer(double learning_rate,
                                          double initial_accumulator_value);
/* TensorFlow's defaults: 0.001, 0.9, 0.999, 1e-8 */
PS_API ps_optimizer *ps_adam_optimizer(double learning_rate, double beta1, double beta2,
                                       double epsilon);
/* tf.train.SyncReplicasOptimizer: synchronous training.  Takes ownership
 * of @inner (also on failure).  minimize() then builds the inner
 * optimizer's apply nodes with the aggregation moved to the ps: each
 * variable's ps averages @replicas_to_aggregate gradients per step (dense:
 * the mean; sparse: each row divided by the number of gradients that had
 * its index, as SparseConditionalAccumulator), applies the average once
 * with the inner optimizer's kernel and slots, and drops gradients
 * computed from an older global_step (stale: a slow or backup worker's).
 * The local step of a run is global_step as the same run read it (no extra
 * RPC), global_step advances once per step, and a run's updates return
 * only when the step they joined has been applied on every ps, so workers
 * move from step to step together.  Run the train op from
 * @total_num_replicas workers at once (0: the same as
 * replicas_to_aggregate; more than replicas_to_aggregate: backup workers).
 * minimize() fails with INVALID_ARGUMENT, naming the problem, when
 * global_step is missing or not an integer scalar, replicas_to_aggregate
 * < 1, or replicas_to_aggregate > total_num_replicas (a step could never
 * fill, since a worker waits for its step).  Asynchronous updates of the
 * same variables (another train op) still apply at once. */
PS_API ps_optimizer *ps_sync_replicas_optimizer(ps_optimizer *inner,
                                                int replicas_to_aggregate,
                                                int total_num_replicas);
PS_API void ps_optimizer_destroy(ps_optimizer *o); /* NULL: no-op; frees a wrapped one */

/* The dtype in which the train op sends each float32 variable's gradient
 * to its ps: PS_DT_FLOAT (the default: as computed) or PS_DT_BFLOAT16 (half
 * the bytes: each element rounded to nearest even once, after duplicate
 * sparse indices are summed in float32 where the optimizer sums them; the
 * ps widens it back and applies the update in float32).  Applies to the
 * apply nodes of the minimize() calls that follow; variables of other
 * dtypes, reads, assigns, global_step and Adam's beta powers always go as
 * they are.  Only what goes to a ps changes: variables the session holds
 * itself (placed on this worker, or a session without a client) are
 * updated in float32, the setting ignored, since nothing crosses a
 * network.  On a ps_sync_replicas_optimizer it is forwarded to
 * the wrapped optimizer (setting either one is the same), and the ps then
 * averages the widened gradients in float32.  Returns 0, or
 * INVALID_ARGUMENT "set_gradient_dtype: gradients go to the ps as float or
 * bfloat16, not DTYPE" (DTYPE as ps_dtype_name names it), or
 * INVALID_ARGUMENT "set_gradient_dtype: no optimizer" for NULL; the
 * optimizer is left as it was then.  Call from the thread that owns @o. */
PS_API int ps_optimizer_set_gradient_dtype(ps_optimizer *o, ps_dtype dtype,
                                           ps_status *st);

/* tf.train.create_global_step: int64 scalar "global_step", zeros, not
 * trainable, in GLOBAL_VARIABLES and GLOBAL_STEP. */
PS_API ps_variable *ps_create_global_step(ps_graph *g, ps_status *st);

/* @var_list NULL: TRAINABLE_VARIABLES.  @global_step may be NULL. */
PS_API ps_node *ps_optimizer_minimize(ps_optimizer *o, ps_graph *g, ps_node *loss,
                                      ps_variable *global_step,
                                      ps_variable *const *var_list, size_t n,
                                      ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
