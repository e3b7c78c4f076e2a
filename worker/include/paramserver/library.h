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

#include <stdint.h>

#include "paramserver/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 0 (the RPC runtime cannot fail to start; the int leaves room).
 * The first init also turns off Abseil's mutex deadlock detection, which
 * Debian 12's Abseil leaves on under every lock gRPC takes (release
 * builds of Abseil have it off); it is process-wide, and
 * PS_ABSL_DEADLOCK_DETECTION=1 in the environment keeps it. */
PS_API int ps_library_init(void);
/* Undoes one ps_library_init(); a call without a matching init is a no-op. */
PS_API void ps_library_shutdown(void);
/* Polling before sleeping, process-wide: a thread waiting for its calls'
 * answers first polls for them without blocking, yielding its core
 * between polls, for up to @us microseconds, and only then sleeps; it
 * polls only while the machine has a core for every runnable thread.
 * On hosts whose idle cores sleep deeply (VMs) this saves two wake-ups
 * per round trip: a small call between two cores of this project's
 * 2-core test VM takes ~29 us instead of ~120.  The cost is CPU time
 * while cores are idle: a waiting thread keeps its core busy for up to
 * @us.  0 turns it off (a host that caps or bills CPU time).  Default:
 * the environment variable PS_POLL_SPIN_US at the first
 * ps_library_init(), else 1000.  Returns 0, or -1 when @us is outside
 * 0..10000 (nothing changes).  Any thread, any time; a call wins over
 * the environment.  The ps-server's own threads take ps-server
 * --poll-spin-us. */
PS_API int ps_library_set_poll_spin_us(int64_t us);
/* The library's version at run time ("0.1.0"); compare with
 * PS_VERSION_STRING of paramserver/version.h to detect a mismatch. */
PS_API const char *ps_library_version(void);

#ifdef __cplusplus
}
#endif

#endif
