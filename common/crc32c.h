/* CRC-32C (Castagnoli), as LevelDB and TensorFlow checkpoints use it.
 *
 * The polynomial is the reflected 0x82F63B78 with init and final xor
 * 0xFFFFFFFF; crc32c("123456789") = 0xE3069283.  ps_crc32c_extend() uses the
 * CPU's CRC32 instruction (SSE4.2 on x86-64, the CRC extension on arm64)
 * when the running CPU has it and a slicing-by-8 table otherwise; both give
 * the same values.  All functions are pure and safe to call from any
 * thread. */
#ifndef PS_CRC32C_H
#define PS_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CRC of @p[0..n) continuing @crc, the CRC of the bytes before it
 * (0 for none): crc(a || b) = ps_crc32c_extend(ps_crc32c(a), b). */
uint32_t ps_crc32c_extend(uint32_t crc, const void *p, size_t n);

static inline uint32_t ps_crc32c(const void *p, size_t n) {
  return ps_crc32c_extend(0, p, n);
}

/* LevelDB's masking: a CRC stored next to data that itself contains CRCs
 * is rotated and offset so that the CRC of a CRC is not trivially related
 * to it.  TensorFlow stores every checksum masked. */
#define PS_CRC32C_MASK_DELTA 0xa282ead8u

static inline uint32_t ps_crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + PS_CRC32C_MASK_DELTA;
}

static inline uint32_t ps_crc32c_unmask(uint32_t masked) {
  uint32_t r = masked - PS_CRC32C_MASK_DELTA;
  return (r >> 17) | (r << 15);
}

/* The two implementations, for tests and benchmarks.  ps_crc32c_extend_hw()
 * may only be called when ps_crc32c_hw_available() is true. */
uint32_t ps_crc32c_extend_sw(uint32_t crc, const void *p, size_t n);
uint32_t ps_crc32c_extend_hw(uint32_t crc, const void *p, size_t n);
bool ps_crc32c_hw_available(void);

#endif
