/* Which cluster this process is in and which task it is: TensorFlow's
 * TF_CONFIG, Slurm's environment (as TensorFlow's SlurmClusterResolver),
 * and the resolution order ps-server, ps-worker and psctl use (see
 * cluster.h).  The spec itself is cluster.c. */
#include <ctype.h>
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"
#include "cluster_internal.h"

/* ---- TF_CONFIG -------------------------------------------------------- */

ps_cluster *ps_cluster_from_tf_config(const char *tf_config, ps_task_id *self,
                                      ps_status *st) {
  const char *pre = "TF_CONFIG";
  char b[SHOW_MAX], why[256];
  if (tf_config == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TF_CONFIG: not set"), NULL;
  json_object *top = ps_cl_json_parse_(tf_config, strlen(tf_config), pre, st);
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
  c = ps_cl_cluster_from_json_(cl, "\"cluster\"", pre, st);
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
  if (strlen(tname) != tlen || (!ps_cl_task_present_(c, tname, tidx, why, sizeof why) &&
                                !ps_cl_evaluator_outside_(c, tname))) {
    if (strlen(tname) != tlen) snprintf(why, sizeof why, "bad job name");
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "TF_CONFIG: task %s/%d is not in the cluster (%s)",
                  ps_cl_show_(tname, tlen, b, sizeof b), tidx, why);
    goto fail;
  }
  ps_cl_task_id_set_(self, tname, tidx);
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
    return strvec_push(out, ps_cl_dup_n_(s, n)) ? "out of memory" : NULL;
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
    long lo = ps_cl_parse_num_(body, lo_n, 999999999);
    long hi = ps_cl_parse_num_(hi_s, (size_t)(e - hi_s), 999999999);
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

/* SLURM_STEP_NODELIST "n[1-2],m5,o[3-4,6]" -> n1 n2 m5 o3 o4 o6; @var
 * names the variable in the error. */
static int expand_hostlist(const char *hl, const char *var, strvec *out, ps_status *st) {
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
  return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: Invalid hostlist format \"%s\": %s",
                       var, ps_cl_show_(hl, strlen(hl), b, sizeof b), why);
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
    long count = ps_cl_parse_num_(p, (size_t)(q - p), PS_CLUSTER_MAX_TASKS), reps = 1;
    if (count >= 0 && q < e) {
      const char *r = q + 2, *re = e - 1;
      if (e - q < 4 || q[0] != '(' || q[1] != 'x' || *re != ')')
        count = -1;
      else
        reps = ps_cl_parse_num_(r, (size_t)(re - r), SLURM_MAX_HOSTS);
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
                         ps_cl_show_(s, strlen(s), b, sizeof b), why);
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
    if (colon == NULL || !ps_cl_is_name_(p, (size_t)(colon - p))) {
      why = "expected NAME:COUNT[,NAME:COUNT...] with NAME letters, digits "
            "and _";
      break;
    }
    if ((size_t)(colon - p) > PS_CLUSTER_MAX_JOB_NAME) {
      why = "job name too long";
      break;
    }
    long count =
        ps_cl_parse_num_(colon + 1, (size_t)(e - colon - 1), PS_CLUSTER_MAX_TASKS);
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
                         ps_cl_show_(spec, strlen(spec), b, sizeof b), why);
  qsort(jobs, (size_t)n, sizeof *jobs, cmp_slurm_job);
  *njobs = n;
  return 0;
}

typedef struct slurm_host {
  const char *name;
  int count;
} slurm_host;

/* The jobs: --slurm-jobs' spec, or one "worker" job of SLURM_STEP_NUM_TASKS
 * tasks. */
static int slurm_jobs(const char *jobs_spec, slurm_job *jobs, int *njobs, ps_status *st) {
  char b[SHOW_MAX];
  if (jobs_spec != NULL) return parse_jobs_spec(jobs_spec, jobs, njobs, st);
  const char *v = slurm_var("SLURM_STEP_NUM_TASKS", st);
  if (v == NULL) return st->code;
  long n = ps_cl_parse_num_(v, strlen(v), PS_CLUSTER_MAX_TASKS);
  if (n < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "SLURM_STEP_NUM_TASKS \"%s\" is not a number from "
                         "1 to %d",
                         ps_cl_show_(v, strlen(v), b, sizeof b), PS_CLUSTER_MAX_TASKS);
  snprintf(jobs[0].name, sizeof jobs[0].name, "worker");
  jobs[0].count = (int)n;
  *njobs = 1;
  return 0;
}

