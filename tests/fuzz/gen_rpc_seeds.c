/* Writes the seed corpus of fuzz_rpc: valid requests of every method of
 * paramserver.Ps for the variables fuzz_rpc creates, in its input format
 * (little-endian uint32 header length, header, bulk bytes).
 *
 *   gen_rpc_seeds DIR      writes DIR/<Method>/<seed> (the committed
 *                          corpus is tests/fuzz/corpus_rpc)
 *
 * A method without seeds here still gets the generic ones (an empty
 * request; it is fuzzed from those). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps.pb-c.h"

static const char *root;

static void put(const char *method, const char *seed, const ProtobufCMessage *m,
                const void *bulk, size_t nb) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, method);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%s", root, method, seed);
  size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
  uint8_t *buf = malloc(4 + n + nb);
  if (buf == NULL) exit(1);
  buf[0] = (uint8_t)n;
  buf[1] = (uint8_t)(n >> 8);
  buf[2] = (uint8_t)(n >> 16);
  buf[3] = (uint8_t)(n >> 24);
  if (m) protobuf_c_message_pack(m, buf + 4);
  if (nb) memcpy(buf + 4 + n, bulk, nb);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(buf, 1, 4 + n + nb, f) != 4 + n + nb || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  free(buf);
}

static void creates(void) {
  static int64_t s23[] = {2, 3}, s4[] = {4}, big[] = {4611686018427387903LL},
                 neg[] = {-1, 2};
  Paramserver__CreateRequest r = PARAMSERVER__CREATE_REQUEST__INIT;
  Paramserver__VariableSpec v = PARAMSERVER__VARIABLE_SPEC__INIT, *pv = &v;
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  r.vars = &pv;
  r.n_vars = 1;
  v.name = "c";
  v.dtype = 1;
  v.shape = s23;
  v.n_shape = 2;
  put("Create", "no_initializer", &r.base, NULL, 0);
  v.initializer = &in;
  const char *types[] = {"zeros",          "ones",          "constant",
                         "random_uniform", "random_normal", "truncated_normal",
                         "glorot_uniform", "glorot_normal", "variance_scaling"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    in.type = (char *)types[i];
    in.maxval = 1;
    in.stddev = 1;
    in.scale = 2;
    in.seed = 7;
    in.mode = i == 8 ? "fan_avg" : "";
    in.distribution = i == 8 ? "uniform" : "";
    put("Create", types[i], &r.base, NULL, 0);
  }
  static double vals[] = {1, 2, 3, 4, 5, 6};
  in = (Paramserver__Initializer)PARAMSERVER__INITIALIZER__INIT;
  in.type = "constant";
  in.values = vals;
  in.n_values = 6;
  put("Create", "constant_list", &r.base, NULL, 0);
  in = (Paramserver__Initializer)PARAMSERVER__INITIALIZER__INIT;
  in.type = "random_uniform";
  in.maxval = 1;
  in.full_name = "q";
  static int64_t fs[] = {4, 3};
  in.full_shape = fs;
  in.n_full_shape = 2;
  in.offset = 6;
  v.name = "q/part_1";
  put("Create", "part", &r.base, NULL, 0);
  v.name = "w"; /* exists: the same spec is idempotent */
  v.shape = (int64_t[]){4, 3};
  in = (Paramserver__Initializer)PARAMSERVER__INITIALIZER__INIT;
  in.type = "glorot_uniform";
  put("Create", "existing", &r.base, NULL, 0);
  v.name = "s";
  v.dtype = 3;
  v.shape = s4;
  v.n_shape = 1;
  in.type = "zeros";
  put("Create", "int32", &r.base, NULL, 0);
  v.shape = big;
  put("Create", "huge_shape", &r.base, NULL, 0);
  v.shape = neg;
  v.n_shape = 2;
  put("Create", "negative_dim", &r.base, NULL, 0);
}

