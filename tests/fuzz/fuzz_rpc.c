/* Fuzz target for the request decoders of the ps's RPC methods
 * (ps/service*.c, ps/ckpt*.c): one method per run, named by PS_FUZZ_METHOD
 * ("Update", "Restore", ...: the macro in a libFuzzer build, one binary per
 * method; the environment variable in the replay build).
 *
 * The ps is real and in-process: a ps_store, a ps_service with a
 * --checkpoint-dir in a scratch directory and small limits, and a
 * ps_rpc_server on 127.0.0.1:0, created once with a few variables of
 * several dtypes and shapes (plain, a partitioned one, optimizer slots, an
 * uninitialized one), two embedding tables ("t" with every policy,
 * "plain") and a checkpoint "seed" to restore.
 *
 * An input is a little-endian uint32 L, then L bytes of request header
 * (the method's request message, as raw bytes: nothing checks it on the
 * way), then the rest as the request's bulk bytes, sent as Chunk messages
 * (inputs shorter than 4 bytes are a header alone).  The call goes through
 * the real gRPC path with ps_rpc_run() and a 1 s deadline (10 s for the
 * Status after it).  Besides "no crash, no leak, no UB" it checks: a failed
 * call carries a message; and after every input the ps still answers
 * Status.  PS_FUZZ_STRICT=1 also
 * fails on INTERNAL and UNKNOWN (a request should never cause those);
 * PS_FUZZ_VERBOSE=1 prints every input's outcome; PS_FUZZ_LAST=FILE writes
 * each input to FILE before it runs (after a failure: the reproducer, to
 * run alone with PS_FUZZ_RUNS=0).
 *
 * Mutations know the input format and the method's request message: most
 * unpack the header with its protobuf-c descriptor, set one field anywhere
 * in it to a boundary or hostile value and pack it again, so that they
 * reach the checks behind the decoder; the rest change bytes.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target
 * (meson -Dfuzzing=true) whose custom mutator does the same, with
 * libFuzzer's own byte mutations.  Otherwise the shared driver (driver.c) replays
 * the seed corpus and PS_FUZZ_RUNS (default 4000) deterministic mutations,
 * so it runs as an ordinary test under gcc and under ASan + UBSan. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "common/rpc.h"
#include "driver.h"
#include "ps.pb-c.h"
#include "service.h"
#include "store.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_rpc %s: ", F.method);                                          \
    fprintf(stderr, __VA_ARGS__);                                                        \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define CALL_MS 1000    /* an input's call (a parked synchronous update waits) */
#define STATUS_MS 10000 /* the Status after it: generous, for loaded machines */
#define WATCH_MS 50     /* a Watch stream's: it stays open until then */
#define MAX_RESPONSE ((size_t)64 << 20) /* a Read response bigger than this fails */

