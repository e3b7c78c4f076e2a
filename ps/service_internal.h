/* Shared by the files of the Ps service: service.c (the service object,
 * Create, Initialize, the queries, Delete), service_check.c (the request
 * checks every handler makes), service_update.c (Update, synchronous
 * updates), service_read.c (Read) and service_handlers.c (the handler
 * table, gathered from the tables the handler files export).  Private to
 * ps/. */
#ifndef PS_SERVICE_INTERNAL_H
#define PS_SERVICE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/init.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/tensor.h"
#include "service.h"

struct ps_service {
  ps_store *store;
  char *ckpt_dir;
  char task[64];
  char address[256];
  struct timespec start;
  atomic_llong rpcs;
  atomic_bool sync_closed; /* shutting down: no call may start waiting */
  ps_service_limits limits;
  /* the last shard this ps saved (metrics): wall-clock end, seconds, bytes */
  pthread_mutex_t ckpt_mu;
  double ckpt_time, ckpt_secs;
  long long ckpt_bytes, ckpt_count;
  void (*on_shutdown)(void *); /* the daemon's stop, for Shutdown calls */
  void *shutdown_arg;
};

/* The request's list (field 1) and strings are checked on the wire before
 * anything is unpacked (see ps_svc_check_items_ and common/wire.h). */
#define CHECK_WIRE(desc, method)                                                         \
  do {                                                                                   \
    int rc_ = ps_wire_check_strings(&(desc), p, n, method, st);                          \
    if (rc_ == 0) rc_ = ps_svc_check_items_(s, p, n, method, st);                        \
    if (rc_ != 0) return rc_;                                                            \
  } while (0)

/* service_check.c: the service of a call (and one more RPC counted),
 * request checks and sizes held to the limits before anything is
 * allocated. */
ps_service *ps_svc_of_(ps_rpc_call *c);
int ps_svc_bad_request_(ps_status *st, const char *method);
int ps_svc_check_items_(ps_service *s, const uint8_t *p, size_t n, const char *method,
                        ps_status *st);
int ps_svc_tensor_bytes_(ps_service *s, int dtype, const ps_shape *shape,
                         const char *what, const char *var, size_t *out, ps_status *st);
int ps_svc_add_staged_(ps_service *s, size_t *total, size_t add, const char *method,
                       ps_status *st);
int ps_svc_elems_bytes_(ps_service *s, int dtype, int64_t count, const char *what,
                        const char *var, size_t *out, ps_status *st);
int ps_svc_shape_from_(ps_shape *s, const int64_t *dims, size_t n, const char *var,
                       ps_status *st);
const char *ps_svc_fmt_shape_(const ps_shape *s, char *buf, size_t n);
struct Paramserver__Initializer;
/* An Initializer message as a spec for variable @var of @dtype
 * (INVALID_ARGUMENT naming @var); @out borrows @p's values. */
int ps_svc_init_from_proto_(const struct Paramserver__Initializer *p, const char *var,
                            int dtype, ps_init_spec *out, ps_status *st);
/* Update's and Read's indices: each in [0, @bound). */
int ps_svc_check_indices_(const void *idx, size_t isize, int64_t n, int64_t bound,
                          const char *var, const char *op, ps_status *st);
/* The handler tables of the files, for service_handlers.c (ckpt.h has
 * ckpt.c's). */
extern const ps_rpc_handler ps_svc_handlers[10];       /* service.c */
extern const ps_rpc_handler ps_svc_update_handlers[1]; /* service_update.c */
extern const ps_rpc_handler ps_svc_read_handlers[1];   /* service_read.c */
/* service_update.c: answers the calls whose synchronous updates @w were
 * waiting on (Delete fails them). */
struct ps_sync_waiter;
void ps_svc_sync_release_all_(struct ps_sync_waiter *w);

#endif
