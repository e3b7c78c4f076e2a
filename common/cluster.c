/* The cluster spec: job name -> task index -> "host:port", read from a JSON
 * file, from TF_CONFIG, or from a Slurm job step, with TensorFlow 1.x's
 * shapes and rules (tf.train.ClusterSpec, Estimator's RunConfig,
 * SlurmClusterResolver) so that a launcher written for TF works unchanged.
 *
 * The JSON comes from users and from the environment, so it is decoded
 * defensively: json-c in strict mode with UTF-8 validation and its default
 * depth limit, a size cap, a cap on task indices (a sparse {"999999999":
 * ...} would otherwise allocate gigabytes), and every address checked
 * before anyone tries to bind or dial it.  Each error names its source
 * (the file, TF_CONFIG, or the Slurm variable) and the job/task concerned,
 * because the person reading it is usually looking at a launch script for
 * a dozen processes and needs to know which line to fix.
 *
 * Jobs are kept sorted by name, as TF's ClusterDef is, so lookups are a
 * binary search and every derived order (Slurm rank slicing, JSON output)
 * matches TF's.
 *
 * This file holds the spec (construction, JSON in and out, lookups);
 * cluster_resolve.c reads TF_CONFIG and Slurm's environment and decides
 * which task this process is. */
#include "cluster.h"
#include "cluster_internal.h"
#include "common/appendf.h"
#include "fileio.h"
#include "view.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------- */

/* ps_status_code_from_errno, with @otherwise for what it calls UNKNOWN. */
static int errno_code(int e, int otherwise) {
  int c = ps_status_code_from_errno(e);
  return c == PS_UNKNOWN ? otherwise : c;
}

int ps_cl_oom_(const char *pre, ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "%s: out of memory", pre);
}

/* A printable, bounded copy of untrusted text for a message. */
const char *ps_cl_show_(const char *s, size_t n, char *buf, size_t bn) {
  size_t i = 0, o = 0;
  for (; i < n && o + 4 < bn; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[o++] = (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') ? '?' : (char)c;
  }
  if (i < n) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

bool ps_cl_is_name_(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && s[i] != '_') return false;
  return true;
}

/* Decimal digits only, at most @max; -1 otherwise. */
long ps_cl_parse_num_(const char *s, size_t n, long max) {
  if (n == 0 || n > 10) return -1;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v > max ? -1 : (long)v;
}

char *ps_cl_dup_n_(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d == NULL) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static int check_job_name(const char *name, size_t n, const char *pre, ps_status *st) {
  char b[SHOW_MAX];
  if (!ps_cl_is_name_(name, n))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: bad job name \"%s\" (letters, digits and _ only)", pre,
                         ps_cl_show_(name, n, b, sizeof b));
  if (n > PS_CLUSTER_MAX_JOB_NAME)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: job name \"%s\" is too long (max %d characters)", pre,
                         ps_cl_show_(name, n, b, sizeof b), PS_CLUSTER_MAX_JOB_NAME);
  return 0;
}

/* ---- addresses -------------------------------------------------------- */

static bool host_char(unsigned char c) {
  return isalnum(c) || c == '.' || c == '-' || c == '_';
}

/* "host:port", "1.2.3.4:port" or "[v6]:port", port 0..65535. */
int ps_cl_addr_check_(const char *a, size_t n, int *port) {
  const char *colon;
  if (n == 0 || n > 300) return ADDR_NOT_HOSTPORT;
  if (a[0] == '[') {
    const char *close = memchr(a, ']', n);
    if (close == NULL || close == a + 1 || close + 1 >= a + n || close[1] != ':')
      return ADDR_NOT_HOSTPORT;
    bool zone = false;
    for (const char *p = a + 1; p < close; p++) {
      unsigned char c = (unsigned char)*p;
      if (c == '%' && !zone)
        zone = true;
      else if (zone ? !host_char(c) : !(isxdigit(c) || c == ':' || c == '.'))
        return ADDR_NOT_HOSTPORT;
    }
    colon = close + 1;
  } else {
    colon = memrchr(a, ':', n);
    if (colon == NULL || colon == a) return ADDR_NOT_HOSTPORT;
    for (const char *p = a; p < colon; p++)
      if (!host_char((unsigned char)*p)) return ADDR_NOT_HOSTPORT;
  }
  size_t pn = (size_t)(a + n - (colon + 1));
  if (pn == 0) return ADDR_NOT_HOSTPORT;
  long v = ps_cl_parse_num_(colon + 1, pn, 65535);
  if (v < 0) return ADDR_BAD_PORT;
  if (port) *port = (int)v;
  return ADDR_OK;
}

