// What the ps-lite comparison programs (pslite_*.cc) share: a clock, a
// median and quantiles, the peak RSS, and the run of one process as
// ps-lite's scheduler, server or worker after DMLC_ROLE.  Only for those
// programs, which link ps-lite.
#ifndef PS_BENCH_PSLITE_UTIL_H
#define PS_BENCH_PSLITE_UTIL_H

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "ps/ps.h"

inline double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The value at quantile @q (0..1) of @v, taken as bench_ps takes it.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(q * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// This process's peak resident set (VmHWM) in MiB, or -1.
inline double peak_rss_mib() {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib / 1024;
}

// Starts ps-lite; a server serves with @handle (prepared by @prepare, run
// on servers only), a worker runs @worker once every server has its
// handle; then ps-lite's finalize barrier.  Returns the exit status.
// (A KVServer takes requests from its construction on, before
// set_request_handle: a worker that did not wait for the servers could
// reach one in between and abort it, `Check failed: request_handle_'.)
template <typename Handle, typename Prepare, typename Worker>
int pslite_run(Handle &handle, Prepare prepare, Worker worker) {
  ps::Start(0);
  ps::KVServer<float> *server = nullptr;
  if (ps::IsServer()) {
    prepare();
    server = new ps::KVServer<float>(0);
    server->set_request_handle(handle);
  }
  if (!ps::IsScheduler())
    ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup);
  if (ps::IsWorker()) worker();
  ps::Finalize(0, true);
  delete server;
  return 0;
}

#endif
