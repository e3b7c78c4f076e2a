/* RPC handlers of the paramserver.Ps service over a ps_store. */
#ifndef PS_SERVICE_H
#define PS_SERVICE_H

#include <stddef.h>

#include "common/rpc.h"
#include "store.h"

typedef struct ps_service ps_service;

ps_service *ps_service_create(ps_store *store, const char *task);
void ps_service_destroy(ps_service *svc);
/* Address reported by Status (set once bound). */
void ps_service_set_address(ps_service *svc, const char *addr);
/* The handler table for ps_rpc_server_create(); user pointer = the service. */
const ps_rpc_handler *ps_service_handlers(size_t *n);

#endif