/* Message for a bad address of task @job/@task; @pre may be "". */
int ps_cl_addr_error_(int why, const char *a, size_t n, const char *pre, const char *job,
                      int task, ps_status *st) {
  char b[SHOW_MAX];
  ps_cl_show_(a, n, b, sizeof b);
  if (why == ADDR_BAD_PORT)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s/%d: address \"%s\" has a bad port (must be a "
                         "number from 0 to 65535)",
                         pre, job, task, b);
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "%s: %s/%d: address \"%s\" is not host:port", pre, job, task, b);
}

static int addr_port(const char *a) {
  int port = -1;
  ps_cl_addr_check_(a, strlen(a), &port);
  return port;
}

/* ---- construction ----------------------------------------------------- */

ps_cluster *ps_cl_cluster_new_(int njobs) {
  ps_cluster *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->jobs = calloc((size_t)njobs, sizeof *c->jobs);
  if (c->jobs == NULL) {
    free(c);
    return NULL;
  }
  c->njobs = njobs;
  return c;
}

/* The string fields of ps_cluster_security, by their JSON keys. */
#define SEC_FIELDS(X)                                                                    \
  X(ca)                                                                                  \
  X(client_cert)                                                                         \
  X(client_key)                                                                          \
  X(token_file)                                                                          \
  X(admin_token_file)                                                                    \
  X(server_cert)                                                                         \
  X(server_key)                                                                          \
  X(client_ca)                                                                           \
  X(auth_token_file)

static void security_free(ps_cluster_security *s) {
  if (s == NULL) return;
#define FREE_FIELD(f) free(s->f);
  SEC_FIELDS(FREE_FIELD)
#undef FREE_FIELD
  free(s);
}

/* The "security" object: every key known, each a non-empty string (a
 * path), require_auth a boolean. */
static ps_cluster_security *security_from_json(json_object *o, const char *pre,
                                               ps_status *st) {
  if (!json_object_is_type(o, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: \"security\" must be an object of file paths, like "
                         "{\"ca\": \"/etc/ps/ca.crt\", \"token_file\": ...}",
                         pre),
           NULL;
  ps_cluster_security *s = calloc(1, sizeof *s);
  if (s == NULL) return ps_cl_oom_(pre, st), NULL;
  json_object_object_foreach(o, key, val) {
    if (!strcmp(key, "require_auth")) {
      if (!json_object_is_type(val, json_type_boolean)) {
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "%s: security.require_auth must be true or false", pre);
        goto fail;
      }
      s->require_auth = json_object_get_boolean(val);
      continue;
    }
    char **field = NULL;
#define MATCH_FIELD(f)                                                                   \
  if (!strcmp(key, #f)) field = &s->f;
    SEC_FIELDS(MATCH_FIELD)
#undef MATCH_FIELD
    if (field == NULL) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "%s: security: unknown key \"%.64s\" (known: ca, client_cert, "
                    "client_key, token_file, admin_token_file, server_cert, server_key, "
                    "client_ca, auth_token_file, require_auth)",
                    pre, key);
      goto fail;
    }
    const char *v =
        json_object_is_type(val, json_type_string) ? json_object_get_string(val) : NULL;
    if (v == NULL || v[0] == '\0' || strlen(v) > 4096) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "%s: security.%s must be a file path (a non-empty string)", pre, key);
      goto fail;
    }
    if ((*field = strdup(v)) == NULL) {
      ps_cl_oom_(pre, st);
      goto fail;
    }
  }
  return s;
fail:
  security_free(s);
  return NULL;
}

