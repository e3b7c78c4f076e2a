/* The replicated client of the test programs repl_client and
 * failover_client: argv[1] the cluster spec, argv[2] the etcd endpoints,
 * argv[3] the replication job; R = 2.  *@cl gets the spec (NULL on
 * error; destroy it after the client); NULL on error, @st says why. */
#ifndef PS_TESTS_REPL_CLIENT_ARGV_H
#define PS_TESTS_REPL_CLIENT_ARGV_H

#include "paramserver/client.h"

static inline ps_client *repl_client_from_argv(char **argv, ps_cluster **cl,
                                               ps_status *st) {
  *cl = ps_cluster_load_file(argv[1], st);
  if (*cl == NULL) return NULL;
  ps_client_options o;
  ps_client_options_default(&o);
  o.etcd = argv[2];
  o.repl_job = argv[3];
  o.replicas = 2;
  return ps_client_create(*cl, "ps", &o, st);
}

#endif
