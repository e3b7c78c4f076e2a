// The scalar round trip of bench_ps (b) against dmlc/ps-lite, for the
// opt-in comparison (tests/bench/run.sh pslite --scalar, with PSLITE_DIR
// pointing at a built ps-lite).  One binary plays ps-lite's scheduler,
// server or worker after DMLC_ROLE, as ps-lite's own tests do.
//
// One key holds one float.  The worker ZPushes a 1-float delta that the
// server adds to it (bench_ps's assign_add of 1) and waits for each push
// before the next, WARM times, then N timed; at the end it ZPulls the
// value, which must be the number of pushes.  pslite.sh places the
// processes (one CPU for both, as bench_ps (b) does, or one each).
// stdout: `pslite: scalar_push_us median M p99 P min L' (microseconds;
// quantiles as bench_ps takes them).
//
//   pslite_scalar N WARM
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ps/ps.h"
#include "pslite_util.h"

namespace {

int g_n, g_warm;

struct Scalar {
  float value = 0;
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    ps::KVPairs<float> res;
    if (meta.push) value += req.vals[0];
    if (meta.pull) {
      res.keys = req.keys;
      res.vals = ps::SArray<float>(1, value);
    }
    server->Response(meta, res);
  }
};

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  ps::SArray<ps::Key> keys(1, 0);
  ps::SArray<float> one(1, 1.0f);
  std::vector<double> us;
  us.reserve(size_t(g_n));
  for (int i = -g_warm; i < g_n; i++) {
    double t0 = now_s();
    kv.Wait(kv.ZPush(keys, one));
    double t1 = now_s();
    if (i >= 0) us.push_back((t1 - t0) * 1e6);
  }
  ps::SArray<float> got;
  kv.Wait(kv.ZPull(keys, &got));
  CHECK(got.size() == 1 && got[0] == float(g_n + g_warm))
      << "the scalar is " << (got.empty() ? -1.0f : got[0]) << " after "
      << g_n + g_warm << " pushes of 1";
  printf("pslite: scalar_push_us median %.1f p99 %.1f min %.1f\n", quantile(us, 0.5),
         quantile(us, 0.99), quantile(us, 0));
  fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3 || atoi(argv[1]) < 1 || atoi(argv[2]) < 0) {
    fprintf(stderr, "usage: pslite_scalar N WARM\n");
    return 2;
  }
  g_n = atoi(argv[1]);
  g_warm = atoi(argv[2]);
  Scalar scalar;
  return pslite_run(scalar, [] {}, run_worker);
}
