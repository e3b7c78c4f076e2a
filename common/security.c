/* Bearer tokens with roles and PEM checks (security.h).  Tokens are kept
 * as SHA-256 digests and compared with OpenSSL's CRYPTO_memcmp, all of
 * them on every check: neither the token nor how much of it matched shows
 * in the time a call takes. */
#include "security.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "log.h"

#define DIGEST_BYTES 32

typedef struct token_entry {
  unsigned char digest[DIGEST_BYTES];
  ps_role role;
} token_entry;

struct ps_auth {
  char *path;
  pthread_rwlock_t mu; /* guards tokens, n */
  token_entry *tokens;
  size_t n;
};

const char *ps_security_env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

void ps_secure_zero(void *p, size_t n) {
  OPENSSL_cleanse(p, n);
}

const char *ps_role_name(ps_role r) {
  return r == PS_ROLE_ADMIN     ? "admin"
         : r == PS_ROLE_WORKER  ? "worker"
         : r == PS_ROLE_REPLICA ? "replica"
                                : "none";
}

/* The whole of a small regular file, NUL-terminated (malloc'd). */
static char *read_small_file(const char *path, const char *what, size_t *len,
                             ps_status *st) {
  /* regular files only: a FIFO put at the path must not block the caller
   * (the daemon's loop, on SIGHUP) until a writer comes */
  char *buf;
  size_t got;
  unsigned type;
  int e = ps_read_file(AT_FDCWD, path, PS_READ_REGULAR, PS_SECURITY_FILE_MAX, &buf, &got,
                       &type, NULL);
  if (e == EFBIG)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: %zu bytes, more than the %zu "
                         "allowed",
                         what, path, got, PS_SECURITY_FILE_MAX),
           NULL;
  if (e == ENOMEM)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "%s %s: out of memory", what, path),
           NULL;
  if (type != 0 || e == EISDIR)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: not a regular file", what,
                         path),
           NULL;
  if (e != 0)
    return ps_status_set(st, e == ENOENT ? PS_NOT_FOUND : PS_INVALID_ARGUMENT,
                         "%s %s: %s", what, path, strerror(e)),
           NULL;
  if (memchr(buf, '\0', got) != NULL) {
    OPENSSL_cleanse(buf, got);
    free(buf);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: has a NUL byte: not a text file", what, path),
           NULL;
  }
  if (len) *len = got;
  return buf;
}

/* The next line of *@cur that is neither blank nor a # comment, trimmed
 * of spaces, tabs and CRs (the text is cut in place; *@line counts every
 * line); NULL at the end. */
static char *next_line(char **cur, int *line) {
  while (*cur) {
    char *l = *cur, *nl = strchr(l, '\n');
    if (nl) *nl++ = '\0';
    *cur = nl;
    (*line)++;
    while (*l == ' ' || *l == '\t' || *l == '\r')
      l++;
    size_t ll = strlen(l);
    while (ll && (l[ll - 1] == ' ' || l[ll - 1] == '\t' || l[ll - 1] == '\r'))
      l[--ll] = '\0';
    if (*l != '\0' && *l != '#') return l;
  }
  return NULL;
}

int ps_token_check(const char *token, const char *what, ps_status *st) {
  size_t n = strlen(token);
  if (n < PS_TOKEN_MIN_BYTES || n > PS_TOKEN_MAX_BYTES)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: a token must have %d to %d characters (this one has %zu; "
                         "deploy/gen-certs.sh --tokens makes 64)",
                         what, PS_TOKEN_MIN_BYTES, PS_TOKEN_MAX_BYTES, n);
  for (size_t i = 0; i < n; i++)
    if (token[i] <= ' ' || token[i] > '~')
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: a token is printable ASCII without spaces (character %zu "
                           "is not)",
                           what, i + 1);
  return 0;
}

static void digest(const void *p, size_t n, unsigned char out[DIGEST_BYTES]) {
  unsigned int len = DIGEST_BYTES;
  if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1) memset(out, 0, DIGEST_BYTES);
}

