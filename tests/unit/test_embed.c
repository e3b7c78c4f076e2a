/* Unit tests of ps/embed: the embedding table's index, rows, policies
 * (admission, expiry, capacity) and sparse optimizers, without gRPC. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/embed_key.h"
#include "embed.h"
#include "tests/support/assert.h"

static ps_embed_spec spec_of(const char *name, int64_t dim) {
  ps_embed_spec s = {.name = name, .dtype = PS_DT_FLOAT, .dim = dim};
  ps_init_spec_default(&s.init, PS_INIT_RANDOM_NORMAL);
  s.init.stddev = 0.1;
  s.init.seed = 7;
  return s;
}

static ps_embed_table *make(ps_embed_store *es, const ps_embed_spec *sp) {
  ps_status st;
  bool created;
  PS_ASSERT_OK(ps_embed_create(es, sp, &created, &st), st);
  ps_embed_table *t = ps_embed_find(es, sp->name, &st);
  ck_assert_ptr_nonnull(t);
  return t;
}

static int64_t rows_of(ps_embed_table *t) {
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  return s.rows;
}

static void lookup1(ps_embed_table *t, int64_t key, int64_t step, float *out) {
  ps_status st;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_lookup(t, &key, 1, true, step, out, &c, &st), st);
}

START_TEST(create_checks_and_conflicts) {
  ps_embed_store *es = ps_embed_store_create();
  ps_status st;
  bool created;
  ps_embed_spec sp = spec_of("emb", 8);
  PS_ASSERT_OK(ps_embed_create(es, &sp, &created, &st), st);
  ck_assert(created);
  PS_ASSERT_OK(ps_embed_create(es, &sp, &created, &st), st);
  ck_assert(!created);
  ps_embed_spec other = sp;
  other.dim = 16;
  PS_ASSERT_STATUS(ps_embed_create(es, &other, &created, &st), st, PS_ALREADY_EXISTS,
                   "TableCreate emb: the table exists with another dim");
  other = sp;
  other.policy.max_rows = 10;
  PS_ASSERT_STATUS(ps_embed_create(es, &other, &created, &st), st, PS_ALREADY_EXISTS,
                   "another max_rows");
  ps_embed_spec b = sp;
  b.name = "b";
  b.dtype = PS_DT_DOUBLE;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "TableCreate b: dtype double is not supported");
  b = sp;
  b.name = "b";
  b.dim = 0;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "TableCreate b: dim 0 is out of range (1 to 65536)");
  b.dim = 4;
  b.policy.min_count = 70000;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "min_count 70000 is out of range (0 to 65535)");
  b.policy.min_count = 0;
  b.policy.max_rows = -1;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "max_rows -1 is out of range");
  b.policy.max_rows = 0;
  b.policy.sketch_width = 3;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "sketch_width 3 is out of range");
  b.policy.sketch_width = 0;
  b.policy.ttl_seconds = -5;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "ttl_seconds -5 is out of range");
  b.policy.ttl_seconds = 0;
  b.slot_init = -1;
  PS_ASSERT_STATUS(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT,
                   "slot_init -1 is out of range");
  b.slot_init = 0;
  b.init.stddev = -1;
  PS_ASSERT_CODE(ps_embed_check_spec(&b, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_ptr_null(ps_embed_find(es, "nope", &st));
  ck_assert_str_eq(st.msg, "table nope not found");
  PS_ASSERT_OK(ps_embed_drop(es, "emb", &st), st);
  PS_ASSERT_CODE(ps_embed_drop(es, "emb", &st), st, PS_NOT_FOUND);
  ps_embed_store_destroy(es);
}
END_TEST

START_TEST(rows_are_deterministic_per_seed_table_and_key) {
  ps_embed_store *a = ps_embed_store_create(), *b = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 16);
  ps_embed_table *ta = make(a, &sp), *tb = make(b, &sp);
  /* keys of any value, b's in another order and spread (another ps) */
  int64_t keys[] = {0, -1, INT64_MIN, INT64_MAX, 42, 1LL << 40};
  float ra[6 * 16], rb[6 * 16], one[16];
  ps_status st;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_lookup(ta, keys, 6, true, 0, ra, &c, &st), st);
  ck_assert_int_eq(c.created, 6);
  for (int i = 5; i >= 0; i--) {
    lookup1(tb, keys[i], 0, one);
    memcpy(rb + i * 16, one, sizeof one);
  }
  ck_assert_mem_eq(ra, rb, sizeof ra);
  /* rows differ by key, and look like N(0, 0.1) */
  ck_assert(memcmp(ra, ra + 16, 16 * sizeof(float)) != 0);
  double sq = 0;
  for (int i = 0; i < 6 * 16; i++)
    sq += (double)ra[i] * ra[i];
  ck_assert(sqrt(sq / 96) > 0.05 && sqrt(sq / 96) < 0.2);
  /* the default row is the row a lookup makes */
  PS_ASSERT_OK(ps_embed_default_row(ta, 42, one, &st), st);
  ck_assert_mem_eq(one, ra + 4 * 16, sizeof one);
  /* another table name: other rows */
  ps_embed_spec sp2 = spec_of("emb2", 16);
  ps_embed_table *t2 = make(a, &sp2);
  lookup1(t2, 42, 0, one);
  ck_assert(memcmp(one, ra + 4 * 16, sizeof one) != 0);
  ps_embed_unref(t2);
  ps_embed_unref(ta);
  ps_embed_unref(tb);
  ps_embed_store_destroy(a);
  ps_embed_store_destroy(b);
}
END_TEST

