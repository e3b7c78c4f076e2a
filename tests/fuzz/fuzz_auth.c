/* Fuzz target for the two decoders of credentials (common/security.c): a
 * ps's token file (ps_auth_load: first byte 0, the rest is the file) and
 * the "authorization" header every call brings (ps_auth_check: first byte
 * 1, the rest is the header value, against a fixed token file).  Besides
 * "no crash, no leak, no UB" it checks: an error carries a message; every
 * token of a file that loads authenticates with the role of its line; a
 * header gets a role only when it is "Bearer " (any case, spaces after)
 * and exactly a known token.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target; otherwise the shared driver (driver.c) replays the corpus and
 * deterministic mutations of it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/security.h"
#include "driver.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_auth: " __VA_ARGS__);                                          \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define WORKER_TOKEN "0123456789abcdef0123456789abcdef"
#define ADMIN_TOKEN "fedcba9876543210fedcba9876543210"

static char path[64];
static ps_auth *fixed; /* WORKER_TOKEN and ADMIN_TOKEN */

static void write_file(const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0)
    FAIL("cannot write %s", path);
}

static void cleanup(void) {
  ps_auth_destroy(fixed);
  unlink(path);
}

static void setup(void) {
  if (path[0]) return;
  snprintf(path, sizeof path, "/tmp/fuzz_auth.%d", (int)getpid());
  static const char text[] = "worker " WORKER_TOKEN "\nadmin " ADMIN_TOKEN "\n";
  write_file((const uint8_t *)text, sizeof text - 1);
  ps_status st = {0};
  if ((fixed = ps_auth_load(path, &st)) == NULL) FAIL("fixed tokens: %s", st.msg);
  atexit(cleanup);
}

static ps_role check(ps_auth *a, const char *v) {
  return ps_auth_check(a, v, strlen(v));
}

/* Every "ROLE TOKEN" line of @text (as ps_auth_load reads it) authenticates. */
static void check_loaded(ps_auth *a, char *text) {
  size_t admins, n = ps_auth_count(a, &admins);
  if (n < 1 || admins > n) FAIL("%zu tokens, %zu admin", n, admins);
  for (char *l = text, *next; l; l = next) {
    next = strchr(l, '\n');
    if (next) *next++ = '\0';
    l += strspn(l, " \t\r");
    size_t ll = strlen(l);
    while (ll && strchr(" \t\r", l[ll - 1]))
      l[--ll] = '\0';
    if (*l == '\0' || *l == '#') continue;
    char *tok = l + strcspn(l, " \t");
    *tok++ = '\0';
    tok += strspn(tok, " \t");
    ps_role want = !strcmp(l, "admin")     ? PS_ROLE_ADMIN
                   : !strcmp(l, "replica") ? PS_ROLE_REPLICA
                                           : PS_ROLE_WORKER;
    char hdr[PS_TOKEN_MAX_BYTES + 16];
    snprintf(hdr, sizeof hdr, "Bearer %s", tok);
    if (check(a, hdr) != want) FAIL("token of role %s does not authenticate", l);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 1) return 0;
  if (data[0] == 0) {
    write_file(data + 1, size - 1);
    ps_status st = {0};
    ps_auth *a = ps_auth_load(path, &st);
    if (a == NULL) {
      if (st.code == PS_OK || st.msg[0] == '\0') FAIL("load failed without a message");
      /* the fixed tokens are back for the header case */
      static const char text[] = "worker " WORKER_TOKEN "\nadmin " ADMIN_TOKEN "\n";
      write_file((const uint8_t *)text, sizeof text - 1);
      return 0;
    }
    char *text = malloc(size);
    if (text == NULL) FAIL("no memory");
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    if (strlen(text) == size - 1) check_loaded(a, text); /* (a NUL ends a line early) */
    free(text);
    ps_auth_destroy(a);
    static const char fixed_text[] = "worker " WORKER_TOKEN "\nadmin " ADMIN_TOKEN "\n";
    write_file((const uint8_t *)fixed_text, sizeof fixed_text - 1);
    return 0;
  }
  const char *v = (const char *)data + 1;
  size_t n = size - 1;
  ps_role r = ps_auth_check(fixed, v, n);
  /* what should match: "bearer" in any case, spaces, one token exactly */
  ps_role want = PS_ROLE_NONE;
  if (n > 7 && strncasecmp(v, "bearer ", 7) == 0) {
    size_t i = 7;
    while (i < n && v[i] == ' ')
      i++;
    size_t tl = n - i;
    if (tl == strlen(WORKER_TOKEN) && memcmp(v + i, WORKER_TOKEN, tl) == 0)
      want = PS_ROLE_WORKER;
    if (tl == strlen(ADMIN_TOKEN) && memcmp(v + i, ADMIN_TOKEN, tl) == 0)
      want = PS_ROLE_ADMIN;
  }
  if (r != want)
    FAIL("header of %zu bytes: role %s, want %s", n, ps_role_name(r), ps_role_name(want));
  return 0;
}

#ifndef PS_LIBFUZZER
size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  static const char *const pieces[] = {"Bearer ",    "bearer",    " ",      "\n",
                                       "\r\n",       "#",         "admin ", "worker ",
                                       WORKER_TOKEN, ADMIN_TOKEN, "\t",     "root "};
  int rounds = 1 + (int)fuzz_rnd(4);
  for (int r = 0; r < rounds; r++) {
    size_t pos = 1 + fuzz_rnd(n); /* byte 0 picks the decoder */
    if (n == 0) break;
    switch (fuzz_rnd(6)) {
    case 0:
      buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1:
    case 2: {
      const char *t = pieces[fuzz_rnd(sizeof pieces / sizeof pieces[0])];
      n = fuzz_insert(buf, n, cap, pos > n ? n : pos, t, strlen(t));
      break;
    }
    case 3:
      if (pos < n) n = fuzz_erase(buf, n, pos);
      break;
    case 4:
      n = fuzz_splice(buf, n, cap, pos > n ? n : pos);
      break;
    default:
      if (pos < n) n = pos;
      break;
    }
  }
  if (n) buf[0] &= 1;
  return n;
}
#endif