static json_object *security_to_json(const ps_cluster_security *s) {
  json_object *o = json_object_new_object();
  if (o == NULL) return NULL;
#define ADD_FIELD(f)                                                                     \
  if (s->f && json_object_object_add(o, #f, json_object_new_string(s->f)) != 0) goto fail;
  SEC_FIELDS(ADD_FIELD)
#undef ADD_FIELD
  if (s->require_auth &&
      json_object_object_add(o, "require_auth", json_object_new_boolean(1)) != 0)
    goto fail;
  return o;
fail:
  json_object_put(o);
  return NULL;
}

/* ---- the replication section ----------------------------------------- */

_Static_assert(sizeof((ps_repl_conf *)0)->etcd > PS_REPL_MAX_ETCD_CHARS, "etcd fits");
_Static_assert(sizeof((ps_repl_conf *)0)->job > PS_REPL_MAX_JOB_CHARS, "job fits");

static void replication_free(ps_cluster_replication *r) {
  if (r == NULL) return;
  free(r->etcd);
  free(r->job);
  free(r);
}

int ps_repl_check_etcd(const char *e, const char *name, ps_status *st) {
  char b[SHOW_MAX];
  size_t n = strlen(e);
  if (n == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: no etcd endpoint given (HOST:PORT[,HOST:PORT...])", name);
  if (n > PS_REPL_MAX_ETCD_CHARS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s is too long (%zu characters, max %d)", name, n,
                         PS_REPL_MAX_ETCD_CHARS);
  int count = 0;
  for (const char *p = e;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int port = -1;
    if (++count > PS_REPL_MAX_ENDPOINTS)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s lists more than %d etcd endpoints", name,
                           PS_REPL_MAX_ENDPOINTS);
    if (len == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s \"%s\" has an empty endpoint (HOST:PORT[,HOST:PORT...])",
                           name, ps_cl_show_(e, n, b, sizeof b));
    int why = ps_cl_addr_check_(p, len, &port);
    if (why == ADDR_NOT_HOSTPORT)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: endpoint \"%s\" is not HOST:PORT", name,
                           ps_cl_show_(p, len, b, sizeof b));
    if (why != ADDR_OK || port == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: endpoint \"%s\" has a bad port (must be a number from 1 "
                           "to 65535)",
                           name, ps_cl_show_(p, len, b, sizeof b));
    if (comma == NULL) return 0;
    p = comma + 1;
  }
}

int ps_repl_check_job(const char *job, const char *name, ps_status *st) {
  char b[SHOW_MAX];
  size_t n = strlen(job);
  bool ok = n >= 1 && n <= PS_REPL_MAX_JOB_CHARS;
  for (size_t i = 0; ok && i < n; i++)
    ok =
        isalnum((unsigned char)job[i]) || job[i] == '_' || job[i] == '.' || job[i] == '-';
  if (!ok)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s \"%s\" must be 1 to %d characters of A-Z a-z 0-9 _ . -",
                         name, ps_cl_show_(job, n, b, sizeof b), PS_REPL_MAX_JOB_CHARS);
  return 0;
}

/* An integer in [lo, hi] (json-c saturates what does not fit). */
static bool json_int_in(json_object *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!json_object_is_type(v, json_type_int)) return false;
  *out = json_object_get_int64(v);
  return *out >= lo && *out <= hi;
}

/* The "replication" object: every key known and checked. */
static ps_cluster_replication *replication_from_json(json_object *o, const char *pre,
                                                     ps_status *st) {
  if (!json_object_is_type(o, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: \"replication\" must be an object like {\"replicas\": 2, "
                         "\"etcd\": \"host:2379,...\", \"job\": \"name\", "
                         "\"lease_ttl\": 2}",
                         pre),
           NULL;
  ps_cluster_replication *r = calloc(1, sizeof *r);
  if (r == NULL) return ps_cl_oom_(pre, st), NULL;
  json_object_object_foreach(o, key, val) {
    int64_t v;
    char name[PRE_MAX + 32];
    snprintf(name, sizeof name, "%s: replication.%.16s", pre, key);
    if (!strcmp(key, "replicas")) {
      if (!json_int_in(val, 1, PS_VIEW_MAX_REPLICAS, &v)) {
        ps_status_set(st, PS_INVALID_ARGUMENT, "%s must be 1, 2 or 3", name);
        goto fail;
      }
      r->replicas = (int)v;
    } else if (!strcmp(key, "lease_ttl")) {
      if (!json_int_in(val, 1, PS_REPL_MAX_LEASE_TTL_S, &v)) {
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "%s must be a whole number of seconds from 1 to %d", name,
                      PS_REPL_MAX_LEASE_TTL_S);
        goto fail;
      }
      r->lease_ttl_s = v;
    } else if (!strcmp(key, "etcd") || !strcmp(key, "job")) {
      bool etcd = key[0] == 'e';
      const char *s =
          json_object_is_type(val, json_type_string) ? json_object_get_string(val) : NULL;
      if (s == NULL || strlen(s) != (size_t)json_object_get_string_len(val)) {
        ps_status_set(st, PS_INVALID_ARGUMENT, "%s must be a string%s", name,
                      etcd ? " \"HOST:PORT[,HOST:PORT...]\"" : "");
        goto fail;
      }
      if ((etcd ? ps_repl_check_etcd(s, name, st) : ps_repl_check_job(s, name, st)) != 0)
        goto fail;
      char **field = etcd ? &r->etcd : &r->job;
      free(*field); /* (a key given twice: json-c keeps the last) */
      if ((*field = strdup(s)) == NULL) {
        ps_cl_oom_(pre, st);
        goto fail;
      }
    } else {
      char b[SHOW_MAX];
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "%s: replication: unknown key \"%s\" (known: replicas, etcd, job, "
                    "lease_ttl)",
                    pre, ps_cl_show_(key, strlen(key), b, sizeof b));
      goto fail;
    }
  }
  return r;