START_TEST(inference_lookups_change_nothing) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  ps_embed_table *t = make(es, &sp);
  int64_t k = 9;
  float r[4], d[4];
  ps_status st;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_lookup(t, &k, 1, false, 0, r, &c, &st), st);
  ck_assert_int_eq(c.missing, 1);
  ck_assert_int_eq(rows_of(t), 0);
  PS_ASSERT_OK(ps_embed_default_row(t, 9, d, &st), st);
  ck_assert_mem_eq(r, d, sizeof r);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

/* Many keys in and out (eviction churn), and every row still found with
 * the value written to it: the index's backward shift and the records'
 * moves keep each key's row. */
START_TEST(index_survives_churn) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 2);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  sp.policy.max_rows = 200000;
  ps_embed_table *t = make(es, &sp);
  enum { N = 400000, B = 4096 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *g = malloc((size_t)B * 2 * sizeof *g),
        *out = malloc((size_t)B * 2 * sizeof *out);
  ck_assert(keys && g && out);
  for (int64_t i = 0; i < N; i++)
    keys[i] = (int64_t)ps_embed_key_hash(i * 7919) ^ 0x5555;
  ps_status st;
  ps_embed_counts c;
  for (int64_t i = 0; i < N; i += B) {
    size_t n = (size_t)(N - i < B ? N - i : B);
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, n, true, i / B, out, &c, &st), st);
    for (size_t k = 0; k < n; k++) {
      g[2 * k] = (float)(keys[i + k] & 0xffff);
      g[2 * k + 1] = (float)((i + (int64_t)k) & 0xffff);
    }
    PS_ASSERT_OK(
        ps_embed_update(t, PS_EMBED_SCATTER_ADD, keys + i, n, g, NULL, i / B, &c, &st),
        st);
    ck_assert_int_eq(c.missing, 0);
  }
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  ck_assert_int_le(s.rows, 200000);
  ck_assert_int_ge(s.rows, 199000);
  ck_assert_int_eq(s.rows + s.evicted_total, N);
  /* every key still held has its own value; every other is gone */
  int64_t held = 0;
  for (int64_t i = 0; i < N; i += B) {
    size_t n = (size_t)(N - i < B ? N - i : B);
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, n, false, 0, out, &c, &st), st);
    for (size_t k = 0; k < n; k++) {
      if (out[2 * k] == 0 && out[2 * k + 1] == 0) continue;
      held++;
      ck_assert_float_eq(out[2 * k], (float)(keys[i + k] & 0xffff));
      ck_assert_float_eq(out[2 * k + 1], (float)((i + (int64_t)k) & 0xffff));
    }
  }
  ck_assert_int_ge(held, s.rows - 5); /* a few keys may have written zeros */
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
  free(keys);
  free(g);
  free(out);
}
END_TEST

/* The overhead beyond key and row (DESIGN.md: at most 24 bytes a row),
 * at a million rows. */
