/* libpsworker: the whole public API in one include.
 *
 *   #include <paramserver/paramserver.h>
 *   ps_library_init();     once per process, before any client
 *   ...
 *   ps_library_shutdown(); once, after the last client is destroyed
 *
 * Build flags: `pkg-config --cflags --libs paramserver`. */
#ifndef PARAMSERVER_PARAMSERVER_H
#define PARAMSERVER_PARAMSERVER_H

#include "paramserver/api.h"
#include "paramserver/checkpoint.h"
#include "paramserver/client.h"
#include "paramserver/cluster.h"
#include "paramserver/coordinator.h"
#include "paramserver/dataset.h"
#include "paramserver/embedding.h"
#include "paramserver/graph.h"
#include "paramserver/init.h"
#include "paramserver/library.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/partition.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"
#include "paramserver/version.h"

#endif
