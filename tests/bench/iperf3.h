/* iperf3 over loopback as the benches' wire limit (iperf3.c).  Called from
 * the thread that started the harness @h (its children die with that
 * thread). */
#ifndef PS_BENCH_IPERF3_H
#define PS_BENCH_IPERF3_H

#include <stddef.h>

#include "harness.h"

/* The iperf3 to run: $IPERF3 if set, else the first `iperf3' on $PATH,
 * written to @path (@n bytes).  0, or -1 when there is none (nothing
 * printed: the caller says it skips). */
int iperf3_find(char *path, size_t n);

/* One iperf3 transfer of @bytes (0: a steady run of 1 s, -t 1, as iperf3's
 * users run it) over 127.0.0.1, client to server, or
 * server to client when @reverse (-R): a one-off server (-s -1) on a port
 * picked at run time, on CPU @server_cpu, and a client with -J on CPU
 * @client_cpu (< 0: not pinned).  Returns the receiver's rate in GB/s
 * (the JSON's end.sum_received.bits_per_second / 8e9), or -1 after
 * printing why.  Both processes are gone when it returns, whatever the
 * outcome. */
double iperf3_gbs(ps_harness *h, const char *prog, size_t bytes, int reverse,
                  int server_cpu, int client_cpu);

#endif
