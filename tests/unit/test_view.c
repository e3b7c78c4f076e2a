/* Unit tests for common/view.c: the ring placement (with and without
 * hosts), the JSON codec and every refusal of its decoder by its text,
 * each transition (remove_task with promotion and loss, join as a first
 * start and as a restart, rejoin, in_sync, the no-ops) and describe(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/view.h"
#include "tests/support/assert.h"

/* A view from JSON, which must decode. */
static ps_view dec(const char *json) {
  ps_view v;
  ps_status st = {0};
  PS_ASSERT_OK(ps_view_decode(json, strlen(json), 0, &v, &st), st);
  return v;
}

/* describe() of @v in a static buffer. */
static const char *desc(const ps_view *v) {
  static char buf[512];
  ps_view_describe(v, buf, sizeof buf);
  return buf;
}

static void dec_fails(const char *json, int ntasks, const char *msg) {
  ps_view v;
  memset(&v, 0x5a, sizeof v);
  ps_status st = {0};
  PS_ASSERT_STATUS(ps_view_decode(json, strlen(json), ntasks, &v, &st), st,
                   PS_INVALID_ARGUMENT, msg);
  ck_assert_msg(strncmp(st.msg, "view: ", 6) == 0, "\"%s\" does not start \"view: \"",
                st.msg);
  ck_assert_ptr_eq(v.shard, (void *)0x5a5a5a5a5a5a5a5aull); /* untouched */
}

/* ---- placement -------------------------------------------------------- */

START_TEST(test_placement_ring) {
  for (int n = 2; n <= 7; n++)
    for (int r = 2; r <= 3; r++)
      for (int s = 0; s < n; s++) {
        int t[PS_VIEW_MAX_REPLICAS];
        int want = r < n ? r : n;
        ck_assert_int_eq(ps_view_placement(n, r, NULL, s, t), want);
        for (int k = 0; k < want; k++)
          ck_assert_msg(t[k] == (s + k) % n, "N=%d R=%d shard %d: replica %d is %d", n, r,
                        s, k, t[k]);
      }
  /* one host for all is plain ring order too */
  const char *one[] = {"h", "h", "h", "h", "h"};
  int t[3];
  ck_assert_int_eq(ps_view_placement(5, 3, one, 4, t), 3);
  ck_assert_int_eq(t[0], 4);
  ck_assert_int_eq(t[1], 0);
  ck_assert_int_eq(t[2], 1);
  /* nonsense arguments place nothing */
  ck_assert_int_eq(ps_view_placement(0, 2, NULL, 0, t), 0);
  ck_assert_int_eq(ps_view_placement(3, 2, NULL, 3, t), 0);
  ck_assert_int_eq(ps_view_placement(3, 2, NULL, -1, t), 0);
  ck_assert_int_eq(ps_view_placement(3, 0, NULL, 0, t), 0);
}
END_TEST

static void expect_place(int n, int r, const char *const *hosts, int s, int a, int b,
                         int c) {
  int t[3] = {-1, -1, -1}, want[3] = {a, b, c};
  ck_assert_int_eq(ps_view_placement(n, r, hosts, s, t), r);
  for (int k = 0; k < r; k++)
    ck_assert_msg(t[k] == want[k], "shard %d: replica %d is %d, want %d", s, k, t[k],
                  want[k]);
}

START_TEST(test_placement_hosts) {
  /* 4 tasks on 2 hosts: ring order would put 0 and 1 together */
  const char *h4[] = {"a", "a", "b", "b"};
  expect_place(4, 2, h4, 0, 0, 2, -1);
  expect_place(4, 2, h4, 1, 1, 2, -1);
  expect_place(4, 2, h4, 2, 2, 0, -1);
  expect_place(4, 2, h4, 3, 3, 0, -1);
  /* R = 3 on 2 hosts: the third goes back to ring order */
  const char *h31[] = {"a", "a", "a", "b"};
  expect_place(4, 3, h31, 0, 0, 3, 1);
  expect_place(4, 3, h31, 1, 1, 3, 2);
  expect_place(4, 3, h31, 2, 2, 3, 0);
  expect_place(4, 3, h31, 3, 3, 0, 1);
  /* 6 tasks on 3 hosts, R = 3: one replica per host */
  const char *h6[] = {"a", "a", "b", "b", "c", "c"};
  expect_place(6, 3, h6, 0, 0, 2, 4);
  expect_place(6, 3, h6, 1, 1, 2, 4);
  expect_place(6, 3, h6, 2, 2, 4, 0);
  expect_place(6, 3, h6, 3, 3, 4, 0);
  expect_place(6, 3, h6, 4, 4, 0, 2);
  expect_place(6, 3, h6, 5, 5, 0, 2);
  /* a NULL host is a host of its own */
  const char *hn[] = {NULL, NULL, "x", "x"};
  expect_place(4, 2, hn, 0, 0, 1, -1);
  expect_place(4, 3, hn, 2, 2, 0, 1);

  /* the property, N = 2..7, R = 2, 3, tasks spread over H hosts in blocks
   * (the usual launch) or round robin: replicas on different hosts
   * whenever there are hosts enough, and no task twice */
  char names[7][4];
  const char *hosts[7];
  for (int n = 2; n <= 7; n++)
    for (int nh = 1; nh <= n; nh++)
      for (int blocks = 0; blocks <= 1; blocks++) {
        for (int i = 0; i < n; i++) {
          int h = blocks ? i * nh / n : i % nh;
          snprintf(names[i], sizeof names[i], "h%d", h);
          hosts[i] = names[i];
        }
        for (int r = 2; r <= 3 && r <= n; r++)
          for (int s = 0; s < n; s++) {
            int t[3];
            ck_assert_int_eq(ps_view_placement(n, r, hosts, s, t), r);
            ck_assert_int_eq(t[0], s);
            for (int i = 0; i < r; i++)
              for (int j = 0; j < i; j++) {
                ck_assert_int_ne(t[i], t[j]);
                if (j < nh && i < nh)
                  ck_assert_msg(strcmp(hosts[t[i]], hosts[t[j]]) != 0,
                                "N=%d H=%d R=%d shard %d: ps/%d and ps/%d share %s", n,
                                nh, r, s, t[i], t[j], hosts[t[i]]);
              }
          }
      }
}
END_TEST