/* Parses a token file into a new table; 0 or an error naming the line. */
static int parse_tokens(const char *path, token_entry **out, size_t *nout,
                        ps_status *st) {
  size_t text_len;
  char *text = read_small_file(path, "--auth-token-file", &text_len, st);
  if (text == NULL) return st->code;
  token_entry *t = NULL;
  size_t n = 0, cap = 0;
  int rc = 0, line = 0;
  char *cur = text, *l;
  while (rc == 0 && (l = next_line(&cur, &line)) != NULL) {
    char *sp = l + strcspn(l, " \t");
    if (*sp == '\0') {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "--auth-token-file %s, line %d: want ROLE TOKEN (ROLE worker, "
                         "admin or replica)",
                         path, line);
      break;
    }
    *sp++ = '\0';
    while (*sp == ' ' || *sp == '\t')
      sp++;
    ps_role role = !strcmp(l, "admin")     ? PS_ROLE_ADMIN
                   : !strcmp(l, "worker")  ? PS_ROLE_WORKER
                   : !strcmp(l, "replica") ? PS_ROLE_REPLICA
                                           : PS_ROLE_NONE;
    char what[4200];
    snprintf(what, sizeof what, "--auth-token-file %s, line %d", path, line);
    if (role == PS_ROLE_NONE) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: role '%.32s' is not worker, admin or replica", what, l);
      break;
    }
    if ((rc = ps_token_check(sp, what, st)) != 0) break;
    unsigned char d[DIGEST_BYTES];
    digest(sp, strlen(sp), d);
    for (size_t i = 0; i < n; i++)
      if (CRYPTO_memcmp(t[i].digest, d, DIGEST_BYTES) == 0)
        rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s: the same token is listed twice",
                           what);
    if (rc) break;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 8;
      token_entry *g = realloc(t, nc * sizeof *t);
      if (g == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
        break;
      }
      t = g;
      cap = nc;
    }
    memcpy(t[n].digest, d, DIGEST_BYTES);
    t[n++].role = role;
  }
  OPENSSL_cleanse(text, text_len);
  free(text);
  if (rc == 0 && n == 0)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "--auth-token-file %s: no token in it",
                       path);
  if (rc) {
    free(t);
    return rc;
  }
  *out = t;
  *nout = n;
  return 0;
}

static void warn_mode(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0 && (sb.st_mode & 0077))
    PS_WARN("--auth-token-file %s can be read by other users (mode %04o): chmod 600 it",
            path, (unsigned)(sb.st_mode & 07777));
}

ps_auth *ps_auth_load(const char *path, ps_status *st) {
  ps_auth *a = calloc(1, sizeof *a);
  if (a == NULL || (a->path = strdup(path)) == NULL) {
    free(a);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory"), NULL;
  }
  if (parse_tokens(path, &a->tokens, &a->n, st) != 0) {
    free(a->path);
    free(a);
    return NULL;
  }
  pthread_rwlock_init(&a->mu, NULL);
  warn_mode(path);
  return a;
}

int ps_auth_reload(ps_auth *a, ps_status *st) {
  token_entry *t;
  size_t n;
  if (parse_tokens(a->path, &t, &n, st) != 0) return st->code;
  warn_mode(a->path);
  pthread_rwlock_wrlock(&a->mu);
  token_entry *old = a->tokens;
  a->tokens = t;
  a->n = n;
  pthread_rwlock_unlock(&a->mu);
  free(old);
  return 0;
}

size_t ps_auth_count(ps_auth *a, size_t *admins) {
  pthread_rwlock_rdlock(&a->mu);
  size_t n = a->n, k = 0;
  for (size_t i = 0; i < n; i++)
    k += a->tokens[i].role == PS_ROLE_ADMIN;
  pthread_rwlock_unlock(&a->mu);
  if (admins) *admins = k;
  return n;
}

const char *ps_auth_path(const ps_auth *a) {
  return a->path;
}

