// The dense transfers of bench_ps (a) against dmlc/ps-lite, for the opt-in
// comparison (tests/bench/run.sh pslite --bulk-mib N, with PSLITE_DIR
// pointing at a built ps-lite).  One binary plays ps-lite's scheduler,
// server or worker after DMLC_ROLE, as ps-lite's own tests do.
//
// One key holds BYTES of float32.  A push replaces the server's value (as
// bench_ps's assign does) and a pull returns it, both zero-copy on the
// server: the store keeps the pushed SArray and the pull's reply shares it.
// The worker pulls into a reused, pre-touched SArray, as bench_ps reads
// into a preallocated tensor.  Pushes and pulls alternate, REPS of each
// after 2 warm-up pairs; the first pull is checked against what was pushed.
// stdout: one `pslite:' line with the median GB/s (1e9 B/s) of each.
//
//   pslite_dense BYTES REPS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ps/ps.h"
#include "pslite_util.h"

namespace {

size_t g_bytes;
int g_reps;

struct Store {
  ps::SArray<float> value;
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    ps::KVPairs<float> res;
    if (meta.push) value = req.vals; /* shares the received buffer */
    if (meta.pull) {
      res.keys = req.keys;
      res.vals = value; /* shares the stored buffer */
      res.lens = ps::SArray<int>(1, int(value.size()));
    }
    server->Response(meta, res);
  }
};

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  size_t n = g_bytes / sizeof(float);
  ps::SArray<ps::Key> keys(1, 0);
  ps::SArray<int> lens(1, int(n));
  ps::SArray<float> val(n), out(n);
  for (size_t i = 0; i < n; i++) val[i] = float(i % 4099);
  memset(out.data(), 0, n * sizeof(float));
  std::vector<double> push, pull;
  for (int r = -2; r < g_reps; r++) {
    double t0 = now_s();
    kv.Wait(kv.ZPush(keys, val, lens));
    double t1 = now_s();
    kv.Wait(kv.ZPull(keys, &out, &lens));
    double t2 = now_s();
    if (r == -2) CHECK(memcmp(out.data(), val.data(), n * sizeof(float)) == 0)
        << "pull returned other values than pushed";
    if (r >= 0) {
      push.push_back(double(g_bytes) / 1e9 / (t1 - t0));
      pull.push_back(double(g_bytes) / 1e9 / (t2 - t1));
    }
  }
  printf("pslite: dense_push %.2f GB/s dense_pull %.2f GB/s\n", median(push), median(pull));
  fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: pslite_dense BYTES REPS\n");
    return 2;
  }
  g_bytes = size_t(atoll(argv[1]));
  g_reps = atoi(argv[2]);
  Store store;
  return pslite_run(store, [] {}, run_worker);
}
