// bench_table's workload on dmlc/ps-lite's own KV server, for the opt-in
// comparison (tests/bench/pslite_table.sh, PSLITE_DIR pointing at a built
// ps-lite).  One binary plays ps-lite's scheduler, server or worker after
// DMLC_ROLE, as ps-lite's own tests do.
//
// The same keys (ROWS distinct 64-bit keys, as ps-lite's uint64 keys), the
// same Zipf batches (zipf.h), the same gradients.  The server is what a
// ps-lite user writes for a table that grows: a KVServer request handle
// over an std::unordered_map from key to the row's place in one growing
// array of rows with Adagrad's accumulator beside each; a pull of a key
// it has not seen makes its row (deterministic per key), a push with cmd 1
// is a sparse Adagrad step (zipf.h adagrad_row, term for term the ps's).
// The worker pays for ps-lite's API as a user must: it finds a batch's
// distinct keys (as the ps client does), sorts them, ZPulls them and
// copies the rows to every position; the push sums each key's gradients
// and ZPushes them.  First every key is pulled once (the table filled,
// as bench_table fills ours), then the timed steps.
//
//   pslite_table ROWS DIM BATCH ZIPF STEPS
// stdout: one `pslite:' line with the medians and the server's RSS.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"
#include "pslite_util.h"
#include "zipf.h"

namespace {

int64_t g_rows, g_dim, g_batch, g_steps;
double g_zipf;
const int kWarm = 10;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// bench_table's keys: distinct, any 64-bit value.
uint64_t key_of(int64_t r) { return mix(uint64_t(r) ^ 0x5DEECE66Dull); }

struct Table {
  std::unordered_map<ps::Key, uint32_t> at;  // key -> its row's place
  std::vector<float> rows;                   // per row: dim values, dim accumulators
  size_t row() const { return size_t(g_dim); }
  float *find_or_make(ps::Key k) {
    auto it = at.find(k);
    if (it == at.end()) {
      uint32_t p = uint32_t(at.size());
      it = at.emplace(k, p).first;
      rows.resize(rows.size() + 2 * row());
      float *r = rows.data() + size_t(p) * 2 * row();
      uint64_t x = mix(k);
      for (size_t j = 0; j < row(); j++) {  // a small value per key, as an initializer's
        x = mix(x + j);
        r[j] = float(int64_t(x % 2001) - 1000) * 1e-5f;
        r[row() + j] = ADAGRAD_INIT;
      }
    }
    return rows.data() + size_t(it->second) * 2 * row();
  }
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    size_t n = req.keys.size(), d = row();
    ps::KVPairs<float> res;
    if (meta.push) {
      for (size_t i = 0; i < n; i++) {
        auto it = at.find(req.keys[i]);
        if (it == at.end()) continue;  // a key without a row: dropped, as ours
        float *r = rows.data() + size_t(it->second) * 2 * d;
        adagrad_row(r, r + d, req.vals.data() + i * d, int64_t(d), ADAGRAD_LR);
      }
    }
    if (meta.pull) {
      res.keys = req.keys;
      res.vals.resize(n * d);
      for (size_t i = 0; i < n; i++)
        memcpy(res.vals.data() + i * d, find_or_make(req.keys[i]), d * sizeof(float));
    }
    server->Response(meta, res);
  }
};

