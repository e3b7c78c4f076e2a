/* bench_ps's bare gRPC core baseline for (b): a minimal server in a
 * forked child (grpc_init only there; a registered method, one
 * completion-queue thread) and a client in the bench's process. */
#include "bench_ps_internal.h"

/* ---- bare gRPC core server (forked child, grpc_init only there) ---- */

enum { BT_CALL = 1, BT_SHUTDOWN };

typedef struct bare_call {
  int kind; /* BT_CALL; first field, like the shutdown tag */
  int replying;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_byte_buffer *reply;
  int cancelled;
} bare_call;

static grpc_server *bare_srv;
static grpc_completion_queue *bare_cq;
static void *bare_method;
static atomic_int bare_stopping;
static int bare_shutdown_tag = BT_SHUTDOWN;

static void unlimited_args(grpc_arg *a, int server) {
  /* The same arguments common/rpc.c gives the ps server and client. */
  a[0] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[2] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = server ? GRPC_ARG_ALLOW_REUSEPORT : GRPC_ARG_ENABLE_RETRIES,
                    .value.integer = 0};
}

static void bare_free(bare_call *c) {
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  grpc_metadata_array_destroy(&c->md);
  if (c->call) grpc_call_unref(c->call);
  free(c);
}

static void bare_post(void) {
  bare_call *c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->kind = BT_CALL;
  grpc_metadata_array_init(&c->md);
  if (grpc_server_request_registered_call(bare_srv, bare_method, &c->call, &c->deadline,
                                          &c->md, &c->payload, bare_cq, bare_cq,
                                          c) != GRPC_CALL_OK)
    bare_free(c);
}

/* A request arrived: echo its first bytes back in one batch. */
static void bare_event(bare_call *c, int ok) {
  if (c->replying || !ok) {
    bare_free(c);
    return;
  }
  if (!atomic_load(&bare_stopping)) bare_post();
  uint8_t out[PING_REPLY] = {0};
  if (c->payload) {
    grpc_byte_buffer_reader r;
    if (grpc_byte_buffer_reader_init(&r, c->payload)) {
      grpc_slice s = grpc_byte_buffer_reader_readall(&r);
      size_t n = GRPC_SLICE_LENGTH(s) < PING_REPLY ? GRPC_SLICE_LENGTH(s) : PING_REPLY;
      memcpy(out, GRPC_SLICE_START_PTR(s), n);
      grpc_slice_unref(s);
      grpc_byte_buffer_reader_destroy(&r);
    }
  }
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)out, sizeof out);
  c->reply = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->reply;
  ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
  ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[3].data.recv_close_on_server.cancelled = &c->cancelled;
  c->replying = 1;
  if (grpc_call_start_batch(c->call, ops, 4, c, NULL) != GRPC_CALL_OK) bare_free(c);
}

/* Waits for EOF on the control pipe (the parent closed it or died). */
static void *bare_watch(void *arg) {
  int fd = *(int *)arg;
  char b;
  for (;;) {
    ssize_t k = read(fd, &b, 1);
    if (k > 0 || (k < 0 && errno == EINTR)) continue;
    break;
  }
  atomic_store(&bare_stopping, 1);
  grpc_server_shutdown_and_notify(bare_srv, bare_cq, &bare_shutdown_tag);
  grpc_server_cancel_all_calls(bare_srv);
  return NULL;
}