fail:
  replication_free(r);
  return NULL;
}

static json_object *replication_to_json(const ps_cluster_replication *r) {
  json_object *o = json_object_new_object();
  if (o == NULL) return NULL;
  if (r->replicas &&
      json_object_object_add(o, "replicas", json_object_new_int(r->replicas)) != 0)
    goto fail;
  if (r->etcd && json_object_object_add(o, "etcd", json_object_new_string(r->etcd)) != 0)
    goto fail;
  if (r->job && json_object_object_add(o, "job", json_object_new_string(r->job)) != 0)
    goto fail;
  if (r->lease_ttl_s &&
      json_object_object_add(o, "lease_ttl", json_object_new_int64(r->lease_ttl_s)) != 0)
    goto fail;
  return o;
fail:
  json_object_put(o);
  return NULL;
}

const ps_cluster_replication *ps_cluster_get_replication(const ps_cluster *c) {
  return c ? c->replication : NULL;
}

void ps_repl_conf_from_cluster(const ps_cluster *c, ps_repl_conf *out) {
  memset(out, 0, sizeof *out);
  out->replicas = 1;
  snprintf(out->job, sizeof out->job, "%s", PS_REPL_DEFAULT_JOB);
  out->lease_ttl_s = PS_REPL_DEFAULT_LEASE_TTL_S;
  const ps_cluster_replication *r = ps_cluster_get_replication(c);
  if (r == NULL) return;
  if (r->replicas) out->replicas = r->replicas;
  if (r->etcd) snprintf(out->etcd, sizeof out->etcd, "%s", r->etcd);
  if (r->job) snprintf(out->job, sizeof out->job, "%s", r->job);
  if (r->lease_ttl_s) out->lease_ttl_s = r->lease_ttl_s;
}

void ps_repl_hosts_free(char **hosts, int n) {
  for (int i = 0; hosts && i < n; i++)
    free(hosts[i]);
  free(hosts);
}

int ps_repl_hosts_from_cluster(const ps_cluster *c, char ***hosts, int *n,
                               ps_status *st) {
  const ps_cluster_job *j = ps_cluster_find_job(c, "ps");
  *hosts = NULL;
  *n = 0;
  if (j == NULL) return 0;
  char **h = calloc((size_t)j->ntasks, sizeof *h);
  if (h == NULL) return ps_cl_oom_("cluster", st);
  for (int i = 0; i < j->ntasks; i++) {
    const char *a = j->addrs[i];
    if (a == NULL) continue;
    const char *colon = strrchr(a, ':'); /* checked host:port: there is one */
    h[i] = ps_cl_dup_n_(a, colon ? (size_t)(colon - a) : strlen(a));
    if (h[i] == NULL) {
      ps_repl_hosts_free(h, j->ntasks);
      return ps_cl_oom_("cluster", st);
    }
  }
  *hosts = h;
  *n = j->ntasks;
  return 0;
}

void ps_cluster_destroy(ps_cluster *c) {
  if (c == NULL) return;
  security_free(c->security);
  replication_free(c->replication);
  for (int i = 0; i < c->njobs; i++) {
    ps_cluster_job *j = &c->jobs[i];
    if (j->addrs != NULL)
      for (int t = 0; t < j->ntasks; t++)
        free(j->addrs[t]);
    free(j->addrs);
    free(j->name);
  }
  free(c->jobs);
  free(c);
}

int ps_cl_job_alloc_(ps_cluster_job *j, const char *name, size_t namelen, int ntasks) {
  j->name = ps_cl_dup_n_(name, namelen);
  j->addrs = calloc((size_t)ntasks, sizeof *j->addrs);
  if (j->name == NULL || j->addrs == NULL) return -1;
  j->ntasks = ntasks;
  return 0;
}

static int cmp_job(const void *a, const void *b) {
  return strcmp(((const ps_cluster_job *)a)->name, ((const ps_cluster_job *)b)->name);
}

typedef struct addr_ref {
  const char *addr;
  int job, task;
} addr_ref;

static int cmp_addr_ref(const void *a, const void *b) {
  const addr_ref *x = a, *y = b;
  int r = strcmp(x->addr, y->addr);
  if (r != 0) return r;
  if (x->job != y->job) return x->job < y->job ? -1 : 1;
  return (x->task > y->task) - (x->task < y->task);
}