ps_role ps_auth_check(ps_auth *a, const char *value, size_t len) {
  static const char scheme[] = "bearer ";
  if (value == NULL || len <= sizeof scheme - 1 || len > PS_TOKEN_MAX_BYTES + 64 ||
      strncasecmp(value, scheme, sizeof scheme - 1) != 0)
    return PS_ROLE_NONE;
  const char *tok = value + sizeof scheme - 1;
  size_t tl = len - (sizeof scheme - 1);
  while (tl && *tok == ' ') {
    tok++;
    tl--;
  }
  unsigned char d[DIGEST_BYTES];
  digest(tok, tl, d);
  int role = PS_ROLE_NONE;
  pthread_rwlock_rdlock(&a->mu);
  for (size_t i = 0; i < a->n; i++) {
    /* no branch on the outcome: every entry costs the same */
    int eq = CRYPTO_memcmp(a->tokens[i].digest, d, DIGEST_BYTES) == 0;
    int mask = -eq;
    role |= (int)a->tokens[i].role & mask;
  }
  pthread_rwlock_unlock(&a->mu);
  return (ps_role)role;
}

void ps_auth_destroy(ps_auth *a) {
  if (a == NULL) return;
  pthread_rwlock_destroy(&a->mu);
  OPENSSL_cleanse(a->tokens, a->n * sizeof *a->tokens);
  free(a->tokens);
  free(a->path);
  free(a);
}

char *ps_token_read_file(const char *path, ps_status *st) {
  size_t text_len;
  char *text = read_small_file(path, "token file", &text_len, st);
  if (text == NULL) return NULL;
  char *tok = NULL, *cur = text, *l;
  int line = 0;
  bool found = (l = next_line(&cur, &line)) != NULL;
  if (found) tok = strdup(l);
  OPENSSL_cleanse(text, text_len);
  free(text);
  if (tok == NULL)
    return found ? ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory"), NULL
                 : (ps_status_set(st, PS_INVALID_ARGUMENT,
                                  "token file %s: no token in it", path),
                    NULL);
  char what[4200];
  snprintf(what, sizeof what, "token file %s", path);
  if (ps_token_check(tok, what, st) != 0) {
    OPENSSL_cleanse(tok, strlen(tok));
    free(tok);
    return NULL;
  }
  return tok;
}

/* OpenSSL's last error as text (its queue is cleared). */
static const char *ssl_error(char *buf, size_t n) {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block of the right kind";
  ERR_error_string_n(e, buf, n);
  return buf;
}

char *ps_pem_read(const char *path, const char *flag, bool want_key, ps_status *st) {
  size_t len;
  char *pem = read_small_file(path, flag, &len, st);
  if (pem == NULL) return NULL;
  BIO *b = BIO_new_mem_buf(pem, (int)len);
  void *obj = NULL;
  if (b) {
    ERR_clear_error();
    obj = want_key ? (void *)PEM_read_bio_PrivateKey(b, NULL, NULL, NULL)
                   : (void *)PEM_read_bio_X509(b, NULL, NULL, NULL);
  }
  char eb[256];
  if (obj == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: not a PEM %s (%s)", flag, path,
                  want_key ? "private key" : "certificate", ssl_error(eb, sizeof eb));
    if (want_key) OPENSSL_cleanse(pem, len);
    free(pem);
    pem = NULL;
  } else if (want_key) {
    EVP_PKEY_free(obj);
  } else {
    X509_free(obj);
  }
  BIO_free(b);
  return pem;
}

int ps_pem_check_pair(const char *cert_pem, const char *key_pem, const char *cert_path,
                      const char *key_path, ps_status *st) {
  BIO *cb = BIO_new_mem_buf(cert_pem, -1), *kb = BIO_new_mem_buf(key_pem, -1);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  int ok = x && k && X509_check_private_key(x, k) == 1;
  ERR_clear_error();
  X509_free(x);
  EVP_PKEY_free(k);
  BIO_free(cb);
  BIO_free(kb);
  if (!ok)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "the key %s is not the private key of the certificate %s",
                         key_path, cert_path);
  return 0;
}
