/* Bytes on the wire (private to the rpc files, see rpc_internal.h): the
 * range lists of ps_rpc_segs, the Chunk messages that carry them (built
 * zero-copy on send, copied straight into the receiver's ranges), protobuf
 * messages to and from gRPC byte buffers, and the channel arguments both
 * sides share.  The bottom layer: calls no other rpc file. */
#include "rpc_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"

#define ZEROCOPY_MIN 4096        /* smaller ranges are copied */
#define HTTP2_MAX_FRAME 16777215 /* the largest SETTINGS_MAX_FRAME_SIZE (RFC 9113) */

int ps_rpc_segs_add(ps_rpc_segs *s, void *ptr, size_t len, ps_buf *owner) {
  if (len == 0) return 0;
  if (ps_array_grow(&s->v, &s->cap, s->n + 1, sizeof *s->v) != 0) return -1;
  s->v[s->n++] = (ps_rpc_seg){ptr, len, ps_buf_ref(owner)};
  s->total += len;
  return 0;
}

void ps_rpc_segs_fini(ps_rpc_segs *s) {
  for (size_t i = 0; i < s->n; i++)
    ps_buf_unref(s->v[i].owner);
  free(s->v);
  memset(s, 0, sizeof *s);
}

void ps_rpc_segs_fill(ps_rpc_segs *s, size_t off, const void *p, size_t n) {
  const uint8_t *src = p;
  for (size_t i = 0; i < s->n && n > 0; i++) {
    if (off >= s->v[i].len) {
      off -= s->v[i].len;
      continue;
    }
    size_t k = s->v[i].len - off;
    if (k > n) k = n;
    memcpy((uint8_t *)s->v[i].ptr + off, src, k);
    src += k;
    n -= k;
    off = 0;
  }
}

static void unref_owner(void *owner) {
  ps_buf_unref(owner);
}

/* The next Chunk message of at most PS_RPC_CHUNK_MAX bytes from @s at @cur. */
grpc_byte_buffer *ps_rpc_build_chunk_(ps_rpc_segs *s, cursor *cur) {
  size_t len = s->total - cur->off;
  if (len > PS_RPC_CHUNK_MAX) len = PS_RPC_CHUNK_MAX;
  grpc_slice stack_slices[16], *slices = stack_slices;
  size_t ns = 0, cap = 16;
  uint8_t hdr[11];
  size_t hn = 0;
  hdr[hn++] = 0x0a;
  for (uint64_t v = len;; v >>= 7) {
    if (v < 0x80) {
      hdr[hn++] = (uint8_t)v;
      break;
    }
    hdr[hn++] = (uint8_t)(v | 0x80);
  }
  /* Small pieces accumulate here and become one copied slice.  Out of
   * memory, the chunk is abandoned (NULL): the call then fails. */
  uint8_t *small = NULL;
  size_t small_n = 0, small_cap = 0;
  bool oom = false;
#define PUSH_SLICE(sl)                                                                   \
  do {                                                                                   \
    grpc_slice sl_ = (sl);                                                               \
    if (ns == cap) {                                                                     \
      grpc_slice *nv = malloc(2 * cap * sizeof *nv);                                     \
      if (nv == NULL) {                                                                  \
        grpc_slice_unref(sl_);                                                           \
        oom = true;                                                                      \
        break;                                                                           \
      }                                                                                  \
      memcpy(nv, slices, ns * sizeof *nv);                                               \
      if (slices != stack_slices) free(slices);                                          \
      slices = nv;                                                                       \
      cap *= 2;                                                                          \
    }                                                                                    \
    slices[ns++] = sl_;                                                                  \
  } while (0)
#define FLUSH_SMALL()                                                                    \
  do {                                                                                   \
    if (small_n) {                                                                       \
      PUSH_SLICE(grpc_slice_from_copied_buffer((char *)small, small_n));                 \
      small_n = 0;                                                                       \
    }                                                                                    \
  } while (0)
#define ADD_SMALL(p, k)                                                                  \
  do {                                                                                   \
    if (small_n + (k) > small_cap) {                                                     \
      size_t nc_ = (small_n + (k)) * 2 + 256;                                            \
      uint8_t *ns_ = realloc(small, nc_);                                                \
      if (ns_ == NULL) {                                                                 \
        oom = true;                                                                      \
        break;                                                                           \
      }                                                                                  \
      small = ns_;                                                                       \
      small_cap = nc_;                                                                   \
    }                                                                                    \
    memcpy(small + small_n, (p), (k));                                                   \
    small_n += (k);                                                                      \
  } while (0)
  ADD_SMALL(hdr, hn);
  size_t left = len;
  while (left > 0 && cur->seg < s->n && !oom) {
    ps_rpc_seg *g = &s->v[cur->seg];
    size_t k = g->len - cur->pos;
    if (k > left) k = left;
    uint8_t *p = (uint8_t *)g->ptr + cur->pos;
    if (k >= ZEROCOPY_MIN && g->owner != NULL) {
      FLUSH_SMALL();
      ps_buf_ref(g->owner);
      PUSH_SLICE(grpc_slice_new_with_user_data(p, k, unref_owner, g->owner));
    } else {
      ADD_SMALL(p, k);
    }
    cur->pos += k;
    cur->off += k;
    left -= k;
    if (cur->pos == g->len) {
      cur->seg++;
      cur->pos = 0;
    }
  }
  if (!oom) FLUSH_SMALL();
  free(small);
  grpc_byte_buffer *bb = oom ? NULL : grpc_raw_byte_buffer_create(slices, ns);
  for (size_t i = 0; i < ns; i++)
    grpc_slice_unref(slices[i]);
  if (slices != stack_slices) free(slices);
  return bb;
#undef PUSH_SLICE
#undef FLUSH_SMALL
#undef ADD_SMALL
}