static struct {
  char method[128]; /* "/paramserver.Ps/Update" */
  const char *name; /* "Update" */
  char dir[256], ckdir[300];
  ps_store *store;
  ps_service *svc;
  ps_rpc_server *srv;
  ps_rpc_channel *ch;
  long inputs;
  long codes[17];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool server_done;
  bool verbose;     /* PS_FUZZ_VERBOSE=1: each input's outcome on stderr */
  bool strict;      /* PS_FUZZ_STRICT=1: INTERNAL or UNKNOWN fails the run */
  const char *last; /* PS_FUZZ_LAST=FILE: each input is written there first */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* ---- calls ---- */

typedef struct sink_ctx {
  uint8_t *buf;
} sink_ctx;

/* Read responses: room for every tensor's bytes (the ps checks sizes). */
static int read_sink(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                     ps_status *st) {
  sink_ctx *x = user;
  Paramserver__ReadResponse *r = paramserver__read_response__unpack(NULL, n, p);
  if (r == NULL) return ps_status_set(st, PS_INTERNAL, "ReadResponse does not parse");
  size_t total = 0;
  int rc = 0;
  for (size_t i = 0; i < r->n_tensors && rc == 0; i++) {
    size_t es = ps_dtype_size(r->tensors[i]->dtype), ne = 1;
    for (size_t k = 0; k < r->tensors[i]->n_shape; k++) {
      int64_t d = r->tensors[i]->shape[k];
      if (d < 0 || __builtin_mul_overflow(ne, (size_t)d, &ne))
        rc = ps_status_set(st, PS_INTERNAL, "ReadResponse: bad shape");
    }
    size_t b;
    if (rc == 0 && (__builtin_mul_overflow(ne, es, &b) ||
                    __builtin_add_overflow(total, b, &total) || total > MAX_RESPONSE))
      rc = ps_status_set(st, PS_INTERNAL, "ReadResponse: over %zu bytes", MAX_RESPONSE);
  }
  paramserver__read_response__free_unpacked(r, NULL);
  if (rc) return rc;
  if (total == 0) return 0;
  x->buf = malloc(total);
  if (x->buf == NULL || ps_rpc_segs_add(sink, x->buf, total, NULL) != 0)
    return ps_status_set(st, PS_INTERNAL, "no memory for %zu response bytes", total);
  return 0;
}

/* TableLookup responses: room for the rows (the ps checks sizes). */
static int lookup_sink(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st) {
  sink_ctx *x = user;
  Paramserver__TableLookupResponse *r =
      paramserver__table_lookup_response__unpack(NULL, n, p);
  if (r == NULL)
    return ps_status_set(st, PS_INTERNAL, "TableLookupResponse does not parse");
  size_t b = 0;
  int rc = 0;
  if (r->num_keys < 0 || r->dim < 1 || r->dim > 65536 ||
      __builtin_mul_overflow((size_t)r->num_keys, (size_t)r->dim * 4, &b) ||
      b > MAX_RESPONSE)
    rc = ps_status_set(st, PS_INTERNAL, "TableLookupResponse: %lld rows of dim %lld",
                       (long long)r->num_keys, (long long)r->dim);
  paramserver__table_lookup_response__free_unpacked(r, NULL);
  if (rc || b == 0) return rc;
  x->buf = malloc(b);
  if (x->buf == NULL || ps_rpc_segs_add(sink, x->buf, b, NULL) != 0)
    return ps_status_set(st, PS_INTERNAL, "no memory for %zu response bytes", b);
  return 0;
}

/* One call of @method with a raw header and bulk bytes; returns its code. */
static int call_raw(const char *method, const uint8_t *hdr, size_t nh,
                    const uint8_t *bulk, size_t nb, int64_t timeout_ms, ps_status *out) {
  ps_rpc_segs send = {0};
  bool read = strcmp(method, "/paramserver.Ps/Read") == 0;
  bool lookup = strcmp(method, "/paramserver.Ps/TableLookup") == 0;
  sink_ctx x = {NULL};
  if (nb && ps_rpc_segs_add(&send, (void *)bulk, nb, NULL) != 0) FAIL("no memory");
  ps_rpc_req r = {.ch = F.ch,
                  .method = method,
                  .raw_request = nh ? hdr : (const uint8_t *)"",
                  .raw_len = nh,
                  .send = nb ? &send : NULL,
                  .unary_response = !read && !lookup,
                  .timeout_ms = timeout_ms,
                  .on_header = read     ? read_sink
                               : lookup ? lookup_sink
                                        : NULL,
                  .user = &x};
  ps_rpc_run(&r, 1);
  ps_rpc_segs_fini(&send);
  free(x.buf);
  if (out) *out = r.st;
  return r.st.code;
}

/* A call with a message built here; fails the run unless it succeeds.
 * (@method is a literal: the client caches a registered call per method
 * pointer.) */
static void call_ok(const char *method, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (buf == NULL) FAIL("no memory");
  protobuf_c_message_pack(m, buf);
  ps_status st;
  if (call_raw(method, buf, n, NULL, 0, STATUS_MS, &st) != 0)
    FAIL("set-up %s failed: %s", method, st.msg);
  free(buf);
}

static void check_status(void) {
  ps_status st; /* an empty StatusRequest is zero bytes */
  if (call_raw("/paramserver.Ps/Status", NULL, 0, NULL, 0, STATUS_MS, &st) != 0)
    FAIL("after input %ld the ps no longer answers Status: %s", F.inputs, st.msg);
}

/* ---- set-up ---- */

/* "Update": the macro of a libFuzzer build, else the environment (NULL if
 * unset).  Mutators may run before the first input, so not only F.name. */
static const char *method_name(void) {
#ifdef PS_FUZZ_METHOD
  return PS_FUZZ_METHOD;
#else
  return getenv("PS_FUZZ_METHOD");
#endif
}

static Paramserver__VariableSpec *spec(Paramserver__VariableSpec *v,
                                       Paramserver__Initializer *in, const char *name,
                                       int dtype, int64_t *shape, size_t rank,
                                       const char *init) {
  paramserver__variable_spec__init(v);
  v->name = (char *)name;
  v->dtype = dtype;
  v->shape = shape;
  v->n_shape = rank;
  if (init) {
    paramserver__initializer__init(in);
    in->type = (char *)init;
    in->maxval = 1;
    in->stddev = 1;
    in->scale = 1;
    in->value = 0.5;
    v->initializer = in;
  }
  return v;
}

static void create_vars(void) {
  static int64_t s43[] = {4, 3}, s3[] = {3}, s104[] = {10, 4}, s22[] = {2, 2}, s2[] = {2},
                 s54[] = {5, 4}, full[] = {10, 4};
  Paramserver__VariableSpec v[12];
  Paramserver__Initializer in[12];
  Paramserver__VariableSpec *pv[12];
  size_t n = 0;
  pv[n] = spec(&v[n], &in[n], "w", 1, s43, 2, "glorot_uniform"), n++;
  pv[n] = spec(&v[n], &in[n], "w/Momentum", 1, s43, 2, "zeros"), n++;
  pv[n] = spec(&v[n], &in[n], "b", 1, s3, 1, "ones"), n++;
  pv[n] = spec(&v[n], &in[n], "step", 9, NULL, 0, "zeros"), n++;
  pv[n] = spec(&v[n], &in[n], "emb", 1, s104, 2, "random_uniform"), n++;
  pv[n] = spec(&v[n], &in[n], "emb/Adam", 1, s104, 2, "zeros"), n++;
  pv[n] = spec(&v[n], &in[n], "emb/Adam_1", 1, s104, 2, "zeros"), n++;
  pv[n] = spec(&v[n], &in[n], "d", 2, s22, 2, "constant"), n++;
  pv[n] = spec(&v[n], &in[n], "i", 3, s2, 1, "ones"), n++;
  pv[n] = spec(&v[n], &in[n], "u", 1, s2, 1, NULL), n++; /* never initialized */
  for (int part = 0; part < 2; part++) {
    pv[n] = spec(&v[n], &in[n], part ? "p/part_1" : "p/part_0", 1, s54, 2,
                 "truncated_normal");
    in[n].full_name = "p";
    in[n].full_shape = full;
    in[n].n_full_shape = 2;
    in[n].offset = part ? 20 : 0;
    n++;
  }
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = pv;
  cr.n_vars = n;
  call_ok("/paramserver.Ps/Create", &cr.base);
  char *names[] = {"w",          "w/Momentum", "b", "step",     "emb",     "emb/Adam",
                   "emb/Adam_1", "d",          "i", "p/part_0", "p/part_1"};
  Paramserver__InitializeRequest ir = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  ir.names = names;
  ir.n_names = sizeof names / sizeof names[0];
  call_ok("/paramserver.Ps/Initialize", &ir.base);
  /* an embedding table with every policy, and one without */
  Paramserver__Initializer ti = PARAMSERVER__INITIALIZER__INIT;
  ti.type = "random_normal";
  ti.stddev = 0.1;
  Paramserver__TablePolicy tp = PARAMSERVER__TABLE_POLICY__INIT;
  tp.min_count = 2;
  tp.sketch_width = 4096;
  tp.ttl_steps = 5;
  tp.max_rows = 100;
  Paramserver__TableSpec ts = PARAMSERVER__TABLE_SPEC__INIT;
  ts.name = "t";
  ts.dtype = 1;
  ts.dim = 4;
  ts.initializer = &ti;
  ts.optimizer = "adagrad";
  ts.policy = &tp;
  Paramserver__TableCreateRequest tc = PARAMSERVER__TABLE_CREATE_REQUEST__INIT;
  tc.spec = &ts;
  call_ok("/paramserver.Ps/TableCreate", &tc.base);
  ts.name = "plain";
  ts.optimizer = "adam";
  ts.policy = NULL;
  call_ok("/paramserver.Ps/TableCreate", &tc.base);
}

/* Writes checkpoint @prefix (shard 0 of 1), merged unless @merge is false. */
/* Snapshot @id of the initialized variables (the uninitialized "u" is
 * skipped), gate reopened, as a coordinator takes it. */
static void snapshot(int64_t id) {
  ps_snapshot_free(ps_store_snapshot_take(F.store, id)); /* an unused one */
  Paramserver__SnapshotRequest sn = PARAMSERVER__SNAPSHOT_REQUEST__INIT;
  sn.id = id;
  sn.hold_ms = 1000;
  sn.skip_uninitialized = 1;
  call_ok("/paramserver.Ps/Snapshot", &sn.base);
  Paramserver__ReleaseRequest rl = PARAMSERVER__RELEASE_REQUEST__INIT;
  rl.id = sn.id;
  call_ok("/paramserver.Ps/Release", &rl.base);
}

static void save(const char *prefix, bool merge) {
  snapshot(424242);
  Paramserver__SaveRequest sr = PARAMSERVER__SAVE_REQUEST__INIT;
  sr.snapshot_id = 424242;
  sr.prefix = (char *)prefix;
  sr.shard = 0;
  sr.num_shards = 1;
  call_ok("/paramserver.Ps/Save", &sr.base);
  if (!merge) return;
  Paramserver__MergeRequest mr = PARAMSERVER__MERGE_REQUEST__INIT;
  mr.prefix = (char *)prefix;
  mr.num_shards = 1;
  mr.max_to_keep = -1;
  call_ok("/paramserver.Ps/Merge", &mr.base);
}

static void remove_tree(const char *path, bool keep_seed) {
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (keep_seed &&
        (!strncmp(e->d_name, "seed.", 5) || !strcmp(e->d_name, "checkpoint")))
      continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      remove_tree(p, false);
      rmdir(p);
    } else {
      unlink(p);
    }
  }
  closedir(d);
}