static void names(void) {
  char *all[] = {"w", "b", "u", "emb", "p/part_0"};
  Paramserver__InitializeRequest ir = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  ir.names = all;
  ir.n_names = 1;
  put("Initialize", "one", &ir.base, NULL, 0);
  ir.n_names = 2;
  put("Initialize", "two", &ir.base, NULL, 0);
  ir.only_uninitialized = 1;
  put("Initialize", "only_uninitialized", &ir.base, NULL, 0);
  ir.names = all + 2; /* u has no initializer */
  ir.n_names = 1;
  put("Initialize", "no_initializer", &ir.base, NULL, 0);
  Paramserver__InitializeRequest none = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  put("Initialize", "all", &none.base, NULL, 0);
  Paramserver__NamesRequest nr = PARAMSERVER__NAMES_REQUEST__INIT;
  put("IsInitialized", "all", &nr.base, NULL, 0);
  put("ReportUninitialized", "all", &nr.base, NULL, 0);
  nr.names = all;
  nr.n_names = 5;
  put("IsInitialized", "five", &nr.base, NULL, 0);
  put("ReportUninitialized", "five", &nr.base, NULL, 0);
  char *missing[] = {"nope", "w"};
  nr.names = missing;
  nr.n_names = 2;
  put("IsInitialized", "missing", &nr.base, NULL, 0);
  put("ReportUninitialized", "missing", &nr.base, NULL, 0);
  Paramserver__DeleteRequest dr = PARAMSERVER__DELETE_REQUEST__INIT;
  dr.names = all;
  dr.n_names = 1;
  put("Delete", "one", &dr.base, NULL, 0);
  dr.with_slots = 1;
  put("Delete", "with_slots", &dr.base, NULL, 0);
  char *part[] = {"p", "nope"};
  dr.names = part;
  dr.n_names = 2;
  dr.missing_ok = 1;
  put("Delete", "partitioned_missing_ok", &dr.base, NULL, 0);
  dr.missing_ok = 0;
  put("Delete", "missing", &dr.base, NULL, 0);
}

/* UpdateRequest with one update; the bulk bytes go inline or as chunks. */
static void update(const char *seed, Paramserver__Update *u, const void *bulk, size_t nb,
                   int inl) {
  Paramserver__UpdateRequest r = PARAMSERVER__UPDATE_REQUEST__INIT;
  r.updates = &u;
  r.n_updates = 1;
  if (inl) {
    r.inline_data.data = (uint8_t *)bulk;
    r.inline_data.len = nb;
    put("Update", seed, &r.base, NULL, 0);
  } else {
    put("Update", seed, &r.base, bulk, nb);
  }
}

