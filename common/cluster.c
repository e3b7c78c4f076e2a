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
 * matches TF's. */
#include "cluster.h"
#include "fileio.h"

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

/* Prefix of every message: "cluster spec /tmp/c.json", "TF_CONFIG". */
#define PRE_MAX 600
/* Untrusted text quoted in a message is cut to this. */
#define SHOW_MAX 96
/* Slurm step limits: hosts after expansion, jobs in a jobs spec. */
#define SLURM_MAX_HOSTS 65536
#define SLURM_MAX_JOBS 64

/* ---- helpers ---------------------------------------------------------- */

/* ps_status_code_from_errno, with @otherwise for what it calls UNKNOWN. */
static int errno_code(int e, int otherwise) {
  int c = ps_status_code_from_errno(e);
  return c == PS_UNKNOWN ? otherwise : c;
}

static int oom(const char *pre, ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "%s: out of memory", pre);
}

/* A printable, bounded copy of untrusted text for a message. */
static const char *show(const char *s, size_t n, char *buf, size_t bn) {
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

static bool is_name(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && s[i] != '_') return false;
  return true;
}

/* Decimal digits only, at most @max; -1 otherwise. */
static long parse_num(const char *s, size_t n, long max) {
  if (n == 0 || n > 10) return -1;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v > max ? -1 : (long)v;
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d == NULL) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static int check_job_name(const char *name, size_t n, const char *pre, ps_status *st) {
  char b[SHOW_MAX];
  if (!is_name(name, n))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: bad job name \"%s\" (letters, digits and _ only)", pre,
                         show(name, n, b, sizeof b));
  if (n > PS_CLUSTER_MAX_JOB_NAME)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: job name \"%s\" is too long (max %d characters)", pre,
                         show(name, n, b, sizeof b), PS_CLUSTER_MAX_JOB_NAME);
  return 0;
}

/* ---- addresses -------------------------------------------------------- */

enum { ADDR_OK, ADDR_NOT_HOSTPORT, ADDR_BAD_PORT };

static bool host_char(unsigned char c) {
  return isalnum(c) || c == '.' || c == '-' || c == '_';
}

/* "host:port", "1.2.3.4:port" or "[v6]:port", port 0..65535. */
static int addr_check(const char *a, size_t n, int *port) {
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
  long v = parse_num(colon + 1, pn, 65535);
  if (v < 0) return ADDR_BAD_PORT;
  if (port) *port = (int)v;
  return ADDR_OK;
}

/* Message for a bad address of task @job/@task; @pre may be "". */
static int addr_error(int why, const char *a, size_t n, const char *pre, const char *job,
                      int task, ps_status *st) {
  char b[SHOW_MAX];
  show(a, n, b, sizeof b);
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
  addr_check(a, strlen(a), &port);
  return port;
}

/* ---- construction ----------------------------------------------------- */

