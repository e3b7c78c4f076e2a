// The 2 ps + 2 workers aggregate of bench_agg against dmlc/ps-lite, for
// the opt-in comparison (tests/bench/run.sh pslite --agg, with PSLITE_DIR
// pointing at a built ps-lite).  One binary plays ps-lite's scheduler, a
// server or a worker after DMLC_ROLE (DMLC_NUM_SERVER=2,
// DMLC_NUM_WORKER=2), as ps-lite's own tests do.
//
// Each worker holds one key of BYTES float32 on each server (a key in
// each server's range), as bench_agg's workers hold a variable on each ps.
// A push (ZPush of both keys: ps-lite sends each server its part at once)
// replaces the server's value; a pull returns it; both zero-copy on the
// server (the store keeps the pushed SArray, the reply shares it).  The
// workers start each phase together (ps-lite's worker barrier); each
// prints its seconds per phase, and pslite.sh takes the longer of the two.
// stdout (workers): `pslite: agg_push_s S agg_pull_s S'.
//
//   pslite_agg BYTES REPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "ps/ps.h"
#include "pslite_util.h"

namespace {

size_t g_bytes;
int g_reps;

struct Store {
  std::unordered_map<ps::Key, ps::SArray<float>> value;
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    ps::KVPairs<float> res;
    size_t nk = req.keys.size(), off = 0;
    if (meta.push)
      for (size_t i = 0; i < nk; i++) {
        size_t len = req.lens.empty() ? req.vals.size() / nk : size_t(req.lens[i]);
        value[req.keys[i]] = req.vals.segment(off, off + len); /* shares */
        off += len;
      }
    if (meta.pull) {
      res.keys = req.keys;
      if (nk == 1) {
        res.vals = value[req.keys[0]]; /* shares */
        res.lens = ps::SArray<int>(1, int(res.vals.size()));
      } else {
        for (size_t i = 0; i < nk; i++) {
          const ps::SArray<float> &v = value[req.keys[i]];
          res.vals.append(v);
          res.lens.push_back(int(v.size()));
        }
      }
    }
    server->Response(meta, res);
  }
};

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  size_t n = g_bytes / sizeof(float);
  const std::vector<ps::Range> &ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  CHECK_EQ(ranges.size(), 2u);
  ps::SArray<ps::Key> keys;
  for (const ps::Range &r : ranges) keys.push_back(r.begin() + ps::Key(ps::MyRank()));
  ps::SArray<int> lens(2, int(n));
  ps::SArray<float> val(2 * n), out(2 * n);
  for (size_t i = 0; i < 2 * n; i++) val[i] = float((i % n + ps::MyRank()) % 4099);
  memset(out.data(), 0, 2 * n * sizeof(float));
  kv.Wait(kv.ZPush(keys, val, lens));
  kv.Wait(kv.ZPull(keys, &out, &lens));
  CHECK(memcmp(out.data(), val.data(), 2 * n * sizeof(float)) == 0)
      << "pull returned other values than pushed";
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  double t0 = now_s();
  for (int r = 0; r < g_reps; r++) kv.Wait(kv.ZPush(keys, val, lens));
  double push = now_s() - t0;
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  t0 = now_s();
  for (int r = 0; r < g_reps; r++) kv.Wait(kv.ZPull(keys, &out, &lens));
  double pull = now_s() - t0;
  printf("pslite: agg_push_s %.9f agg_pull_s %.9f\n", push, pull);
  fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: pslite_agg BYTES REPS\n");
    return 2;
  }
  g_bytes = size_t(atoll(argv[1]));
  g_reps = atoi(argv[2]);
  Store store;
  return pslite_run(store, [] {}, run_worker);
}