/* Jobs sorted, names unique, then no address (port != 0) used twice. */
int ps_cl_cluster_finish_(ps_cluster *c, const char *pre, ps_status *st) {
  qsort(c->jobs, (size_t)c->njobs, sizeof *c->jobs, cmp_job);
  size_t total = 0;
  for (int i = 0; i < c->njobs; i++) {
    if (i > 0 && strcmp(c->jobs[i - 1].name, c->jobs[i].name) == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: job \"%s\" is given twice", pre,
                           c->jobs[i].name);
    total += (size_t)c->jobs[i].ntasks;
  }
  addr_ref *refs = malloc((total ? total : 1) * sizeof *refs);
  if (refs == NULL) return ps_cl_oom_(pre, st);
  size_t n = 0;
  for (int i = 0; i < c->njobs; i++)
    for (int t = 0; t < c->jobs[i].ntasks; t++) {
      const char *a = c->jobs[i].addrs[t];
      if (a != NULL && addr_port(a) != 0) refs[n++] = (addr_ref){a, i, t};
    }
  qsort(refs, n, sizeof *refs, cmp_addr_ref);
  int rc = 0;
  for (size_t k = 1; k < n && rc == 0; k++)
    if (strcmp(refs[k - 1].addr, refs[k].addr) == 0)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: address %s is used by both %s/%d and %s/%d", pre,
                         refs[k].addr, c->jobs[refs[k - 1].job].name, refs[k - 1].task,
                         c->jobs[refs[k].job].name, refs[k].task);
  free(refs);
  return rc;
}

/* ---- JSON ------------------------------------------------------------- */

static int line_at(const char *s, size_t off) {
  int line = 1;
  for (size_t i = 0; i < off; i++)
    if (s[i] == '\n' && line < INT_MAX) line++;
  return line;
}

/* Parses @len bytes of JSON text; NULL with a message on error. */
json_object *ps_cl_json_parse_(const char *text, size_t len, const char *pre,
                               ps_status *st) {
  if (len > PS_CLUSTER_MAX_BYTES)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: too large (%zu bytes, max %u)",
                         pre, len, PS_CLUSTER_MAX_BYTES),
           NULL;
  const char *nul = memchr(text, '\0', len);
  if (nul != NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: invalid JSON at line %d: NUL byte in the text", pre,
                         line_at(text, (size_t)(nul - text))),
           NULL;
  /* json-c finishes a top-level number or literal only when it sees the
   * end of the string, so hand it a NUL-terminated copy, NUL included. */
  char *copy = ps_cl_dup_n_(text, len);
  struct json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
  if (copy == NULL || tok == NULL) {
    free(copy);
    if (tok) json_tokener_free(tok);
    return ps_cl_oom_(pre, st), NULL;
  }
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
  json_object *o = json_tokener_parse_ex(tok, copy, (int)len + 1);
  enum json_tokener_error err = json_tokener_get_error(tok);
  if (o == NULL || err != json_tokener_success) {
    size_t end = json_tokener_get_parse_end(tok);
    if (end > len) end = len;
    const char *what = json_tokener_error_desc(err);
    if (len == 0 || err == json_tokener_continue) what = "unexpected end of data";
    ps_status_set(st, PS_INVALID_ARGUMENT, "%s: invalid JSON at line %d: %s", pre,
                  line_at(text, end), what);
    json_object_put(o);
    o = NULL;
  }
  json_tokener_free(tok);
  free(copy);
  return o;
}

/* Stores element @v as task @t's address of job @j. */
static int set_task_json(ps_cluster_job *j, int t, json_object *v, const char *pre,
                         ps_status *st) {
  if (!json_object_is_type(v, json_type_string))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s/%d: address must be a \"host:port\" string, "
                         "not %s",
                         pre, j->name, t, json_type_to_name(json_object_get_type(v)));
  const char *a = json_object_get_string(v);
  size_t n = (size_t)json_object_get_string_len(v);
  int why = strlen(a) != n ? ADDR_NOT_HOSTPORT : ps_cl_addr_check_(a, n, NULL);
  if (why != ADDR_OK) return ps_cl_addr_error_(why, a, n, pre, j->name, t, st);
  j->addrs[t] = ps_cl_dup_n_(a, n);
  return j->addrs[t] == NULL ? ps_cl_oom_(pre, st) : 0;
}