START_TEST(overhead_per_row_is_bounded) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 16);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  ps_embed_table *t = make(es, &sp);
  enum { N = 1000000, B = 8192 };
  int64_t *keys = malloc(B * sizeof *keys);
  float *out = malloc((size_t)B * 16 * sizeof *out);
  ck_assert(keys && out);
  ps_status st;
  ps_embed_counts c;
  for (int64_t i = 0; i < N; i += B) {
    size_t n = (size_t)(N - i < B ? N - i : B);
    for (size_t k = 0; k < n; k++)
      keys[k] = (int64_t)ps_embed_key_hash(i + (int64_t)k);
    PS_ASSERT_OK(ps_embed_lookup(t, keys, n, true, 0, out, &c, &st), st);
  }
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  ck_assert_int_eq(s.rows, N);
  double per_row = (double)s.bytes / (double)s.rows - 8 - 16 * sizeof(float);
  ck_assert_msg(per_row <= 24, "%.1f bytes of overhead per row", per_row);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
  free(keys);
  free(out);
}
END_TEST

START_TEST(admission_needs_min_count_sightings) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.policy.min_count = 3;
  ps_embed_table *t = make(es, &sp);
  float r[4], d[4];
  ps_status st;
  for (int i = 0; i < 2; i++) {
    lookup1(t, 77, 0, r);
    ck_assert_int_eq(rows_of(t), 0);
    PS_ASSERT_OK(ps_embed_default_row(t, 77, d, &st), st);
    ck_assert_mem_eq(r, d, sizeof r); /* a refused key reads its default row */
  }
  /* an update of a key without a row is dropped */
  float g[4] = {1, 1, 1, 1};
  int64_t k = 77;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_SCATTER_ADD, &k, 1, g, NULL, 0, &c, &st), st);
  ck_assert_int_eq(c.missing, 1);
  lookup1(t, 77, 0, r);
  ck_assert_int_eq(rows_of(t), 1);
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  ck_assert_int_eq(s.refused_total, 2);
  /* the sketch is bounded: 100000 unseen keys, no growth beyond it */
  int64_t before = s.bytes;
  int64_t *keys = malloc(100000 * sizeof *keys);
  float *out = malloc(100000 * 4 * sizeof *out);
  for (int i = 0; i < 100000; i++)
    keys[i] = 1000000 + i;
  PS_ASSERT_OK(ps_embed_lookup(t, keys, 100000, true, 0, out, &c, &st), st);
  ck_assert_int_eq(c.refused, 100000 - c.created);
  ck_assert_int_lt(c.created, 1000); /* the sketch overcounts a few */
  ps_embed_table_stats(t, &s);
  /* the sketch (64 stripes x 4 x 16384 counters of 2 bytes) and the
   * admitted rows with their index */
  ck_assert_int_le(s.bytes - before, (8 << 20) + c.created * 40 + 64 * 1024 * 36);
  free(keys);
  free(out);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

START_TEST(rows_expire_by_steps) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.policy.ttl_steps = 5;
  ps_embed_table *t = make(es, &sp);
  float r[4], first[4];
  lookup1(t, 1, 1, first);
  lookup1(t, 2, 1, r);
  /* key 1 is touched at step 6 by an update, key 2 is not */
  ps_status st;
  ps_embed_counts c;
  float g[4] = {1, 1, 1, 1};
  int64_t k = 1;
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_SCATTER_ADD, &k, 1, g, NULL, 6, &c, &st), st);
  ck_assert_int_eq(rows_of(t), 2);
  /* an inference lookup's step moves no clock: at step 6, key 2 (touched
   * at 1) is 5 steps old and still there */
  k = 2;
  PS_ASSERT_OK(ps_embed_lookup(t, &k, 1, false, 7, r, &c, &st), st);
  ck_assert_int_eq(c.missing, 0);
  /* a training call at step 7: now key 2 is 6 steps old, expired */
  lookup1(t, 1, 7, r);
  ck_assert_float_eq(r[0], first[0] + 1);
  PS_ASSERT_OK(ps_embed_lookup(t, &k, 1, false, 7, r, &c, &st), st);
  ck_assert_int_eq(c.missing, 1);
  ck_assert_int_eq(rows_of(t), 2); /* inference changes nothing */
  ck_assert_int_eq(ps_embed_sweep(t), 1);
  ck_assert_int_eq(rows_of(t), 1);
  /* a key that comes back gets a fresh row */
  float d[4];
  lookup1(t, 2, 13, r);
  PS_ASSERT_OK(ps_embed_default_row(t, 2, d, &st), st);
  ck_assert_mem_eq(r, d, sizeof r);
  ck_assert_int_eq(ps_embed_sweep(t), 1); /* key 1, touched at 7 */
  /* an inference lookup's step (a serving client's) moves no clock */
  k = 2;
  PS_ASSERT_OK(ps_embed_lookup(t, &k, 1, false, 1000000, r, &c, &st), st);
  ck_assert_int_eq(ps_embed_sweep(t), 0);
  ck_assert_int_eq(rows_of(t), 1);
  /* rows restored without versions (TensorFlow's own tables) age once
   * touched, not at once */
  ps_embed_export x = {.n = 1, .dim = 4, .keys = (int64_t[]){55}, .values = r};
  PS_ASSERT_OK(ps_embed_replace(t, &x, &st), st);
  k = 56;
  PS_ASSERT_OK(ps_embed_lookup(t, &k, 1, true, 500, r, &c, &st), st);
  ck_assert_int_eq(ps_embed_sweep(t), 0);
  ck_assert_int_eq(rows_of(t), 2);
  /* training calls sweep the stripes they visit: 10000 old rows go while
   * 10000 new keys arrive, with no sweep of its own */
  enum { N = 10000 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *out = malloc(N * 4 * sizeof *out);
  for (int i = 0; i < N; i++)
    keys[i] = 100 + i;
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, true, 520, out, &c, &st), st);
  for (int i = 0; i < N; i++)
    keys[i] = 100000 + i;
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, true, 530, out, &c, &st), st);
  ck_assert_int_ge(c.expired, N * 9 / 10);
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  ck_assert_int_le(s.rows, N + N / 10);
  free(keys);
  free(out);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

