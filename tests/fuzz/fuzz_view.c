/* Fuzz target for the replication view's decoder (common/view.c): the
 * value of the etcd key /paramserver/JOB/view, which any etcd client can
 * write.  Input: byte 0 picks a task, byte 1 a shard (each may fall
 * outside the view), the rest is the view's JSON.
 *
 * Besides "no crash, no leak, no UB" it checks properties: an error
 * carries a "view: " message; a view that decodes encodes to text that
 * decodes to an equal view and encodes to the same bytes; each transition
 * (remove_task, join, rejoin, in_sync; the fuzzer's task and shard, then
 * every task of a small view; hosts none or two) either fails with a
 * message or gives a view that survives the same round trip, is one epoch
 * on exactly when it changed, is the same bytes when computed twice, and
 * did what it says (the removed task is gone, the joined one joined, the
 * synced one in sync).
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target; otherwise the shared driver (driver.c) replays the corpus and
 * deterministic mutations of it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/view.h"
#include "driver.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_view: " __VA_ARGS__);                                          \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

static void expect_error(int rc, const ps_status *st, const char *what) {
  if (rc == 0 || st->code != rc || strncmp(st->msg, "view: ", 6) != 0)
    FAIL("%s failed without a \"view: \" message (%d: %s)", what, rc, st->msg);
}

/* @v encodes, decodes back equal, and encodes to the same bytes; returns
 * the text (caller frees). */
static char *round_trip(const ps_view *v, const char *what) {
  char *text = ps_view_encode(v);
  if (text == NULL) FAIL("%s: encode failed", what);
  ps_view back;
  ps_status st = {0};
  if (ps_view_decode(text, strlen(text), v->ntasks, &back, &st) != 0)
    FAIL("%s: the encoded view does not decode: %s\n%s", what, st.msg, text);
  if (!ps_view_equal(v, &back)) FAIL("%s: round trip changed the view\n%s", what, text);
  char *again = ps_view_encode(&back);
  if (again == NULL || strcmp(text, again) != 0)
    FAIL("%s: encoding is not stable:\n%s\n%s", what, text, again ? again : "");
  free(again);
  ps_view_free(&back);
  char d[256];
  ps_view_describe(v, d, sizeof d);
  ps_view_describe(v, d, 7);
  return text;
}

enum { T_REMOVE, T_JOIN, T_REJOIN, T_IN_SYNC, T_LEAVE, T_COUNT };
static const char *const tname[] = {"remove_task", "join", "rejoin", "in_sync", "leave"};

static int apply(int kind, const ps_view *v, int task, int s, const char *const *hosts,
                 ps_view *out, bool *changed, int *lost, ps_status *st) {
  switch (kind) {
  case T_REMOVE:
    return ps_view_remove_task(v, task, out, changed, lost, st);
  case T_JOIN:
    return ps_view_join(v, task, hosts, out, changed, st);
  case T_REJOIN:
    return ps_view_rejoin(v, task, hosts, out, changed, st);
  case T_LEAVE:
    return ps_view_leave(v, task, out, changed, lost, st);
  default:
    return ps_view_in_sync(v, s, task, out, changed, st);
  }
}

static void transition(int kind, const ps_view *v, int task, int s,
                       const char *const *hosts) {
  char what[96];
  snprintf(what, sizeof what, "%s(task %d, shard %d, hosts %s)", tname[kind], task, s,
           hosts ? "two" : "none");
  ps_view out, out2;
  ps_status st = {0};
  bool changed = false, changed2 = false;
  int lost = -1;
  int rc = apply(kind, v, task, s, hosts, &out, &changed, &lost, &st);
  if (rc != 0) {
    expect_error(rc, &st, what);
    bool inside =
        task >= 0 && task < v->ntasks && (kind != T_IN_SYNC || (s >= 0 && s < v->ntasks));
    if (inside && v->epoch < INT64_MAX - 1)
      FAIL("%s refused a valid call: %s", what, st.msg);
    return;
  }
  char *text = round_trip(&out, what);
  if (changed ? out.epoch != v->epoch + 1 : !ps_view_equal(&out, v))
    FAIL("%s: changed=%d but epoch %lld -> %lld", what, changed, (long long)v->epoch,
         (long long)out.epoch);
  if (out.ntasks != v->ntasks || out.replicas != v->replicas)
    FAIL("%s changed the view's size", what);
  for (int i = 0; i < out.ntasks; i++) {
    bool p;
    int role = ps_view_role(&out, i, task, &p);
    if ((kind == T_REMOVE || kind == T_LEAVE) && role != -1)
      FAIL("%s: the task is still in shard %d", what, i);
    if (kind == T_IN_SYNC && i == s && role == PS_REPLICA_SYNCING)
      FAIL("%s: the task is still syncing", what);
    if (out.shard[i].n > out.replicas) FAIL("%s: shard %d over R", what, i);
    if (ps_view_primary(&out, i) != (out.shard[i].n ? out.shard[i].task[0] : -1))
      FAIL("%s: primary of shard %d", what, i);
    if (out.shard[i].since != v->shard[i].since && out.shard[i].since != out.epoch)
      FAIL("%s: shard %d's since went to %lld", what, i, (long long)out.shard[i].since);
  }
  if ((kind == T_REMOVE || kind == T_LEAVE) && (lost < 0 || lost > v->ntasks))
    FAIL("%s: lost %d", what, lost);
  if (kind == T_LEAVE && out.joined[task]) FAIL("%s: still joined", what);
  if (kind == T_JOIN && !out.joined[task]) FAIL("%s: not joined", what);
  /* a pure function: the same call gives the same bytes */
  rc = apply(kind, v, task, s, hosts, &out2, &changed2, NULL, &st);
  if (rc != 0 || changed2 != changed) FAIL("%s: a second call differs", what);
  char *text2 = ps_view_encode(&out2);
  if (text2 == NULL || strcmp(text, text2) != 0) FAIL("%s: not deterministic", what);
  free(text2);
  free(text);
  ps_view_free(&out2);
  ps_view_free(&out);
}