START_TEST(test_initial) {
  ps_view v;
  ps_status st = {0};
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  ck_assert_int_eq(v.epoch, 1);
  ck_assert_int_eq(v.replicas, 2);
  ck_assert_int_eq(v.ntasks, 3);
  ck_assert_str_eq(desc(&v), "epoch 1: 0=[0*,1] 1=[1*,2] 2=[2*,0]");
  for (int s = 0; s < 3; s++) {
    ck_assert(!v.joined[s]);
    ck_assert_int_eq(v.shard[s].since, 1);
    ck_assert_int_eq(ps_view_primary(&v, s), s);
  }
  ps_view_free(&v);
  const char *h4[] = {"a", "a", "b", "b"};
  PS_ASSERT_OK(ps_view_initial(4, 2, h4, &v, &st), st);
  ck_assert_str_eq(desc(&v), "epoch 1: 0=[0*,2] 1=[1*,2] 2=[2*,0] 3=[3*,0]");
  ps_view_free(&v);
  ps_view_free(&v); /* twice is harmless */
  ps_view_free(NULL);

  PS_ASSERT_STATUS(ps_view_initial(2, 3, NULL, &v, &st), st, PS_INVALID_ARGUMENT,
                   "--replicas 3 needs at least 3 ps tasks, the cluster has 2");
  PS_ASSERT_STATUS(ps_view_initial(3, 1, NULL, &v, &st), st, PS_INVALID_ARGUMENT,
                   "--replicas 1 is out of range (a replicated view has 2 to 3)");
  PS_ASSERT_STATUS(ps_view_initial(5, 4, NULL, &v, &st), st, PS_INVALID_ARGUMENT,
                   "--replicas 4 is out of range");
  PS_ASSERT_STATUS(ps_view_initial(0, 2, NULL, &v, &st), st, PS_INVALID_ARGUMENT,
                   "view: 0 ps tasks (a replicated job has 1 to 4096)");
  PS_ASSERT_STATUS(ps_view_initial(4097, 2, NULL, &v, &st), st, PS_INVALID_ARGUMENT,
                   "view: 4097 ps tasks");
}
END_TEST

/* ---- JSON ------------------------------------------------------------- */