/* Copies the payload of one Chunk message into @sink at *@received. */
int ps_rpc_consume_chunk_(grpc_byte_buffer *bb, ps_rpc_segs *sink, size_t *received,
                          const char *what, ps_status *st) {
  size_t msg_len = grpc_byte_buffer_length(bb);
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return ps_status_set(st, PS_INTERNAL, "%s: cannot read message", what);
  uint8_t hdr[11];
  size_t hn = 0, need = msg_len == 0 ? 0 : 2, payload = 0, got = 0;
  int hdr_done = msg_len == 0, rc = 0;
  grpc_slice sl;
  while (grpc_byte_buffer_reader_next(&r, &sl)) {
    const uint8_t *p = GRPC_SLICE_START_PTR(sl);
    size_t n = GRPC_SLICE_LENGTH(sl);
    while (!hdr_done && n > 0 && rc == 0) {
      hdr[hn++] = *p++;
      n--;
      if (hn == 1 && hdr[0] != 0x0a) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: malformed data chunk (tag 0x%02x)", what, hdr[0]);
      } else if (hn >= 2 && !(hdr[hn - 1] & 0x80)) {
        uint64_t v = 0;
        for (size_t i = 1; i < hn; i++)
          v |= (uint64_t)(hdr[i] & 0x7f) << (7 * (i - 1));
        if (v != msg_len - hn)
          rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s: malformed data chunk (length %llu in a "
                             "message of %zu bytes)",
                             what, (unsigned long long)v, msg_len);
        else if (*received + v > sink->total)
          rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s: more data than announced (%zu bytes)", what,
                             sink->total);
        payload = (size_t)v;
        hdr_done = 1;
      } else if (hn == sizeof hdr) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: malformed data chunk (varint)",
                           what);
      }
    }
    if (rc == 0 && hdr_done && n > 0) {
      ps_rpc_segs_fill(sink, *received + got, p, n);
      got += n;
    }
    grpc_slice_unref(sl);
    if (rc) break;
  }
  grpc_byte_buffer_reader_destroy(&r);
  (void)need;
  if (rc == 0 && !hdr_done)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: truncated data chunk", what);
  if (rc == 0 && got != payload)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: truncated data chunk", what);
  /* no peer sends one; a stream of them would hold a call to its deadline */
  if (rc == 0 && payload == 0)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: an empty data message", what);
  if (rc == 0) *received += got;
  return rc;
}

grpc_byte_buffer *ps_rpc_pack_message_(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

/* Contiguous copy of a received message; caller unrefs. */
grpc_slice ps_rpc_read_all_(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return s;
}

size_t ps_rpc_window_args_(grpc_arg *a, int64_t w) {
  if (w == 0) return 0; /* gRPC's probing */
  if (w < PS_RPC_MIN_RECV_WINDOW) w = PS_RPC_MIN_RECV_WINDOW;
  if (w > PS_RPC_MAX_RECV_WINDOW) w = PS_RPC_MAX_RECV_WINDOW;
  a[0] = (grpc_arg){
      .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                    .value.integer = (int)w};
  /* the probe is also what grows the frames a peer may send, from 16 KiB,
   * with the bandwidth it measures: without it they would stay small */
  a[2] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_HTTP2_MAX_FRAME_SIZE,
                    .value.integer = (int)(w < HTTP2_MAX_FRAME ? w : HTTP2_MAX_FRAME)};
  return 3;
}

void ps_rpc_unlimited_args_(grpc_arg *a, int server) {
  a[0] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                    .value.integer = -1};
  /* A stale daemon must not silently share our port. */
  a[2] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = server ? GRPC_ARG_ALLOW_REUSEPORT : GRPC_ARG_ENABLE_RETRIES,
                    .value.integer = 0};
}
