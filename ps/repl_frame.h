/* The frames of the replication link (ps/repl_frame.c; DESIGN.md "The
 * replication link"): their encoders and decoders, the part of the link
 * that reads bytes from outside (tests/fuzz/fuzz_link.c fuzzes them). */
#ifndef PS_REPL_FRAME_H
#define PS_REPL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"

/* Frames: a 24-byte header (magic "PSRL", kind, meta bytes, data bytes,
 * little-endian), then meta, then data.  HELLO (primary): meta = its task
 * (u32) and the backup's link key; BATCH: meta = a packed ReplicateRequest,
 * data = its entries' bulk bytes; ACK (backup, to each BATCH): meta = code
 * (u32), entries applied (i64), view epoch (i64), message.
 *
 * Cut-through (DESIGN.md "The replication link"): while a large assign's
 * bytes still arrive from its client, the primary forwards them in STAGE
 * frames: meta = stage id (u64, not 0), the stage's total bytes (u64) and
 * this piece's offset in it (u64); data = the piece.  Pieces of one id come
 * in order, without gaps.  A BATCH entry with `staged` = id then takes the
 * staged bytes as its value; UNSTAGE (meta = the id) drops a stage no entry
 * will take.  Neither is answered; a connection's stages end with it. */
#define PS_LINK_HDR 24
#define PS_LINK_HELLO 1u
#define PS_LINK_BATCH 2u
#define PS_LINK_ACK 3u
#define PS_LINK_STAGE 4u
#define PS_LINK_UNSTAGE 5u
#define PS_LINK_STAGE_META 24
#define PS_LINK_UNSTAGE_META 8
#define PS_LINK_ACK_MAX (20 + 255)
/* Little-endian fields. */
void ps_link_put32(uint8_t *b, uint32_t v);
void ps_link_put64(uint8_t *b, uint64_t v);
uint32_t ps_link_get32(const uint8_t *b);
uint64_t ps_link_get64(const uint8_t *b);
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
/* The kind of the frame whose header is @b (unchecked: ps_link_get_hdr
 * checks it). */
uint32_t ps_link_kind(const uint8_t *b);
typedef struct ps_link_stage {
  uint64_t id, total, offset;
} ps_link_stage;
/* STAGE meta into @b (PS_LINK_STAGE_META bytes). */
void ps_link_put_stage(uint8_t *b, const ps_link_stage *s);
/* Decodes the meta (@n bytes) of a STAGE frame carrying @data bytes: 0,
 * or INVALID_ARGUMENT (a wrong length, id 0, a total of 0 or over
 * @max_total, a piece past the total). */
int ps_link_get_stage(const uint8_t *p, size_t n, uint64_t data, uint64_t max_total,
                      ps_link_stage *s, ps_status *st);

#define PS_LINK_MAX_STAGES 8
/* Backup: the stages of one link connection (at most PS_LINK_MAX_STAGES
 * at once). */
typedef struct ps_link_stages {
  struct {
    uint64_t id;
    ps_buf *buf;
    size_t got;
  } v[PS_LINK_MAX_STAGES];
  int n;
} ps_link_stages;
/* Where the @data bytes of STAGE piece @m go (a new stage made at offset
 * 0): NULL and an error (@st) for a piece out of order, a total that
 * changed, too many stages. */
uint8_t *ps_link_stages_dest(ps_link_stages *t, const ps_link_stage *m, uint64_t data,
                             ps_status *st);
void ps_link_stages_got(ps_link_stages *t, uint64_t id, uint64_t data);
void ps_link_stages_drop(ps_link_stages *t, uint64_t id);
/* Takes stage @id, complete with @bytes bytes: its buffer, or NULL. */
ps_buf *ps_link_stages_take(ps_link_stages *t, uint64_t id, size_t bytes);
void ps_link_stages_fini(ps_link_stages *t);

#endif
