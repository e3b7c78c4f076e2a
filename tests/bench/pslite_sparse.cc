// The sparse workload of bench_ps (d) against dmlc/ps-lite, for the
// opt-in comparison (tests/bench/run.sh pslite, with PSLITE_DIR pointing
// at a built ps-lite).  One binary plays ps-lite's scheduler, server or
// worker after DMLC_ROLE, as ps-lite's own tests do.
//
// Same table (rows x dim float32 on transparent huge pages), same Zipf
// batches (zipf.h), same gradient values.  ps-lite's API takes unique,
// sorted keys, so its worker pays for that inside its step as a user
// must: the pull deduplicates the batch the way the ps client does
// (open addressing, worker/client/dedup.c), sorts the distinct keys,
// ZPulls them and copies the rows out to every position; the push sums
// the rows of each id and ZPushes them.  (Sorting the whole batch of
// (id, position) pairs instead, as an earlier version did, costs ps-lite
// about 0.35 ms more per step at the default sizes: work our side does
// not do.)  stdout: one `pslite:' line with the medians.
//
//   pslite_sparse ROWS DIM BATCH ZIPF STEPS [add|adagrad]
// With adagrad the push is a sparse Adagrad step on the server (ZPush with
// cmd 1), term for term as the ps's kernel (zipf.h adagrad_row).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ps/ps.h"
#include "pslite_util.h"
#include "zipf.h"

namespace {

int64_t g_rows, g_dim, g_batch, g_steps;
double g_zipf;
bool g_adagrad;
const int kWarm = 10;

// The gradient rows of each id summed: built for wide vectors where the
// CPU has them, as the ps client's own sum is (worker/client/dedup.c).
__attribute__((target_clones("avx512f", "avx2", "default"))) void sum_rows(
    float *sum, const float *grad, const uint32_t *slot, size_t b, size_t row) {
  for (size_t j = 0; j < b; j++) {
    float *d = sum + size_t(slot[j]) * row;
    const float *g = grad + j * row;
    for (size_t k = 0; k < row; k++) d[k] += g[k];
  }
}

// A batch's distinct ids as ps-lite takes them (sorted) and each
// position's index among them.  The distinct ids are found as the ps
// client finds them (an open-addressing table of twice the batch,
// splitmix64's finalizer, worker/client/dedup.c); only those are sorted.
// The scratch is kept from step to step, as a user's would be.
struct Dedup {
  std::vector<int64_t> key;
  std::vector<int32_t> at;  // -1: empty, else the id's first-seen index
  std::vector<std::pair<ps::Key, uint32_t>> order;  // (id, first-seen index)
  std::vector<uint32_t> rank;                       // first-seen index -> sorted
  std::vector<uint32_t> from;                       // position -> first-seen index

