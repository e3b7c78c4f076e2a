// The dense transfers of bench_ps (a) against dmlc/ps-lite, for the opt-in
// comparison (tests/bench/run.sh pslite --bulk-mib N, with PSLITE_DIR
// pointing at a built ps-lite).  One binary plays ps-lite's scheduler,
// server or worker after DMLC_ROLE, as ps-lite's own tests do.
//
// Key 0 holds BYTES of float32.  A push replaces the server's value (as
// bench_ps's assign does) and a pull returns it, both zero-copy on the
// server: the store keeps the pushed SArray and the pull's reply shares it.
// The worker pulls into a reused, pre-touched SArray, as bench_ps reads
// into a preallocated tensor.  Pushes and pulls alternate, REPS of each
// after 2 warm-up pairs; the first pull is checked against what was pushed.
// With SMALL_BYTES, key 1 holds that many as bench_ps's second variable of
// (a) does, SMALL_PER_REP push/pull pairs of it after each pair of key 0's.
// stdout: the worker's `pslite: dense_push G GB/s dense_pull G GB/s' (the
// medians of key 0, 1e9 B/s), the server's `pslite: server_peak_rss M MiB
// held H MiB' (its VmHWM once the worker is done, as bench_ps reads the
// ps-server's after (a)).
//
//   pslite_dense BYTES REPS [SMALL_BYTES SMALL_PER_REP]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ps/ps.h"
#include "pslite_util.h"

namespace {

size_t g_bytes, g_small;
int g_reps, g_small_per_rep;

struct Store {
  ps::SArray<float> value[2];  // key 0, key 1
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    ps::KVPairs<float> res;
    CHECK(req.keys.size() == 1 && req.keys[0] < 2) << "one key, 0 or 1, a request";
    ps::SArray<float> &v = value[req.keys[0]];
    if (meta.push) v = req.vals; /* shares the received buffer */
    if (meta.pull) {
      res.keys = req.keys;
      res.vals = v; /* shares the stored buffer */
      res.lens = ps::SArray<int>(1, int(v.size()));
    }
    server->Response(meta, res);
  }
};

// One key's value, the worker's reused pull buffer, and its GB/s.
struct Transfer {
  ps::SArray<ps::Key> keys;
  ps::SArray<int> lens;
  ps::SArray<float> val, out;
  size_t bytes;
  std::vector<double> push, pull;

  Transfer(ps::Key key, size_t b)
      : keys(1, key), lens(1, int(b / sizeof(float))), bytes(b) {
    size_t n = b / sizeof(float);
    val.resize(n);
    out.resize(n);
    for (size_t i = 0; i < n; i++) val[i] = float((i + key) % 4099);
    memset(out.data(), 0, n * sizeof(float));
  }

  // A push and a pull, recorded when @keep; with @check the pull must
  // return what was pushed.
  void pair(ps::KVWorker<float> &kv, bool keep, bool check) {
    double t0 = now_s();
    kv.Wait(kv.ZPush(keys, val, lens));
    double t1 = now_s();
    kv.Wait(kv.ZPull(keys, &out, &lens));
    double t2 = now_s();
    if (check)
      CHECK(memcmp(out.data(), val.data(), bytes) == 0)
          << "pull of key " << keys[0] << " returned other values than pushed";
    if (keep) {
      push.push_back(double(bytes) / 1e9 / (t1 - t0));
      pull.push_back(double(bytes) / 1e9 / (t2 - t1));
    }
  }
};

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  Transfer big(0, g_bytes);
  std::unique_ptr<Transfer> small(g_small ? new Transfer(1, g_small) : nullptr);
  for (int r = -2; r < g_reps; r++) {
    big.pair(kv, r >= 0, r == -2);
    for (int k = 0; small && k < (r < 0 ? 1 : g_small_per_rep); k++)
      small->pair(kv, r >= 0, r == -2);
  }
  printf("pslite: dense_push %.2f GB/s dense_pull %.2f GB/s\n", median(big.push),
         median(big.pull));
  if (small)
    printf("pslite: small_push %.2f GB/s small_pull %.2f GB/s\n", median(small->push),
           median(small->pull));
  fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  if ((argc != 3 && argc != 5) || atoll(argv[1]) < 4 || atoi(argv[2]) < 1 ||
      (argc == 5 && (atoll(argv[3]) < 4 || atoi(argv[4]) < 1))) {
    fprintf(stderr, "usage: pslite_dense BYTES REPS [SMALL_BYTES SMALL_PER_REP]\n");
    return 2;
  }
  g_bytes = size_t(atoll(argv[1]));
  g_reps = atoi(argv[2]);
  g_small = argc == 5 ? size_t(atoll(argv[3])) : 0;
  g_small_per_rep = argc == 5 ? atoi(argv[4]) : 0;
  Store store;
  const char *role = getenv("DMLC_ROLE");
  int rc = pslite_run(store, [] {}, run_worker);
  if (rc == 0 && role != nullptr && strcmp(role, "server") == 0) {
    printf("pslite: server_peak_rss %.1f MiB held %.1f MiB\n", peak_rss_mib(),
           double(g_bytes + g_small) / 1048576.0);
    fflush(stdout);
  }
  return rc;
}
