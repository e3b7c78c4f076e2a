/* The security flags psctl and ps-worker share (common/SECURITY.md): each
 * sets a field of ps_client_options; the environment variable named in
 * the help text applies when the flag is not given. */
#ifndef PS_SECURITY_FLAGS_H
#define PS_SECURITY_FLAGS_H

#include "common/security.h"
#include "paramserver/client.h"
#include "paramserver/cluster.h"

#define PS_SECURITY_FLAG_BASE 3000
#define PS_SECURITY_OPTIONS                                                              \
  {"tls-ca", required_argument, NULL, PS_SECURITY_FLAG_BASE},                            \
      {"tls-cert", required_argument, NULL, PS_SECURITY_FLAG_BASE + 1},                  \
      {"tls-key", required_argument, NULL, PS_SECURITY_FLAG_BASE + 2},                   \
      {"tls-server-name", required_argument, NULL, PS_SECURITY_FLAG_BASE + 3}, {         \
    "token-file", required_argument, NULL, PS_SECURITY_FLAG_BASE + 4                     \
  }

#define PS_SECURITY_HELP                                                                 \
  "security (each also from the environment, else the spec):\n"                          \
  "  --tls-ca FILE     TLS: the CA of the ps certificates (PS_TLS_CA)\n"                 \
  "  --tls-cert FILE   mutual TLS: this client's PEM certificate (PS_TLS_CERT)\n"        \
  "  --tls-key FILE    and its PEM key (PS_TLS_KEY)\n"                                   \
  "  --tls-server-name NAME  the name in the ps certificates (PS_TLS_SERVER_NAME)\n"     \
  "  --token-file FILE send this token on every call (PS_TOKEN_FILE; PS_AUTH_TOKEN)\n"

/* true when @o was one of PS_SECURITY_OPTIONS (its value stored in @c). */
static inline bool ps_security_option(int o, const char *arg, ps_client_options *c) {
  switch (o - PS_SECURITY_FLAG_BASE) {
  case 0:
    c->tls_ca_file = arg;
    return true;
  case 1:
    c->tls_cert_file = arg;
    return true;
  case 2:
    c->tls_key_file = arg;
    return true;
  case 3:
    c->tls_server_name = arg;
    return true;
  case 4:
    c->token_file = arg;
    return true;
  default:
    return false;
  }
}

/* The chief and psctl act as admins: with no token given by flag or
 * environment, the spec's "security" admin_token_file is theirs. */
static inline void ps_security_admin_token(ps_client_options *c,
                                           const ps_cluster *cluster) {
  if (c->token_file == NULL && c->token == NULL && !ps_security_env("PS_TOKEN_FILE") &&
      !ps_security_env("PS_AUTH_TOKEN") && cluster->security &&
      cluster->security->admin_token_file)
    c->token_file = cluster->security->admin_token_file;
}

#endif