START_TEST(test_encode_decode) {
  ps_view v, back;
  ps_status st = {0};
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  char *text = ps_view_encode(&v);
  ck_assert_ptr_nonnull(text);
  ck_assert_str_eq(text, "{\"epoch\":1,\"replicas\":2,\"joined\":[false,false,false],"
                         "\"shards\":[{\"replicas\":[0,1],\"syncing\":[],\"since\":1},"
                         "{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"
                         "{\"replicas\":[2,0],\"syncing\":[],\"since\":1}]}");
  PS_ASSERT_OK(ps_view_decode(text, strlen(text), 3, &back, &st), st);
  ck_assert(ps_view_equal(&v, &back));
  free(text);
  ps_view_free(&back);
  ps_view_free(&v);

  /* syncing, a lost shard, joined tasks, a later epoch; spaces and key
   * order of the input do not matter, the output is canonical */
  const char *in =
      "{ \"shards\": [ {\"since\": 7, \"syncing\": [3, 1], "
      "\"replicas\": [2, 1, 3]},\n {\"replicas\": [], \"syncing\": [], "
      "\"since\": 2}, {\"replicas\": [2,3,0], \"syncing\": [], \"since\": 1},"
      " {\"replicas\": [3], \"syncing\": [], \"since\": 9} ],"
      " \"joined\": [true, false, true, true], \"replicas\": 3,"
      " \"epoch\": 9 }";
  v = dec(in);
  ck_assert_int_eq(v.epoch, 9);
  ck_assert_int_eq(v.replicas, 3);
  ck_assert_int_eq(v.ntasks, 4);
  ck_assert(v.joined[0] && !v.joined[1] && v.joined[2] && v.joined[3]);
  ck_assert_str_eq(desc(&v), "epoch 9: 0=[2*,1~,3~] 1=[lost] 2=[2*,3,0] 3=[3*]");
  ck_assert_int_eq(ps_view_primary(&v, 0), 2);
  ck_assert_int_eq(ps_view_primary(&v, 1), -1);
  ck_assert_int_eq(ps_view_primary(&v, 4), -1);
  bool prim = true;
  ck_assert_int_eq(ps_view_role(&v, 0, 1, &prim), PS_REPLICA_SYNCING);
  ck_assert(!prim);
  ck_assert_int_eq(ps_view_role(&v, 0, 2, &prim), PS_REPLICA_IN_SYNC);
  ck_assert(prim);
  ck_assert_int_eq(ps_view_role(&v, 2, 3, NULL), PS_REPLICA_IN_SYNC);
  ck_assert_int_eq(ps_view_role(&v, 0, 0, &prim), -1);
  ck_assert(!prim);
  ck_assert_int_eq(ps_view_role(&v, 1, 1, NULL), -1);
  ck_assert_int_eq(ps_view_role(&v, 7, 1, NULL), -1);
  text = ps_view_encode(&v);
  ck_assert_str_eq(text,
                   "{\"epoch\":9,\"replicas\":3,\"joined\":[true,false,true,true],"
                   "\"shards\":[{\"replicas\":[2,1,3],\"syncing\":[1,3],\"since\":7},"
                   "{\"replicas\":[],\"syncing\":[],\"since\":2},"
                   "{\"replicas\":[2,3,0],\"syncing\":[],\"since\":1},"
                   "{\"replicas\":[3],\"syncing\":[],\"since\":9}]}");
  back = dec(text);
  ck_assert(ps_view_equal(&v, &back));
  ps_view copy;
  PS_ASSERT_OK(ps_view_copy(&v, &copy, &st), st);
  ck_assert(ps_view_equal(&v, &copy));
  copy.shard[2].state[2] = PS_REPLICA_SYNCING;
  ck_assert(!ps_view_equal(&v, &copy));
  copy.shard[2].state[2] = PS_REPLICA_IN_SYNC;
  copy.epoch++;
  ck_assert(!ps_view_equal(&v, &copy));
  ck_assert(!ps_view_equal(&v, NULL));
  ck_assert(ps_view_equal(NULL, NULL));
  free(text);
  ps_view_free(&copy);
  ps_view_free(&back);
  ps_view_free(&v);
  ck_assert_ptr_null(ps_view_encode(NULL));
}
END_TEST