static ps_cluster *cluster_new(int njobs) {
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

void ps_cluster_destroy(ps_cluster *c) {
  if (c == NULL) return;
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

static int job_alloc(ps_cluster_job *j, const char *name, size_t namelen, int ntasks) {
  j->name = dup_n(name, namelen);
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
static int cluster_finish(ps_cluster *c, const char *pre, ps_status *st) {
  qsort(c->jobs, (size_t)c->njobs, sizeof *c->jobs, cmp_job);
  size_t total = 0;
  for (int i = 0; i < c->njobs; i++) {
    if (i > 0 && strcmp(c->jobs[i - 1].name, c->jobs[i].name) == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: job \"%s\" is given twice", pre,
                           c->jobs[i].name);
    total += (size_t)c->jobs[i].ntasks;
  }
  addr_ref *refs = malloc((total ? total : 1) * sizeof *refs);
  if (refs == NULL) return oom(pre, st);
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
static json_object *json_parse(const char *text, size_t len, const char *pre,
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
  char *copy = dup_n(text, len);
  struct json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
  if (copy == NULL || tok == NULL) {
    free(copy);
    if (tok) json_tokener_free(tok);
    return oom(pre, st), NULL;
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
  int why = strlen(a) != n ? ADDR_NOT_HOSTPORT : addr_check(a, n, NULL);
  if (why != ADDR_OK) return addr_error(why, a, n, pre, j->name, t, st);
  j->addrs[t] = dup_n(a, n);
  return j->addrs[t] == NULL ? oom(pre, st) : 0;
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
    if (job_alloc(j, name, namelen, (int)n) != 0) return oom(pre, st);
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
    long idx = parse_num(key, strlen(key), PS_CLUSTER_MAX_TASKS - 1);
    if (idx < 0) {
      char b[SHOW_MAX];
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: job \"%s\": bad task index \"%s\" (must be a "
                           "number from 0 to %d)",
                           pre, name, show(key, strlen(key), b, sizeof b),
                           PS_CLUSTER_MAX_TASKS - 1);
    }
    if (idx > max) max = idx;
  }
  if (job_alloc(j, name, namelen, (int)max + 1) != 0) return oom(pre, st);
  it = json_object_iter_begin(v);
  for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it)) {
    const char *key = json_object_iter_peek_name(&it);
    int idx = (int)parse_num(key, strlen(key), PS_CLUSTER_MAX_TASKS - 1);
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
static ps_cluster *cluster_from_json(json_object *top, const char *what, const char *pre,
                                     ps_status *st) {
  if (!json_object_is_type(top, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s must be an object of job names, like "
                         "{\"ps\": [\"host:port\", ...], \"worker\": [...]}",
                         pre, what),
           NULL;
  int njobs = json_object_object_length(top);
  if (njobs <= 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s has no jobs, expected something like "
                         "{\"ps\": [\"host:port\", ...], \"worker\": [...]}",
                         pre, what),
           NULL;
  ps_cluster *c = cluster_new(njobs);
  if (c == NULL) return oom(pre, st), NULL;
  int i = 0;
  struct json_object_iterator it = json_object_iter_begin(top);
  struct json_object_iterator end = json_object_iter_end(top);
  for (; !json_object_iter_equal(&it, &end) && i < njobs;
       json_object_iter_next(&it), i++) {
    if (job_from_json(&c->jobs[i], json_object_iter_peek_name(&it),
                      json_object_iter_peek_value(&it), pre, st) != 0)
      goto fail;
  }
  c->njobs = i;
  if (cluster_finish(c, pre, st) != 0) goto fail;
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
  json_object *top = json_parse(json, len, pre, st);
  if (top == NULL) return NULL;
  ps_cluster *c = cluster_from_json(top, "top level", pre, st);
  json_object_put(top);
  return c;
}

ps_cluster *ps_cluster_load_file(const char *path, ps_status *st) {
  char pre[PRE_MAX];
  make_pre(pre, path);
  if (path == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: no path given", pre), NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return ps_status_set(st, errno_code(e, PS_INVALID_ARGUMENT), "%s: cannot open: %s",
                         pre, strerror(e)),
           NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ps_cluster *c = NULL;
  if (buf == NULL) {
    oom(pre, st);
    goto out;
  }
  for (;;) {
    if (n == cap) {
      size_t nc = cap * 2 > PS_CLUSTER_MAX_BYTES ? PS_CLUSTER_MAX_BYTES + 1 : cap * 2;
      char *nb = realloc(buf, nc);
      if (nb == NULL) {
        oom(pre, st);
        goto out;
      }
      buf = nb;
      cap = nc;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ps_status_set(st, errno_code(e, PS_INVALID_ARGUMENT), "%s: cannot read: %s", pre,
                    strerror(e));
      goto out;
    }
    if (r == 0) break;
    n += (size_t)r;
    if (n > PS_CLUSTER_MAX_BYTES) {
      ps_status_set(st, PS_INVALID_ARGUMENT, "%s: too large (more than %u bytes)", pre,
                    PS_CLUSTER_MAX_BYTES);
      goto out;
    }
  }
  json_object *top = json_parse(buf, n, pre, st);
  if (top != NULL) {
    c = cluster_from_json(top, "top level", pre, st);
    json_object_put(top);
  }
out:
  free(buf);
  close(fd);
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

const char *ps_cluster_address(const ps_cluster *c, const char *job, int task) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  if (j == NULL || task < 0 || task >= j->ntasks) return NULL;
  return j->addrs[task];
}

/* True if job/task has an address; else says why not in @why. */
static bool task_present(const ps_cluster *c, const char *job, int task, char *why,
                         size_t n) {
  const ps_cluster_job *j = ps_cluster_find_job(c, job);
  char b[SHOW_MAX];
  if (j == NULL) {
    int o = snprintf(why, n, "no job \"%s\"; jobs:", show(job, strlen(job), b, sizeof b));
    for (int i = 0; i < c->njobs && o > 0 && (size_t)o < n; i++)
      o += snprintf(why + o, n - (size_t)o, "%s %s", i ? "," : "", c->jobs[i].name);
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

static void task_id_set(ps_task_id *id, const char *job, int task) {
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
    task_present(c, job, task, why, sizeof why);
    return ps_status_set(st, PS_NOT_FOUND, "cluster: no task %s/%d (%s)",
                         show(job, strlen(job), b, sizeof b), task, why);
  }
  ps_cluster_job *j = &c->jobs[cj - c->jobs];
  int port = -1, rc = addr_check(addr, strlen(addr), &port);
  if (rc != ADDR_OK)
    return addr_error(rc, addr, strlen(addr), "cluster", j->name, task, st);
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
  if (copy == NULL) return oom("cluster", st);
  free(j->addrs[task]);
  j->addrs[task] = copy;
  return 0;
}

int ps_cluster_chief(const ps_cluster *c, ps_task_id *chief) {
  static const char *const jobs[] = {"chief", "worker"};
  for (size_t i = 0; i < 2; i++)
    if (ps_cluster_address(c, jobs[i], 0) != NULL) {
      task_id_set(chief, jobs[i], 0);
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
  if (text == NULL) return oom(pre, st);
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

/* ---- TF_CONFIG -------------------------------------------------------- */

ps_cluster *ps_cluster_from_tf_config(const char *tf_config, ps_task_id *self,
                                      ps_status *st) {
  const char *pre = "TF_CONFIG";
  char b[SHOW_MAX], why[256];
  if (tf_config == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TF_CONFIG: not set"), NULL;
  json_object *top = json_parse(tf_config, strlen(tf_config), pre, st);
  if (top == NULL) return NULL;
  ps_cluster *c = NULL;
  json_object *cl = NULL, *task = NULL, *type = NULL, *index = NULL;
  if (!json_object_is_type(top, json_type_object)) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: top level must be an object like {\"cluster\": "
                  "{...}, \"task\": {\"type\": \"worker\", \"index\": 0}}");
    goto fail;
  }
  if (!json_object_object_get_ex(top, "cluster", &cl) || cl == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: no \"cluster\" (TF's local mode): a parameter "
                  "server needs one");
    goto fail;
  }
  /* TF's RunConfig check, done on the JSON so that an empty "chief" gets
   * TF's message rather than the generic "has no tasks". */
  json_object *chief = NULL;
  if (json_object_object_get_ex(cl, "chief", &chief) &&
      ((json_object_is_type(chief, json_type_array) &&
        json_object_array_length(chief) == 0) ||
       (json_object_is_type(chief, json_type_object) &&
        json_object_object_length(chief) == 0))) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: If \"cluster\" is set in TF_CONFIG, it must "
                  "have one \"chief\" node.");
    goto fail;
  }
  c = cluster_from_json(cl, "\"cluster\"", pre, st);
  if (c == NULL) goto fail;
  if (ps_cluster_num_tasks(c, "chief") > 1) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: The \"cluster\" in TF_CONFIG must have only one "
                  "\"chief\" node.");
    goto fail;
  }
  if (!json_object_object_get_ex(top, "task", &task) ||
      !json_object_is_type(task, json_type_object)) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: \"task\" must be an object saying which task "
                  "this is, like {\"type\": \"worker\", \"index\": 0}");
    goto fail;
  }
  if (!json_object_object_get_ex(task, "type", &type) ||
      !json_object_is_type(type, json_type_string)) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: \"task\" needs \"type\", a job name string");
    goto fail;
  }
  if (!json_object_object_get_ex(task, "index", &index) ||
      !json_object_is_type(index, json_type_int) || json_object_get_int64(index) < 0 ||
      json_object_get_int64(index) > INT_MAX) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: \"task\" needs \"index\", an integer >= 0");
    goto fail;
  }
  const char *tname = json_object_get_string(type);
  int tidx = (int)json_object_get_int64(index);
  size_t tlen = (size_t)json_object_get_string_len(type);
  if (strlen(tname) != tlen || !task_present(c, tname, tidx, why, sizeof why)) {
    if (strlen(tname) != tlen) snprintf(why, sizeof why, "bad job name");
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: task %s/%d is not in the cluster (%s)",
                  show(tname, tlen, b, sizeof b), tidx, why);
    goto fail;
  }
  task_id_set(self, tname, tidx);
  json_object_put(top);
  return c;
