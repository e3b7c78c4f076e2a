/* Who may call a ps: bearer tokens with a role, and the PEM files of TLS
 * (common/SECURITY.md).  Used by common/rpc*.c (the check on every call,
 * the credentials) and by the programs that read the files. */
#ifndef PS_SECURITY_H
#define PS_SECURITY_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* A caller's role.  A worker token creates, initializes, reads and updates
 * variables; an admin token may also restore, snapshot, save, merge,
 * delete, shut down and re-initialize initialized variables.  A replica
 * token (the ps tasks' own, --replicas R) may call Replicate only; an
 * admin token may too.  (Distinct bits: ps_auth_check ORs them.) */
typedef enum ps_role {
  PS_ROLE_NONE = 0,
  PS_ROLE_WORKER = 1,
  PS_ROLE_ADMIN = 2,
  PS_ROLE_REPLICA = 4
} ps_role;
const char *ps_role_name(ps_role r); /* "worker", "admin", "replica", "none" */

/* Bytes of a token (printable ASCII, no spaces). */
#define PS_TOKEN_MIN_BYTES 16
#define PS_TOKEN_MAX_BYTES 4096
/* Largest token or PEM file read. */
#define PS_SECURITY_FILE_MAX ((size_t)1 << 20)

/* A ps's tokens (--auth-token-file): one "ROLE TOKEN" a line, ROLE worker,
 * admin or replica; blank lines and lines starting with # are skipped.  Only the
 * tokens' SHA-256 digests are kept.  NULL with @st naming the file and
 * line on any error (a bad role, a short token, a token listed twice, no
 * token at all). */
typedef struct ps_auth ps_auth;
ps_auth *ps_auth_load(const char *path, ps_status *st);
/* Reads the file again (SIGHUP): on success the new tokens replace the old
 * ones for calls that start afterwards; on error the old ones stay. */
int ps_auth_reload(ps_auth *a, ps_status *st);
/* Tokens held, and how many are admin tokens. */
size_t ps_auth_count(ps_auth *a, size_t *admins);
const char *ps_auth_path(const ps_auth *a);
/* The role of an "authorization" value "Bearer TOKEN" (the scheme in any
 * case), PS_ROLE_NONE when it matches no token.  Every token is compared,
 * by digest, in constant time: the time taken does not depend on which
 * token matched or how much of one did.  Any thread. */
ps_role ps_auth_check(ps_auth *a, const char *value, size_t len);
void ps_auth_destroy(ps_auth *a); /* NULL is a no-op */

/* The environment variable @name when set and not empty, else NULL (the
 * PS_* security settings: an empty one counts as unset). */
const char *ps_security_env(const char *name);

/* Zeroes @n bytes of a key or token before it is freed, in a way the
 * compiler keeps (OPENSSL_cleanse). */
void ps_secure_zero(void *p, size_t n);

/* A client's token: the first line of @path that is neither blank nor a
 * # comment, trimmed (malloc'd).  NULL with @st naming the file. */
char *ps_token_read_file(const char *path, ps_status *st);
/* Checks a token's form (length, characters); 0 or INVALID_ARGUMENT
 * naming @what (a flag or file, never the token). */
int ps_token_check(const char *token, const char *what, ps_status *st);

/* A PEM file's text (malloc'd, NUL-terminated), checked to hold at least
 * one certificate (@want_key false) or one private key (true).  @flag
 * names the option in errors ("--tls-cert"). */
char *ps_pem_read(const char *path, const char *flag, bool want_key, ps_status *st);
/* 0 when @key_pem is the private key of the first certificate of
 * @cert_pem; else INVALID_ARGUMENT naming both files. */
int ps_pem_check_pair(const char *cert_pem, const char *key_pem, const char *cert_path,
                      const char *key_path, ps_status *st);

#endif
