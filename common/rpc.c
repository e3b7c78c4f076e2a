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

#include <grpc/grpc.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

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

void ps_rpc_global_init(void) {
  /* A connection attempt of a channel with no call waiting on it (calls
   * fail fast while it reconnects) makes progress only when gRPC's backup
   * poller runs: every 5 s by default, so a restarted ps was found ~5.5 s
   * after it was up.  The environment still wins. */
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", 0);
  tune_malloc();
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