fail:
  ps_cluster_destroy(c);
  json_object_put(top);
  return NULL;
}

/* ---- Slurm ------------------------------------------------------------ */

/* Growable array of strings, capped. */
typedef struct strvec {
  char **v;
  size_t n, cap;
} strvec;

static void strvec_fini(strvec *s) {
  for (size_t i = 0; i < s->n; i++)
    free(s->v[i]);
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

/* Takes ownership of @str (NULL = out of memory). */
static int strvec_push(strvec *s, char *str) {
  if (str == NULL) return -1;
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 16;
    char **nv = realloc(s->v, nc * sizeof *nv);
    if (nv == NULL) {
      free(str);
      return -1;
    }
    s->v = nv;
    s->cap = nc;
  }
  s->v[s->n++] = str;
  return 0;
}

static const char *slurm_var(const char *name, ps_status *st) {
  const char *v = getenv(name);
  if (v == NULL)
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "%s not found in environment. Not running inside a SLURM "
                  "step?",
                  name);
  return v;
}

/* One hostlist part: "prefix" or "prefix[ranges]".  Returns NULL or the
 * reason it is invalid. */
static const char *expand_part(const char *s, size_t n, strvec *out) {
  const char *lb = memchr(s, '[', n);
  size_t plen = lb ? (size_t)(lb - s) : n;
  if (memchr(s, ']', plen) != NULL) return "Invalid part";
  if (lb == NULL) {
    if (out->n >= SLURM_MAX_HOSTS) return "too many hosts";
    return strvec_push(out, dup_n(s, n)) ? "out of memory" : NULL;
  }
  const char *body = lb + 1, *bend = s + n - 1;
  if (*bend != ']' || bend == body || memchr(body, ']', (size_t)(bend - body)))
    return "Invalid part";
  while (body < bend) {
    const char *comma = memchr(body, ',', (size_t)(bend - body));
    const char *e = comma ? comma : bend;
    const char *dash = memchr(body, '-', (size_t)(e - body));
    const char *hi_s = dash ? dash + 1 : body;
    size_t lo_n = (size_t)((dash ? dash : e) - body);
    long lo = parse_num(body, lo_n, 999999999);
    long hi = parse_num(hi_s, (size_t)(e - hi_s), 999999999);
    if (lo < 0 || hi < 0 || hi < lo) return "Invalid range";
    if (hi - lo >= (long)(SLURM_MAX_HOSTS - out->n)) return "too many hosts";
    for (long i = lo; i <= hi; i++) {
      char *h = malloc(plen + lo_n + 12);
      if (h == NULL) return "out of memory";
      /* zfill(len(first bound)), as newer TF does: n[01-02] -> n01 n02 */
      snprintf(h, plen + lo_n + 12, "%.*s%0*ld", (int)plen, s, (int)lo_n, i);
      if (strvec_push(out, h) != 0) return "out of memory";
    }
    body = comma ? comma + 1 : bend;
    if (comma && body == bend) return "Invalid range";
  }
  return NULL;
}