START_TEST(capacity_evicts_least_recently_used) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.policy.max_rows = 4;
  ps_embed_table *t = make(es, &sp);
  float r[4];
  for (int64_t k = 1; k <= 4; k++)
    lookup1(t, k, k, r);
  lookup1(t, 1, 5, r); /* 2 is now the least recently used */
  lookup1(t, 5, 6, r);
  ck_assert_int_eq(rows_of(t), 4);
  ps_status st;
  ps_embed_counts c;
  int64_t keys[] = {1, 2, 3, 4, 5};
  float out[20];
  PS_ASSERT_OK(ps_embed_lookup(t, keys, 5, false, 0, out, &c, &st), st);
  ck_assert_int_eq(c.missing, 1);
  float g[4] = {1, 1, 1, 1};
  int64_t k = 2;
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_SCATTER_ADD, &k, 1, g, NULL, 6, &c, &st), st);
  ck_assert_int_eq(c.missing, 1); /* 2 went */
  ps_embed_stats s;
  ps_embed_table_stats(t, &s);
  ck_assert_int_eq(s.evicted_total, 1);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

START_TEST(capacity_evicts_least_frequently_used) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.policy.max_rows = 3;
  sp.policy.evict = PS_EMBED_EVICT_LFU;
  ps_embed_table *t = make(es, &sp);
  float r[4];
  for (int i = 0; i < 3; i++)
    lookup1(t, 3, 0, r);
  lookup1(t, 1, 0, r); /* the newest, but used once */
  for (int i = 0; i < 2; i++)
    lookup1(t, 2, 0, r);
  lookup1(t, 4, 0, r);
  ps_status st;
  ps_embed_counts c;
  float g[4] = {1, 1, 1, 1};
  int64_t k = 1;
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_SCATTER_ADD, &k, 1, g, NULL, 0, &c, &st), st);
  ck_assert_int_eq(c.missing, 1);
  int64_t keep[] = {2, 3, 4};
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_SCATTER_ADD, keep, 1, g, NULL, 0, &c, &st),
               st);
  ck_assert_int_eq(c.missing, 0);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

/* The sparse optimizers against their formulas, two steps of one row
 * (in double here, float on the ps: compared to 1e-5 relative). */