// A batch's distinct keys, sorted, and each position's index among them.
void distinct_sorted(const uint64_t *k, size_t b, ps::SArray<ps::Key> *keys,
                     std::vector<uint32_t> *slot) {
  size_t cap = 1;
  while (cap < 2 * b) cap <<= 1;
  std::vector<int64_t> tab(cap, -1);
  std::vector<std::pair<ps::Key, uint32_t>> order;
  std::vector<uint32_t> from(b);
  for (size_t j = 0; j < b; j++) {
    size_t h = size_t(mix(k[j])) & (cap - 1);
    while (tab[h] >= 0 && order[size_t(tab[h])].first != k[j]) h = (h + 1) & (cap - 1);
    if (tab[h] < 0) {
      tab[h] = int64_t(order.size());
      order.push_back({k[j], uint32_t(order.size())});
    }
    from[j] = uint32_t(tab[h]);
  }
  std::sort(order.begin(), order.end());
  std::vector<uint32_t> rank(order.size());
  keys->resize(order.size());
  for (size_t q = 0; q < order.size(); q++) {
    (*keys)[q] = order[q].first;
    rank[order[q].second] = uint32_t(q);
  }
  slot->resize(b);
  for (size_t j = 0; j < b; j++) (*slot)[j] = rank[from[j]];
}

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  size_t b = size_t(g_batch), d = size_t(g_dim);
  // the fill: every key pulled once, in sorted chunks
  double f0 = now_s();
  const size_t chunk = 65536;
  std::vector<uint64_t> all(static_cast<size_t>(g_rows));
  for (int64_t r = 0; r < g_rows; r++) all[size_t(r)] = key_of(r);
  for (size_t i = 0; i < all.size(); i += chunk) {
    size_t n = std::min(chunk, all.size() - i);
    std::vector<uint64_t> part(all.begin() + long(i), all.begin() + long(i + n));
    std::sort(part.begin(), part.end());
    ps::SArray<ps::Key> keys(part.data(), n);
    ps::SArray<float> vals;
    kv.Wait(kv.ZPull(keys, &vals));
  }
  double fill_s = now_s() - f0;
  size_t nall = size_t(kWarm + g_steps);
  int64_t *ids = zipf_ids(g_rows, g_zipf, nall, b);
  CHECK(ids != nullptr) << "out of memory";
  std::vector<float> rows(b * d), grad(b * d);
  std::vector<uint64_t> k(b);
  std::vector<uint32_t> slot;
  std::vector<double> tp, tq;
  for (size_t i = 0; i < nall; i++) {
    for (size_t j = 0; j < b; j++) k[j] = key_of(ids[i * b + j]);
    for (size_t j = 0; j < b; j++)
      for (size_t q = 0; q < d; q++) grad[j * d + q] = grad_value(int64_t(i), int64_t(q));
    double t0 = now_s();
    ps::SArray<ps::Key> keys;
    distinct_sorted(k.data(), b, &keys, &slot);
    ps::SArray<float> vals;
    kv.Wait(kv.ZPull(keys, &vals));
    for (size_t j = 0; j < b; j++)
      memcpy(rows.data() + j * d, vals.data() + size_t(slot[j]) * d, d * sizeof(float));
    double t1 = now_s();
    ps::SArray<float> sum(keys.size() * d, 0.0f);
    for (size_t j = 0; j < b; j++)
      for (size_t q = 0; q < d; q++) sum[size_t(slot[j]) * d + q] += grad[j * d + q];
    kv.Wait(kv.ZPush(keys, sum, {}, 1));
    double t2 = now_s();
    if (i >= size_t(kWarm)) {
      tp.push_back(t1 - t0);
      tq.push_back(t2 - t1);
    }
  }
  std::vector<double> step(tp.size());
  for (size_t i = 0; i < tp.size(); i++) step[i] = tp[i] + tq[i];
  printf("pslite: table_step %.3f ms lookup_rows %.3f M/s update_rows %.3f M/s fill_rows "
         "%.3f M/s\n",
         median(step) * 1e3, double(b) / median(tp) / 1e6, double(b) / median(tq) / 1e6,
         double(g_rows) / fill_s / 1e6);
  fflush(stdout);
  free(ids);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: pslite_table ROWS DIM BATCH ZIPF STEPS\n");
    return 2;
  }
  g_rows = atoll(argv[1]);
  g_dim = atoll(argv[2]);
  g_batch = atoll(argv[3]);
  g_zipf = atof(argv[4]);
  g_steps = atoll(argv[5]);
  Table handle;
  int rc = pslite_run(handle, [] {}, run_worker);
  const char *role = getenv("DMLC_ROLE");
  if (role != nullptr && strcmp(role, "server") == 0)
    fprintf(stdout, "pslite: server rows %zu peak_rss_mib %.1f\n", handle.at.size(),
            peak_rss_mib());
  return rc;
}