static void updates(void) {
  float v12[12], v8[8], v3[3];
  for (int i = 0; i < 12; i++)
    v12[i] = 0.25f * (float)i;
  for (int i = 0; i < 8; i++)
    v8[i] = 1.0f + (float)i;
  for (int i = 0; i < 3; i++)
    v3[i] = 0.5f;
  static int64_t s43[] = {4, 3}, s24[] = {2, 4}, s3[] = {3}, s2[] = {2};
  Paramserver__Update u = PARAMSERVER__UPDATE__INIT;
  u.name = "w";
  u.dtype = 1;
  u.shape = s43;
  u.n_shape = 2;
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN;
  update("assign_inline", &u, v12, sizeof v12, 1);
  update("assign_chunks", &u, v12, sizeof v12, 0);
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN_ADD;
  update("assign_add", &u, v12, sizeof v12, 1);
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN_SUB;
  update("assign_sub", &u, v12, sizeof v12, 0);
  u.op = PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT;
  double lr[] = {0.1, 0.9};
  u.hparams = lr;
  u.n_hparams = 1;
  update("apply_gd", &u, v12, sizeof v12, 1);
  char *mom[] = {"w/Momentum"};
  u.op = PARAMSERVER__UPDATE_OP__APPLY_MOMENTUM;
  u.slots = mom;
  u.n_slots = 1;
  u.n_hparams = 2;
  u.use_nesterov = 1;
  update("apply_momentum", &u, v12, sizeof v12, 1);
  u.use_nesterov = 0;
  u.op = PARAMSERVER__UPDATE_OP__APPLY_ADAGRAD;
  u.n_hparams = 1;
  update("apply_adagrad", &u, v12, sizeof v12, 0);
  /* synchronous, one replica: applied at once */
  u = (Paramserver__Update)PARAMSERVER__UPDATE__INIT;
  u.name = "step";
  u.dtype = 9;
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN_ADD;
  u.replicas_to_aggregate = 1;
  u.sync_local_step = 0;
  int64_t one = 1;
  update("sync_step", &u, &one, sizeof one, 1);
  u.replicas_to_aggregate = 0;
  update("step_add", &u, &one, sizeof one, 0);
  /* scatter: indices then values */
  uint8_t sb[4 * 2 + sizeof v8];
  int32_t i32[] = {1, 7};
  memcpy(sb, i32, sizeof i32);
  memcpy(sb + sizeof i32, v8, sizeof v8);
  u = (Paramserver__Update)PARAMSERVER__UPDATE__INIT;
  u.name = "emb";
  u.dtype = 1;
  u.shape = s24;
  u.n_shape = 2;
  u.index_dtype = 3;
  u.num_indices = 2;
  u.op = PARAMSERVER__UPDATE_OP__SCATTER_UPDATE;
  update("scatter_update", &u, sb, sizeof sb, 1);
  u.op = PARAMSERVER__UPDATE_OP__SCATTER_ADD;
  update("scatter_add", &u, sb, sizeof sb, 0);
  uint8_t sb64[8 * 2 + sizeof v8];
  int64_t i64[] = {9, 0};
  memcpy(sb64, i64, sizeof i64);
  memcpy(sb64 + sizeof i64, v8, sizeof v8);
  u.index_dtype = 9;
  u.op = PARAMSERVER__UPDATE_OP__SCATTER_SUB;
  update("scatter_sub_int64", &u, sb64, sizeof sb64, 0);
  /* sparse Adam */
  char *adam[] = {"emb/Adam", "emb/Adam_1"};
  double hp[] = {0.001, 0.9, 0.999, 1e-8, 0.9, 0.999};
  u.op = PARAMSERVER__UPDATE_OP__APPLY_ADAM;
  u.slots = adam;
  u.n_slots = 2;
  u.hparams = hp;
  u.n_hparams = 6;
  update("apply_adam_sparse", &u, sb64, sizeof sb64, 1);
  /* assign of another shape without validation */
  u = (Paramserver__Update)PARAMSERVER__UPDATE__INIT;
  u.name = "b";
  u.dtype = 1;
  u.shape = s2;
  u.n_shape = 1;
  u.no_validate_shape = 1;
  update("assign_no_validate", &u, v3, 2 * sizeof(float), 1);
  u.shape = s3;
  u.no_validate_shape = 0;
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN;
  update("assign_b", &u, v3, sizeof v3, 0);
  /* two updates in one request */
  Paramserver__Update a = PARAMSERVER__UPDATE__INIT, b = PARAMSERVER__UPDATE__INIT;
  a.name = "w";
  a.dtype = 1;
  a.shape = s43;
  a.n_shape = 2;
  a.op = PARAMSERVER__UPDATE_OP__ASSIGN_ADD;
  b = u;
  Paramserver__Update *two[] = {&a, &b};
  Paramserver__UpdateRequest r = PARAMSERVER__UPDATE_REQUEST__INIT;
  r.updates = two;
  r.n_updates = 2;
  uint8_t both[sizeof v12 + sizeof v3];
  memcpy(both, v12, sizeof v12);
  memcpy(both + sizeof v12, v3, sizeof v3);
  put("Update", "two_updates", &r.base, both, sizeof both);
  /* a graph's initializer filled by the ps: no bulk bytes */
  static int64_t s12[] = {12};
  Paramserver__Initializer fi = PARAMSERVER__INITIALIZER__INIT;
  fi.type = "random_normal";
  fi.stddev = 1;
  u = (Paramserver__Update)PARAMSERVER__UPDATE__INIT;
  u.name = "w";
  u.dtype = 1;
  u.shape = s43;
  u.n_shape = 2;
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN;
  u.fill = &fi;
  u.fill_seed = 7;
  u.fill_draw = 2;
  update("assign_fill", &u, NULL, 0, 1);
  fi.type = "glorot_uniform";
  fi.full_name = "w_full";
  fi.full_shape = s12;
  fi.n_full_shape = 1;
  update("assign_fill_part", &u, NULL, 0, 0);
}