  static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  // @keys: the sorted distinct ids of @ids[0..b); @slot[j]: @ids[j]'s index in @keys.
  void run(const int64_t *ids, size_t b, ps::SArray<ps::Key> *keys, uint32_t *slot) {
    size_t cap = 1;
    while (cap < 2 * b) cap <<= 1;
    key.resize(cap);
    at.assign(cap, -1);
    from.resize(b);
    order.clear();
    for (size_t j = 0; j < b; j++) {
      size_t h = size_t(mix(uint64_t(ids[j]))) & (cap - 1);
      while (at[h] >= 0 && key[h] != ids[j]) h = (h + 1) & (cap - 1);
      if (at[h] < 0) {
        key[h] = ids[j];
        at[h] = int32_t(order.size());
        order.push_back({ps::Key(ids[j]), uint32_t(order.size())});
      }
      from[j] = uint32_t(at[h]);
    }
    std::sort(order.begin(), order.end());
    rank.resize(order.size());
    keys->resize(order.size());
    for (size_t q = 0; q < order.size(); q++) {
      (*keys)[q] = order[q].first;
      rank[order[q].second] = uint32_t(q);
    }
    for (size_t j = 0; j < b; j++) slot[j] = rank[from[j]];
  }
};

float *table_alloc(size_t n) {
  size_t huge = size_t(2) << 20, bytes = (n * sizeof(float) + huge - 1) / huge * huge;
  float *t = static_cast<float *>(aligned_alloc(huge, bytes));
  if (t == nullptr) return nullptr;
  madvise(t, bytes, MADV_HUGEPAGE);
  memset(t, 0, bytes);
  return t;
}

// PSLITE_RESPOND_FIRST=1: a push is answered before its rows are added,
// as our ps answers an unreplicated update (and the raw TCP peer of
// bench_ps (d)); by default the server adds and then answers, the order
// of ps-lite's own KVServerDefaultHandle.  Either way the server's one
// handler thread takes the next request only after the add.
bool respond_first() {
  const char *e = getenv("PSLITE_RESPOND_FIRST");
  return e != nullptr && strcmp(e, "1") == 0;
}

struct Table {
  float *t = nullptr, *acc = nullptr;
  bool first = respond_first();
  void operator()(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
                  ps::KVServer<float> *server) {
    size_t n = req.keys.size();
    size_t row = size_t(g_dim);
    ps::KVPairs<float> res;
    bool early = first && meta.push && !meta.pull;
    if (early) server->Response(meta, res);
    if (meta.push && meta.cmd == 1) {
      for (size_t i = 0; i < n; i++)
        adagrad_row(t + req.keys[i] * row, acc + req.keys[i] * row,
                    req.vals.data() + i * row, int64_t(row), ADAGRAD_LR);
    } else if (meta.push) {
      for (size_t i = 0; i < n; i++) {
        float *d = t + req.keys[i] * row;
        const float *v = req.vals.data() + i * row;
        for (size_t k = 0; k < row; k++) d[k] += v[k];
      }
    }
    if (meta.pull) {
      res.keys = req.keys;
      res.vals.resize(n * row);
      for (size_t i = 0; i < n; i++)
        memcpy(res.vals.data() + i * row, t + req.keys[i] * row, row * sizeof(float));
    }
    if (!early) server->Response(meta, res);
  }
};

void run_worker() {
  ps::KVWorker<float> kv(0, 0);
  size_t nall = size_t(kWarm + g_steps), b = size_t(g_batch), row = size_t(g_dim);
  int64_t *ids = zipf_ids(g_rows, g_zipf, nall, b);
  CHECK(ids != nullptr) << "out of memory";
  std::vector<float> rows(b * row), grad(b * row);
  std::vector<double> tp, tq;
  std::vector<uint32_t> slot(b);
  Dedup dedup;
  for (size_t i = 0; i < nall; i++) {
    const int64_t *si = ids + i * b;
    for (size_t j = 0; j < b * row; j++) grad[j] = grad_value(int64_t(i), int64_t(j));
    double t0 = now_s();
    ps::SArray<ps::Key> keys;
    dedup.run(si, b, &keys, slot.data());
    size_t nu = keys.size();
    ps::SArray<float> vals;
    kv.Wait(kv.ZPull(keys, &vals));
    for (size_t j = 0; j < b; j++)
      memcpy(rows.data() + j * row, vals.data() + size_t(slot[j]) * row, row * sizeof(float));
    double t1 = now_s();
    ps::SArray<float> sum(nu * row, 0.0f);
    sum_rows(sum.data(), grad.data(), slot.data(), b, row);
    kv.Wait(kv.ZPush(keys, sum, {}, g_adagrad ? 1 : 0));
    double t2 = now_s();
    if (i >= size_t(kWarm)) {
      tp.push_back(t1 - t0);
      tq.push_back(t2 - t1);
    }
  }
  std::vector<double> step(tp.size());
  for (size_t i = 0; i < tp.size(); i++) step[i] = tp[i] + tq[i];
  printf("pslite: sparse_step %.3f ms pull_rows %.2f M/s push_rows %.2f M/s\n",
         median(step) * 1e3, double(b) / median(tp) / 1e6, double(b) / median(tq) / 1e6);
  fflush(stdout);
  free(ids);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: pslite_sparse ROWS DIM BATCH ZIPF STEPS [add|adagrad]\n");
    return 2;
  }
  g_adagrad = argc == 7 && strcmp(argv[6], "adagrad") == 0;
  g_rows = atoll(argv[1]);
  g_dim = atoll(argv[2]);
  g_batch = atoll(argv[3]);
  g_zipf = atof(argv[4]);
  g_steps = atoll(argv[5]);
  Table handle;
  int rc = pslite_run(
      handle,
      [&] {
        handle.t = table_alloc(size_t(g_rows * g_dim));
        CHECK(handle.t != nullptr) << "out of memory";
        if (g_adagrad) {
          handle.acc = table_alloc(size_t(g_rows * g_dim));
          CHECK(handle.acc != nullptr) << "out of memory";
          std::fill(handle.acc, handle.acc + g_rows * g_dim, ADAGRAD_INIT);
        }
      },
      run_worker);
  free(handle.t);
  free(handle.acc);
  return rc;
}