static void on_server_done(void *arg) {
  (void)arg;
  pthread_mutex_lock(&F.mu);
  F.server_done = true;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
}

static void teardown(void) {
  if (F.srv == NULL) return;
  ps_rpc_channel_destroy(F.ch);
  ps_rpc_server_shutdown(F.srv, on_server_done, NULL);
  ps_service_shutdown(F.svc);
  ps_rpc_server_cancel_all(F.srv);
  pthread_mutex_lock(&F.mu);
  while (!F.server_done)
    pthread_cond_wait(&F.cv, &F.mu);
  pthread_mutex_unlock(&F.mu);
  ps_ckpt_abort_all();
  ps_ckpt_wait_all();
  ps_rpc_server_destroy(F.srv);
  F.srv = NULL;
  ps_service_destroy(F.svc);
  ps_store_destroy(F.store);
  ps_rpc_global_shutdown();
  remove_tree(F.dir, false);
  rmdir(F.dir);
  fprintf(stderr, "fuzz_rpc %s: %ld inputs; codes:", F.name, F.inputs);
  for (int i = 0; i < 17; i++)
    if (F.codes[i]) fprintf(stderr, " %d:%ld", i, F.codes[i]);
  fputc('\n', stderr);
}

static void setup(void) {
  F.name = method_name();
  if (F.name == NULL || F.name[0] == '\0') {
    fprintf(stderr, "fuzz_rpc: set PS_FUZZ_METHOD to a method of paramserver.Ps\n");
    exit(2);
  }
  /* "HealthCheck" / "HealthWatch": grpc.health.v1.Health's methods */
  if (!strncmp(F.name, "Health", 6))
    snprintf(F.method, sizeof F.method, "/grpc.health.v1.Health/%s", F.name + 6);
  else
    snprintf(F.method, sizeof F.method, "/paramserver.Ps/%s", F.name);
  F.verbose = getenv("PS_FUZZ_VERBOSE") && atoi(getenv("PS_FUZZ_VERBOSE")) > 0;
  F.strict = getenv("PS_FUZZ_STRICT") && atoi(getenv("PS_FUZZ_STRICT")) > 0;
  F.last = getenv("PS_FUZZ_LAST");
  size_t nh;
  const ps_rpc_handler *h = ps_service_handlers(&nh);
  bool known = false;
  for (size_t i = 0; i < nh; i++)
    known |= strcmp(h[i].method, F.method) == 0;
  if (!known) FAIL("the ps has no method %s", F.method);
  const char *base = getenv("TMPDIR");
  snprintf(F.dir, sizeof F.dir, "%s/fuzz_rpc.XXXXXX", base && base[0] ? base : "/tmp");
  if (mkdtemp(F.dir) == NULL) FAIL("mkdtemp %s: %s", F.dir, strerror(errno));
  snprintf(F.ckdir, sizeof F.ckdir, "%s/ckpt", F.dir);
  if (mkdir(F.ckdir, 0700) != 0) FAIL("mkdir %s: %s", F.ckdir, strerror(errno));
  char real[4096];
  if (realpath(F.ckdir, real) == NULL) FAIL("realpath %s: %s", F.ckdir, strerror(errno));
  ps_rpc_global_init();
  F.store = ps_store_create("ps/0");
  F.svc = ps_service_create(F.store, "ps/0");
  if (F.store == NULL || F.svc == NULL) FAIL("no memory");
  ps_service_set_checkpoint_dir(F.svc, real);
  /* Small limits, so that no input can make the ps take the machine. */
  ps_service_limits lim;
  ps_service_limits_default(&lim);
  lim.max_tensor_bytes = 16 << 20;
  lim.max_read_names = 1000;
  lim.max_gather_rows = 100000;
  lim.max_hold_ms = 2000;
  ps_service_set_limits(F.svc, &lim);
  ps_status st;
  ps_rpc_server_options so;
  ps_rpc_server_options_default(&so);
  so.nthreads = 1;
  so.max_message_bytes = 1 << 20;
  so.stream_timeout_ms = 5000;
  F.srv = ps_rpc_server_create("127.0.0.1:0", h, nh, &so, F.svc, &st);
  if (F.srv == NULL) FAIL("server: %s", st.msg);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(F.srv));
  ps_service_set_address(F.svc, addr);
  ps_rpc_server_start(F.srv);
  F.ch = ps_rpc_channel_create(addr);
  if (F.ch == NULL) FAIL("channel to %s", addr);
  atexit(teardown);
  create_vars();
  save("seed", true);
  check_status();
}