START_TEST(test_decode_refusals) {
  const char *ok3 = "{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true],"
                    "\"shards\":[{\"replicas\":[0,1],\"syncing\":[1],\"since\":4},"
                    "{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"
                    "{\"replicas\":[2,0],\"syncing\":[],\"since\":1}]}";
  ps_view v = dec(ok3);
  ps_view_free(&v);
#define SHARDS3(s0)                                                                      \
  "\"shards\":[" s0 ",{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"                  \
  "{\"replicas\":[2,0],\"syncing\":[],\"since\":1}]"
#define TOP3(s0)                                                                         \
  "{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true]," SHARDS3(s0) "}"

  /* the text */
  dec_fails("", 0, "view: invalid JSON at offset 0: unexpected end of data");
  dec_fails("{\"epoch\":4", 0, "view: invalid JSON at offset 10: unexpected end of data");
  dec_fails("{\"epoch\":4,}", 0, "view: invalid JSON at offset");
  dec_fails("{\"epoch\":4} x", 0, "view: invalid JSON");
  dec_fails("{\"e\xff\":4}", 0, "view: invalid JSON");
  {
    char deep[100];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = '\0';
    dec_fails(deep, 0, "view: invalid JSON");
  }
  {
    const char nul[] = "{\"epoch\":4\0}";
    ps_view w;
    ps_status st = {0};
    PS_ASSERT_STATUS(ps_view_decode(nul, sizeof nul - 1, 0, &w, &st), st,
                     PS_INVALID_ARGUMENT, "view: invalid JSON: NUL byte at offset 10");
  }
  {
    size_t n = PS_VIEW_MAX_BYTES + 1;
    char *big = malloc(n);
    ck_assert_ptr_nonnull(big);
    memset(big, ' ', n);
    ps_view w;
    ps_status st = {0};
    PS_ASSERT_STATUS(ps_view_decode(big, n, 0, &w, &st), st, PS_INVALID_ARGUMENT,
                     "view: too large (4194305 bytes, max 4194304)");
    free(big);
  }
  {
    ps_view w;
    ps_status st = {0};
    PS_ASSERT_STATUS(ps_view_decode(ok3, strlen(ok3), -1, &w, &st), st,
                     PS_INVALID_ARGUMENT, "view: bad task count -1 (0 to 4096)");
    PS_ASSERT_STATUS(ps_view_decode(NULL, 0, 0, &w, &st), st, PS_INVALID_ARGUMENT,
                     "view: invalid JSON at offset 0: unexpected end of data");
  }
  /* the top level */
  dec_fails("[1]", 0, "view: not a JSON object");
  dec_fails("42", 0, "view: not a JSON object");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true],\"shards\":[],\"x\":1}", 0,
            "view: unknown key \"x\"");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true]}", 0,
            "view: \"shards\" is missing");
  dec_fails("{\"replicas\":2,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"epoch\" is missing");
  dec_fails("{\"epoch\":0,\"replicas\":2,\"joined\":[true, true],\"shards\":[]}", 0,
            "view: \"epoch\" must be a whole number from 1 to 9223372036854775806");
  dec_fails("{\"epoch\":-3,\"replicas\":2,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"epoch\" must be a whole number");
  dec_fails("{\"epoch\":1.5,\"replicas\":2,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"epoch\" must be a whole number");
  dec_fails("{\"epoch\":\"4\",\"replicas\":2,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"epoch\" must be a whole number");
  dec_fails("{\"epoch\":9223372036854775807,\"replicas\":2,\"joined\":[true],"
            "\"shards\":[]}",
            0, "view: \"epoch\" must be a whole number");
  dec_fails("{\"epoch\":99999999999999999999999,\"replicas\":2,\"joined\":[true],"
            "\"shards\":[]}",
            0, "view: \"epoch\" must be a whole number");
  dec_fails("{\"epoch\":4,\"replicas\":1,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"replicas\" must be 2 to 3");
  dec_fails("{\"epoch\":4,\"replicas\":4,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"replicas\" must be 2 to 3");
  dec_fails("{\"epoch\":4,\"replicas\":true,\"joined\":[true],\"shards\":[]}", 0,
            "view: \"replicas\" must be 2 to 3");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":{},\"shards\":[]}", 0,
            "view: \"joined\" must be a list of true/false");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true],\"shards\":{}}", 0,
            "view: \"shards\" must be a list of objects");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[],\"shards\":[]}", 0,
            "view: \"joined\" lists 0 tasks (1 to 4096)");
  dec_fails(ok3, 4, "view: it has 3 ps tasks, the cluster has 4");
  dec_fails(ok3, 2, "view: it has 3 ps tasks, the cluster has 2");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true,true],\"shards\":[{}]}", 0,
            "view: \"shards\" lists 1 shards for 2 ps tasks");
  dec_fails("{\"epoch\":4,\"replicas\":3,\"joined\":[true,true],\"shards\":[{},{}]}", 0,
            "view: \"replicas\" is 3, more than its 2 ps tasks");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true,1,true]," SHARDS3("{}") "}", 0,
            "view: joined[1] must be true or false");
  /* a shard */
  dec_fails(TOP3("[0,1]"), 0, "view: shard 0 must be an object");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[],\"since\":1,\"lag\":0}"), 0,
            "view: shard 0: unknown key \"lag\"");
  dec_fails(TOP3("{\"replicas\":[0,1],\"since\":1}"), 0,
            "view: shard 0: \"syncing\" is missing");
  dec_fails(TOP3("{\"replicas\":0,\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: \"replicas\" must be a list of task indices");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":null,\"since\":1}"), 0,
            "view: shard 0: \"syncing\" must be a list of task indices");
  dec_fails(TOP3("{\"replicas\":[0,1,2],\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: \"replicas\" lists 3 tasks (at most 2)");
  dec_fails(TOP3("{\"replicas\":[0,3],\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: replicas[1] must be a task index from 0 to 2");
  dec_fails(TOP3("{\"replicas\":[-1],\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: replicas[0] must be a task index from 0 to 2");
  dec_fails(TOP3("{\"replicas\":[\"1\"],\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: replicas[0] must be a task index");
  dec_fails(TOP3("{\"replicas\":[1,1],\"syncing\":[],\"since\":1}"), 0,
            "view: shard 0: \"replicas\" lists task 1 twice");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[1,1],\"since\":1}"), 0,
            "view: shard 0: \"syncing\" lists task 1 twice");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[2],\"since\":1}"), 0,
            "view: shard 0: syncing task 2 is not one of its replicas");
  dec_fails(TOP3("{\"replicas\":[],\"syncing\":[1],\"since\":1}"), 0,
            "view: shard 0: syncing task 1 is not one of its replicas");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[0],\"since\":1}"), 0,
            "view: shard 0: its primary (task 0) cannot be syncing");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[],\"since\":5}"), 0,
            "view: shard 0: \"since\" must be an epoch from 1 to the view's (4)");
  dec_fails(TOP3("{\"replicas\":[0,1],\"syncing\":[],\"since\":0}"), 0,
            "view: shard 0: \"since\" must be an epoch from 1");
  dec_fails("{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true],\"shards\":["
            "{\"replicas\":[0,1],\"syncing\":[],\"since\":1},{\"replicas\":[1,2],"
            "\"syncing\":[],\"since\":1},{\"replicas\":[2,0],\"syncing\":[]}]}",
            0, "view: shard 2: \"since\" is missing");
