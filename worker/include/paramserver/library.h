/* libpsworker: process-wide setup.
 *
 * A program calls ps_library_init() once before its first ps_client (or
 * session, or anything else that talks to a ps) and ps_library_shutdown()
 * once after destroying the last one.  Both are reference counted and
 * thread-safe: libraries built on libpsworker may call them in pairs of
 * their own; only the first init and the last shutdown do work (start and
 * stop the RPC runtime).  A program that forks calls ps_library_init() in
 * the child after fork(), not before.
 *
 * Everything else in libpsworker except pure functions (status, tensor,
 * cluster spec, init spec helpers) needs the library initialized. */
#ifndef PARAMSERVER_LIBRARY_H
#define PARAMSERVER_LIBRARY_H

#include "paramserver/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 0 (the RPC runtime cannot fail to start; the int leaves room). */
PS_API int ps_library_init(void);
/* Undoes one ps_library_init(); a call without a matching init is a no-op. */
PS_API void ps_library_shutdown(void);
/* The library's version at run time ("0.1.0"); compare with
 * PS_VERSION_STRING of paramserver/version.h to detect a mismatch. */
PS_API const char *ps_library_version(void);

#ifdef __cplusplus
}
#endif

#endif