START_TEST(optimizers_follow_their_formulas) {
  ps_embed_store *es = ps_embed_store_create();
  const int D = 3;
  float g[3] = {0.5f, -1.0f, 0.25f};
  ps_status st;
  ps_embed_counts c;
  int64_t k = 11;
  for (int o = PS_EMBED_OPT_NONE; o <= PS_EMBED_OPT_FTRL; o++) {
    char name[32];
    snprintf(name, sizeof name, "t%d", o);
    ps_embed_spec sp = spec_of(name, D);
    sp.optimizer = (ps_embed_optimizer)o;
    sp.slot_init = 0.1;
    ps_embed_table *t = make(es, &sp);
    float w0[3], w[3];
    lookup1(t, k, 0, w0);
    ps_embed_op op = o == PS_EMBED_OPT_NONE      ? PS_EMBED_SGD
                     : o == PS_EMBED_OPT_ADAGRAD ? PS_EMBED_ADAGRAD
                     : o == PS_EMBED_OPT_ADAM    ? PS_EMBED_ADAM
                                                 : PS_EMBED_FTRL;
    double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-7, l1 = 0.01, l2 = 0.02;
    double ref[3], s1[3], s2[3];
    for (int j = 0; j < D; j++) {
      ref[j] = w0[j];
      s1[j] = o == PS_EMBED_OPT_ADAM ? 0 : 0.1;
      s2[j] = 0;
    }
    for (int stepn = 1; stepn <= 2; stepn++) {
      double hp[6] = {lr, 0, 0, 0, 0, 0};
      if (op == PS_EMBED_ADAM) {
        hp[1] = b1, hp[2] = b2, hp[3] = eps, hp[4] = pow(b1, stepn),
        hp[5] = pow(b2, stepn);
      } else if (op == PS_EMBED_FTRL) {
        hp[1] = l1, hp[2] = l2, hp[3] = -0.5;
      }
      PS_ASSERT_OK(ps_embed_update(t, op, &k, 1, g, hp, stepn, &c, &st), st);
      for (int j = 0; j < D; j++) {
        double gj = g[j];
        if (op == PS_EMBED_SGD) {
          ref[j] -= lr * gj;
        } else if (op == PS_EMBED_ADAGRAD) {
          s1[j] += gj * gj;
          ref[j] -= lr * gj / sqrt(s1[j]);
        } else if (op == PS_EMBED_ADAM) {
          double alpha = lr * sqrt(1 - hp[5]) / (1 - hp[4]);
          s1[j] += (gj - s1[j]) * (1 - b1);
          s2[j] += (gj * gj - s2[j]) * (1 - b2);
          ref[j] -= s1[j] * alpha / (sqrt(s2[j]) + eps);
        } else {
          double na = s1[j] + gj * gj;
          s2[j] += gj - (sqrt(na) - sqrt(s1[j])) / lr * ref[j];
          double quad = sqrt(na) / lr + 2 * l2;
          ref[j] = fabs(s2[j]) > l1 ? ((s2[j] > 0 ? l1 : -l1) - s2[j]) / quad : 0;
          s1[j] = na;
        }
      }
    }
    lookup1(t, k, 3, w);
    for (int j = 0; j < D; j++)
      ck_assert_msg(fabs(w[j] - ref[j]) <= 1e-5 * (1 + fabs(ref[j])),
                    "%s element %d: %.8g, want %.8g", name, j, w[j], ref[j]);
    /* another optimizer's op is refused and changes nothing */
    if (o != PS_EMBED_OPT_ADAGRAD) {
      double hp[1] = {0.1};
      PS_ASSERT_STATUS(ps_embed_update(t, PS_EMBED_ADAGRAD, &k, 1, g, hp, 4, &c, &st), st,
                       PS_INVALID_ARGUMENT,
                       "ApplyAdagrad needs a table made for its "
                       "optimizer");
      float after[3];
      lookup1(t, k, 4, after);
      ck_assert_mem_eq(after, w, sizeof w);
    }
    ps_embed_unref(t);
  }
  ps_embed_store_destroy(es);
}
END_TEST

/* A snapshot keeps the rows as they were when it was taken, however the
 * table changes before it is exported; a replace brings them back, with
 * their slots and counters. */
/* A large table's chunks come from its pool of 2 MiB blocks: they move
 * with a restore, and blocks whose rows are all gone are given back. */