/* SLURM_STEP_NODELIST "n[1-2],m5,o[3-4,6]" -> n1 n2 m5 o3 o4 o6. */
static int expand_hostlist(const char *hl, strvec *out, ps_status *st) {
  const char *why = NULL, *p = hl, *start = hl;
  bool in_br = false;
  char b[SHOW_MAX];
  for (;; p++) {
    if (*p == '\0' || (*p == ',' && !in_br)) {
      if (in_br)
        why = "unclosed '['";
      else if (p == start && *p == ',')
        why = "empty host name";
      else if (p > start)
        why = expand_part(start, (size_t)(p - start), out);
      if (why != NULL || *p == '\0') break;
      start = p + 1;
    } else if (*p == '[') {
      if (in_br) {
        why = "'[' inside a range";
        break;
      }
      in_br = true;
    } else if (*p == ']' && in_br) {
      in_br = false;
    }
  }
  if (why == NULL && out->n == 0) why = "no hosts";
  if (why == NULL) return 0;
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "SLURM_STEP_NODELIST: Invalid hostlist format \"%s\": "
                       "%s",
                       show(hl, strlen(hl), b, sizeof b), why);
}

/* SLURM_STEP_TASKS_PER_NODE "3(x2),2,1" -> 3 3 2 1; *@out malloc'd. */
static int expand_tasks_per_node(const char *s, int **out, size_t *nout, ps_status *st) {
  size_t n = 0, cap = 0;
  int *v = NULL;
  const char *p = s, *why = NULL;
  char b[SHOW_MAX];
  for (;;) {
    const char *e = strchr(p, ',');
    if (e == NULL) e = p + strlen(p);
    const char *q = p;
    while (q < e && *q >= '0' && *q <= '9')
      q++;
    long count = parse_num(p, (size_t)(q - p), PS_CLUSTER_MAX_TASKS), reps = 1;
    if (count >= 0 && q < e) {
      const char *r = q + 2, *re = e - 1;
      if (e - q < 4 || q[0] != '(' || q[1] != 'x' || *re != ')')
        count = -1;
      else
        reps = parse_num(r, (size_t)(re - r), SLURM_MAX_HOSTS);
    }
    if (count < 0 || reps < 0) {
      why = "bad entry";
      break;
    }
    if ((size_t)reps > SLURM_MAX_HOSTS - n) {
      why = "too many nodes";
      break;
    }
    if (n + (size_t)reps > cap) {
      size_t nc = n + (size_t)reps + 16;
      int *nv = realloc(v, nc * sizeof *nv);
      if (nv == NULL) {
        why = "out of memory";
        break;
      }
      v = nv;
      cap = nc;
    }
    for (long k = 0; k < reps; k++)
      v[n++] = (int)count;
    if (*e == '\0') break;
    p = e + 1;
  }
  if (why != NULL) {
    free(v);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "SLURM_STEP_TASKS_PER_NODE: Invalid tasks-per-node "
                         "list format \"%s\": %s",
                         show(s, strlen(s), b, sizeof b), why);
  }
  *out = v;
  *nout = n;
  return 0;
}