#undef TOP3
#undef SHARDS3
}
END_TEST

/* ---- transitions ------------------------------------------------------ */

/* @fn applied to @from gives @want (describe() text) and *changed. */
#define EXPECT(call, want_desc, want_changed)                                            \
  do {                                                                                   \
    ps_status st_ = {0};                                                                 \
    bool ch_ = !(want_changed);                                                          \
    ps_view out_;                                                                        \
    PS_ASSERT_OK(call, st_);                                                             \
    ck_assert_str_eq(desc(&out_), want_desc);                                            \
    ck_assert_int_eq(ch_, want_changed);                                                 \
    char *t_ = ps_view_encode(&out_);                                                    \
    ps_view back_;                                                                       \
    ck_assert_ptr_nonnull(t_);                                                           \
    PS_ASSERT_OK(ps_view_decode(t_, strlen(t_), out_.ntasks, &back_, &st_), st_);        \
    ck_assert(ps_view_equal(&out_, &back_));                                             \
    free(t_);                                                                            \
    ps_view_free(&back_);                                                                \
    ps_view_free(&out_);                                                                 \
  } while (0)

START_TEST(test_leave) {
  ps_view v, w, x;
  ps_status st = {0};
  bool ch;
  int lost = -1;
  /* R = 2, all joined: ps/1 stops cleanly: removed as by remove_task, and
   * no longer joined (its next start is a first start) */
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  for (int t = 0; t < 3; t++)
    v.joined[t] = true;
  EXPECT(ps_view_leave(&v, 1, &out_, &ch_, &lost, &st_),
         "epoch 2: 0=[0*] 1=[2*] 2=[2*,0]", true);
  ck_assert_int_eq(lost, 0);
  PS_ASSERT_OK(ps_view_leave(&v, 1, &w, &ch, NULL, &st), st);
  ck_assert(w.joined[0] && !w.joined[1] && w.joined[2]);
  /* the last replica of shard 1 and 2 leaves: they end, counted as lost */
  PS_ASSERT_OK(ps_view_leave(&w, 2, &x, &ch, &lost, &st), st);
  ck_assert(ch);
  ck_assert_int_eq(lost, 1);
  ck_assert_int_eq(x.shard[1].n, 0);
  ck_assert(!x.joined[2]);
  ps_view_free(&x);
  /* a task that is listed nowhere and not joined: nothing changes */
  PS_ASSERT_OK(ps_view_leave(&w, 1, &x, &ch, &lost, &st), st);
  ck_assert(!ch);
  ck_assert_int_eq(x.epoch, w.epoch);
  ps_view_free(&x);
  PS_ASSERT_STATUS(ps_view_leave(&w, 7, &x, &ch, NULL, &st), st, PS_INVALID_ARGUMENT,
                   "view: no task ps/7 (the view has 3)");
  ps_view_free(&w);
  ps_view_free(&v);
}
END_TEST

START_TEST(test_remove_primary) {
  ps_view v;
  ps_status st = {0};
  int lost = -1;
  /* R = 2: ps/1 dies; its shard goes to ps/2, since = new epoch */
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  EXPECT(ps_view_remove_task(&v, 1, &out_, &ch_, &lost, &st_),
         "epoch 2: 0=[0*] 1=[2*] 2=[2*,0]", true);
  ck_assert_int_eq(lost, 0);
  {
    ps_view w;
    bool ch;
    PS_ASSERT_OK(ps_view_remove_task(&v, 1, &w, &ch, NULL, &st), st);
    ck_assert_int_eq(w.shard[1].since, 2);
    ck_assert_int_eq(w.shard[0].since, 1);
    ck_assert_int_eq(w.shard[0].n, 1);
    ck_assert(!w.joined[1]); /* joined is kept as it is */
    /* two ps computing the same transition write the same bytes */
    ps_view w2;
    PS_ASSERT_OK(ps_view_remove_task(&v, 1, &w2, &ch, NULL, &st), st);
    char *a = ps_view_encode(&w), *b = ps_view_encode(&w2);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    ps_view_free(&w2);
    ps_view_free(&w);
  }
  ps_view_free(&v);

  /* R = 3: the first IN_SYNC backup is promoted (a SYNCING one is
   * passed over), the other backups become SYNCING */
  v = dec("{\"epoch\":5,\"replicas\":3,\"joined\":[true,true,true,true],\"shards\":["
          "{\"replicas\":[0,1,2],\"syncing\":[1],\"since\":1},"
          "{\"replicas\":[1,2,3],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[2,3,0],\"syncing\":[],\"since\":3},"
          "{\"replicas\":[3,0,1],\"syncing\":[],\"since\":1}]}");
  EXPECT(ps_view_remove_task(&v, 0, &out_, &ch_, &lost, &st_),
         "epoch 6: 0=[2*,1~] 1=[1*,2,3] 2=[2*,3] 3=[3*,1]", true);
  ck_assert_int_eq(lost, 0);
  EXPECT(ps_view_remove_task(&v, 2, &out_, &ch_, &lost, &st_),
         "epoch 6: 0=[0*,1~] 1=[1*,3] 2=[3*,0~] 3=[3*,0,1]", true);
  {
    ps_view w;
    PS_ASSERT_OK(ps_view_remove_task(&v, 2, &w, NULL, NULL, &st), st);
    ck_assert_int_eq(w.shard[2].since, 6);
    ck_assert_int_eq(w.shard[1].since, 1);
    ps_view_free(&w);
  }
  ps_view_free(&v);
}
END_TEST

