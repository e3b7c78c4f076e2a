/* A replicated client that updates without a pause, for test_failover.sh:
 *   failover_client SPEC ETCD REPL_JOB SHARD NAME STOPFILE
 * Creates float scalar NAME on shard SHARD (0), then assign_adds 1.0 to
 * it until STOPFILE exists, printing "ack N MS" after each acknowledged
 * update (MS: CLOCK_REALTIME milliseconds), then reads it: "value V".
 * An update that fails prints "error CODE: MESSAGE" and exits 1.  The
 * client's own retries (same dedup id) run up to PS_RPC_TIMEOUT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paramserver/client.h"
#include "paramserver/tensor.h"
#include "repl_client_argv.h"

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int update(ps_client *c, int shard, const char *name, ps_update_op op, float v,
                  ps_status *st) {
  ps_shape s = {0};
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  if (t == NULL) {
    st->code = PS_RESOURCE_EXHAUSTED;
    snprintf(st->msg, sizeof st->msg, "out of memory");
    return -1;
  }
  *(float *)ps_tensor_data(t) = v;
  ps_update_result res = {0};
  ps_update u = {.name = name, .op = op, .value = t, .result = &res};
  int rc = ps_client_update(c, shard, &u, 1, st);
  ps_tensor_destroy(t);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: failover_client SPEC ETCD REPL_JOB SHARD NAME STOPFILE\n");
    return 2;
  }
  ps_library_init();
  ps_status st;
  ps_status_clear(&st);
  int rc = 1, shard = atoi(argv[4]);
  const char *name = argv[5];
  ps_cluster *cl;
  ps_client *c = repl_client_from_argv(argv, &cl, &st);
  ps_var_spec spec = {.name = name, .dtype = PS_DT_FLOAT};
  if (c && ps_client_create_vars(c, shard, &spec, 1, &st) == 0 &&
      update(c, shard, name, PS_ASSIGN, 0.0f, &st) == 0) {
    printf("created\n");
    fflush(stdout);
    long long n = 0;
    rc = 0;
    while (access(argv[6], F_OK) != 0) {
      if (update(c, shard, name, PS_ASSIGN_ADD, 1.0f, &st) != 0) {
        rc = 1;
        break;
      }
      printf("ack %lld %lld\n", ++n, now_ms());
      fflush(stdout);
    }
    ps_read r = {.name = name};
    if (rc == 0 && ps_client_read(c, shard, &r, 1, &st) == 0)
      printf("value %.0f\n", (double)*(float *)ps_tensor_data(r.out));
    else
      rc = 1;
    ps_tensor_destroy(r.out);
  }
  if (rc != 0) printf("error %s: %s\n", ps_status_code_name(st.code), st.msg);
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc;
}