START_TEST(large_tables_take_and_give_back_blocks) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 16);
  sp.policy.ttl_steps = 5;
  ps_embed_table *t = make(es, &sp);
  enum { N = 400000, B = 8192 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *out = malloc((size_t)N * 16 * sizeof *out);
  ck_assert(keys && out);
  for (int64_t i = 0; i < N; i++)
    keys[i] = (int64_t)(ps_embed_key_hash(i) * 3u);
  ps_status st;
  ps_embed_counts c;
  for (int64_t i = 0; i < N; i += B)
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, (size_t)(N - i < B ? N - i : B), true, 1,
                                 out + i * 16, &c, &st),
                 st);
  ps_embed_stats s0, s1, s2;
  ps_embed_table_stats(t, &s0);
  ck_assert_int_eq(s0.rows, N);
  /* a restore of the table's own rows: the same rows, the same memory */
  ps_embed_snap *snap = ps_embed_snap_begin(t);
  ck_assert_ptr_nonnull(snap);
  ps_embed_export e;
  PS_ASSERT_OK(ps_embed_snap_export(snap, &e, &st), st);
  ps_embed_snap_free(snap);
  PS_ASSERT_OK(ps_embed_replace(t, &e, &st), st);
  ps_embed_export_fini(&e);
  ps_embed_table_stats(t, &s1);
  ck_assert_int_eq(s1.rows, N);
  ck_assert_int_le(llabs(s1.bytes - s0.bytes), 4 << 20);
  float *again = malloc((size_t)B * 16 * sizeof *again);
  ck_assert_ptr_nonnull(again);
  for (int64_t i = 0; i < N; i += B) {
    size_t n = (size_t)(N - i < B ? N - i : B);
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, n, false, 0, again, &c, &st), st);
    ck_assert_int_eq(c.missing, 0);
    ck_assert_mem_eq(again, out + i * 16, n * 16 * sizeof(float));
  }
  /* every row expires: the blocks go back, the index and each stripe's
   * first chunks stay */
  PS_ASSERT_OK(ps_embed_lookup(t, keys, 1, true, 100, again, &c, &st), st);
  /* (the lookup's own key expired and came back; the call swept some) */
  ck_assert_int_eq(c.expired + ps_embed_sweep(t), N);
  ps_embed_table_stats(t, &s2);
  ck_assert_int_eq(s2.rows, 1);
  ck_assert_msg(s2.bytes < 12 << 20, "%lld bytes left of %lld", (long long)s2.bytes,
                (long long)s1.bytes);
  ps_embed_unref(t);
  /* one stripe of 60000 rows: its index grows through 256 and 512 KiB,
   * pieces of the pool's blocks, and moves with a restore */
  ps_embed_spec one = spec_of("one", 16);
  one.policy.max_rows = 60000;
  t = make(es, &one);
  enum { M = 60000 };
  for (int64_t i = 0; i < M; i += B)
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, (size_t)(M - i < B ? M - i : B), true, 1,
                                 out + i * 16, &c, &st),
                 st);
  snap = ps_embed_snap_begin(t);
  ck_assert_ptr_nonnull(snap);
  PS_ASSERT_OK(ps_embed_snap_export(snap, &e, &st), st);
  ps_embed_snap_free(snap);
  PS_ASSERT_OK(ps_embed_replace(t, &e, &st), st);
  ps_embed_export_fini(&e);
  ck_assert_int_eq(rows_of(t), M);
  for (int64_t i = 0; i < M; i += B) {
    size_t n = (size_t)(M - i < B ? M - i : B);
    PS_ASSERT_OK(ps_embed_lookup(t, keys + i, n, false, 0, again, &c, &st), st);
    ck_assert_int_eq(c.missing, 0);
    ck_assert_mem_eq(again, out + i * 16, n * 16 * sizeof(float));
  }
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
  free(keys);
  free(out);
  free(again);
}
END_TEST