START_TEST(test_remove_backup_and_lost) {
  ps_view v;
  int lost = -1;
  /* a backup leaves: order kept, primary and since unchanged */
  v = dec("{\"epoch\":2,\"replicas\":3,\"joined\":[true,true,true],\"shards\":["
          "{\"replicas\":[0,1,2],\"syncing\":[2],\"since\":1},"
          "{\"replicas\":[1,2,0],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[2,0,1],\"syncing\":[],\"since\":2}]}");
  EXPECT(ps_view_remove_task(&v, 1, &out_, &ch_, &lost, &st_),
         "epoch 3: 0=[0*,2~] 1=[2*,0~] 2=[2*,0]", true);
  ck_assert_int_eq(lost, 0);
  ps_view_free(&v);

  /* shards with no replica left, or only a SYNCING one, are lost */
  v = dec("{\"epoch\":7,\"replicas\":2,\"joined\":[true,true,true],\"shards\":["
          "{\"replicas\":[0],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[1,0],\"syncing\":[0],\"since\":1},"
          "{\"replicas\":[],\"syncing\":[],\"since\":3}]}");
  EXPECT(ps_view_remove_task(&v, 0, &out_, &ch_, &lost, &st_),
         "epoch 8: 0=[lost] 1=[1*] 2=[lost]", true);
  ck_assert_int_eq(lost, 1);
  EXPECT(ps_view_remove_task(&v, 1, &out_, &ch_, &lost, &st_),
         "epoch 8: 0=[0*] 1=[lost] 2=[lost]", true);
  ck_assert_int_eq(lost, 1);
  ps_view_free(&v);
  v = dec("{\"epoch\":7,\"replicas\":2,\"joined\":[true,true],\"shards\":["
          "{\"replicas\":[0],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[0],\"syncing\":[],\"since\":5}]}");
  EXPECT(ps_view_remove_task(&v, 0, &out_, &ch_, &lost, &st_),
         "epoch 8: 0=[lost] 1=[lost]", true);
  ck_assert_int_eq(lost, 2);
  /* no-op: the task holds nothing */
  lost = -1;
  EXPECT(ps_view_remove_task(&v, 1, &out_, &ch_, &lost, &st_), "epoch 7: 0=[0*] 1=[0*]",
         false);
  ck_assert_int_eq(lost, 0);
  ps_view_free(&v);
}
END_TEST

