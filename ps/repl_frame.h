/* The frames of the replication link (ps/repl_link.c; DESIGN.md "The
 * replication link"): their encoders and decoders, the part of the link
 * that reads bytes from outside (tests/fuzz/fuzz_link.c fuzzes them). */
#ifndef PS_REPL_FRAME_H
#define PS_REPL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Frames: a 24-byte header (magic "PSRL", kind, meta bytes, data bytes,
 * little-endian), then meta, then data.  HELLO (primary): meta = its task
 * (u32) and the backup's link key; BATCH: meta = a packed ReplicateRequest,
 * data = its entries' bulk bytes; ACK (backup, to each): meta = code (u32),
 * entries applied (i64), view epoch (i64), message. */
#define PS_LINK_HDR 24
#define PS_LINK_HELLO 1u
#define PS_LINK_BATCH 2u
#define PS_LINK_ACK 3u
#define PS_LINK_ACK_MAX (20 + 255)
typedef struct ps_link_hdr {
  uint32_t kind;
  uint64_t meta, data;
} ps_link_hdr;
void ps_link_put_hdr(uint8_t *b, uint32_t kind, uint64_t meta, uint64_t data);
/* A header of kind @kind with meta <= @max_meta and data <= @max_data. */
int ps_link_get_hdr(const uint8_t *b, uint32_t kind, uint64_t max_meta, uint64_t max_data,
                    ps_link_hdr *h, ps_status *st);
/* ACK meta into @b (PS_LINK_ACK_MAX bytes); returns its length. */
size_t ps_link_put_ack(uint8_t *b, int code, int64_t applied, int64_t epoch,
                       const char *msg);
/* Decodes ACK meta: 0 and *@res (the backup's code and text), or an error. */
int ps_link_get_ack(const uint8_t *p, size_t n, int64_t *applied, ps_status *res,
                    ps_status *st);

#endif