/* The step's hosts with their task counts, in Slurm's order (the
 * nodelist's, which is how Slurm hands out ranks; TensorFlow's resolver
 * sorts the names as text, which puts n10 before n9 and gives ranks the
 * wrong hosts).  zip(): the shorter list wins.  *hs (malloc'd) and *m. */
static int slurm_hosts(const strvec *hosts, const int *tpn, size_t ntpn, slurm_host **hs,
                       size_t *m, ps_status *st) {
  char b[SHOW_MAX];
  size_t nh = hosts->n < ntpn ? hosts->n : ntpn;
  if ((*hs = malloc((nh ? nh : 1) * sizeof **hs)) == NULL) return ps_cl_oom_("Slurm", st);
  for (size_t i = 0; i < nh; i++) {
    for (size_t j = 0; j < i; j++)
      if (strcmp(hosts->v[j], hosts->v[i]) == 0)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "SLURM_STEP_NODELIST names host %s twice",
                             ps_cl_show_(hosts->v[i], strlen(hosts->v[i]), b, sizeof b));
    (*hs)[i] = (slurm_host){hosts->v[i], tpn[i]};
  }
  *m = nh;
  return 0;
}

/* SLURM_STEP_RESV_PORTS ("12000-12003", srun --resv-ports): ports Slurm
 * reserved for this step on each of its nodes, so that steps sharing a
 * node never collide.  *@ports gets them (malloc'd), *@n how many; 0 and
 * NULL when the variable is not set. */
static int slurm_resv_ports(int **ports, size_t *n, ps_status *st) {
  *ports = NULL;
  *n = 0;
  const char *v = getenv("SLURM_STEP_RESV_PORTS");
  if (v == NULL || v[0] == '\0') return 0;
  char b[SHOW_MAX];
  size_t cap = 0;
  for (const char *p = v; *p;) {
    const char *e = p + strcspn(p, ",");
    const char *dash = memchr(p, '-', (size_t)(e - p));
    long lo = ps_cl_parse_num_(p, (size_t)((dash ? dash : e) - p), 65535);
    long hi = dash ? ps_cl_parse_num_(dash + 1, (size_t)(e - dash - 1), 65535) : lo;
    if (lo < 1 || hi < lo || hi - lo > 4096) {
      free(*ports);
      *ports = NULL;
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "SLURM_STEP_RESV_PORTS \"%s\" is not a list of port ranges",
                           ps_cl_show_(v, strlen(v), b, sizeof b));
    }
    for (long q = lo; q <= hi; q++) {
      if (*n == cap) {
        size_t nc = cap ? 2 * cap : 16;
        int *np = realloc(*ports, nc * sizeof *np);
        if (np == NULL) {
          free(*ports);
          *ports = NULL;
          return ps_cl_oom_("Slurm", st);
        }
        *ports = np;
        cap = nc;
      }
      (*ports)[(*n)++] = (int)q;
    }
    p = *e ? e + 1 : e;
  }
  return 0;
}

/* A heterogeneous job (sbatch/salloc with "hetjob" components) has
 * SLURM_HET_SIZE (SLURM_PACK_SIZE before Slurm 20.02) and each component's
 * nodes in SLURM_JOB_NODELIST_HET_GROUP_<k> (_PACK_GROUP_<k>).  One step
 * across components (srun A : B) lists all their nodes in
 * SLURM_STEP_NODELIST (in node order) and gives each component's tasks
 * the next ranks, component by component, each component laid out on its
 * own nodes.  Its SLURM_DISTRIBUTION does not describe that layout (Slurm
 * 22.05 says cyclic for 2,1,1 tasks laid out 0-1 | 2 | 3, and block for a
 * component run with -m cyclic).  *@comp (malloc'd, [m]) gets each step
 * host's component and *@ncomp the components, or NULL and 0 when this is
 * no such step (no hetjob, or a step inside one component). */