START_TEST(test_join) {
  ps_view v, w;
  ps_status st = {0};
  bool ch;
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  /* first start: marked joined, places kept */
  PS_ASSERT_OK(ps_view_join(&v, 1, NULL, &w, &ch, &st), st);
  ck_assert(ch);
  ck_assert_int_eq(w.epoch, 2);
  ck_assert(w.joined[1] && !w.joined[0] && !w.joined[2]);
  ck_assert_str_eq(desc(&w), "epoch 2: 0=[0*,1] 1=[1*,2] 2=[2*,0]");
  /* a restart: it leaves (shard 1 fails over to ps/2) and comes back
   * SYNCING where its placement names it */
  EXPECT(ps_view_join(&w, 1, NULL, &out_, &ch_, &st_),
         "epoch 3: 0=[0*,1~] 1=[2*,1~] 2=[2*,0]", true);
  {
    ps_view x;
    PS_ASSERT_OK(ps_view_join(&w, 1, NULL, &x, &ch, &st), st);
    ck_assert_int_eq(x.shard[1].since, 3);
    ck_assert(x.joined[1]);
    ps_view_free(&x);
  }
  ps_view_free(&w);

  /* a first start after a removal took it out: back as SYNCING */
  PS_ASSERT_OK(ps_view_remove_task(&v, 2, &w, &ch, NULL, &st), st);
  ck_assert_str_eq(desc(&w), "epoch 2: 0=[0*,1] 1=[1*] 2=[0*]");
  EXPECT(ps_view_join(&w, 2, NULL, &out_, &ch_, &st_),
         "epoch 3: 0=[0*,1] 1=[1*,2~] 2=[0*,2~]", true);
  ps_view_free(&w);
  ps_view_free(&v);

  /* a restart of the last replica of a shard: the shard is lost and stays
   * lost (it comes back only where a copy exists) */
  v = dec("{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true],\"shards\":["
          "{\"replicas\":[0],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[2,0],\"syncing\":[],\"since\":1}]}");
  EXPECT(ps_view_join(&v, 0, NULL, &out_, &ch_, &st_),
         "epoch 5: 0=[lost] 1=[1*,2] 2=[2*,0~]", true);
  ps_view_free(&v);

  /* placement with hosts decides where it comes back */
  const char *h4[] = {"a", "a", "b", "b"};
  PS_ASSERT_OK(ps_view_initial(4, 2, h4, &v, &st), st);
  for (int t = 0; t < 4; t++) {
    PS_ASSERT_OK(ps_view_join(&v, t, h4, &w, &ch, &st), st);
    ps_view_free(&v);
    v = w;
  }
  ck_assert_str_eq(desc(&v), "epoch 5: 0=[0*,2] 1=[1*,2] 2=[2*,0] 3=[3*,0]");
  EXPECT(ps_view_join(&v, 2, h4, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,2~] 1=[1*,2~] 2=[0*,2~] 3=[3*,0]", true);
  ps_view_free(&v);
}
END_TEST

START_TEST(test_rejoin_in_sync) {
  ps_view v, w;
  ps_status st = {0};
  bool ch;
  v = dec("{\"epoch\":6,\"replicas\":3,\"joined\":[true,true,true,true],\"shards\":["
          "{\"replicas\":[0,1],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[2],\"syncing\":[],\"since\":5},"
          "{\"replicas\":[],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[3,0,1],\"syncing\":[1],\"since\":1}]}");
  /* ps/2: shards 0 (placement 0,1,2) and 1 lack it; 2 is lost; 3 is full */
  EXPECT(ps_view_rejoin(&v, 2, NULL, &out_, &ch_, &st_),
         "epoch 7: 0=[0*,1,2~] 1=[2*] 2=[lost] 3=[3*,0,1~]", true);
  /* ps/3 is in the placement of shard 1 only among those lacking it */
  EXPECT(ps_view_rejoin(&v, 3, NULL, &out_, &ch_, &st_),
         "epoch 7: 0=[0*,1] 1=[2*,3~] 2=[lost] 3=[3*,0,1~]", true);
  /* ps/0: nothing lacks it where it belongs (shard 1's placement is 1,2,3) */
  EXPECT(ps_view_rejoin(&v, 0, NULL, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1~]", false);
  {
    PS_ASSERT_OK(ps_view_rejoin(&v, 2, NULL, &w, &ch, &st), st);
    ck_assert(w.joined[2]);
    ck_assert_int_eq(w.shard[0].since, 1); /* no failover */
    ps_view_free(&w);
  }

  /* in_sync: SYNCING -> IN_SYNC */
  EXPECT(ps_view_in_sync(&v, 3, 1, &out_, &ch_, &st_),
         "epoch 7: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1]", true);
  /* no-ops: already in sync, the primary, not listed, a lost shard */
  EXPECT(ps_view_in_sync(&v, 3, 0, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1~]", false);
  EXPECT(ps_view_in_sync(&v, 3, 3, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1~]", false);
  EXPECT(ps_view_in_sync(&v, 0, 2, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1~]", false);
  EXPECT(ps_view_in_sync(&v, 2, 2, &out_, &ch_, &st_),
         "epoch 6: 0=[0*,1] 1=[2*] 2=[lost] 3=[3*,0,1~]", false);
  ps_view_free(&v);
}
END_TEST

START_TEST(test_drop_backup) {
  ps_view v;
  /* ps/0 is primary of shard 0 (backup ps/1) and backup of shard 2 */
  v = dec("{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true],\"shards\":["
          "{\"replicas\":[0,1],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[2,0],\"syncing\":[],\"since\":1}]}");
  /* ps/0 cut off from ps/1 and ps/2: each primary drops the other as a
   * backup of its own shard only; no shard loses its last replica */
  EXPECT(ps_view_drop_backup(&v, 0, 1, &out_, &ch_, &st_),
         "epoch 5: 0=[0*] 1=[1*,2] 2=[2*,0]", true);
  EXPECT(ps_view_drop_backup(&v, 2, 0, &out_, &ch_, &st_),
         "epoch 5: 0=[0*,1] 1=[1*,2] 2=[2*]", true);
  /* no-ops: the primary, a task not listed there */
  EXPECT(ps_view_drop_backup(&v, 0, 0, &out_, &ch_, &st_),
         "epoch 4: 0=[0*,1] 1=[1*,2] 2=[2*,0]", false);
  EXPECT(ps_view_drop_backup(&v, 1, 0, &out_, &ch_, &st_),
         "epoch 4: 0=[0*,1] 1=[1*,2] 2=[2*,0]", false);
  ps_status st = {0};
  ps_view w;
  bool ch;
  PS_ASSERT_STATUS(ps_view_drop_backup(&v, 3, 0, &w, &ch, &st), st, PS_INVALID_ARGUMENT,
                   "view: no shard 3 (the view has 3)");
  ps_view_free(&v);
}
END_TEST

START_TEST(test_transition_errors) {
  ps_view v, w;
  ps_status st = {0};
  bool ch;
  PS_ASSERT_OK(ps_view_initial(3, 2, NULL, &v, &st), st);
  memset(&w, 0x5a, sizeof w);
  PS_ASSERT_STATUS(ps_view_remove_task(&v, 3, &w, &ch, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "view: no task ps/3 (the view has 3)");
  PS_ASSERT_STATUS(ps_view_join(&v, -1, NULL, &w, &ch, &st), st, PS_INVALID_ARGUMENT,
                   "view: no task ps/-1 (the view has 3)");
  PS_ASSERT_STATUS(ps_view_rejoin(&v, 5, NULL, &w, &ch, &st), st, PS_INVALID_ARGUMENT,
                   "view: no task ps/5");
  PS_ASSERT_STATUS(ps_view_in_sync(&v, 3, 0, &w, &ch, &st), st, PS_INVALID_ARGUMENT,
                   "view: no shard 3 (the view has 3)");
  PS_ASSERT_STATUS(ps_view_in_sync(&v, 0, 9, &w, &ch, &st), st, PS_INVALID_ARGUMENT,
                   "view: no task ps/9");
  PS_ASSERT_STATUS(ps_view_remove_task(NULL, 0, &w, &ch, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "view: no view to change");
  ck_assert_ptr_eq(w.shard, (void *)0x5a5a5a5a5a5a5a5aull); /* untouched */
  ps_view_free(&v);
  /* the last epoch cannot advance */
  v = dec("{\"epoch\":9223372036854775806,\"replicas\":2,\"joined\":[true,true],"
          "\"shards\":[{\"replicas\":[0,1],\"syncing\":[],\"since\":1},"
          "{\"replicas\":[1,0],\"syncing\":[],\"since\":1}]}");
  PS_ASSERT_STATUS(ps_view_remove_task(&v, 0, &w, &ch, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "view: epoch 9223372036854775806 cannot advance");
  ck_assert_ptr_eq(w.shard, (void *)0x5a5a5a5a5a5a5a5aull);
  ps_view_free(&v);
}
END_TEST

START_TEST(test_describe) {
  ps_view v = dec("{\"epoch\":4,\"replicas\":2,\"joined\":[true,true,true],\"shards\":["
                  "{\"replicas\":[1,2],\"syncing\":[],\"since\":1},"
                  "{\"replicas\":[2],\"syncing\":[],\"since\":4},"
                  "{\"replicas\":[0,1],\"syncing\":[1],\"since\":1}]}");
  ck_assert_str_eq(desc(&v), "epoch 4: 0=[1*,2] 1=[2*] 2=[0*,1~]");
  char small[16];
  memset(small, 'x', sizeof small);
  ps_view_describe(&v, small, sizeof small);
  ck_assert_str_eq(small, "epoch 4: 0=[...");
  char one[1] = {'x'};
  ps_view_describe(&v, one, 1);
  ck_assert_int_eq(one[0], '\0');
  ps_view_describe(&v, one, 0); /* writes nothing */
  ck_assert_str_eq(desc(NULL), "no view");

  char line[256];
  const char *h4[] = {"a", "a", "b", "b"}, *same[] = {"a", "a", "a"};
  ps_view_describe_placement(4, 2, h4, line, sizeof line);
  ck_assert_str_eq(
      line, "placement (R=2, ring order, a new host first): 0=[0,2] 1=[1,2] 2=[2,0] "
            "3=[3,0]");
  ps_view_describe_placement(3, 2, NULL, line, sizeof line);
  ck_assert_str_eq(line, "placement (R=2, ring order): 0=[0,1] 1=[1,2] 2=[2,0]");
  ps_view_describe_placement(3, 3, same, line, sizeof line);
  ck_assert_str_eq(line, "placement (R=3, ring order): 0=[0,1,2] 1=[1,2,0] 2=[2,0,1]");
  ps_view_describe_placement(3, 3, same, line, 20);
  ck_assert_str_eq(line, "placement (R=3, ...");
  ps_view_free(&v);
}
END_TEST

static Suite *view_suite(void) {
  Suite *s = suite_create("view");
  TCase *tc = tcase_create("view");
  tcase_add_test(tc, test_placement_ring);
  tcase_add_test(tc, test_placement_hosts);
  tcase_add_test(tc, test_initial);
  tcase_add_test(tc, test_encode_decode);
  tcase_add_test(tc, test_decode_refusals);
  tcase_add_test(tc, test_leave);
  tcase_add_test(tc, test_remove_primary);
  tcase_add_test(tc, test_remove_backup_and_lost);
  tcase_add_test(tc, test_join);
  tcase_add_test(tc, test_rejoin_in_sync);
  tcase_add_test(tc, test_drop_backup);
  tcase_add_test(tc, test_transition_errors);
  tcase_add_test(tc, test_describe);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(view_suite());
}
