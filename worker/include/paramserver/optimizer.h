/* Optimizers whose update kernels run on the ps that owns each variable.
 *
 * minimize() differentiates the loss, creates the slots TensorFlow creates
 * (named "var/Momentum", "var/Adagrad", "var/Adam", "var/Adam_1", placed
 * with their variable; Adam's beta1_power and beta2_power with the first
 * variable by name) and returns a train op whose run sends, per ps, one
 * Update RPC with every variable's gradient (sparse gradients as rows,
 * duplicate indices summed first, as TensorFlow's Optimizer does) and
 * increments global_step. */
#ifndef PARAMSERVER_OPTIMIZER_H
#define PARAMSERVER_OPTIMIZER_H

#include "paramserver/graph.h"

typedef struct ps_optimizer ps_optimizer;

ps_optimizer *ps_gradient_descent_optimizer(double learning_rate);
ps_optimizer *ps_momentum_optimizer(double learning_rate, double momentum,
                                    bool use_nesterov);
/* initial_accumulator_value: TensorFlow's default is 0.1 */
ps_optimizer *ps_adagrad_optimizer(double learning_rate,
                                   double initial_accumulator_value);
/* TensorFlow's defaults: 0.001, 0.9, 0.999, 1e-8 */
ps_optimizer *ps_adam_optimizer(double learning_rate, double beta1, double beta2,
                                double epsilon);
void ps_optimizer_destroy(ps_optimizer *o);

/* tf.train.create_global_step: int64 scalar "global_step", zeros, not
 * trainable, in GLOBAL_VARIABLES and GLOBAL_STEP. */
ps_variable *ps_create_global_step(ps_graph *g, ps_status *st);

/* @var_list NULL: TRAINABLE_VARIABLES.  @global_step may be NULL. */
ps_node *ps_optimizer_minimize(ps_optimizer *o, ps_graph *g, ps_node *loss,
                               ps_variable *global_step,
                               ps_variable *const *var_list, size_t n,
                               ps_status *st);

#endif