/* ---- one input ---- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (F.srv == NULL) setup();
  const uint8_t *hdr = data, *bulk = NULL;
  size_t nh = size, nb = 0;
  if (size >= 4) {
    uint32_t l = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                 (uint32_t)data[3] << 24;
    hdr = data + 4;
    nh = l < size - 4 ? l : size - 4;
    bulk = hdr + nh;
    nb = size - 4 - nh;
  }
  if (F.last) { /* the input that failed the run is left there */
    FILE *f = fopen(F.last, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
      FAIL("cannot write %s", F.last);
  }
  bool is_snapshot = strcmp(F.name, "Snapshot") == 0;
  if (strcmp(F.name, "Merge") == 0) save("mg", false); /* shards to merge */
  if (strcmp(F.name, "Save") == 0) snapshot(77);       /* what seeds save */
  ps_status st;
  /* A valid Watch is a stream the ps holds open: the client's deadline
   * ends it (and the ps must free it then). */
  bool is_watch = strcmp(F.name, "HealthWatch") == 0;
  int code = call_raw(F.method, hdr, nh, bulk, nb, is_watch ? WATCH_MS : CALL_MS, &st);
  if (strcmp(F.name, "Delete") == 0) create_vars(); /* the next input finds them */
  F.inputs++;
  F.codes[code >= 0 && code < 17 ? code : 16]++;
  if (code != 0 && st.msg[0] == '\0')
    FAIL("input %ld: code %d without a message", F.inputs, code);
  if (F.strict && (code == PS_INTERNAL || code == PS_UNKNOWN))
    FAIL("input %ld: code %d: %s", F.inputs, code, st.msg);
  if (F.verbose)
    fprintf(stderr, "input %ld: %zu+%zu bytes: %d %s\n", F.inputs, nh, nb, code,
            code ? st.msg : "OK");
  if (is_snapshot) { /* reopen the gate at once, as a coordinator would */
    Paramserver__SnapshotRequest *rq =
        paramserver__snapshot_request__unpack(NULL, nh, hdr);
    if (rq) {
      ps_store_snapshot_release(F.store, rq->id);
      paramserver__snapshot_request__free_unpacked(rq, NULL);
    }
  }
  check_status();
  if (F.inputs % 500 == 0) { /* bound the checkpoint directory */
    ps_ckpt_wait_all();
    remove_tree(F.ckdir, true);
  }
  return 0;
}