#define SLURM_MAX_HET 128
static int slurm_het_components(const slurm_host *hs, size_t m, int **comp, int *ncomp,
                                ps_status *st) {
  char b[SHOW_MAX], var[64];
  const char *sz = getenv("SLURM_HET_SIZE"), *kind = "HET";
  *comp = NULL;
  *ncomp = 0;
  if (sz == NULL || sz[0] == '\0') sz = getenv("SLURM_PACK_SIZE"), kind = "PACK";
  if (sz == NULL || sz[0] == '\0') return 0;
  long n = ps_cl_parse_num_(sz, strlen(sz), SLURM_MAX_HET);
  if (n < 1)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "SLURM_%s_SIZE \"%s\" is not a number of components from 1 to %d", kind,
        ps_cl_show_(sz, strlen(sz), b, sizeof b), SLURM_MAX_HET);
  int *c = malloc((m ? m : 1) * sizeof *c);
  if (c == NULL) return ps_cl_oom_("Slurm", st);
  for (size_t i = 0; i < m; i++)
    c[i] = -1;
  int rc = 0;
  for (long k = 0; k < n && rc == 0; k++) {
    snprintf(var, sizeof var, "SLURM_JOB_NODELIST_%s_GROUP_%ld", kind, k);
    const char *v = getenv(var);
    if (v == NULL || v[0] == '\0') break; /* not this job's: see below */
    strvec nodes = {0};
    rc = expand_hostlist(v, var, &nodes, st);
    for (size_t i = 0; i < m && rc == 0; i++)
      for (size_t j = 0; j < nodes.n; j++) {
        if (strcmp(nodes.v[j], hs[i].name) != 0) continue;
        if (c[i] >= 0)
          rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                             "Slurm: host %s is in heterogeneous job components %d and "
                             "%ld: their tasks cannot be told apart",
                             ps_cl_show_(hs[i].name, strlen(hs[i].name), b, sizeof b),
                             c[i], k);
        c[i] = (int)k;
        break;
      }
    strvec_fini(&nodes);
  }
  /* A step within one component (srun --het-group=1) is an ordinary one;
   * so is a step with a host in no component (variables a job submitted
   * from inside a heterogeneous one inherited: SLURMD_NODENAME and
   * SLURM_GTIDS still check the layout). */
  bool several = false, stray = false;
  for (size_t i = 0; i < m && rc == 0; i++) {
    if (c[i] < 0)
      stray = true;
    else if (c[i] != c[0])
      several = true;
  }
  if (rc != 0 || !several || stray) {
    free(c);
    return rc;
  }
  *comp = c;
  *ncomp = (int)n;
  return 0;
}

/* Which host each rank runs on, and its index among that host's tasks:
 * block distribution (Slurm's default: the first host's tasks, then the
 * next's) or cyclic (one task per host in turn); in a heterogeneous step,
 * component after component, each in block order (Slurm's default within
 * a component; SLURM_GTIDS catches another, see slurm_gtids_check).
 * @host/@local: [total]; *@het: it is a heterogeneous step. */
static int slurm_layout(const slurm_host *hs, size_t m, long long total, size_t *host,
                        int *local, bool *het, ps_status *st) {
  int *comp = NULL, ncomp = 0;
  if (slurm_het_components(hs, m, &comp, &ncomp, st) != 0) return st->code;
  if ((*het = comp != NULL)) {
    long long r = 0;
    for (int k = 0; k < ncomp; k++)
      for (size_t i = 0; i < m; i++)
        for (int t = 0; comp[i] == k && t < hs[i].count && r < total; t++, r++) {
          host[r] = i;
          local[r] = t;
        }
    free(comp);
    return 0;
  }
  const char *d = getenv("SLURM_DISTRIBUTION");
  bool cyclic = d && !strncmp(d, "cyclic", 6);
  if (d && d[0] && !cyclic && strncmp(d, "block", 5) != 0) {
    char b[SHOW_MAX];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Slurm: SLURM_DISTRIBUTION \"%s\" is not supported: run the "
                         "step with --distribution=block or cyclic",
                         ps_cl_show_(d, strlen(d), b, sizeof b));
  }
  int *used = calloc(m + 1, sizeof *used);
  if (used == NULL) return ps_cl_oom_("Slurm", st);
  size_t h = 0;
  for (long long r = 0; r < total; r++) {
    if (cyclic) {
      while (used[h] >= hs[h].count) /* some host still has room: total fits */
        h = (h + 1) % m;
    } else {
      while (used[h] >= hs[h].count)
        h++;
    }
    host[r] = h;
    local[r] = used[h]++;
    if (cyclic) h = (h + 1) % m;
  }
  free(used);
  return 0;
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

/* "0,2,5" for the ranks @host puts on host @h, at most @n bytes. */
static void ranks_on(const size_t *host, long long total, size_t h, char *buf, size_t n) {
  size_t o = 0;
  buf[0] = '\0';
  for (long long r = 0; r < total && o + 24 < n; r++)
    if (host[r] == h) o += (size_t)snprintf(buf + o, n - o, "%s%lld", o ? "," : "", r);
}

