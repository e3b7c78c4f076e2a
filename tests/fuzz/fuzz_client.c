/* Fuzz target for the client's answer decoders (worker/client/client_fuzz.c,
 * parse_*): a ps is input from outside, so every answer it sends is
 * decoded as the ps's requests are (fuzz_rpc.c).  One method per run,
 * named by PS_FUZZ_METHOD ("Read", "List", "IsInitialized", "Initialize",
 * "ReportUninitialized", "Delete", "Update", "Status", "Save", "Merge",
 * "Restore", "Shutdown", "StatusRepl", "Digest", "Epoch"; the macro in a libFuzzer build,
 * one binary per method; the environment variable in the replay build).
 *
 * An input is a little-endian uint32 L, then L bytes of answer header (the
 * method's response message, raw), then the rest as the answer's bulk
 * bytes (inputs shorter than 4 bytes are a header alone).
 * fuzz_client_answer decodes it against a typical request (Read: a
 * plain read of "w", a read of "b" into a given float [2], a deduplicated
 * gather of "emb" at 80 ids (20 distinct), a gather of "tab" at 2 ids) and
 * fills the bulk ranges as the transport does.  Besides "no crash, no leak, no UB" it
 * checks that a failed decode carries a message.  PS_FUZZ_VERBOSE=1 prints each input's
 * outcome.
 *
 * Mutations: bytes, interesting varints and field keys of the response
 * messages, ranges erased, repeated and spliced, and L changed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "driver.h"

/* worker/client/client_fuzz.c (not public API) */
int fuzz_client_answer(const char *method, const uint8_t *p, size_t n,
                       const uint8_t *data, size_t ndata, ps_status *st);

static const char *method(void) {
#ifdef PS_FUZZ_METHOD
  return PS_FUZZ_METHOD;
#else
  const char *m = getenv("PS_FUZZ_METHOD");
  if (m == NULL || m[0] == '\0') {
    fprintf(stderr, "fuzz_client: set PS_FUZZ_METHOD to a method of paramserver.Ps\n");
    abort();
  }
  return m;
#endif
}

static long inputs, codes[17];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
  ps_status st;
  int code = fuzz_client_answer(method(), hdr, nh, bulk, nb, &st);
  inputs++;
  codes[code >= 0 && code < 17 ? code : 16]++;
  if (code == PS_INVALID_ARGUMENT && strstr(st.msg, "no decoder for")) {
    fprintf(stderr, "fuzz_client: %s\n", st.msg);
    abort();
  }
  if (code != 0 && st.msg[0] == '\0') {
    fprintf(stderr, "fuzz_client %s: input %ld: code %d without a message\n", method(),
            inputs, code);
    abort();
  }
  if (getenv("PS_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz_client %s: input %ld: %s %s\n", method(), inputs,
            ps_status_code_name(code), st.msg);
  return 0;
}

#ifndef PS_LIBFUZZER
/* Varints and keys that reach the decoders' checks: counts, negative
 * and huge dims, dtypes, lengths, and the keys of fields 1-9 in every wire
 * type. */
static const uint8_t tokens[][11] = {
    {1, 0x00},
    {1, 0x01},
    {1, 0x7f},
    {2, 0x80, 0x01},
    {3, 0xff, 0xff, 0x03},
    {6, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20},                          /* 2^40 */
    {10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, /* -1 */
    {5, 0xff, 0xff, 0xff, 0xff, 0x07},
    {1, 0x08},
    {1, 0x0a},
    {1, 0x10},
    {1, 0x12},
    {1, 0x18},
    {1, 0x1a},
    {1, 0x20},
    {1, 0x22},
    {1, 0x28},
    {1, 0x30},
    {1, 0x3a},
    {1, 0x42},
    {1, 0x48},
    {1, 0x0d},
    {1, 0x09},
    {2, 0x0a, 0x00},
    {3, 0x0a, 0x01, 0x00},
    {3, 0x0a, 0x01, 0x1b},
    {4, 0x0a, 0x02, 0x0a, 0x00},
    /* replication: field 100 (an answer's epoch, Status's replicas) as a
     * varint and length-delimited, 101-104 (Status's view fields) */
    {2, 0xa0, 0x06},
    {2, 0xa2, 0x06},
    {2, 0xa8, 0x06},
    {2, 0xb2, 0x06},
    {2, 0xb8, 0x06},
    {2, 0xc2, 0x06},
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(4);
  for (int r = 0; r < rounds; r++) {
    /* mostly inside the header, past the length */
    size_t pos = n > 4 ? 4 + fuzz_rnd(n - 3) : fuzz_rnd(n + 1);
    switch (fuzz_rnd(9)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte */
      if (n) buf[fuzz_rnd(n)] = (uint8_t)fuzz_rng();
      break;
    case 2: /* insert a token */
    case 3: {
      const uint8_t *t = tokens[fuzz_rnd(NTOKENS)];
      n = fuzz_insert(buf, n, cap, pos, t + 1, t[0]);
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range: repeated fields */
      n = fuzz_duplicate(buf, n, cap, pos, 64);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    case 7: /* another header length: bulk bytes become header and back */
      if (n >= 4) {
        uint32_t l = (uint32_t)fuzz_rnd(n - 3);
        buf[0] = (uint8_t)l;
        buf[1] = (uint8_t)(l >> 8);
        buf[2] = (uint8_t)(l >> 16);
        buf[3] = (uint8_t)(l >> 24);
      }
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}
#endif