static int job_from_json(ps_cluster_job *j, const char *name, json_object *v,
                         const char *pre, ps_status *st) {
  size_t namelen = strlen(name);
  int rc = check_job_name(name, namelen, pre, st);
  if (rc != 0) return rc;
  bool list = json_object_is_type(v, json_type_array);
  if (!list && !json_object_is_type(v, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: job \"%s\" must be a list of \"host:port\" "
                         "strings or an object",
                         pre, name);
  size_t n = list ? json_object_array_length(v) : (size_t)json_object_object_length(v);
  if (n == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: job \"%s\" has no tasks", pre,
                         name);
  if (n > PS_CLUSTER_MAX_TASKS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: job \"%s\" has too many tasks (max %d)", pre, name,
                         PS_CLUSTER_MAX_TASKS);
  if (list) {
    if (ps_cl_job_alloc_(j, name, namelen, (int)n) != 0) return ps_cl_oom_(pre, st);
    for (size_t t = 0; t < n; t++) {
      rc = set_task_json(j, (int)t, json_object_array_get_idx(v, t), pre, st);
      if (rc != 0) return rc;
    }
    return 0;
  }
  /* Sparse: first find the largest index, then fill. */
  long max = -1;
  struct json_object_iterator it = json_object_iter_begin(v);
  struct json_object_iterator end = json_object_iter_end(v);
  for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
    const char *key = json_object_iter_peek_name(&it);
    long idx = ps_cl_parse_num_(key, strlen(key), PS_CLUSTER_MAX_TASKS - 1);
    if (idx < 0) {
      char b[SHOW_MAX];
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: job \"%s\": bad task index \"%s\" (must be a "
                           "number from 0 to %d)",
                           pre, name, ps_cl_show_(key, strlen(key), b, sizeof b),
                           PS_CLUSTER_MAX_TASKS - 1);
    }
    if (idx > max) max = idx;
  }
  if (ps_cl_job_alloc_(j, name, namelen, (int)max + 1) != 0) return ps_cl_oom_(pre, st);
  it = json_object_iter_begin(v);
  for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
    const char *key = json_object_iter_peek_name(&it);
    int idx = (int)ps_cl_parse_num_(key, strlen(key), PS_CLUSTER_MAX_TASKS - 1);
    if (j->addrs[idx] != NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: job \"%s\": task index %d is given twice", pre, name,
                           idx);
    rc = set_task_json(j, idx, json_object_iter_peek_value(&it), pre, st);
    if (rc != 0) return rc;
  }
  return 0;
}

