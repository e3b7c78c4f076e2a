/* RPC glue over gRPC core (Debian 12: core 29 / gRPC 1.51).
 *
 * All direct gRPC calls of the project live in common/rpc*.c, because the
 * core API is not stable across releases: one module to adapt when it
 * changes.  The files and their layers are listed in rpc_internal.h; this
 * one holds the library's init.
 *
 * Each call, server or client side, is a small state machine driven by
 * completion-queue events; the event tag points at a struct whose first
 * field says what kind of tag it is.  Bulk bytes travel as Chunk messages
 * (tag 0x0a, varint length, bytes): outgoing ranges of 4 KiB or more are
 * wrapped as zero-copy slices that hold a reference on the owning ps_buf;
 * smaller ranges are coalesced into one copied slice.  Incoming chunks are
 * walked slice by slice and copied straight into the receiver's ranges, so a
 * tensor is copied once on receive and never on send. */
#include "rpc_internal.h"

#include "log.h"
#include "units.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <malloc.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* gRPC reads each transfer into fresh buffers of up to a few MiB and frees
 * them once the bytes are copied out.  glibc serves such sizes with mmap
 * (or trims its heap back) at once, so every transfer faulted its pages in
 * anew: a 4 MiB read or assign took ~870 page faults a call and a third of
 * the CPU.  Blocks under 32 MiB come from the heap instead, and up to
 * 64 MiB of free heap is kept for the next transfer (bench_ps --bulk-mib 4:
 * faults 174K -> 13K, CPU -30%).  PS_MALLOC_TUNE=0, or any malloc setting
 * in GLIBC_TUNABLES, leaves glibc's own. */
static void tune_malloc(void) {
  const char *e = getenv("PS_MALLOC_TUNE"), *t = getenv("GLIBC_TUNABLES");
  if ((e && !strcmp(e, "0")) || (t && strstr(t, "glibc.malloc."))) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

static _Atomic int64_t client_recv_window; /* 0: gRPC's probing */

int ps_rpc_parse_recv_window(const char *s, int64_t *w) {
  int64_t v;
  if (s && !strcmp(s, "0")) {
    *w = 0;
    return 0;
  }
  if (ps_parse_size(s, PS_RPC_MIN_RECV_WINDOW, PS_RPC_MAX_RECV_WINDOW, &v) != 0)
    return -1;
  *w = v;
  return 0;
}

int64_t ps_rpc_client_recv_window(void) {
  return atomic_load(&client_recv_window);
}

static _Atomic int64_t client_spin_us = PS_RPC_DEFAULT_POLL_SPIN_US;
static atomic_bool client_spin_set; /* by a call: the environment no longer counts */

int ps_rpc_parse_poll_spin_us(const char *s, int64_t *us) {
  if (s[0] < '0' || s[0] > '9') return -1; /* no sign, no space */
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || errno || v < 0 || v > PS_RPC_MAX_POLL_SPIN_US) return -1;
  *us = v;
  return 0;
}

int ps_rpc_set_poll_spin_us(int64_t us) {
  if (us < 0 || us > PS_RPC_MAX_POLL_SPIN_US) return -1;
  atomic_store(&client_spin_us, us);
  atomic_store(&client_spin_set, true);
  return 0;
}

int64_t ps_rpc_poll_spin_us(void) {
  return atomic_load(&client_spin_us);
}

/* Each poll is a grpc_completion_queue_next with a past deadline: one
 * epoll_wait with no timeout when this thread holds gRPC 1.51's one
 * epoll poller role (epoll1: one thread of the process at a time waits in
 * epoll), else a look at the queue alone, so polling pays where the
 * waiting thread is the process's only gRPC waiter (the ps-server's one
 * RPC thread, a single-threaded training loop).  Between polls the thread
 * yields, so a thread sharing the core (the ps and its client on one CPU)
 * runs at once.  A yield that came back late means another thread had
 * work for this core: the thread then polls once more and sleeps, so on
 * a machine with more busy threads than cores (2 ps and 2 clients on 2
 * cores) polling does not take turns from them. */
#define YIELD_BUSY_NS 20000

/* Whether the machine has more runnable threads than cores: the
 * "running" count of /proc/loadavg (this thread included), read at most
 * once a millisecond by whichever thread asks.  A polling thread keeps its
 * core looking busy to the scheduler, which then does not move a waiting
 * thread of another core onto it (2 ps and 2 clients on 2 cores moved up
 * to 9% less with 1 ms of polling), so it polls only while every runnable
 * thread has a core.  Both figures are the host's (or container's view of
 * it): in a container held to a few of many cores only the yield check
 * below guards. */
#define CROWD_CHECK_NS 1000000
static _Atomic int64_t crowd_checked;
static atomic_bool crowd;
static atomic_int loadavg_fd = -1, ncpu;

static bool crowded(int64_t now) {
  int64_t last = atomic_load(&crowd_checked);
  if (now - last < CROWD_CHECK_NS ||
      !atomic_compare_exchange_strong(&crowd_checked, &last, now))
    return atomic_load(&crowd);
  int fd = atomic_load(&loadavg_fd);
  if (fd < 0) { /* first time; a race opens it twice and closes one */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    atomic_store(&ncpu, n > 0 ? (int)n : 1); /* before the fd that says it is set */
    int nfd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (nfd < 0) return false;
    if (!atomic_compare_exchange_strong(&loadavg_fd, &fd, nfd))
      close(nfd);
    else
      fd = nfd;
  }
  char buf[128];
  ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
  if (r <= 0) return false;
  buf[r] = '\0';
  unsigned running = 0;
  bool busy = sscanf(buf, "%*s %*s %*s %u/", &running) == 1 &&
              running > (unsigned)atomic_load(&ncpu);
  atomic_store(&crowd, busy);
  return busy;
}