/* SLURM_GTIDS (when set): the ranks Slurm runs on this task's node.  They
 * must be the ones the layout puts on this rank's host, or the layout is
 * not the step's (a distribution the environment does not tell, such as
 * -m cyclic in a heterogeneous step) and every address would be wrong. */
static int slurm_gtids_check(const slurm_host *hs, const size_t *host, long long total,
                             long rank, bool het, ps_status *st) {
  const char *g = getenv("SLURM_GTIDS");
  if (g == NULL || g[0] == '\0') return 0;
  char b[SHOW_MAX], want[160], dist[96];
  size_t h = host[rank], n = 0, cap = 0;
  long *v = NULL;
  bool ok = true;
  for (const char *p = g; *p && ok;) {
    const char *e = p + strcspn(p, ",");
    long r = ps_cl_parse_num_(p, (size_t)(e - p), INT_MAX);
    if (r < 0 || (long long)n >= total) {
      ok = false;
      break;
    }
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      long *nv = realloc(v, nc * sizeof *nv);
      if (nv == NULL) {
        free(v);
        return ps_cl_oom_("Slurm", st);
      }
      v = nv;
      cap = nc;
    }
    v[n++] = r;
    p = *e ? e + 1 : e;
  }
  if (ok) {
    qsort(v, n, sizeof *v, cmp_long);
    size_t k = 0;
    for (long long r = 0; r < total && ok; r++)
      if (host[r] == h) ok = k < n && v[k++] == r;
    ok = ok && k == n;
  }
  free(v);
  if (ok) return 0;
  ranks_on(host, total, h, want, sizeof want);
  if (het)
    snprintf(dist, sizeof dist,
             "a heterogeneous step: each component's tasks in block order; run it "
             "without -m/--distribution");
  else
    snprintf(dist, sizeof dist, "SLURM_DISTRIBUTION %.40s",
             getenv("SLURM_DISTRIBUTION") ? getenv("SLURM_DISTRIBUTION") : "block");
  return ps_status_set(
      st, PS_INVALID_ARGUMENT,
      "Slurm: the step's layout puts ranks %s on %s, but SLURM_GTIDS says "
      "\"%s\" run there (%s)",
      want, hs[h].name, ps_cl_show_(g, strlen(g), b, sizeof b), dist);
}

/* Rank r runs on the host the step's layout gives it, on that host's
 * local-index-th port (from SLURM_STEP_RESV_PORTS when Slurm reserved
 * some, else from @port_base); ranks are dealt out to the jobs in name
 * order.  When SLURMD_NODENAME is set it must be this rank's host. */
static int slurm_addresses(ps_cluster *c, const slurm_job *jobs, const slurm_host *hs,
                           size_t m, long long total, int port_base, long rank,
                           ps_task_id *self, ps_status *st) {
  char b[SHOW_MAX];
  int *resv = NULL, *local = calloc((size_t)total + 1, sizeof *local);
  size_t nresv = 0, *host = calloc((size_t)total + 1, sizeof *host);
  int rc = local && host ? 0 : ps_cl_oom_("Slurm", st);
  if (rc == 0) rc = slurm_resv_ports(&resv, &nresv, st);
  bool het = false;
  if (rc == 0) rc = slurm_layout(hs, m, total, host, local, &het, st);
  int ji = 0, jt = 0;
  for (long long r = 0; r < total && rc == 0; r++) {
    const char *name = hs[host[r]].name;
    int k = local[r];
    if (resv && (size_t)k >= nresv) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Slurm: host %s runs %d tasks but SLURM_STEP_RESV_PORTS "
                         "reserves %zu ports",
                         ps_cl_show_(name, strlen(name), b, sizeof b), hs[host[r]].count,
                         nresv);
      break;
    }
    if (!resv && port_base + (long long)k > 65535) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Slurm: host %s has %d tasks, so ports from %d run past 65535",
                         ps_cl_show_(name, strlen(name), b, sizeof b), hs[host[r]].count,
                         port_base);
      break;
    }
    size_t len = strlen(name);
    char *a = malloc(len + 8);
    if (a == NULL) {
      rc = ps_cl_oom_("Slurm", st);
      break;
    }
    snprintf(a, len + 8, "%s:%d", name, resv ? resv[k] : port_base + k);
    c->jobs[ji].addrs[jt] = a;
    int why = ps_cl_addr_check_(a, strlen(a), NULL);
    if (why != ADDR_OK) {
      ps_cl_addr_error_(why, a, strlen(a), "SLURM_STEP_NODELIST", jobs[ji].name, jt, st);
      rc = st->code;
      break;
    }
    if (r == rank) {
      const char *me = getenv("SLURMD_NODENAME");
      if (me && me[0] && strcmp(me, name) != 0) {
        char b2[SHOW_MAX];
        const char *d = getenv("SLURM_DISTRIBUTION");
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Slurm: rank %ld runs on %s, but the step's layout puts it on "
                           "%s (%s%s)",
                           rank, ps_cl_show_(me, strlen(me), b, sizeof b),
                           ps_cl_show_(name, strlen(name), b2, sizeof b2),
                           het ? "a heterogeneous step: each component's tasks in block "
                                 "order"
                               : "SLURM_DISTRIBUTION ",
                           het ? "" : (d ? d : "block"));
        break;
      }
      if ((rc = slurm_gtids_check(hs, host, total, rank, het, st)) != 0) break;
      ps_cl_task_id_set_(self, jobs[ji].name, jt);
    }
    if (++jt == c->jobs[ji].ntasks) ji++, jt = 0;
  }
  free(resv);
  free(local);
  free(host);
  return rc;
}