/* @what names @top in messages: "top level" or "\"cluster\"". */
ps_cluster *ps_cl_cluster_from_json_(json_object *top, const char *what, const char *pre,
                                     ps_status *st) {
  if (!json_object_is_type(top, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s must be an object of job names, like "
                         "{\"ps\": [\"host:port\", ...], \"worker\": [...]}",
                         pre, what),
           NULL;
  json_object *sec = NULL, *repl = NULL;
  int njobs = json_object_object_length(top);
  if (json_object_object_get_ex(top, "security", &sec)) njobs--;
  if (json_object_object_get_ex(top, "replication", &repl)) njobs--;
  if (njobs <= 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s has no jobs, expected something like "
                         "{\"ps\": [\"host:port\", ...], \"worker\": [...]}",
                         pre, what),
           NULL;
  ps_cluster *c = ps_cl_cluster_new_(njobs);
  if (c == NULL) return ps_cl_oom_(pre, st), NULL;
  int i = 0;
  struct json_object_iterator it = json_object_iter_begin(top);
  struct json_object_iterator end = json_object_iter_end(top);
  for (; !json_object_iter_equal(&it, &end) && i < njobs; json_object_iter_next(&it)) {
    const char *name = json_object_iter_peek_name(&it);
    if (!strcmp(name, "security") || !strcmp(name, "replication")) continue;
    if (job_from_json(&c->jobs[i], name, json_object_iter_peek_value(&it), pre, st) != 0)
      goto fail;
    i++;
  }
  c->njobs = i;
  if (sec && (c->security = security_from_json(sec, pre, st)) == NULL) goto fail;
  if (json_object_object_get_ex(top, "replication", NULL) &&
      (c->replication = replication_from_json(repl, pre, st)) == NULL)
    goto fail;
  if (ps_cl_cluster_finish_(c, pre, st) != 0) goto fail;
  return c;
fail:
  ps_cluster_destroy(c);
  return NULL;
}

static void make_pre(char *pre, const char *origin) {
  snprintf(pre, PRE_MAX, "cluster spec %.500s", origin ? origin : "(string)");
}

ps_cluster *ps_cluster_parse(const char *json, size_t len, const char *origin,
                             ps_status *st) {
  char pre[PRE_MAX];
  make_pre(pre, origin);
  if (json == NULL) len = 0, json = "";
  json_object *top = ps_cl_json_parse_(json, len, pre, st);
  if (top == NULL) return NULL;
  ps_cluster *c = ps_cl_cluster_from_json_(top, "top level", pre, st);
  json_object_put(top);
  return c;
}

ps_cluster *ps_cluster_load_file(const char *path, ps_status *st) {
  char pre[PRE_MAX];
  make_pre(pre, path);
  if (path == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: no path given", pre), NULL;
  char *buf;
  size_t n;
  const char *op;
  ps_cluster *c = NULL;
  int e = ps_read_file(AT_FDCWD, path, 0, PS_CLUSTER_MAX_BYTES, &buf, &n, NULL, &op);
  if (e == EFBIG)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: too large (more than %u bytes)",
                         pre, PS_CLUSTER_MAX_BYTES),
           NULL;
  if (e == ENOMEM) return ps_cl_oom_(pre, st), NULL;
  if (e != 0)
    return ps_status_set(st, errno_code(e, PS_INVALID_ARGUMENT), "%s: cannot %s: %s", pre,
                         strcmp(op, "opening") == 0 ? "open" : "read", strerror(e)),
           NULL;
  json_object *top = ps_cl_json_parse_(buf, n, pre, st);
  if (top != NULL) {
    c = ps_cl_cluster_from_json_(top, "top level", pre, st);
    json_object_put(top);
  }
  free(buf);
  return c;
}

/* ---- lookups ---------------------------------------------------------- */

const ps_cluster_job *ps_cluster_find_job(const ps_cluster *c, const char *job) {
  if (c == NULL || job == NULL) return NULL;
  int lo = 0, hi = c->njobs - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int r = strcmp(job, c->jobs[mid].name);
    if (r == 0) return &c->jobs[mid];
    if (r < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

int ps_cluster_num_tasks(const ps_cluster *c, const char *job) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  return j ? j->ntasks : 0;
}

int ps_cluster_num_listed(const ps_cluster *c, const char *job) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  int n = 0;
  for (int i = 0; j && i < j->ntasks; i++)
    n += j->addrs[i] != NULL;
  return n;
}

const char *ps_cluster_address(const ps_cluster *c, const char *job, int task) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  if (j == NULL || task < 0 || task >= j->ntasks) return NULL;
  return j->addrs[task];
}

/* True if job/task has an address; else says why not in @why. */
bool ps_cl_evaluator_outside_(const ps_cluster *c, const char *job) {
  return job && !strcmp(job, "evaluator") && ps_cluster_num_tasks(c, "evaluator") == 0;
}

bool ps_cl_task_present_(const ps_cluster *c, const char *job, int task, char *why,
                         size_t n) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  char b[SHOW_MAX];
  if (j == NULL) {
    size_t o = 0;
    if (n) why[0] = '\0';
    ps_appendf(why, n, &o,
               "no job \"%s\"; jobs:", ps_cl_show_(job, strlen(job), b, sizeof b));
    for (int i = 0; i < c->njobs; i++)
      ps_appendf(why, n, &o, "%s %s", i ? "," : "", c->jobs[i].name);
    return false;
  }
  if (task < 0 || task >= j->ntasks) {
    snprintf(why, n, "job %s has %d task%s", j->name, j->ntasks,
             j->ntasks == 1 ? "" : "s");
    return false;
  }
  if (j->addrs[task] == NULL) {
    snprintf(why, n, "job %s has no task %d", j->name, task);
    return false;
  }
  return true;
}

void ps_cl_task_id_set_(ps_task_id *id, const char *job, int task) {
  if (id == NULL) return;
  snprintf(id->job, sizeof id->job, "%s", job);
  id->task = task;
}