START_TEST(snapshots_copy_on_write_and_replace_restores) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.optimizer = PS_EMBED_OPT_ADAGRAD;
  ps_embed_table *t = make(es, &sp);
  enum { N = 5000 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *before = malloc(N * 4 * sizeof *before), *out = malloc(N * 4 * sizeof *out);
  float *g = malloc(N * 4 * sizeof *g);
  for (int i = 0; i < N; i++)
    keys[i] = i * 31;
  for (int i = 0; i < N * 4; i++)
    g[i] = 0.5f;
  ps_status st;
  ps_embed_counts c;
  double lr[1] = {0.1};
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, true, 3, before, &c, &st), st);
  ps_embed_snap *snap = ps_embed_snap_begin(t);
  ck_assert_ptr_nonnull(snap);
  /* half the keys change, and new ones come */
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_ADAGRAD, keys, N / 2, g, lr, 4, &c, &st), st);
  int64_t fresh[3] = {-1, -2, -3};
  float f3[12];
  PS_ASSERT_OK(ps_embed_lookup(t, fresh, 3, true, 4, f3, &c, &st), st);
  ps_embed_export e;
  PS_ASSERT_OK(ps_embed_snap_export(snap, &e, &st), st);
  ps_embed_snap *second = ps_embed_snap_begin(t);
  ck_assert_int_eq(e.n, N);
  ck_assert_int_eq(e.nslots, 1);
  for (int64_t i = 0; i < e.n; i++) {
    int64_t k = e.keys[i];
    ck_assert(k >= 0 && k % 31 == 0);
    ck_assert_mem_eq(e.values + i * 4, before + (k / 31) * 4, 4 * sizeof(float));
    ck_assert_float_eq(e.slots[0][i * 4], 0.1f);
    ck_assert_int_eq(e.versions[i], 3);
    ck_assert_int_eq(e.freqs[i], 1);
  }
  ps_embed_export e2;
  PS_ASSERT_OK(ps_embed_snap_export(second, &e2, &st), st);
  ck_assert_int_eq(e2.n, N + 3);
  ps_embed_snap_free(second);
  ps_embed_export_fini(&e2);
  /* a snapshot taken while an older one still waits: the older one's save
   * fails (no copy under the closed gate), the newer one's works */
  ps_embed_snap *older = ps_embed_snap_begin(t), *newer = ps_embed_snap_begin(t);
  PS_ASSERT_STATUS(ps_embed_snap_export(older, &e2, &st), st, PS_ABORTED,
                   "table emb: a newer snapshot was taken before this save copied the "
                   "table; save again");
  PS_ASSERT_OK(ps_embed_snap_export(newer, &e2, &st), st);
  ck_assert_int_eq(e2.n, N + 3);
  ps_embed_export_fini(&e2);
  ps_embed_snap_free(older);
  ps_embed_snap_free(newer);
  /* another dim is refused, nothing changes */
  ps_embed_export bad = e;
  bad.dim = 8;
  PS_ASSERT_STATUS(ps_embed_replace(t, &bad, &st), st, PS_INVALID_ARGUMENT,
                   "table emb: the rows have dim 8, the table's dim is 4");
  ck_assert_int_eq(rows_of(t), N + 3);
  /* the snapshot back: the updates and the new keys are gone */
  PS_ASSERT_OK(ps_embed_replace(t, &e, &st), st);
  ck_assert_int_eq(rows_of(t), N);
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, false, 0, out, &c, &st), st);
  ck_assert_int_eq(c.missing, 0);
  ck_assert_mem_eq(out, before, N * 4 * sizeof(float));
  /* the accumulators came back too: the same update gives the same rows */
  float *again = malloc(N * 4 * sizeof *again);
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_ADAGRAD, keys, N / 2, g, lr, 4, &c, &st), st);
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, false, 0, again, &c, &st), st);
  for (int i = 0; i < N / 2; i++)
    ck_assert_float_eq_tol(again[i * 4],
                           before[i * 4] - 0.1f * 0.5f / sqrtf(0.1f + 0.25f), 1e-6);
  free(again);
  ps_embed_export_fini(&e);
  ps_embed_snap_free(snap);
  /* a snapshot dropped without an export lets go of the table */
  ps_embed_snap_free(ps_embed_snap_begin(t));
  PS_ASSERT_OK(ps_embed_update(t, PS_EMBED_ADAGRAD, keys, N, g, lr, 5, &c, &st), st);
  free(keys);
  free(before);
  free(out);
  free(g);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

/* A snapshot holds the rows as they were while rows expire (their places
 * taken by the last records, chunks freed), new rows take the freed
 * places, and a restore replaces every row. */