static void reads(void) {
  Paramserver__ReadItem a = PARAMSERVER__READ_ITEM__INIT,
                        b = PARAMSERVER__READ_ITEM__INIT;
  Paramserver__ReadItem *items[] = {&a, &b};
  Paramserver__ReadRequest r = PARAMSERVER__READ_REQUEST__INIT;
  r.items = items;
  r.n_items = 1;
  a.name = "w";
  put("Read", "one", &r.base, NULL, 0);
  b.name = "step";
  r.n_items = 2;
  put("Read", "two", &r.base, NULL, 0);
  b.name = "u";
  put("Read", "uninitialized", &r.base, NULL, 0);
  a.name = "emb";
  a.gather = 1;
  a.index_dtype = 3;
  a.num_indices = 3;
  int32_t i32[] = {0, 9, 9};
  r.n_items = 1;
  put("Read", "gather_int32", &r.base, i32, sizeof i32);
  a.index_dtype = 9;
  a.num_indices = 2;
  int64_t i64[] = {3, 4};
  put("Read", "gather_int64", &r.base, i64, sizeof i64);
  b.name = "p/part_1";
  r.n_items = 2;
  put("Read", "gather_and_part", &r.base, i64, sizeof i64);
}

static void others(void) {
  Paramserver__ListRequest l = PARAMSERVER__LIST_REQUEST__INIT;
  put("List", "empty", &l.base, NULL, 0);
  Paramserver__StatusRequest s = PARAMSERVER__STATUS_REQUEST__INIT;
  put("Status", "empty", &s.base, NULL, 0);
  Paramserver__SnapshotRequest sn = PARAMSERVER__SNAPSHOT_REQUEST__INIT;
  sn.id = 7;
  sn.hold_ms = 500;
  put("Snapshot", "hold", &sn.base, NULL, 0);
  sn.skip_uninitialized = 1;
  put("Snapshot", "skip_uninitialized", &sn.base, NULL, 0);
  sn.hold_ms = 1000000000000LL;
  put("Snapshot", "hold_forever", &sn.base, NULL, 0);
  Paramserver__ReleaseRequest rl = PARAMSERVER__RELEASE_REQUEST__INIT;
  rl.id = 7;
  put("Release", "id", &rl.base, NULL, 0);
  rl.id = 0;
  put("Release", "zero", &rl.base, NULL, 0);
  /* fuzz_rpc takes snapshot 77 (initialized variables) before each input */
  Paramserver__SaveRequest sv = PARAMSERVER__SAVE_REQUEST__INIT;
  sv.prefix = "fz";
  sv.num_shards = 1;
  put("Save", "fresh", &sv.base, NULL, 0);
  sv.snapshot_id = 77;
  put("Save", "snapshot", &sv.base, NULL, 0);
  sv.prefix = "sub/dir/fz-100";
  sv.shard = 1;
  sv.num_shards = 2;
  put("Save", "shard_1_of_2", &sv.base, NULL, 0);
  sv.prefix = "../fz";
  sv.shard = 0;
  sv.num_shards = 1;
  put("Save", "outside", &sv.base, NULL, 0);
  sv.prefix = "fz";
  sv.snapshot_id = 8;
  put("Save", "no_such_snapshot", &sv.base, NULL, 0);
  Paramserver__MergeRequest mg = PARAMSERVER__MERGE_REQUEST__INIT;
  mg.prefix = "mg";
  mg.num_shards = 1;
  put("Merge", "one_shard", &mg.base, NULL, 0);
  mg.max_to_keep = -1;
  mg.keep_every_n_hours = 1;
  put("Merge", "keep_all", &mg.base, NULL, 0);
  mg.num_shards = 2;
  put("Merge", "missing_shard", &mg.base, NULL, 0);
  mg.prefix = "/etc/passwd";
  mg.num_shards = 1;
  put("Merge", "absolute", &mg.base, NULL, 0);
  mg.prefix = "mg";
  static uint8_t meta[] = "paramserver.meta/2 not a real graph";
  mg.meta_graph.data = meta;
  mg.meta_graph.len = sizeof meta - 1;
  put("Merge", "meta_graph", &mg.base, NULL, 0);
  mg.meta_graph.len = 0;
  Paramserver__RestoreRequest rs = PARAMSERVER__RESTORE_REQUEST__INIT;
  rs.prefix = "seed";
  put("Restore", "all", &rs.base, NULL, 0);
  rs.prefix = "";
  put("Restore", "latest", &rs.base, NULL, 0);
  Paramserver__RestoreItem it1 = PARAMSERVER__RESTORE_ITEM__INIT,
                           it2 = PARAMSERVER__RESTORE_ITEM__INIT;
  Paramserver__RestoreItem *its[] = {&it1, &it2};
  it1.name = "w";
  it2.name = "p/part_1";
  it2.key = "p";
  rs.prefix = "seed";
  rs.items = its;
  rs.n_items = 2;
  put("Restore", "items", &rs.base, NULL, 0);
  it1.key = "b"; /* another shape */
  put("Restore", "wrong_key", &rs.base, NULL, 0);
  rs.n_items = 0; /* psctl restore's list of the checkpoint's tensors */
  rs.check_only = 1;
  rs.list = 1;
  put("Restore", "list", &rs.base, NULL, 0);
  /* embedding tables: "t" from itself and "plain" from "t" (another
   * optimizer's slots), as task 1 of 3 */
  rs.list = 0;
  rs.check_only = 0;
  it1.name = "t";
  it1.key = "";
  it2.name = "plain";
  it2.key = "t";
  rs.n_items = 2;
  rs.table_task = 1;
  rs.table_tasks = 3;
  put("Restore", "tables", &rs.base, NULL, 0);
  rs.n_items = 0;
  put("Restore", "all_task1of3", &rs.base, NULL, 0);
}