int ps_cluster_set_address(ps_cluster *c, const char *job, int task, const char *addr,
                           ps_status *st) {
  char why[256], b[SHOW_MAX];
  const ps_cluster_job *cj = ps_cluster_find_job(c, job);
  if (c == NULL || job == NULL || addr == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "cluster: set address: missing argument");
  if (cj == NULL || task < 0 || task >= cj->ntasks) {
    ps_cl_task_present_(c, job, task, why, sizeof why);
    return ps_status_set(st, PS_NOT_FOUND, "cluster: no task %s/%d (%s)",
                         ps_cl_show_(job, strlen(job), b, sizeof b), task, why);
  }
  ps_cluster_job *j = &c->jobs[cj - c->jobs];
  int port = -1, rc = ps_cl_addr_check_(addr, strlen(addr), &port);
  if (rc != ADDR_OK)
    return ps_cl_addr_error_(rc, addr, strlen(addr), "cluster", j->name, task, st);
  for (int i = 0; port != 0 && i < c->njobs; i++)
    for (int t = 0; t < c->jobs[i].ntasks; t++) {
      const char *a = c->jobs[i].addrs[t];
      if (a != NULL && !(&c->jobs[i] == j && t == task) && strcmp(a, addr) == 0)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "cluster: %s/%d: address %s is already used by "
                             "%s/%d",
                             j->name, task, addr, c->jobs[i].name, t);
    }
  char *copy = strdup(addr);
  if (copy == NULL) return ps_cl_oom_("cluster", st);
  free(j->addrs[task]);
  j->addrs[task] = copy;
  return 0;
}

int ps_cluster_chief(const ps_cluster *c, ps_task_id *chief) {
  static const char *const jobs[] = {"chief", "worker"};
  for (size_t i = 0; i < 2; i++)
    if (ps_cluster_address(c, jobs[i], 0) != NULL) {
      ps_cl_task_id_set_(chief, jobs[i], 0);
      return 0;
    }
  return PS_NOT_FOUND;
}

/* ---- output ----------------------------------------------------------- */

static json_object *job_to_json(const ps_cluster_job *j) {
  bool dense = true;
  for (int t = 0; t < j->ntasks; t++)
    if (j->addrs[t] == NULL) dense = false;
  json_object *v = dense ? json_object_new_array() : json_object_new_object();
  if (v == NULL) return NULL;
  for (int t = 0; t < j->ntasks; t++) {
    if (j->addrs[t] == NULL) continue;
    json_object *s = json_object_new_string(j->addrs[t]);
    int rc = -1;
    if (s != NULL && dense) {
      rc = json_object_array_add(v, s);
    } else if (s != NULL) {
      char key[16];
      snprintf(key, sizeof key, "%d", t);
      rc = json_object_object_add(v, key, s);
    }
    if (rc != 0) {
      json_object_put(s);
      json_object_put(v);
      return NULL;
    }
  }
  return v;
}

static char *to_json_flags(const ps_cluster *c, int flags) {
  if (c == NULL) return NULL;
  json_object *top = json_object_new_object();
  if (top == NULL) return NULL;
  char *out = NULL;
  for (int i = 0; i < c->njobs; i++) {
    json_object *v = job_to_json(&c->jobs[i]);
    if (v == NULL) goto done;
    if (json_object_object_add(top, c->jobs[i].name, v) != 0) {
      json_object_put(v);
      goto done;
    }
  }
  if (c->security) {
    json_object *v = security_to_json(c->security);
    if (v == NULL) goto done;
    if (json_object_object_add(top, "security", v) != 0) {
      json_object_put(v);
      goto done;
    }
  }
  if (c->replication) {
    json_object *v = replication_to_json(c->replication);
    if (v == NULL) goto done;
    if (json_object_object_add(top, "replication", v) != 0) {
      json_object_put(v);
      goto done;
    }
  }
  const char *s = json_object_to_json_string_ext(top, flags);
  if (s != NULL) out = strdup(s);
done:
  json_object_put(top);
  return out;
}

char *ps_cluster_to_json(const ps_cluster *c) {
  return to_json_flags(c, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
}

int ps_cluster_write_file(const ps_cluster *c, const char *path, ps_status *st) {
  char pre[PRE_MAX];
  make_pre(pre, path);
  if (c == NULL || path == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: nothing to write", pre);
  char *text = to_json_flags(c, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
  if (text == NULL) return ps_cl_oom_(pre, st);
  size_t n = strlen(text);
  text[n] = '\n'; /* replaces the NUL; the length is n + 1 */
  const char *op = NULL;
  int rc = 0, e = ps_replace_file(path, NULL, text, n + 1, &op, NULL);
  if (e != 0 && !strcmp(op, "creating"))
    rc = ps_status_set(st, errno_code(e, PS_INTERNAL),
                       "%s: cannot create temporary file: %s", pre, strerror(e));
  else if (e != 0)
    rc = ps_status_set(st, errno_code(e, PS_INTERNAL), "%s: cannot %s: %s", pre,
                       !strcmp(op, "renaming")  ? "rename"
                       : !strcmp(op, "writing") ? "write"
                       : !strcmp(op, "closing") ? "close"
                       : !strcmp(op, "syncing") ? "fsync"
                                                : "fsync the directory",
                       strerror(e));
  free(text);
  return rc;
}
