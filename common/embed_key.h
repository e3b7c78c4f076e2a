/* The one rule that places an embedding table's key (DESIGN.md
 * "Embedding tables"): ps_embed_key_hash() mixes the 64-bit key
 * (splitmix64's finalizer, a bijection), and
 *   ps task   = hash % (ps tasks)
 *   stripe    = (hash >> 32) % 64     (a lock of the table on that ps)
 *   index tag = hash >> 58            (6 bits kept beside the row's id)
 * so the client and every ps agree without talking, a key is on one ps
 * for a given ps count whatever else the table holds, and a restore into
 * another ps count re-spreads rows by the same rule.  Pure; any thread. */
#ifndef PS_EMBED_KEY_H
#define PS_EMBED_KEY_H

#include <stdint.h>

static inline uint64_t ps_embed_key_hash(int64_t key) {
  uint64_t z = (uint64_t)key + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The ps task (of @nps >= 1) holding @key. */
static inline int ps_embed_key_task(int64_t key, int nps) {
  return (int)(ps_embed_key_hash(key) % (uint64_t)nps);
}

#endif