/* Replicate (a ps without replication decodes and checks it, then
 * refuses it) and Digest. */
static void replication(void) {
  int64_t sh[2] = {2, 2};
  float val[4] = {1, 2, 3, 4};
  Paramserver__ReplicateEntry v = PARAMSERVER__REPLICATE_ENTRY__INIT;
  v.kind = PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE;
  v.name = "w";
  v.dtype = 1;
  v.shape = sh;
  v.n_shape = 2;
  v.version = 3;
  v.initialized = 1;
  v.value_bytes = sizeof val;
  Paramserver__ReplicateEntry *ep = &v;
  Paramserver__ReplicateRequest r = PARAMSERVER__REPLICATE_REQUEST__INIT;
  r.epoch = 1;
  r.entries = &ep;
  r.n_entries = 1;
  put("Replicate", "value", &r.base, val, sizeof val);
  int32_t rows[1] = {1};
  uint8_t bulk[sizeof rows + 8];
  memcpy(bulk, rows, sizeof rows);
  memcpy(bulk + sizeof rows, val, 8);
  v.kind = PARAMSERVER__REPLICATE_ENTRY__KIND__ROWS;
  v.index_dtype = 3;
  v.num_indices = 1;
  v.index_bytes = sizeof rows;
  v.value_bytes = 8;
  v.base_version = 2;
  put("Replicate", "rows", &r.base, bulk, sizeof bulk);
  Paramserver__ReplicateEntry c = PARAMSERVER__REPLICATE_ENTRY__INIT;
  Paramserver__VariableSpec spec = PARAMSERVER__VARIABLE_SPEC__INIT;
  spec.name = "w";
  spec.dtype = 1;
  spec.shape = sh;
  spec.n_shape = 2;
  c.kind = PARAMSERVER__REPLICATE_ENTRY__KIND__CREATE;
  c.name = "w";
  c.spec = &spec;
  ep = &c;
  put("Replicate", "create", &r.base, NULL, 0);
  Paramserver__DigestRequest d = PARAMSERVER__DIGEST_REQUEST__INIT;
  put("Digest", "shard0", &d.base, NULL, 0);
}