grpc_event ps_rpc_cq_wait_(grpc_completion_queue *cq, int64_t spin_ns,
                           gpr_timespec deadline) {
  int64_t now = spin_ns > 0 ? mono_ns() : 0, end = now + spin_ns;
  if (spin_ns > 0 && !crowded(now)) {
    for (;;) {
      grpc_event ev =
          grpc_completion_queue_next(cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
      if (ev.type != GRPC_QUEUE_TIMEOUT) return ev;
      if (now >= end) break;
      int64_t before = mono_ns();
      sched_yield();
      now = mono_ns();
      if (now - before > YIELD_BUSY_NS) end = now;
    }
  }
  return grpc_completion_queue_next(cq, deadline, NULL);
}

/* Debian 12's Abseil is built without NDEBUG, so every absl::Mutex that
 * gRPC 1.51 locks (its grpc_core::Mutex) also updates Abseil's global
 * lock-order graph for deadlock detection (GraphCycles::GetId, stack
 * traces for new edges): 15-20K of the ~73K instructions a scalar call
 * costs the ps-server (callgrind, bench_ps (b)).  Release builds of
 * Abseil have it off; this turns it off too, through Abseil's own switch
 * (absl::SetMutexDeadlockDetectionMode(kIgnore)), found by its mangled
 * name in the Abseil gRPC is linked with, so another Abseil (another
 * inline namespace) is simply left as it is.  PS_ABSL_DEADLOCK_DETECTION=1
 * keeps it (debugging gRPC itself). */
void ps_rpc_quiet_abseil(void) {
  const char *e = getenv("PS_ABSL_DEADLOCK_DETECTION");
  if (e && !strcmp(e, "1")) return;
  static const char name[] =
      "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE";
  void *sym = dlsym(RTLD_DEFAULT, name);
  if (sym == NULL) { /* libpsworker loaded RTLD_LOCAL (Python's ctypes) */
    void *lib = dlopen("libabsl_synchronization.so.20220623", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL) return;
    sym = dlsym(lib, name);
    dlclose(lib);
    if (sym == NULL) return;
  }
  void (*set_mode)(int);
  memcpy(&set_mode, &sym, sizeof set_mode);
  set_mode(0); /* absl::OnDeadlockCycle::kIgnore */
}

void ps_rpc_global_init(void) {
  /* A connection attempt of a channel with no call waiting on it (calls
   * fail fast while it reconnects) makes progress only when gRPC's backup
   * poller runs: every 5 s by default, so a restarted ps was found ~5.5 s
   * after it was up.  The environment still wins. */
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", 0);
  tune_malloc();
  const char *spin = getenv("PS_POLL_SPIN_US");
  int64_t us;
  if (spin && *spin && !atomic_load(&client_spin_set)) {
    if (ps_rpc_parse_poll_spin_us(spin, &us) == 0)
      atomic_store(&client_spin_us, us);
    else
      PS_WARN("PS_POLL_SPIN_US must be an integer from 0 to %d (microseconds), got '%s'; "
              "using %lld",
              PS_RPC_MAX_POLL_SPIN_US, spin, (long long)ps_rpc_poll_spin_us());
  }
  const char *win = getenv("PS_RECV_WINDOW");
  int64_t w;
  if (win && *win) {
    if (ps_rpc_parse_recv_window(win, &w) == 0)
      atomic_store(&client_recv_window, w);
    else
      PS_WARN("PS_RECV_WINDOW must be 0 (gRPC's probing) or a size from 64K to 1G, got "
              "'%s'; keeping %lld",
              win, (long long)ps_rpc_client_recv_window());
  }
  ps_rpc_quiet_abseil();
  grpc_init();
}
/* gRPC 1.51's TCP reads (its default experiment "tcp_read_chunks") take
 * 64 KiB buffers for as many bytes as its estimate of the next read, an
 * estimate that doubles whenever a read fills 80% of it and has no cap;
 * the part a read leaves unused waits for the next one.  After a few
 * 64 MiB assigns a connection held ~17 MiB of them even while it only
 * received small requests (the ps serving reads), on top of the
 * flow-control window's worth of received data during an assign.
 * Without the experiment a read takes one buffer of at most
 * GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE (rpc_server.c: PS_RPC_CHUNK_MAX),
 * freed once the chunks it carried are copied out: a ps holding a 64
 * and a 4 MiB variable peaks 6-14 MiB lower (bench_ps --only a, median
 * 170 -> 161 MiB on a quiet machine), throughput unchanged
 * (tests/bench/README.md).  For the ps-server only (the experiments are
 * per process); the environment still wins. */
void ps_rpc_global_init_server(void) {
  setenv("GRPC_EXPERIMENTS", "-tcp_read_chunks", 0);
  ps_rpc_global_init();
}

void ps_rpc_global_shutdown(void) {
  grpc_shutdown();
}