typedef struct slurm_job {
  char name[PS_CLUSTER_MAX_JOB_NAME + 1];
  int count;
} slurm_job;

static int cmp_slurm_job(const void *a, const void *b) {
  return strcmp(((const slurm_job *)a)->name, ((const slurm_job *)b)->name);
}

/* "ps:2,worker:2" -> jobs sorted by name. */
static int parse_jobs_spec(const char *spec, slurm_job *jobs, int *njobs, ps_status *st) {
  char b[SHOW_MAX];
  const char *p = spec, *why = NULL;
  int n = 0;
  for (;;) {
    const char *e = strchr(p, ',');
    if (e == NULL) e = p + strlen(p);
    const char *colon = memchr(p, ':', (size_t)(e - p));
    if (colon == NULL || !is_name(p, (size_t)(colon - p))) {
      why = "expected NAME:COUNT[,NAME:COUNT...] with NAME letters, digits "
            "and _";
      break;
    }
    if ((size_t)(colon - p) > PS_CLUSTER_MAX_JOB_NAME) {
      why = "job name too long";
      break;
    }
    long count = parse_num(colon + 1, (size_t)(e - colon - 1), PS_CLUSTER_MAX_TASKS);
    if (count < 1) {
      why = "COUNT must be a number from 1 to 65536";
      break;
    }
    if (n == SLURM_MAX_JOBS) {
      why = "too many jobs";
      break;
    }
    memcpy(jobs[n].name, p, (size_t)(colon - p));
    jobs[n].name[colon - p] = '\0';
    jobs[n].count = (int)count;
    for (int i = 0; i < n && why == NULL; i++)
      if (strcmp(jobs[i].name, jobs[n].name) == 0) why = "a job is given twice";
    if (why != NULL) break;
    n++;
    if (*e == '\0') break;
    p = e + 1;
  }
  if (why != NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "jobs \"%s\": %s",
                         show(spec, strlen(spec), b, sizeof b), why);
  qsort(jobs, (size_t)n, sizeof *jobs, cmp_slurm_job);
  *njobs = n;
  return 0;
}

