/* Shared by the files of the checkpoint bundle code, split the way
 * LevelDB splits its table format:
 *   bundle_format.c  byte buffers, varints, the BundleHeader/BundleEntry
 *                    protos, dtype sizes
 *   bundle_table.c   the SSTable of the .index file: block builder, table
 *                    builder and table reader
 *   bundle_slice.c   slice keys (TensorFlow's OrderedCode), slices, paths
 *   bundle_writer.c  entry sets and the bundle writer
 *   bundle_reader.c  the bundle reader
 *   bundle_merge.c   the merge of sharded saves
 * The format itself is described at the top of bundle_format.c.  Private to
 * common/. */
#ifndef PS_BUNDLE_INTERNAL_H
#define PS_BUNDLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bundle.h"

#define BLOCK_SIZE 262144
#define RESTART_INTERVAL 16
#define TRAILER_SIZE 5
#define FOOTER_SIZE 48
#define TABLE_MAGIC 0xdb4775248b80fb57ull
#define IO_CHUNK                                                                         \
  ((size_t)256 << 10) /* reads move at most this: small enough that the checksum         \
                       * reads the piece while it is in the core's L2 cache */
#define WRITE_BUF ((size_t)4 << 20) /* the writer's copy buffer */
#define MAX_SHARDS 1000000          /* beyond any real checkpoint */
#define DT_STRING 7
#define KEYBUF 1024

typedef struct bbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} bbuf;

/* ---- The table: writing ------------------------------------------------
 *
 * The whole index is built in memory (it is small next to the data: about
 * 60 bytes per tensor) and written with one write. */

typedef struct block_builder {
  bbuf buf;
  bbuf restarts; /* fixed32 offsets */
  size_t nrestarts;
  int counter;
  int interval;
  bbuf last_key;
} block_builder;

typedef struct handle {
  uint64_t offset, size;
} handle;

/* Called for every key/value in order; returns 0 or a status code (@st
 * set). */
typedef int kv_fn(void *arg, const uint8_t *k, size_t kn, const uint8_t *v, size_t vn,
                  ps_status *st);

typedef struct header {
  int num_shards;
  int endianness;
  const uint8_t *version; /* points into the decoded bytes */
  size_t version_len;
} header;

typedef struct table_builder {
  bbuf out;
  block_builder data, index;
  bbuf last_key;
  size_t nentries;
  bool pending;
  handle pending_handle;
} table_builder;

typedef struct table_src {
  const char *path; /* for messages */
  const uint8_t *p;
  size_t n;
} table_src;

typedef struct entry_set {
  ps_bundle_entry *e;
  size_t n, cap;
  size_t *slot; /* index + 1, 0 = empty */
  size_t nslot;
} entry_set;

typedef struct shard {
  char *path;
  int fd; /* -1 until first use */
  uint64_t size;
  struct timespec mtime, ctime; /* when opened: to see whether it changed */
} shard;

size_t ps_bdl_elem_size_(int dtype);
size_t ps_bdl_swap_size_(int dtype);
int ps_bdl_host_endianness_(void);
const char *ps_bdl_key_str_(const char *k, size_t n, char *buf, size_t cap);
void ps_bdl_bb_put_(bbuf *b, const void *p, size_t n);
void ps_bdl_bb_byte_(bbuf *b, uint8_t c);
size_t ps_bdl_varint_encode_(uint8_t *out, uint64_t v);
void ps_bdl_bb_varint_(bbuf *b, uint64_t v);
void ps_bdl_put_le32_(uint8_t *p, uint32_t v);
uint32_t ps_bdl_get_le32_(const uint8_t *p);
void ps_bdl_bb_fixed32_(bbuf *b, uint32_t v);
void ps_bdl_bb_free_(bbuf *b);
bool ps_bdl_get_varint_(const uint8_t **p, const uint8_t *end, uint64_t *v);
void ps_bdl_encode_entry_(bbuf *b, const ps_bundle_entry *e);
void ps_bdl_encode_header_(bbuf *b, int num_shards, int endianness,
                           const uint8_t *version, size_t version_len);
int ps_bdl_decode_header_(const uint8_t *p, size_t n, header *h, char *why, size_t cap);
bool ps_bdl_slice_inside_(const ps_bundle_slice *sl, const ps_shape *full);
int ps_bdl_decode_entry_(const uint8_t *p, size_t n, ps_bundle_entry *e, char *why,
                         size_t cap);
void ps_bdl_tb_init_(table_builder *tb);
void ps_bdl_tb_free_(table_builder *tb);
void ps_bdl_tb_add_(table_builder *tb, const uint8_t *k, size_t kn, const uint8_t *v,
                    size_t vn);
bool ps_bdl_tb_finish_(table_builder *tb);
int ps_bdl_table_read_(const table_src *src, kv_fn *fn, void *arg, ps_status *st);
void ps_bdl_encode_slice_key_(bbuf *b, const char *name, size_t name_len,
                              const ps_bundle_slice *sl);
void ps_bdl_slice_bounds_(const ps_bundle_slice *sl, const ps_shape *full, int d,
                          int64_t *lo, int64_t *hi);
void ps_bdl_slice_shape_(const ps_bundle_slice *sl, const ps_shape *full, ps_shape *out);
bool ps_bdl_slice_is_full_(const ps_bundle_slice *sl, const ps_shape *full);
int ps_bdl_make_slice_(const ps_shape *full, const int64_t *start, const int64_t *length,
                       ps_bundle_slice *sl, const char *name, ps_status *st);
char *ps_bdl_data_path_(const char *prefix, int id, int num_shards);
char *ps_bdl_path_cat_(const char *a, const char *b);
char *ps_bdl_temp_path_(const char *path);
int ps_bdl_make_dirs_(const char *dir);
int ps_bdl_write_temp_(const char *path, const uint8_t *p, size_t n, char **tmp);
int ps_bdl_write_file_atomic_(const char *path, const uint8_t *p, size_t n);
ps_bundle_entry *ps_bdl_es_find_(const entry_set *s, const char *k, size_t n);
ps_bundle_entry *ps_bdl_es_add_(entry_set *s, const char *k, size_t n);
bool ps_bdl_entry_add_slice_(ps_bundle_entry *e, const ps_bundle_slice *sl);
void ps_bdl_es_free_(entry_set *s);
int ps_bdl_cmp_key_(const char *a, size_t an, const char *b, size_t bn);
bool ps_bdl_build_index_(const entry_set *s, int num_shards, int endianness,
                         const uint8_t *version, size_t version_len, bbuf *out);
bool ps_bdl_slices_overlap_(const ps_bundle_slice *a, const ps_bundle_slice *b,
                            const ps_shape *full);
struct ps_bundle_reader {
  char *prefix;
  char *index_path;
  int num_shards;
  int endianness;
  uint8_t *version;
  size_t version_len;
  entry_set set;      /* sorted by key; no hash */
  pthread_mutex_t mu; /* guards opening shards */
  shard *shards;
  bool nofollow; /* ps_bundle_reader_open_nofollow: links at files refused */
};

/* The BundleHeaderProto version of files this code writes. */
extern const uint8_t ps_bdl_new_version_[2];

#endif
