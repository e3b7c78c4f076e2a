/* ps-worker's stop request: SIGINT or SIGTERM sets it, and every loop of
 * the worker (training, the evaluator's, the chief's end-of-job wait)
 * looks at it. */
#include "ps_worker_internal.h"

atomic_int ps_worker_stop_requested_; /* the signal's number, 0 while none came */
void ps_worker_on_signal_(int sig) {
  atomic_store(&ps_worker_stop_requested_, sig);
  ps_coordinator_cancel(); /* a wait for the ps or the chief ends too */
}
