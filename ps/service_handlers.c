/* The handler table of the ps (ps_service_handlers, service.h): the tables
 * each handler file exports (service.c, service_update.c, service_read.c,
 * service_embed.c, ckpt.c) gathered into one.  This file alone knows them all, so no
 * handler file uses another (check_layers: no circles between files). */
#include <stddef.h>
#include <string.h>

#include "ckpt.h"
#include "service.h"
#include "service_internal.h"

#define COUNT(t) (sizeof(t) / sizeof((t)[0]))

static ps_rpc_handler handlers[COUNT(ps_svc_handlers) + COUNT(ps_svc_update_handlers) +
                               COUNT(ps_svc_read_handlers) + COUNT(ps_ckpt_handlers) +
                               COUNT(ps_repl_handlers) + COUNT(ps_svc_embed_handlers)];
static size_t nhandlers;

static void add(const ps_rpc_handler *t, size_t n) {
  memcpy(handlers + nhandlers, t, n * sizeof *t);
  nhandlers += n;
}

const ps_rpc_handler *ps_service_handlers(size_t *n) {
  if (nhandlers == 0) {
    add(ps_svc_handlers, COUNT(ps_svc_handlers));
    add(ps_svc_update_handlers, COUNT(ps_svc_update_handlers));
    add(ps_svc_read_handlers, COUNT(ps_svc_read_handlers));
    add(ps_ckpt_handlers, COUNT(ps_ckpt_handlers));
    add(ps_repl_handlers, COUNT(ps_repl_handlers));
    add(ps_svc_embed_handlers, COUNT(ps_svc_embed_handlers));
  }
  *n = nhandlers;
  return handlers;
}