void bare_server_main(int port_fd, int ctl_fd) {
  ps_rpc_quiet_abseil(); /* as ours: gRPC without Debian's debug locks */
  grpc_init();
  grpc_arg a[3];
  unlimited_args(a, 1);
  grpc_channel_args args = {3, a};
  bare_srv = grpc_server_create(&args, NULL);
  bare_cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(bare_srv, bare_cq, NULL);
  bare_method = grpc_server_register_method(bare_srv, PING_METHOD, NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(bare_srv, "127.0.0.1:0", sc);
  grpc_server_credentials_release(sc);
  if (port == 0 || write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) _exit(1);
  close(port_fd);
  grpc_server_start(bare_srv);
  for (int i = 0; i < 8; i++)
    bare_post(); /* as many as the ps keeps */
  pthread_t w;
  if (pthread_create(&w, NULL, bare_watch, &ctl_fd) != 0) _exit(1);
  /* The one completion-queue thread. */
  for (;;) {
    grpc_event ev =
        grpc_completion_queue_next(bare_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) continue;
    if (*(int *)ev.tag == BT_SHUTDOWN) break;
    bare_event(ev.tag, ev.success);
  }
  grpc_server_destroy(bare_srv);
  grpc_completion_queue_shutdown(bare_cq);
  for (;;) {
    grpc_event ev =
        grpc_completion_queue_next(bare_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE && *(int *)ev.tag == BT_CALL) bare_free(ev.tag);
  }
  grpc_completion_queue_destroy(bare_cq);
  pthread_join(w, NULL);
  grpc_shutdown();
  _exit(0);
}

/* ---- bare gRPC core client (in this process, after grpc_init) ---- */

int bare_client_init(bare_client *b, int port) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  grpc_arg a[3];
  unlimited_args(a, 0);
  grpc_channel_args args = {3, a};
  grpc_channel_credentials *cc = grpc_insecure_credentials_create();
  b->ch = grpc_channel_create(target, cc, &args);
  grpc_channel_credentials_release(cc);
  b->reg = grpc_channel_register_call(b->ch, PING_METHOD, NULL, NULL);
  b->cq = grpc_completion_queue_create_for_next(NULL);
  return b->ch && b->reg && b->cq ? 0 : -1;
}

void bare_client_fini(bare_client *b) {
  if (b->ch) grpc_channel_destroy(b->ch);
  if (b->cq) {
    grpc_completion_queue_shutdown(b->cq);
    while (grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(b->cq);
  }
  memset(b, 0, sizeof *b);
}

/* One unary call in one batch; 0 or -1 (message on stderr). */
int bare_ping(bare_client *b, uint32_t seq) {
  gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(30000, GPR_TIMESPAN));
  grpc_call *call = grpc_channel_create_registered_call(
      b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, b->cq, b->reg, deadline, NULL);
  if (call == NULL) {
    fprintf(stderr, "bench: bare call: cannot create\n");
    return -1;
  }
  uint8_t req[PING_REQ] = {0};
  memcpy(req, &seq, sizeof seq);
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)req, sizeof req);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_byte_buffer *recv = NULL;
  grpc_metadata_array init_md, trail_md;
  grpc_metadata_array_init(&init_md);
  grpc_metadata_array_init(&trail_md);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  int rc = -1;
  if (grpc_call_start_batch(call, ops, 6, b, NULL) == GRPC_CALL_OK) {
    grpc_event ev;
    do {
      ev = grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    } while (ev.type != GRPC_OP_COMPLETE);
    uint32_t echo = 0;
    if (ev.success && status == GRPC_STATUS_OK && recv != NULL &&
        grpc_byte_buffer_length(recv) == PING_REPLY) {
      grpc_byte_buffer_reader r;
      if (grpc_byte_buffer_reader_init(&r, recv)) {
        grpc_slice s = grpc_byte_buffer_reader_readall(&r);
        memcpy(&echo, GRPC_SLICE_START_PTR(s), sizeof echo);
        grpc_slice_unref(s);
        grpc_byte_buffer_reader_destroy(&r);
      }
      rc = echo == seq ? 0 : -1;
    }
    if (rc != 0)
      fprintf(stderr, "bench: bare call failed: success=%d status=%d '%.*s'\n",
              ev.success, (int)status, (int)GRPC_SLICE_LENGTH(details),
              (const char *)GRPC_SLICE_START_PTR(details));
  } else {
    fprintf(stderr, "bench: bare call: start_batch failed\n");
  }
  grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&init_md);
  grpc_metadata_array_destroy(&trail_md);
  grpc_call_unref(call);
  return rc;
}
