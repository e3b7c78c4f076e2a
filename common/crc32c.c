/* CRC-32C with the CPU's CRC32 instruction where it exists.
 *
 * Checkpoints checksum every byte they hold, so a 10 GiB restore runs the
 * CRC over 10 GiB: the hardware instruction (8 bytes per 3-cycle latency
 * in one stream, several GB/s, against about 1 GB/s for the table)
 * matters.  x86-64 has it from SSE4.2 on (three streams at once, see
 * below); the function is
 * compiled with target("sse4.2") so the rest of the program keeps the
 * baseline instruction set, and a runtime check picks it.  Elsewhere, or on
 * an old CPU, a slicing-by-8 table (eight table lookups per 8 bytes) is used.
 * The tables are built once, on first use. */
#include "crc32c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PS_CRC32C_X86 1
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define PS_CRC32C_ARM 1
#include <arm_acle.h>
#endif

#define POLY 0x82f63b78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
    table[0][i] = c;
  }
  for (int t = 1; t < 8; t++)
    for (uint32_t i = 0; i < 256; i++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static inline uint64_t load_le64(const uint8_t *p) {
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
         (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
         (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

uint32_t ps_crc32c_extend_sw(uint32_t crc, const void *data, size_t n) {
  pthread_once(&table_once, table_init);
  const uint8_t *p = data;
  uint32_t c = crc ^ 0xffffffffu;
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    n--;
  }
  while (n >= 8) {
    uint64_t v = load_le64(p) ^ c;
    c = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
        table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^
        table[2][(v >> 40) & 0xff] ^ table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    n--;
  }
  return c ^ 0xffffffffu;
}

#if defined(PS_CRC32C_X86)

/* One CRC32 instruction has a latency of 3 cycles and a throughput of 1,
 * so three independent streams go about three times as fast as one: a
 * long buffer is taken in rounds of 3 x STREAM bytes, the three thirds
 * run interleaved (the 2nd and 3rd from a zero register), and the three
 * registers are joined.  The CRC register is linear over GF(2): the
 * register after A || B is zeros(reg after A, |B|) ^ (reg after B from 0),
 * where zeros(r, n) (the register after n zero bytes from r) is a linear
 * map of r, tabulated once for n = STREAM as four 256-entry tables. */
#define STREAM 4096
static uint32_t shift_tab[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint32_t zeros_hw(uint32_t r, size_t n) {
  uint64_t c = r;
  for (size_t i = 0; i < n; i += 8)
    c = _mm_crc32_u64(c, 0);
  return (uint32_t)c;
}

static void shift_init(void) {
  uint32_t col[32];
  for (int i = 0; i < 32; i++)
    col[i] = zeros_hw(1u << i, STREAM);
  for (int k = 0; k < 4; k++)
    for (uint32_t b = 0; b < 256; b++) {
      uint32_t v = 0;
      for (int j = 0; j < 8; j++)
        if (b & (1u << j)) v ^= col[8 * k + j];
      shift_tab[k][b] = v;
    }
}

static inline uint32_t shift_stream(uint32_t r) {
  return shift_tab[0][r & 0xff] ^ shift_tab[1][(r >> 8) & 0xff] ^
         shift_tab[2][(r >> 16) & 0xff] ^ shift_tab[3][r >> 24];
}

__attribute__((target("sse4.2"))) uint32_t
ps_crc32c_extend_hw(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
  uint64_t c = crc ^ 0xffffffffu;
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    n--;
  }
  if (n >= 3 * STREAM) {
    pthread_once(&shift_once, shift_init);
    while (n >= 3 * STREAM) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < STREAM; i += 8) {
        uint64_t va, vb, vd;
        memcpy(&va, p + i, 8);
        memcpy(&vb, p + STREAM + i, 8);
        memcpy(&vd, p + 2 * STREAM + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = shift_stream(shift_stream((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
      p += 3 * STREAM;
      n -= 3 * STREAM;
    }
  }
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    n--;
  }
  return (uint32_t)c ^ 0xffffffffu;
}

static bool detect_hw(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#elif defined(PS_CRC32C_ARM)

uint32_t ps_crc32c_extend_hw(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
  uint32_t c = crc ^ 0xffffffffu;
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c = __crc32cb(c, *p++);
    n--;
  }
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __crc32cd(c, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = __crc32cb(c, *p++);
    n--;
  }
  return c ^ 0xffffffffu;
}

static bool detect_hw(void) {
  return true;
} /* compiled for a CPU with CRC */

#else

uint32_t ps_crc32c_extend_hw(uint32_t crc, const void *data, size_t n) {
  return ps_crc32c_extend_sw(crc, data, n);
}

static bool detect_hw(void) {
  return false;
}

#endif

/* 0 = not probed yet, 1 = hardware, 2 = table. */
static atomic_int impl;

bool ps_crc32c_hw_available(void) {
  int i = atomic_load_explicit(&impl, memory_order_relaxed);
  if (i == 0) {
    i = detect_hw() ? 1 : 2;
    atomic_store_explicit(&impl, i, memory_order_relaxed);
  }
  return i == 1;
}

uint32_t ps_crc32c_extend(uint32_t crc, const void *p, size_t n) {
  if (ps_crc32c_hw_available()) return ps_crc32c_extend_hw(crc, p, n);
  return ps_crc32c_extend_sw(crc, p, n);
}