START_TEST(snapshots_hold_through_removals_and_reuse) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  sp.policy.ttl_steps = 5;
  sp.policy.max_rows = 60000; /* one stripe: chunks free as it shrinks */
  ps_embed_table *t = make(es, &sp);
  enum { N = 8000 };
  int64_t *keys = malloc(2 * N * sizeof *keys);
  float *before = malloc(N * 4 * sizeof *before), *out = malloc(2 * N * 4 * sizeof *out);
  ck_assert(keys && before && out);
  for (int i = 0; i < 2 * N; i++)
    keys[i] = (int64_t)ps_embed_key_hash(i) | 1;
  ps_status st;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_lookup(t, keys, N, true, 1, before, &c, &st), st);
  for (int round = 0; round < 2; round++) {
    ps_embed_snap *snap = ps_embed_snap_begin(t);
    ck_assert_ptr_nonnull(snap);
    if (round == 0) {
      /* the first half of the keys (the first records) is touched at step
       * 10; the rest expire and are swept, the last records moving into
       * their places and the last chunks freed; new keys take them */
      PS_ASSERT_OK(ps_embed_lookup(t, keys, N / 2, true, 10, out, &c, &st), st);
      ps_embed_sweep(t);
      ck_assert_int_eq(rows_of(t), N / 2);
      PS_ASSERT_OK(ps_embed_lookup(t, keys + N, N, true, 10, out, &c, &st), st);
      ck_assert_int_eq(rows_of(t), N / 2 + N);
    } else {
      /* a restore of other rows replaces them all */
      ps_embed_export other = {0};
      PS_ASSERT_OK(ps_embed_lookup(t, keys + N, 10, false, 0, out, &c, &st), st);
      other.n = 10;
      other.dim = 4;
      other.keys = keys + N;
      other.values = out;
      PS_ASSERT_OK(ps_embed_replace(t, &other, &st), st);
      ck_assert_int_eq(rows_of(t), 10);
    }
    ps_embed_export e;
    PS_ASSERT_OK(ps_embed_snap_export(snap, &e, &st), st);
    ps_embed_snap_free(snap);
    /* round 0: the first N keys at step 1; round 1: the table after round
     * 0 (half of them touched at step 10, N new ones) */
    ck_assert_int_eq(e.n, round == 0 ? N : N / 2 + N);
    int64_t seen = 0;
    for (int64_t i = 0; i < e.n; i++) {
      int64_t k = e.keys[i];
      for (int j = 0; j < N; j++) {
        if (keys[j] != k) continue;
        ck_assert_mem_eq(e.values + i * 4, before + j * 4, 4 * sizeof(float));
        ck_assert_int_eq(e.versions[i], round == 0 ? 1 : 10);
        seen++;
        break;
      }
    }
    ck_assert_int_eq(seen, round == 0 ? N : N / 2);
    ps_embed_export_fini(&e);
  }
  free(keys);
  free(before);
  free(out);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

/* Lookups and updates from several threads on shared keys (also run
 * under ThreadSanitizer): the counts add up. */
typedef struct worker_arg {
  ps_embed_table *t;
  int id;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  enum { B = 512 };
  int64_t keys[B];
  float out[B * 4], g[B * 4];
  for (int i = 0; i < B * 4; i++)
    g[i] = 1;
  uint64_t x = 88172645463325252ull + (uint64_t)a->id;
  ps_status st;
  ps_embed_counts c;
  for (int it = 0; it < 40; it++) {
    for (int i = 0; i < B; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      keys[i] = (int64_t)(x % 20000);
    }
    if (ps_embed_lookup(a->t, keys, B, true, it, out, &c, &st) != 0) return "lookup";
    if (ps_embed_update(a->t, PS_EMBED_SCATTER_ADD, keys, B, g, NULL, it, &c, &st) != 0)
      return "update";
  }
  return NULL;
}

START_TEST(threads_share_a_table) {
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = spec_of("emb", 4);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  ps_embed_table *t = make(es, &sp);
  pthread_t th[4];
  worker_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (worker_arg){t, i};
    pthread_create(&th[i], NULL, worker, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    ck_assert_ptr_null(r);
  }
  /* every update found its row: the rows' values sum to 4*40*512 per column */
  int64_t keys[20000];
  for (int i = 0; i < 20000; i++)
    keys[i] = i;
  float *out = malloc(20000 * 4 * sizeof *out);
  ps_status st;
  ps_embed_counts c;
  PS_ASSERT_OK(ps_embed_lookup(t, keys, 20000, false, 0, out, &c, &st), st);
  double sum = 0;
  for (int i = 0; i < 20000; i++)
    sum += out[4 * i];
  ck_assert_double_eq(sum, 4.0 * 40 * 512);
  ck_assert_int_eq(rows_of(t), 20000 - c.missing);
  free(out);
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
}
END_TEST

int main(void) {
  Suite *s = suite_create("embed");
  TCase *tc = tcase_create("embed");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, create_checks_and_conflicts);
  tcase_add_test(tc, rows_are_deterministic_per_seed_table_and_key);
  tcase_add_test(tc, inference_lookups_change_nothing);
  tcase_add_test(tc, index_survives_churn);
  tcase_add_test(tc, overhead_per_row_is_bounded);
  tcase_add_test(tc, admission_needs_min_count_sightings);
  tcase_add_test(tc, rows_expire_by_steps);
  tcase_add_test(tc, capacity_evicts_least_recently_used);
  tcase_add_test(tc, capacity_evicts_least_frequently_used);
  tcase_add_test(tc, optimizers_follow_their_formulas);
  tcase_add_test(tc, large_tables_take_and_give_back_blocks);
  tcase_add_test(tc, snapshots_hold_through_removals_and_reuse);
  tcase_add_test(tc, snapshots_copy_on_write_and_replace_restores);
  tcase_add_test(tc, threads_share_a_table);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