ps_cluster *ps_cluster_from_slurm(const char *jobs_spec, int port_base, ps_task_id *self,
                                  ps_status *st) {
  slurm_job jobs[SLURM_MAX_JOBS];
  int njobs = 0;
  strvec hosts = {0};
  int *tpn = NULL;
  size_t ntpn = 0, m = 0;
  slurm_host *hs = NULL;
  ps_cluster *c = NULL;
  char b[SHOW_MAX];

  const char *v = slurm_var("SLURM_PROCID", st);
  if (v == NULL) return NULL;
  long rank = ps_cl_parse_num_(v, strlen(v), INT_MAX);
  if (rank < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "SLURM_PROCID \"%s\" is not a task rank (a number "
                         ">= 0)",
                         ps_cl_show_(v, strlen(v), b, sizeof b)),
           NULL;
  if (slurm_jobs(jobs_spec, jobs, &njobs, st) != 0) return NULL;
  if (port_base < 1 || port_base > 65535)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Slurm: port base %d is not a port number (1-65535)", port_base),
           NULL;
  if ((v = slurm_var("SLURM_STEP_NODELIST", st)) == NULL ||
      expand_hostlist(v, "SLURM_STEP_NODELIST", &hosts, st) != 0)
    goto fail;
  if ((v = slurm_var("SLURM_STEP_TASKS_PER_NODE", st)) == NULL ||
      expand_tasks_per_node(v, &tpn, &ntpn, st) != 0)
    goto fail;
  if (slurm_hosts(&hosts, tpn, ntpn, &hs, &m, st) != 0) goto fail;
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
  if ((c = ps_cl_cluster_new_(njobs)) == NULL) {
    ps_cl_oom_("Slurm", st);
    goto fail;
  }
  for (int i = 0; i < njobs; i++)
    if (ps_cl_job_alloc_(&c->jobs[i], jobs[i].name, strlen(jobs[i].name),
                         jobs[i].count) != 0) {
      ps_cl_oom_("Slurm", st);
      goto fail;
    }
  if (slurm_addresses(c, jobs, hs, m, assigned, port_base, rank, self, st) != 0 ||
      ps_cl_cluster_finish_(c, "Slurm", st) != 0)
    goto fail;
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
    if (!ps_cl_task_present_(c, job, task, why, sizeof why) &&
        !ps_cl_evaluator_outside_(c, job)) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "--job %s --task %d: not in cluster spec %s (%s)",
                    ps_cl_show_(job, strlen(job), b, sizeof b), task, cluster_file, why);
      ps_cluster_destroy(c);
      return NULL;
    }
    ps_cl_task_id_set_(self, job, task);
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
    if (pb != NULL && pb[0] != '\0' &&
        (port_base = ps_cl_parse_num_(pb, strlen(pb), 65535)) < 1)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "PS_SLURM_PORT_BASE \"%s\" is not a port number "
                           "(1-65535)",
                           ps_cl_show_(pb, strlen(pb), b, sizeof b)),
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
    if (!ps_cl_task_present_(c, job, task, why, sizeof why) &&
        !ps_cl_evaluator_outside_(c, job)) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "--job %s --task %d: not in the cluster from %s (%s)",
                    ps_cl_show_(job, strlen(job), b, sizeof b), task, source, why);
      ps_cluster_destroy(c);
      return NULL;
    }
    ps_cl_task_id_set_(&me, job, task);
  }
  if (self != NULL) *self = me;
  return c;
}
