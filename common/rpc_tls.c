/* The server's TLS: its certificate, key and client CA read and checked,
 * handed to gRPC through a certificate-config fetcher so that
 * ps_rpc_server_reload_tls takes effect on the next handshake, and the
 * TLS port (our own listener through gRPC's external-connection door, or
 * gRPC's own listener).  Above rpc_listen.c. */
#include "rpc_internal.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "security.h"

void ps_rpc_tls_files_free_(char **cert, char **key, char **ca) {
  free(*cert);
  if (*key) {
    ps_secure_zero(*key, strlen(*key));
    free(*key);
  }
  free(*ca);
  *cert = *key = *ca = NULL;
}

/* The TLS files of @o, read and checked: a certificate, its key, and the
 * client CA if any.  0, or an error naming the flag and file. */
int ps_rpc_tls_files_read_(const ps_rpc_server_options *o, char **cert, char **key,
                           char **ca, ps_status *st) {
  *cert = *key = *ca = NULL;
  if (o->tls_cert_file == NULL || o->tls_key_file == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TLS needs both --tls-cert and --tls-key (got only %s)",
                         o->tls_cert_file ? "--tls-cert" : "--tls-key");
  if ((*cert = ps_pem_read(o->tls_cert_file, "--tls-cert", false, st)) == NULL ||
      (*key = ps_pem_read(o->tls_key_file, "--tls-key", true, st)) == NULL ||
      (o->tls_client_ca_file &&
       (*ca = ps_pem_read(o->tls_client_ca_file, "--tls-client-ca", false, st)) ==
           NULL) ||
      ps_pem_check_pair(*cert, *key, o->tls_cert_file, o->tls_key_file, st) != 0) {
    ps_rpc_tls_files_free_(cert, key, ca);
    return st->code;
  }
  return 0;
}

/* gRPC asks on every TLS handshake: a new certificate config once one was
 * loaded (at the start, then by ps_rpc_server_reload_tls). */
static grpc_ssl_certificate_config_reload_status
tls_fetch(void *user, grpc_ssl_server_certificate_config **config) {
  ps_rpc_server *s = user;
  pthread_mutex_lock(&s->tls_mu);
  grpc_ssl_certificate_config_reload_status r =
      GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  if (s->tls_pending) {
    grpc_ssl_pem_key_cert_pair kp = {s->tls_key, s->tls_cert};
    /* gRPC 1.51 asserts the roots are set even when it asks no client for
     * a certificate (then they are never used): its own chain stands in */
    *config = grpc_ssl_server_certificate_config_create(
        s->tls_ca ? s->tls_ca : s->tls_cert, &kp, 1);
    r = *config ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW
                : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    s->tls_pending = 0;
  }
  pthread_mutex_unlock(&s->tls_mu);
  return r;
}

bool ps_rpc_server_tls(const ps_rpc_server *s) {
  return s->tls;
}

int ps_rpc_server_reload_tls(ps_rpc_server *s, ps_status *st) {
  if (!s->tls)
    return ps_status_set(st, PS_FAILED_PRECONDITION, "this server has no TLS to reload");
  char *cert, *key, *ca;
  if (ps_rpc_tls_files_read_(&s->opt, &cert, &key, &ca, st) != 0) return st->code;
  pthread_mutex_lock(&s->tls_mu);
  ps_rpc_tls_files_free_(&s->tls_cert, &s->tls_key, &s->tls_ca);
  s->tls_cert = cert;
  s->tls_key = key;
  s->tls_ca = ca;
  s->tls_pending = 1;
  pthread_mutex_unlock(&s->tls_mu);
  return 0;
}

/* TLS: gRPC listens on the port open_listeners just bound and checked
 * (it is released first).  0, or an error naming the address. */
int ps_rpc_tls_listen_(ps_rpc_server *s, const char *addr, ps_status *st) {
  char host[256], port[32], gaddr[320];
  ps_rpc_split_addr_(addr, host, sizeof host, port, sizeof port);
  int wild = !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*") ||
             host[0] == '\0';
  snprintf(gaddr, sizeof gaddr, "%s%s%s:%d", wild || strchr(host, ':') ? "[" : "",
           wild ? "::" : host, wild || strchr(host, ':') ? "]" : "", s->port);
  grpc_ssl_server_credentials_options *so =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          s->tls_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          tls_fetch, s);
  grpc_server_credentials *sc =
      so ? grpc_ssl_server_credentials_create_with_options(so) : NULL;
  /* our own listeners and accept loop, connections handed over by fd */
  if (sc && s->tls_external) grpc_server_add_http2_port(s->srv, TLS_EXTERNAL_PORT, sc);
  if (s->fd_handler && !ps_rpc_tls_handler_ok_(s->fd_handler)) {
    PS_WARN("TLS: gRPC's external-connection handler is not of the type this ps was "
            "built for (%s): gRPC's own listener accepts TLS connections instead",
            TLS_EXTERNAL_TYPE);
    pthread_mutex_lock(&s->accept_mu);
    s->fd_handler = NULL;
    pthread_mutex_unlock(&s->accept_mu);
    pthread_mutex_lock(&s->tls_mu); /* the external port took the first config */
    s->tls_pending = 1;
    pthread_mutex_unlock(&s->tls_mu);
  }
  if (s->fd_handler) {
    s->tls_own = 1;
    grpc_server_credentials_release(sc);
    return 0;
  }
  ps_rpc_close_listeners_(s); /* gRPC listens itself, on the port just checked */
  int got = sc ? grpc_server_add_http2_port(s->srv, gaddr, sc) : 0;
  if (sc) grpc_server_credentials_release(sc);
  if (got != s->port)
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s with TLS: %s", addr,
                         sc ? "address in use" : "the certificate was refused");
  return 0;
}