#ifndef PS_LIBFUZZER
/* Protobuf-aware mutations: varints and length-delimited fields are what
 * the decoders read, so bytes that make big, negative or boundary varints
 * are inserted as often as bits are flipped.  The 4-byte length prefix is
 * sometimes moved so that header bytes become bulk bytes and back. */
static const uint8_t tokens[][11] = {
    {1, 0x00},
    {1, 0xff},
    {1, 0x80},
    {1, 0x7f},
    {2, 0xff, 0x01},
    {5, 0xff, 0xff, 0xff, 0xff, 0x0f},
    {10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, /* -1 */
    {9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f},        /* 2^62-1 */
    {9, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40},        /* 2^62 */
    {5, 0x80, 0x80, 0x80, 0x80, 0x08},                                /* 2^31 */
    {3, 0x80, 0x80, 0x04},                                            /* 65536 */
    {2, 0x0a, 0x00},                                                  /* field 1, "" */
    {3, 0x12, 0x01, 0x00},                                            /* field 2, "\0" */
    {2, 0x22, 0x7f}, /* field 4, len 127 */
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

/* Mutates @buf (@n bytes, room for @cap) as a protobuf message. */
static size_t mutate_message(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(3);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(9)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* a byte near its value (lengths, tags, counts) */
      if (n) buf[fuzz_rnd(n)] += (uint8_t)(fuzz_rnd(5) - 2);
      break;
    case 2:   /* insert a token */
    case 3: { /* (twice as likely) */
      size_t k = fuzz_rnd(NTOKENS);
      n = fuzz_insert(buf, n, cap, pos, tokens[k] + 1, tokens[k][0]);
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range (repeated fields) */
      n = fuzz_duplicate(buf, n, cap, pos, 64);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    case 7: /* a random byte */
      if (n) buf[fuzz_rnd(n)] = (uint8_t)fuzz_rng();
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}
#else
/* libFuzzer: its own byte mutations, and a generator for ours seeded by
 * the seed it passes. */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size,
                               unsigned int seed);

static uint64_t rng_state = 1;

static uint64_t fuzz_rng(void) { /* xorshift64*, as driver.c */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1du;
}

static size_t fuzz_rnd(size_t n) {
  return n ? (size_t)(fuzz_rng() % n) : 0;
}

static size_t mutate_message(uint8_t *buf, size_t n, size_t cap) {
  return LLVMFuzzerMutate(buf, n, cap);
}
#endif

/* ---- request descriptors (structure-aware mutations) ---- */

/* The request message of each method; a method missing here is mutated
 * as bytes only. */
static const struct {
  const char *name;
  const ProtobufCMessageDescriptor *d;
} requests[] = {
    {"Create", &paramserver__create_request__descriptor},
    {"Initialize", &paramserver__initialize_request__descriptor},
    {"IsInitialized", &paramserver__names_request__descriptor},
    {"ReportUninitialized", &paramserver__names_request__descriptor},
    {"Update", &paramserver__update_request__descriptor},
    {"Read", &paramserver__read_request__descriptor},
    {"List", &paramserver__list_request__descriptor},
    {"Status", &paramserver__status_request__descriptor},
    {"Snapshot", &paramserver__snapshot_request__descriptor},
    {"Release", &paramserver__release_request__descriptor},
    {"Save", &paramserver__save_request__descriptor},
    {"Merge", &paramserver__merge_request__descriptor},
    {"Restore", &paramserver__restore_request__descriptor},
    {"Delete", &paramserver__delete_request__descriptor},
    {"Replicate", &paramserver__replicate_request__descriptor},
    {"Digest", &paramserver__digest_request__descriptor},
    {"TableCreate", &paramserver__table_create_request__descriptor},
    {"TableLookup", &paramserver__table_lookup_request__descriptor},
    {"TableUpdate", &paramserver__table_update_request__descriptor},
    {"TableList", &paramserver__table_list_request__descriptor},
};

static const ProtobufCMessageDescriptor *request_descriptor(void) {
  const char *name = method_name();
  for (size_t i = 0; name && i < sizeof requests / sizeof requests[0]; i++)
    if (!strcmp(requests[i].name, name)) return requests[i].d;
  return NULL;
}

/* Structure-aware: the header is unpacked with the method's descriptor,
 * one scalar field anywhere in it (nested messages and repeated elements
 * too) gets a boundary or hostile value, and it is packed again, so the
 * mutant always parses and reaches the checks behind the decoder. */
typedef struct field_ref {
  void *p;
  const ProtobufCFieldDescriptor *f;
} field_ref;

#define MAX_REFS 512

static size_t elem_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
    return 8;
  case PROTOBUF_C_TYPE_BOOL:
    return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_STRING:
    return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(void *);
  default:
    return 4;
  }
}