typedef struct slurm_host {
  const char *name;
  int count;
  size_t order;
} slurm_host;

static int cmp_slurm_host(const void *a, const void *b) {
  const slurm_host *x = a, *y = b;
  int r = strcmp(x->name, y->name);
  if (r != 0) return r;
  return (x->order > y->order) - (x->order < y->order);
}

ps_cluster *ps_cluster_from_slurm(const char *jobs_spec, int port_base, ps_task_id *self,
                                  ps_status *st) {
  slurm_job jobs[SLURM_MAX_JOBS];
  int njobs = 0;
  strvec hosts = {0};
  int *tpn = NULL;
  size_t ntpn = 0;
  slurm_host *hs = NULL;
  ps_cluster *c = NULL;
  char b[SHOW_MAX];

  const char *v = slurm_var("SLURM_PROCID", st);
  if (v == NULL) return NULL;
  long rank = parse_num(v, strlen(v), INT_MAX);
  if (rank < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "SLURM_PROCID \"%s\" is not a task rank (a number "
                         ">= 0)",
                         show(v, strlen(v), b, sizeof b)),
           NULL;
  if (jobs_spec == NULL) {
    if ((v = slurm_var("SLURM_STEP_NUM_TASKS", st)) == NULL) return NULL;
    long n = parse_num(v, strlen(v), PS_CLUSTER_MAX_TASKS);
    if (n < 1)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "SLURM_STEP_NUM_TASKS \"%s\" is not a number from "
                           "1 to %d",
                           show(v, strlen(v), b, sizeof b), PS_CLUSTER_MAX_TASKS),
             NULL;
    snprintf(jobs[0].name, sizeof jobs[0].name, "worker");
    jobs[0].count = (int)n;
    njobs = 1;
  } else if (parse_jobs_spec(jobs_spec, jobs, &njobs, st) != 0) {
    return NULL;
  }
  if (port_base < 1 || port_base > 65535)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Slurm: port base %d is not a port number (1-65535)", port_base),
           NULL;
  if ((v = slurm_var("SLURM_STEP_NODELIST", st)) == NULL ||
      expand_hostlist(v, &hosts, st) != 0)
    goto fail;
  if ((v = slurm_var("SLURM_STEP_TASKS_PER_NODE", st)) == NULL ||
      expand_tasks_per_node(v, &tpn, &ntpn, st) != 0)
    goto fail;

  /* TF: dict(zip(hostlist, tasks_per_node)), then sorted(): the shorter
   * list wins, a repeated host keeps its last count. */
  size_t nh = hosts.n < ntpn ? hosts.n : ntpn;
  hs = malloc((nh ? nh : 1) * sizeof *hs);
  if (hs == NULL) {
    oom("Slurm", st);
    goto fail;
  }
  for (size_t i = 0; i < nh; i++)
    hs[i] = (slurm_host){hosts.v[i], tpn[i], i};
  qsort(hs, nh, sizeof *hs, cmp_slurm_host);
  size_t m = 0;
  for (size_t i = 0; i < nh; i++) {
    if (m > 0 && strcmp(hs[m - 1].name, hs[i].name) == 0)
      hs[m - 1] = hs[i];
    else
      hs[m++] = hs[i];
  }
  long long assigned = 0, requested = 0;
  for (size_t i = 0; i < m; i++)
    assigned += hs[i].count;
  for (int i = 0; i < njobs; i++)
    requested += jobs[i].count;
  if (requested != assigned) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "Slurm: Requested %lld tasks but only %lld were assigned. "
                  "(jobs %s; SLURM_STEP_NODELIST and "
                  "SLURM_STEP_TASKS_PER_NODE give the step's tasks)",
                  requested, assigned,
                  jobs_spec ? jobs_spec : "from SLURM_STEP_NUM_TASKS");
    goto fail;
  }
  if (rank >= assigned) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SLURM_PROCID %ld is out of range: the step has %lld tasks", rank,
                  assigned);
    goto fail;
  }
  if ((c = cluster_new(njobs)) == NULL) {
    oom("Slurm", st);
    goto fail;
  }
  for (int i = 0; i < njobs; i++)
    if (job_alloc(&c->jobs[i], jobs[i].name, strlen(jobs[i].name), jobs[i].count) != 0) {
      oom("Slurm", st);
      goto fail;
    }
  /* Hosts in name order, each host's tasks on consecutive ports, dealt out
   * to the jobs in name order: rank r is the r-th address. */
  int ji = 0, jt = 0;
  long long r = 0;
  for (size_t i = 0; i < m; i++) {
    if (port_base + (long long)hs[i].count - 1 > 65535) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "Slurm: host %s has %d tasks, so ports from %d run past "
                    "65535",
                    show(hs[i].name, strlen(hs[i].name), b, sizeof b), hs[i].count,
                    port_base);
      goto fail;
    }
    for (int k = 0; k < hs[i].count; k++, r++) {
      size_t len = strlen(hs[i].name);
      char *a = malloc(len + 8);
      if (a == NULL) {
        oom("Slurm", st);
        goto fail;
      }
      snprintf(a, len + 8, "%s:%d", hs[i].name, port_base + k);
      c->jobs[ji].addrs[jt] = a;
      int why = addr_check(a, strlen(a), NULL);
      if (why != ADDR_OK) {
        addr_error(why, a, strlen(a), "SLURM_STEP_NODELIST", jobs[ji].name, jt, st);
        goto fail;
      }
      if (r == rank) task_id_set(self, jobs[ji].name, jt);
      if (++jt == c->jobs[ji].ntasks) ji++, jt = 0;
    }
  }
  if (cluster_finish(c, "Slurm", st) != 0) goto fail;
  goto out;