static void transitions(const ps_view *v, int task, int s) {
  static const char *const two[] = {"a", "b"};
  const char *hosts[64];
  const char *const *h = NULL;
  if (v->ntasks <= 64) {
    for (int i = 0; i < v->ntasks; i++)
      hosts[i] = two[(i / 2) % 2];
    h = hosts;
  }
  for (int k = 0; k < T_COUNT; k++) {
    transition(k, v, task, s, NULL);
    if (h) transition(k, v, task, s, h);
  }
  if (v->ntasks > 8) return;
  for (int t = 0; t < v->ntasks; t++)
    for (int k = 0; k < T_COUNT; k++)
      transition(k, v, t, (s + t) % v->ntasks, h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const char *text = (const char *)data + 2;
  size_t n = size - 2;
  ps_view v;
  ps_status st = {0};
  int rc = ps_view_decode(text, n, 0, &v, &st);
  if (rc != 0) {
    expect_error(rc, &st, "ps_view_decode");
    return 0;
  }
  /* the count the caller expects: the view's is accepted, another not */
  ps_view w;
  ps_status_clear(&st);
  if (ps_view_decode(text, n, v.ntasks, &w, &st) != 0)
    FAIL("decode with its own task count failed: %s", st.msg);
  ps_view_free(&w);
  rc = ps_view_decode(text, n, v.ntasks + 1, &w, &st);
  if (rc == 0) FAIL("decode accepted %d tasks for a view of %d", v.ntasks + 1, v.ntasks);
  expect_error(rc, &st, "ps_view_decode(ntasks + 1)");
  free(round_trip(&v, "decoded view"));
  int span = v.ntasks + 2;
  transitions(&v, (int)(data[0] % span) - 1, (int)(data[1] % span) - 1);
  ps_view_free(&v);
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of the view's JSON, so mutations reach deep paths. */
static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\"",
    "null",
    "true",
    "false",
    "0",
    "1",
    "2",
    "3",
    "-1",
    "4096",
    "1.5",
    "9223372036854775806",
    "9223372036854775807",
    "99999999999999999999",
    "\\u0000",
    "\xff",
    "\"epoch\":",
    "\"replicas\":",
    "\"joined\":",
    "\"shards\":",
    "\"syncing\":",
    "\"since\":",
    "[0,1]",
    "[2,0,1]",
    "[1]",
    "[]",
    "true,",
    "false,",
    "{\"replicas\":[1,2],\"syncing\":[2],\"since\":1},",
    "{\"replicas\":[],\"syncing\":[],\"since\":1},",
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  /* few rounds, many digit changes: most views that still decode differ
   * from a seed in their numbers (tasks, epochs, since) */
  int rounds = 1 + (int)fuzz_rnd(2);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(13)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte (the task and shard bytes too) */
      if (n) buf[fuzz_rnd(n < 2 ? n : (fuzz_rnd(2) ? 2 : n))] = (uint8_t)fuzz_rng();
      break;
    case 2:   /* insert a token */
    case 3: { /* (twice as likely) */
      const char *t = tokens[fuzz_rnd(NTOKENS)];
      n = fuzz_insert(buf, n, cap, pos < 2 && n >= 2 ? 2 : pos, t, strlen(t));
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range */
      n = fuzz_duplicate(buf, n, cap, pos, 64);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    case 7: /* a digit changed: other tasks, epochs, counts */
    case 8:
    case 9:
    case 10:
      for (size_t i = pos; i < n; i++)
        if (buf[i] >= '0' && buf[i] <= '9') {
          buf[i] = (uint8_t)('0' + fuzz_rnd(10));
          break;
        }
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
