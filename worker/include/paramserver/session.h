/* Sessions: run(feeds, fetches, targets) executes only the subgraph the
 * fetches and targets need.  Variable reads, initializers and updates are
 * remote: per wave of ready nodes, all reads for one ps go in one RPC and
 * all updates for one ps in one RPC, with the ps contacted in parallel. */
#ifndef PARAMSERVER_SESSION_H
#define PARAMSERVER_SESSION_H

#include "paramserver/api.h"
#include "paramserver/client.h"
#include "paramserver/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_session ps_session;

typedef struct ps_feed {
  ps_node *node;
  const ps_tensor *value; /* borrowed for the run */
} ps_feed;

/* @client may be NULL for graphs without variables (local computation).
 * Variables of the graph are created on their ps at the first run. */
PS_API ps_session *ps_session_create(ps_graph *g, ps_client *client, ps_status *st);
PS_API void ps_session_destroy(ps_session *s);

typedef struct ps_session_options {
  /* TensorFlow's allow_soft_placement: a node on a device that does not
   * exist (a GPU, another worker task) runs on its ps task's CPU, or in
   * this process, instead of failing the run with INVALID_ARGUMENT
   * "Cannot assign a device for operation v: Operation was explicitly
   * assigned to /device:GPU:1 but available devices are [ ... ]". */
  bool allow_soft_placement;
  /* This process's device, e.g. "/job:worker/task:1" (NULL: "/job:worker",
   * task unknown).  Nodes placed on its job (or "localhost", or no job)
   * and its task (or none) run here; variables there are held by the
   * session. */
  const char *device;
} ps_session_options;

/* ps_session_create with options (NULL: the defaults above). */
PS_API ps_session *ps_session_create_opts(ps_graph *g, ps_client *client,
                                          const ps_session_options *opt, ps_status *st);

/* outputs[i] receives a new tensor for fetches[i] (caller destroys). */
PS_API int ps_session_run(ps_session *s, const ps_feed *feeds, size_t nfeeds,
                          ps_node *const *fetches, size_t nfetches,
                          ps_node *const *targets, size_t ntargets, ps_tensor **outputs,
                          ps_status *st);

/* Creates every variable of the graph on its ps now (a run does it
 * lazily); needed before restoring a checkpoint into a fresh cluster. */
PS_API int ps_session_create_variables(ps_session *s, ps_status *st);

/* Runs a report_uninitialized_variables node: names of the uninitialized
 * variables (free with ps_client_free_names). */
PS_API int ps_session_run_report(ps_session *s, ps_node *report, char ***names, size_t *n,
                                 ps_status *st);

/* The client (NULL: no ps) and graph the session was created with. */
PS_API ps_client *ps_session_client(const ps_session *s);
PS_API ps_graph *ps_session_graph(const ps_session *s);

/* RPCs issued by the last run: reads and updates (for tests). */
PS_API void ps_session_last_rpcs(const ps_session *s, int *reads, int *updates);
/* Synchronous updates (ps_sync_replicas_optimizer) of the last run: how
 * many the ps applied (joined their step) and how many it dropped as stale
 * (computed from an older global_step; the run still succeeds, as in
 * TensorFlow). */
PS_API void ps_session_last_sync(const ps_session *s, int *applied, int *stale);

#ifdef __cplusplus
}
#endif

#endif