fail:
  ps_cluster_destroy(c);
  c = NULL;
out:
  free(hs);
  free(tpn);
  strvec_fini(&hosts);
  return c;
}

/* ---- resolution ------------------------------------------------------- */

ps_cluster *ps_cluster_resolve(const char *cluster_file, const char *job, int task,
                               ps_task_id *self, ps_status *st) {
  char why[256], b[SHOW_MAX];
  ps_task_id me = {{0}, -1};
  ps_cluster *c;
  const char *source;
  if (cluster_file != NULL) {
    if (job == NULL || task < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "--cluster %s needs --job NAME and --task N", cluster_file),
             NULL;
    if ((c = ps_cluster_load_file(cluster_file, st)) == NULL) return NULL;
    if (!task_present(c, job, task, why, sizeof why)) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "--job %s --task %d: not in cluster spec %s (%s)",
                    show(job, strlen(job), b, sizeof b), task, cluster_file, why);
      ps_cluster_destroy(c);
      return NULL;
    }
    task_id_set(self, job, task);
    return c;
  }
  const char *tf = getenv("TF_CONFIG");
  if (tf != NULL && tf[0] != '\0') {
    source = "TF_CONFIG";
    c = ps_cluster_from_tf_config(tf, &me, st);
  } else if (getenv("SLURM_PROCID") != NULL) {
    source = "the Slurm step";
    const char *jobs = getenv("PS_SLURM_JOBS");
    const char *pb = getenv("PS_SLURM_PORT_BASE");
    long port_base = 8888;
    if (pb != NULL && pb[0] != '\0' && (port_base = parse_num(pb, strlen(pb), 65535)) < 1)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "PS_SLURM_PORT_BASE \"%s\" is not a port number "
                           "(1-65535)",
                           show(pb, strlen(pb), b, sizeof b)),
             NULL;
    c = ps_cluster_from_slurm(jobs && jobs[0] ? jobs : NULL, (int)port_base, &me, st);
  } else {
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "no cluster spec: pass --cluster FILE --job NAME "
                         "--task N or set TF_CONFIG"),
           NULL;
  }
  if (c == NULL) return NULL;
  if (job != NULL) {
    if (!task_present(c, job, task, why, sizeof why)) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "--job %s --task %d: not in the cluster from %s (%s)",
                    show(job, strlen(job), b, sizeof b), task, source, why);
      ps_cluster_destroy(c);
      return NULL;
    }
    task_id_set(&me, job, task);
  }
  if (self != NULL) *self = me;
  return c;
}