/* Embedding tables: fuzz_rpc makes "t" (dim 4, adagrad, every policy) and
 * "plain" (dim 4, adam). */
static void tables(void) {
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  in.type = "truncated_normal";
  in.stddev = 0.5;
  Paramserver__TablePolicy pol = PARAMSERVER__TABLE_POLICY__INIT;
  Paramserver__TableSpec sp = PARAMSERVER__TABLE_SPEC__INIT;
  sp.name = "n";
  sp.dtype = 1;
  sp.dim = 8;
  sp.initializer = &in;
  Paramserver__TableCreateRequest c = PARAMSERVER__TABLE_CREATE_REQUEST__INIT;
  c.spec = &sp;
  put("TableCreate", "plain", &c.base, NULL, 0);
  sp.optimizer = "ftrl";
  sp.slot_init = 0.5;
  sp.policy = &pol;
  pol.min_count = 3;
  pol.sketch_width = 1024;
  pol.sketch_depth = 2;
  pol.ttl_steps = 10;
  pol.ttl_seconds = 60;
  pol.max_rows = 1000;
  pol.evict = "lfu";
  put("TableCreate", "policies", &c.base, NULL, 0);
  sp.name = "t";
  put("TableCreate", "existing_other", &c.base, NULL, 0);
  int64_t keys[6] = {1, -1, 1, INT64_MAX, INT64_MIN, 42};
  Paramserver__TableLookupRequest l = PARAMSERVER__TABLE_LOOKUP_REQUEST__INIT;
  l.name = "t";
  l.key_dtype = 9;
  l.num_keys = 6;
  l.train = true;
  l.step = 3;
  put("TableLookup", "bulk", &l.base, keys, sizeof keys);
  l.inline_data.data = (uint8_t *)keys;
  l.inline_data.len = sizeof keys;
  put("TableLookup", "inline", &l.base, NULL, 0);
  l.name = "plain";
  l.train = false;
  put("TableLookup", "inference", &l.base, NULL, 0);
  struct {
    int op;
    const char *name, *table;
    double hp[6];
    size_t nhp;
  } ops[] = {{0, "scatter_add", "t", {0}, 0},
             {1, "sgd", "t", {0.1}, 1},
             {2, "adagrad", "t", {0.1}, 1},
             {3, "adam", "plain", {0.01, 0.9, 0.999, 1e-7, 0.9, 0.999}, 6},
             {4, "ftrl", "t", {0.1, 0.01, 0.01, -0.5}, 4}};
  uint8_t bulk[6 * 8 + 6 * 4 * 4];
  memcpy(bulk, keys, sizeof keys);
  for (int i = 0; i < 24; i++) {
    float g = 0.25f * (float)(i % 5) - 0.5f;
    memcpy(bulk + 48 + 4 * i, &g, 4);
  }
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    Paramserver__TableUpdateRequest u = PARAMSERVER__TABLE_UPDATE_REQUEST__INIT;
    u.name = (char *)ops[i].table;
    u.op = (Paramserver__TableOp)ops[i].op;
    u.key_dtype = 9;
    u.num_keys = 6;
    u.dtype = 1;
    u.dim = 4;
    u.hparams = ops[i].hp;
    u.n_hparams = ops[i].nhp;
    u.step = 4;
    put("TableUpdate", ops[i].name, &u.base, bulk, sizeof bulk);
    if (i == 2) {
      u.inline_data.data = bulk;
      u.inline_data.len = sizeof bulk;
      put("TableUpdate", "adagrad_inline", &u.base, NULL, 0);
    }
  }
  Paramserver__TableListRequest tl = PARAMSERVER__TABLE_LIST_REQUEST__INIT;
  put("TableList", "all", &tl.base, NULL, 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  if (mkdir(root, 0755) != 0 && errno != EEXIST) {
    perror(root);
    return 1;
  }
  creates();
  replication();
  names();
  updates();
  reads();
  others();
  tables();
  return 0;
}
