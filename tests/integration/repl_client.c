/* A replicated client's one call, for test_client_repl.sh:
 *   repl_client SPEC ETCD REPL_JOB update|read|probe SHARD NAME
 * update: assign_add 1.0 to float scalar NAME of shard SHARD; read: its
 * value; probe: ps_client_probe of the shard (NAME unused).  Prints "ok ..." and exits 0,
 * or "error CODE: MESSAGE" and exits
 * 1.  The rpc timeout is PS_RPC_TIMEOUT's (the client reads it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserver/client.h"
#include "paramserver/tensor.h"
#include "repl_client_argv.h"

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr,
            "usage: repl_client SPEC ETCD REPL_JOB update|read|probe SHARD NAME\n");
    return 2;
  }
  ps_library_init();
  ps_status st;
  ps_status_clear(&st);
  int rc = 1;
  ps_cluster *cl;
  ps_client *c = repl_client_from_argv(argv, &cl, &st);
  if (c) {
    int shard = atoi(argv[5]);
    if (!strcmp(argv[4], "update")) {
      ps_shape s = {0};
      ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &s, true);
      ps_update_result res = {0};
      ps_update u = {.name = argv[6], .op = PS_ASSIGN_ADD, .value = one, .result = &res};
      if (one) {
        *(float *)ps_tensor_data(one) = 1.0f;
        if (ps_client_update(c, shard, &u, 1, &st) == 0) {
          printf("ok version=%lld\n", (long long)res.version);
          rc = 0;
        }
      }
      ps_tensor_destroy(one);
    } else if (!strcmp(argv[4], "probe")) {
      if (ps_client_probe(c, shard, &st) == 0) {
        printf("ok probe\n");
        rc = 0;
      }
    } else {
      ps_read r = {.name = argv[6]};
      if (ps_client_read(c, shard, &r, 1, &st) == 0) {
        printf("ok value=%g\n", (double)*(float *)ps_tensor_data(r.out));
        rc = 0;
      }
      ps_tensor_destroy(r.out);
    }
  }
  if (rc != 0) printf("error %s: %s\n", ps_status_code_name(st.code), st.msg);
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc;
}