static void collect(ProtobufCMessage *m, field_ref *refs, size_t *n) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    char *member = (char *)m + f->offset;
    size_t count = 1;
    char *base = member;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      count = *(size_t *)((char *)m + f->quantifier_offset);
      base = *(char **)member;
    }
    for (size_t k = 0; k < count && base; k++) {
      char *e = base + k * elem_size(f->type);
      if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        if (*(ProtobufCMessage **)e) collect(*(ProtobufCMessage **)e, refs, n);
      } else if (*n < MAX_REFS) {
        refs[(*n)++] = (field_ref){e, f};
      }
    }
    /* an absent singular message is no field to change */
  }
}

static const int64_t ints[] = {0,
                               1,
                               -1,
                               2,
                               3,
                               9,
                               19,
                               100,
                               65536,
                               INT32_MAX,
                               INT32_MIN,
                               (int64_t)1 << 31,
                               (int64_t)1 << 32,
                               (int64_t)1 << 40,
                               (int64_t)1 << 61,
                               ((int64_t)1 << 61) - 1,
                               (int64_t)1 << 62,
                               4611686018427387903LL,
                               INT64_MAX,
                               INT64_MIN};
static const char *const strs[] = {"",
                                   "w",
                                   "b",
                                   "emb",
                                   "u",
                                   "d",
                                   "i",
                                   "p",
                                   "p/part_0",
                                   "p/part_1",
                                   "step",
                                   "w/Momentum",
                                   "emb/Adam",
                                   "nope",
                                   "seed",
                                   "mg",
                                   "fz",
                                   "sub/x",
                                   "../x",
                                   "/etc/passwd",
                                   "a\nb",
                                   "a\x01b",
                                   "seed/../seed",
                                   ".",
                                   "..",
                                   "checkpoint",
                                   "zeros",
                                   "ones",
                                   "constant",
                                   "random_uniform",
                                   "truncated_normal",
                                   "variance_scaling",
                                   "fan_in",
                                   "fan_out",
                                   "uniform",
                                   "normal",
                                   "untruncated_normal",
                                   "bogus",
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
static const double dbls[] = {0, -0.0, 1, -1, 0.5, 2, 1e308, -1e308, 1e-310, 1e20};
static uint8_t zeros64[64];

static size_t mutate_structure(uint8_t *buf, size_t n, size_t cap,
                               const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, n, buf);
  if (m == NULL) return (size_t)-1;
  static field_ref refs[MAX_REFS];
  size_t nr = 0;
  collect(m, refs, &nr);
  if (nr == 0) {
    protobuf_c_message_free_unpacked(m, NULL);
    return (size_t)-1;
  }
  /* pointers put into the message are restored before it is freed */
  field_ref saved[4];
  uint8_t old[4][sizeof(ProtobufCBinaryData)];
  int rounds = 1 + (int)fuzz_rnd(2), ns = 0;
  for (int r = 0; r < rounds; r++) {
    field_ref x = refs[fuzz_rnd(nr)];
    int64_t v = ints[fuzz_rnd(sizeof ints / sizeof ints[0])];
    if (fuzz_rnd(4) == 0) v = (int64_t)fuzz_rng();
    switch (x.f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      if (fuzz_rnd(3) == 0) v = (int64_t)(*(uint64_t *)x.p + fuzz_rnd(5) - 2); /* wraps */
      *(int64_t *)x.p = v;
      break;
    case PROTOBUF_C_TYPE_DOUBLE: {
      double dv = dbls[fuzz_rnd(sizeof dbls / sizeof dbls[0])];
      if (fuzz_rnd(5) == 0) dv = fuzz_rnd(2) ? __builtin_nan("") : __builtin_inf();
      *(double *)x.p = dv;
      break;
    }
    case PROTOBUF_C_TYPE_FLOAT:
      *(float *)x.p = (float)dbls[fuzz_rnd(5)];
      break;
    case PROTOBUF_C_TYPE_BOOL:
      *(protobuf_c_boolean *)x.p = !*(protobuf_c_boolean *)x.p;
      break;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
      if (ns == 4) break;
      saved[ns] = x;
      memcpy(old[ns++], x.p, elem_size(x.f->type));
      if (x.f->type == PROTOBUF_C_TYPE_STRING) {
        *(const char **)x.p = strs[fuzz_rnd(sizeof strs / sizeof strs[0])];
      } else {
        ProtobufCBinaryData *b = x.p;
        if (fuzz_rnd(2) && b->len) {
          b->len = fuzz_rnd(b->len); /* shorter */
        } else {
          b->data = zeros64;
          b->len = fuzz_rnd(sizeof zeros64 + 1);
        }
      }
      break;
    default: /* 32-bit integers and enums */
      if (fuzz_rnd(3) == 0) v = (int32_t)(*(uint32_t *)x.p + (uint32_t)fuzz_rnd(5) - 2u);
      *(int32_t *)x.p = (int32_t)v;
      break;
    }
  }
  size_t out = protobuf_c_message_get_packed_size(m);
  if (out <= cap) protobuf_c_message_pack(m, buf);
  while (ns > 0) {
    ns--;
    memcpy(saved[ns].p, old[ns], elem_size(saved[ns].f->type));
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return out <= cap ? out : n;
}

/* Mutates the header (mostly) or the bulk bytes and rewrites the length
 * prefix to match, so that most mutants still split where they should;
 * sometimes the prefix itself is moved. */
static size_t mutate_input(uint8_t *buf, size_t n, size_t cap) {
  static uint8_t part[65536];
  if (n < 4 || fuzz_rnd(16) == 0) return mutate_message(buf, n, cap);
  uint32_t l = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
               (uint32_t)buf[3] << 24;
  size_t nh = l < n - 4 ? l : n - 4, nb = n - 4 - nh;
  if (fuzz_rnd(8) == 0) { /* move the split */
    nh = fuzz_rnd(n - 4 + 1);
  } else if (nb == 0 || fuzz_rnd(5) != 0) { /* the header */
    memcpy(part, buf + 4, nh);
    const ProtobufCMessageDescriptor *d = request_descriptor();
    size_t m = (size_t)-1;
    if (d && fuzz_rnd(3) != 0) m = mutate_structure(part, nh, sizeof part, d);
    if (m == (size_t)-1) m = mutate_message(part, nh, sizeof part);
    if (4 + m + nb > cap) return n;
    memmove(buf + 4 + m, buf + 4 + nh, nb);
    memcpy(buf + 4, part, m);
    nh = m;
  } else { /* the bulk bytes */
    memcpy(part, buf + 4 + nh, nb);
    size_t m = mutate_message(part, nb, sizeof part);
    if (4 + nh + m > cap) return n;
    memcpy(buf + 4 + nh, part, m);
    nb = m;
  }
  buf[0] = (uint8_t)nh;
  buf[1] = (uint8_t)(nh >> 8);
  buf[2] = (uint8_t)(nh >> 16);
  buf[3] = (uint8_t)(nh >> 24);
  return 4 + nh + nb;
}
#ifndef PS_LIBFUZZER
size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  return mutate_input(buf, n, cap);
}
#else
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size,
                               unsigned int seed) {
  rng_state = ((uint64_t)seed << 1 | 1) * 0x9e3779b97f4a7c15u;
  return mutate_input(data, size, max_size);
}
#endif
