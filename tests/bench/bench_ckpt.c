/* bench_ckpt: how close a cluster-wide checkpoint gets to what the disk
 * underneath it can do, each figure against a baseline measured in the same
 * run, interleaved with it (so the noise of a shared box hits both sides),
 * on the same filesystem.
 *
 * Two real ps-server processes (the integration harness, kernel-picked
 * ports) share a fresh --checkpoint-dir.  They hold --mib MiB (default
 * 1 GiB) of float32 variables: 8 of [mib*8, 4096], 4 per ps, filled by the
 * server-side random_uniform initializer (no zero pages), plus one scalar
 * per ps for the training loop of (c).
 *
 *  (a) ckpt_save: ps_client_save of the whole cluster, in GB/s (1e9 B/s) of
 *      the data bytes the save reports.  Each ps writes its shard on a
 *      thread of its own and fdatasyncs it (common/bundle_writer.c,
 *      ps_bundle_writer_finish), fsyncs its index, the last ps merges the
 *      shards by renaming the data files and rewrites the small index and
 *      the `checkpoint` state file (fsync + rename + directory fsync).
 *      Baseline: `dd if=/dev/zero of=F bs=4M count=N conv=fdatasync` of the
 *      same number of bytes into the same directory: one stream, one
 *      fdatasync at the end, as each shard of ours.  Also shown (dd_x2,
 *      ratio_x2): two such dd of half the size at once, the way our two ps
 *      write; on this disk two streams are often faster than one.  The
 *      save keeps every checkpoint (max_to_keep -1), so no retention
 *      deletes happen inside the timed save; the bench deletes each
 *      checkpoint itself.  Every timed write starts from the same state:
 *      the previous write's files just deleted, nothing else of the
 *      bench's on the disk, and an untimed warm-up write before the first
 *      (see main(): on this thin-provisioned virtual disk, blocks never
 *      written before are 3-4 times slower, and ext4 reuses freed blocks
 *      first).
 *  (b) ckpt_restore: ps_client_restore of the checkpoint saved in (c)
 *      into the live variables (each ps first checks every tensor, reading
 *      and CRC32C-checking it through a bounded scratch buffer, then reads
 *      it again into a new buffer, checked, swapped in for the variable's:
 *      the checkpoint is read twice), GB/s.  Baseline: `dd if=F of=/dev/null bs=4M` of a
 *      file dd wrote.  Both read cold: just before each, the files about
 *      to be read (the checkpoint's, or dd's) are evicted from the page
 *      cache with posix_fadvise(POSIX_FADV_DONTNEED) (the pages are clean
 *      after the fdatasync, so this needs no privilege and touches no
 *      other process's cache, unlike drop_caches), and mincore() confirms
 *      it (the residency is printed).  Also shown (dd_x2, ratio_x2): two
 *      dd reading one half each at once, as our two ps read.  Then both
 *      run again warm (files in the page cache), which shows the CPU cost
 *      alone: ckpt_restore_cached against a cached dd read (which copies
 *      into one reused 4 MiB buffer: no page faults, no checksum).  The ps
 *      processes' CPU time during each save and restore is printed too,
 *      and each restore's minor page faults (its new staging memory).
 *      ckpt_restore_fresh: the same checkpoint restored by a new pair of
 *      ps (the old ones stopped) whose variables are created but hold no
 *      memory yet, as after a crash: every tensor goes into new memory the
 *      kernel must fault in and zero.  Against the same cold dd read.
 *  (c) ckpt_pause: while a save runs, a training-like loop does steps of
 *      one ps_client_update_many with a scalar assign_add on each ps and
 *      records every step's latency.  Reported: the longest step that
 *      overlapped the save (the worst repetition), with how long the save
 *      took, against the steps outside saves (the second before and after):
 *      their median (median over repetitions), p99 (likewise) and maximum
 *      (over all), since on a shared box a step can stall without a save.
 *
 * Order alternates per repetition (ours first, then dd first) so a noisy
 * period does not always hit the same side.  stdout gets one `bench:' line
 * per result (medians over --reps; the pause is the worst repetition);
 * every repetition and the details go to stderr.  Targets are reported, not
 * asserted: the exit status is 1 only when something fails (an RPC, a dd,
 * a restored value that differs, a server that does not start or stop). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/checkpoint.h"
#include "paramserver/client.h"
#include "steps.h"

extern char **environ;

#define NPS 2
#define VARS_PER_PS 4
#define NVARS (NPS * VARS_PER_PS)
#define COLS 4096

typedef struct opts {
  int reps;
  long long mib; /* total size of the big variables */
  int pause;     /* run (c) */
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  double *s = malloc((size_t)n * sizeof *s);
  if (s == NULL) return 0;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  free(s);
  return m;
}

static void ps_fail(const char *what, const ps_status *st) {
  fprintf(stderr, "bench_ckpt: %s failed: %s\n", what, st->msg);
}

/* CPU seconds used so far by the ps processes (@what 0), threads that have
 * exited included (utime + stime of /proc/PID/stat, in clock ticks: 10 ms
 * resolution), or their minor page faults (@what 1); -1 if unavailable.  (The per-thread
 * schedstat files would miss the save and restore threads, which exit when done.) */
static double ps_stat_sum(const pid_t *pids, int n, int what) {
  double sum = 0;
  long hz = sysconf(_SC_CLK_TCK);
  for (int i = 0; i < n; i++) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pids[i]);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *q = strrchr(buf, ')'); /* after the command name */
    unsigned long long mf, ut, st;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
     */
    if (q == NULL ||
        sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %llu %*u %*u %*u %llu %llu", &mf, &ut,
               &st) != 3)
      return -1;
    sum += what ? (double)mf : (double)(ut + st) / (double)hz;
  }
  return sum;
}

static double ps_cpu_s(const pid_t *pids, int n) {
  return ps_stat_sum(pids, n, 0);
}

/* Minor page faults of the ps processes so far (minflt, the same way); -1
 * if unavailable.  New memory shows here: a restore's staging buffers take
 * 262144 faults per GiB in 4 KiB pages, 512 in 2 MiB pages. */
static double ps_minflt(const pid_t *pids, int n) {
  return ps_stat_sum(pids, n, 1);
}

/* ---- dd, spawned and timed ---------------------------------------------- */

/* Starts dd with @args (NULL-terminated, without argv[0]); pid or -1. */
static pid_t dd_start(const char *const *args) {
  const char *argv[16] = {"dd"};
  int n = 1;
  for (; args[n - 1] && n < 15; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid;
  int e = posix_spawnp(&pid, "dd", NULL, NULL, (char *const *)argv, environ);
  if (e != 0) {
    fprintf(stderr, "bench_ckpt: cannot run dd: %s\n", strerror(e));
    return -1;
  }
  return pid;
}

static int dd_wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "bench_ckpt: dd failed (status 0x%x)\n", status);
    return -1;
  }
  return 0;
}

/* Writes @mib MiB of zeros to each of @nfiles files at once, fdatasync'ed;
 * seconds, or -1. */
static double dd_write(char files[][300], int nfiles, long long mib) {
  char of[2][320], count[32];
  snprintf(count, sizeof count, "count=%lld", mib % 4 ? mib : mib / 4);
  pid_t pid[2];
  int bad = 0;
  double t0 = now_s();
  for (int i = 0; i < nfiles; i++) {
    snprintf(of[i], sizeof of[i], "of=%s", files[i]);
    const char *args[] = {
        "if=/dev/zero", of[i], mib % 4 ? "bs=1M" : "bs=4M", count, "conv=fdatasync",
        "status=none",  NULL};
    if ((pid[i] = dd_start(args)) < 0) {
      bad = 1;
      nfiles = i; /* reap the ones started */
    }
  }
  for (int i = 0; i < nfiles; i++)
    bad |= dd_wait(pid[i]);
  double t = now_s() - t0;
  return bad ? -1 : t;
}

/* Reads @file (@mib MiB) with one dd, or with two at once, each reading
 * one half; seconds, or -1. */
static double dd_read(const char *file, long long mib, int nparts) {
  char in[320], count[2][32], skip[2][32];
  snprintf(in, sizeof in, "if=%s", file);
  long long blocks = mib % 4 ? mib : mib / 4, per = nparts > 1 ? blocks / 2 : blocks;
  pid_t pid[2];
  int bad = 0;
  double t0 = now_s();
  for (int i = 0; i < nparts; i++) {
    snprintf(count[i], sizeof count[i], "count=%lld",
             i == nparts - 1 ? blocks - per * i : per);
    snprintf(skip[i], sizeof skip[i], "skip=%lld", per * i);
    const char *args[] = {in,       "of=/dev/null", mib % 4 ? "bs=1M" : "bs=4M",
                          count[i], skip[i],        "status=none",
                          NULL};
    if ((pid[i] = dd_start(args)) < 0) {
      bad = 1;
      nparts = i; /* reap the ones started */
    }
  }
  for (int i = 0; i < nparts; i++)
    bad |= dd_wait(pid[i]);
  double t = now_s() - t0;
  return bad ? -1 : t;
}

/* ---- page cache ----------------------------------------------------------- */

/* The files of @dir whose names start with @prefix: with @evict, first
 * dropped from the page cache (posix_fadvise DONTNEED; the pages are clean
 * after the writers' fdatasync, so no privilege is needed and no other
 * process's cache is touched).  Returns the bytes resident (mincore), and
 * the files' total size in *@total. */
static long long cache_files(const char *dir, const char *prefix, int evict,
                             long long *total) {
  DIR *d = opendir(dir);
  long long resident = 0;
  *total = 0;
  if (d == NULL) return -1;
  long page = sysconf(_SC_PAGESIZE);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) continue;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (evict) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    *total += sb.st_size;
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      size_t np = ((size_t)sb.st_size + (size_t)page - 1) / (size_t)page;
      unsigned char *vec = malloc(np);
      if (vec && mincore(m, (size_t)sb.st_size, vec) == 0)
        for (size_t i = 0; i < np; i++)
          resident += (vec[i] & 1) ? page : 0;
      free(vec);
      munmap(m, (size_t)sb.st_size);
    }
    close(fd);
  }
  closedir(d);
  return resident;
}

/* Prints how much of the files is cached (after evicting them if asked). */
static void cache_report(const char *dir, const char *prefix, int evict) {
  long long total;
  long long res = cache_files(dir, prefix, evict, &total);
  fprintf(stderr, "    %s%s*: %.1f of %.1f MiB in the page cache\n",
          evict ? "evicted " : "", prefix, (double)res / 1048576,
          (double)total / 1048576);
}

/* ---- the cluster ---------------------------------------------------------- */

static void var_name(char *out, size_t n, int task, int k) {
  snprintf(out, n, "big_%d_%d", task, k);
}

static const char *const tick_names[NPS] = {"tick_0", "tick_1"};

/* Creates the variables; @init: and fills them (else they stay
 * uninitialized, as on a fresh cluster about to restore). */
static int setup_vars(ps_client *c, const opts *o, bool init) {
  ps_status st;
  ps_init_spec ru;
  ps_init_spec_default(&ru, PS_INIT_RANDOM_UNIFORM);
  ps_init_spec zero;
  ps_init_spec_default(&zero, PS_INIT_ZEROS);
  int64_t rows = o->mib * 8; /* mib MiB over 8 variables of 4096 float columns */
  double t0 = now_s();
  for (int t = 0; t < NPS; t++) {
    char names[VARS_PER_PS][32];
    ps_var_spec v[VARS_PER_PS + 1];
    for (int k = 0; k < VARS_PER_PS; k++) {
      var_name(names[k], sizeof names[k], t, k);
      ru.seed = 1 + t * VARS_PER_PS + k;
      v[k] = (ps_var_spec){.name = names[k],
                           .dtype = PS_DT_FLOAT,
                           .shape = {2, {rows, COLS}},
                           .init = &ru};
    }
    v[VARS_PER_PS] = (ps_var_spec){
        .name = tick_names[t], .dtype = PS_DT_FLOAT, .shape = {0, {0}}, .init = &zero};
    if (ps_client_create_vars(c, t, v, VARS_PER_PS + 1, &st) != 0) {
      ps_fail("create_vars", &st);
      return -1;
    }
  }
  for (int t = 0; t < NPS && init; t++)
    if (ps_client_initialize(c, t, NULL, 0, false, NULL, &st) != 0) {
      ps_fail("initialize", &st);
      return -1;
    }
  fprintf(stderr,
          "bench_ckpt: %d variables of [%lld, %d] float32 (%lld MiB) on %d ps, "
          "initialized in %.2f s\n",
          NVARS, (long long)rows, COLS, o->mib, NPS, now_s() - t0);
  return 0;
}

/* A 64-bit fingerprint of the first big variable of each ps. */
static int fingerprint(ps_client *c, uint64_t fp[NPS]) {
  ps_status st;
  for (int t = 0; t < NPS; t++) {
    char name[32];
    var_name(name, sizeof name, t, 0);
    ps_read r = {.name = name};
    if (ps_client_read(c, t, &r, 1, &st) != 0) {
      ps_fail("read", &st);
      return -1;
    }
    const uint64_t *w = ps_tensor_data(r.out);
    size_t n = ps_tensor_nbytes(r.out) / 8;
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
      h = (h ^ w[i]) * 1099511628211u;
    fp[t] = h;
    ps_tensor_destroy(r.out);
  }
  return 0;
}

/* ---- (c) the training loop ------------------------------------------------ */

typedef struct ticker {
  ps_client *c;
  atomic_int stop;
  step_log log;
  int failed;
  ps_status st;
} ticker;

static void *ticker_main(void *arg) {
  ticker *tk = arg;
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){0, {0}}, false);
  *(float *)ps_tensor_data(one) = 1.0f;
  ps_update u[NPS];
  ps_task_updates tu[NPS];
  for (int t = 0; t < NPS; t++) {
    u[t] = (ps_update){.name = tick_names[t], .op = PS_ASSIGN_ADD, .value = one};
    tu[t] = (ps_task_updates){.task = t, .updates = &u[t], .n = 1};
  }
  while (!atomic_load(&tk->stop)) {
    double t0 = now_s();
    if (ps_client_update_many(tk->c, tu, NPS, &tk->st) != 0) {
      tk->failed = 1;
      break;
    }
    double t1 = now_s();
    if (step_log_add(&tk->log, t0, t1 - t0) != 0) {
      tk->failed = 1;
      break;
    }
  }
  ps_tensor_destroy(one);
  return NULL;
}

typedef struct pause_result {
  double max_ms, max_at_ms, save_ms, base_median_ms, base_p99_ms, base_max_ms;
  size_t during, outside;
} pause_result;

/* One save to @prefix with the training loop running from 1 s before to
 * 1 s after it. */
static int bench_pause(ps_client *c, const char *prefix, const ps_save_options *so,
                       pause_result *pr, char **written) {
  ticker tk = {.c = c};
  pthread_t th;
  if (pthread_create(&th, NULL, ticker_main, &tk) != 0) return -1;
  ps_status st;
  sleep_s(1.0);
  double s0 = now_s();
  int rc = ps_client_save(c, prefix, so, written, NULL, &st);
  double s1 = now_s();
  if (rc != 0) ps_fail("save (with training)", &st);
  sleep_s(1.0);
  atomic_store(&tk.stop, 1);
  pthread_join(th, NULL);
  if (tk.failed) {
    ps_fail("training step during save", &tk.st);
    rc = -1;
  }
  memset(pr, 0, sizeof *pr);
  pr->save_ms = (s1 - s0) * 1e3;
  double *base = malloc((tk.log.n ? tk.log.n : 1) * sizeof *base);
  if (base == NULL)
    rc = -1;
  else
    pr->during =
        step_log_split(&tk.log, s0, s1, &pr->max_ms, &pr->max_at_ms, base, &pr->outside);
  if (base && pr->outside > 0) {
    qsort(base, pr->outside, sizeof *base, cmp_double);
    pr->base_median_ms = base[pr->outside / 2];
    pr->base_p99_ms = base[(size_t)((double)(pr->outside - 1) * 0.99)];
    pr->base_max_ms = base[pr->outside - 1];
  }
  free(base);
  step_log_free(&tk.log);
  return rc == 0 && pr->during > 0 ? 0 : -1;
}

/* ---- options ---------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr,
          "usage: bench_ckpt [--reps N] [--mib N] [--no-pause]\n"
          "  --reps N    repetitions of each measurement (default 3)\n"
          "  --mib N     total size of the variables in MiB, even (default 1024)\n"
          "  --no-pause  skip the training-loop pause measurement\n"
          "PS_SERVER names the ps-server binary; TMPDIR the filesystem to use.\n");
}

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.reps = 3, .mib = 1024, .pause = 1};
  for (int i = 1; i < argc; i++) {
    char *end;
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      o->reps = (int)strtol(argv[++i], &end, 10);
      if (*end || o->reps < 1 || o->reps > 1000) return -1;
    } else if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
      o->mib = strtoll(argv[++i], &end, 10);
      if (*end || o->mib < 2 || o->mib % 2 || o->mib > (1 << 20)) return -1;
    } else if (!strcmp(argv[i], "--no-pause")) {
      o->pause = 0;
    } else {
      return -1;
    }
  }
  return 0;
}

/* ---- main -------------------------------------------------------------- */

static double gbps(double bytes, double secs) {
  return bytes / secs / 1e9;
}

static void remove_ckpt(const char *written) {
  ps_status st;
  if (written && ps_ckpt_remove(written, &st) != 0) ps_fail("remove checkpoint", &st);
}

int main(int argc, char **argv) {
  opts o;
  if (parse_opts(argc, argv, &o) != 0) {
    usage();
    return 2;
  }
  double t_start = now_s();
  char label[32];
  if (o.mib % 1024 == 0)
    snprintf(label, sizeof label, "%lldGiB", o.mib / 1024);
  else
    snprintf(label, sizeof label, "%lldMiB", o.mib);
  double bytes = (double)o.mib * 1048576.0;

  const char *tmp = getenv("TMPDIR");
  char dir[256], ddfile[3][300];
  snprintf(dir, sizeof dir, "%s/bench-ckpt-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("bench_ckpt: mkdtemp");
    return 1;
  }
  snprintf(ddfile[0], sizeof ddfile[0], "%s/dd-0.bin", dir);
  snprintf(ddfile[1], sizeof ddfile[1], "%s/dd-a.bin", dir);
  snprintf(ddfile[2], sizeof ddfile[2], "%s/dd-b.bin", dir);

  int rc = 1, harness_up = 0, grpc_up = 0;
  ps_harness h;
  ps_client *c = NULL;
  char *written = NULL; /* the checkpoint on disk, if any */
  ps_status st;
  double *save = calloc((size_t)o.reps, sizeof *save),
         *dd_w = calloc((size_t)o.reps, sizeof *dd_w),
         *dd_w2 = calloc((size_t)o.reps, sizeof *dd_w2),
         *rest = calloc((size_t)o.reps, sizeof *rest),
         *dd_r = calloc((size_t)o.reps, sizeof *dd_r),
         *rest_c = calloc((size_t)o.reps, sizeof *rest_c),
         *dd_rc = calloc((size_t)o.reps, sizeof *dd_rc),
         *base_med = calloc((size_t)o.reps, sizeof *base_med),
         *base_p99 = calloc((size_t)o.reps, sizeof *base_p99),
         *dd_r2 = calloc((size_t)o.reps, sizeof *dd_r2),
         *rest_f = calloc((size_t)o.reps, sizeof *rest_f);
  double base_max = 0;
  pause_result worst = {0};
  if (!save || !dd_w || !dd_w2 || !rest || !dd_r || !rest_c || !dd_rc || !base_med ||
      !base_p99 || !dd_r2 || !rest_f)
    goto done;

  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  if (harness_start(&h, NPS, extra) != 0) {
    fprintf(stderr, "bench_ckpt: cannot start ps-server (PS_SERVER=%s)\n",
            harness_prog("PS_SERVER", "build/ps/ps-server"));
    goto done;
  }
  harness_up = 1;
  ps_rpc_global_init();
  grpc_up = 1;
  if ((c = ps_client_create(h.cluster, "ps", NULL, &st)) == NULL) {
    ps_fail("ps_client_create", &st);
    goto done;
  }
  fprintf(stderr, "bench_ckpt: ps/0 %s (pid %d), ps/1 %s (pid %d), checkpoint dir %s\n",
          h.addrs[0], (int)h.pids[0], h.addrs[1], (int)h.pids[1], dir);
  if (setup_vars(c, &o, true) != 0) goto done;
  uint64_t fp0[NPS], fp1[NPS];
  if (fingerprint(c, fp0) != 0) goto done;

  /* A thin-provisioned virtual disk writes blocks it has never backed far
   * more slowly than blocks written before (here 3-4 s against 1 s per
   * GiB), and ext4 reuses just-freed blocks.  So each timed write starts
   * right after the previous one's files were deleted, with nothing else
   * of the bench's on the disk, and an untimed write first warms the
   * region up: neither side gets the fresh blocks. */
  if (dd_write(ddfile, 1, o.mib) < 0) goto done;
  unlink(ddfile[0]);
  ps_save_options so = {.max_to_keep = -1};
  for (int r = 0; r < o.reps; r++) {
    char prefix[64];
    int64_t nbytes = 0;
    size_t nrest = 0;
    fprintf(stderr, "rep %d/%d (%s first)\n", r + 1, o.reps, r % 2 ? "dd" : "ours");
    /* (a) save vs dd write, each deleted right after */
    for (int side = 0; side < 2; side++) {
      if ((side ^ (r % 2)) == 0) {
        snprintf(prefix, sizeof prefix, "bench-save-%d", r);
        double cpu0 = ps_cpu_s(h.pids, NPS), t0 = now_s();
        if (ps_client_save(c, prefix, &so, &written, &nbytes, &st) != 0) {
          ps_fail("save", &st);
          goto done;
        }
        save[r] = now_s() - t0;
        fprintf(stderr, "  save      %7.3f s  %6.3f GB/s (%lld bytes, ps CPU %.3f s)\n",
                save[r], gbps((double)nbytes, save[r]), (long long)nbytes,
                ps_cpu_s(h.pids, NPS) - cpu0);
        remove_ckpt(written);
        free(written);
        written = NULL;
      } else {
        if ((dd_w[r] = dd_write(ddfile, 1, o.mib)) < 0) goto done;
        unlink(ddfile[0]);
        if ((dd_w2[r] = dd_write(ddfile + 1, 2, o.mib / 2)) < 0) goto done;
        unlink(ddfile[1]);
        unlink(ddfile[2]);
        fprintf(stderr,
                "  dd write  %7.3f s  %6.3f GB/s  (2 x dd in parallel: %.3f s, "
                "%.3f GB/s)\n",
                dd_w[r], gbps(bytes, dd_w[r]), dd_w2[r], gbps(bytes, dd_w2[r]));
      }
    }
    save[r] = (double)nbytes / save[r]; /* from here on: bytes/s */
    dd_w[r] = bytes / dd_w[r];
    dd_w2[r] = bytes / dd_w2[r];
    /* (c) the longest training step during a save; this save's checkpoint
     * is the one (b) restores */
    snprintf(prefix, sizeof prefix, "bench-%d", r);
    char ckpt_files[80]; /* bench-R.index, bench-R.data-* */
    snprintf(ckpt_files, sizeof ckpt_files, "%s.", prefix);
    if (o.pause) {
      pause_result pr;
      if (bench_pause(c, prefix, &so, &pr, &written) != 0) goto done;
      base_med[r] = pr.base_median_ms;
      base_p99[r] = pr.base_p99_ms;
      if (pr.base_max_ms > base_max) base_max = pr.base_max_ms;
      fprintf(stderr,
              "  pause: longest step %.2f ms (began at %+.0f ms) during a %.0f ms "
              "save (%zu steps); outside: median %.3f ms, p99 %.3f ms, max %.2f ms "
              "(%zu steps)\n",
              pr.max_ms, pr.max_at_ms, pr.save_ms, pr.during, pr.base_median_ms,
              pr.base_p99_ms, pr.base_max_ms, pr.outside);
      if (pr.max_ms > worst.max_ms) worst = pr;
    } else if (ps_client_save(c, prefix, &so, &written, NULL, &st) != 0) {
      ps_fail("save", &st);
      goto done;
    }
    /* dd's file for (b) */
    if (dd_write(ddfile, 1, o.mib) < 0) goto done;
    /* (b) restore vs dd read, cold then cached */
    for (int cached = 0; cached < 2; cached++) {
      for (int side = 0; side < 2; side++) {
        /* only the files about to be read are evicted: the other side's
         * stay cached for the cached round */
        char files[80];
        snprintf(files, sizeof files, "%s",
                 (side ^ (r % 2)) == 0 ? ckpt_files : "dd-0.bin");
        cache_report(dir, files, !cached);
        if ((side ^ (r % 2)) == 0) {
          double cpu0 = ps_cpu_s(h.pids, NPS), mf0 = ps_minflt(h.pids, NPS);
          double t0 = now_s();
          if (ps_client_restore(c, prefix, &nrest, &st) != 0) {
            ps_fail("restore", &st);
            goto done;
          }
          double t = now_s() - t0, cpu = ps_cpu_s(h.pids, NPS) - cpu0;
          double mf = ps_minflt(h.pids, NPS) - mf0;
          if (nrest != NVARS + NPS) {
            fprintf(stderr, "bench_ckpt: restored %zu variables, expected %d\n", nrest,
                    NVARS + NPS);
            goto done;
          }
          (cached ? rest_c : rest)[r] = bytes / t;
          fprintf(stderr,
                  "  restore%s %7.3f s  %6.3f GB/s (ps CPU %.3f s, %.0f page faults)\n",
                  cached ? " (cached)" : "         ", t, gbps(bytes, t), cpu, mf);
        } else {
          double t = dd_read(ddfile[0], o.mib, 1);
          if (t < 0) goto done;
          (cached ? dd_rc : dd_r)[r] = bytes / t;
          fprintf(stderr, "  dd read%s %7.3f s  %6.3f GB/s\n",
                  cached ? " (cached)" : "         ", t, gbps(bytes, t));
          if (!cached) { /* for interpretation: two readers, as our two ps */
            cache_report(dir, files, 1);
            if ((t = dd_read(ddfile[0], o.mib, 2)) < 0) goto done;
            dd_r2[r] = bytes / t;
            fprintf(stderr,
                    "  (2 x dd read in parallel, one half each: %.3f s, %.3f GB/s)\n", t,
                    gbps(bytes, t));
          }
        }
      }
    }
    if (fingerprint(c, fp1) != 0) goto done;
    if (memcmp(fp0, fp1, sizeof fp0) != 0) {
      fprintf(stderr, "bench_ckpt: restored values differ from the saved ones\n");
      goto done;
    }
    /* (b') a fresh cluster restores the same checkpoint, cold */
    ps_client_destroy(c);
    c = NULL;
    harness_up = 0;
    if (harness_stop(&h) != 0) {
      fprintf(stderr, "bench_ckpt: ps-server did not stop cleanly\n");
      goto done;
    }
    if (harness_start(&h, NPS, extra) != 0) goto done;
    harness_up = 1;
    if ((c = ps_client_create(h.cluster, "ps", NULL, &st)) == NULL) {
      ps_fail("ps_client_create", &st);
      goto done;
    }
    if (setup_vars(c, &o, false) != 0) goto done;
    cache_report(dir, ckpt_files, 1);
    {
      double cpu0 = ps_cpu_s(h.pids, NPS), mf0 = ps_minflt(h.pids, NPS);
      double t0 = now_s();
      if (ps_client_restore(c, prefix, &nrest, &st) != 0) {
        ps_fail("restore (fresh cluster)", &st);
        goto done;
      }
      double t = now_s() - t0;
      rest_f[r] = bytes / t;
      fprintf(stderr,
              "  restore (fresh ps) %7.3f s  %6.3f GB/s (ps CPU %.3f s, %.0f page "
              "faults)\n",
              t, gbps(bytes, t), ps_cpu_s(h.pids, NPS) - cpu0,
              ps_minflt(h.pids, NPS) - mf0);
    }
    if (fingerprint(c, fp1) != 0) goto done;
    if (memcmp(fp0, fp1, sizeof fp0) != 0) {
      fprintf(stderr, "bench_ckpt: values restored by a fresh cluster differ\n");
      goto done;
    }
    remove_ckpt(written);
    free(written);
    written = NULL;
    unlink(ddfile[0]);
    fprintf(stderr,
            "  rep %d: save %.2f GB/s vs dd %.2f GB/s (ratio %.2f); restore %.2f vs "
            "%.2f GB/s (ratio %.2f); cached restore %.2f vs %.2f GB/s (ratio %.2f)\n",
            r + 1, save[r] / 1e9, dd_w[r] / 1e9, save[r] / dd_w[r], rest[r] / 1e9,
            dd_r[r] / 1e9, rest[r] / dd_r[r], rest_c[r] / 1e9, dd_rc[r] / 1e9,
            rest_c[r] / dd_rc[r]);
  }

  double ms = median(save, o.reps), mw = median(dd_w, o.reps),
         mw2 = median(dd_w2, o.reps);
  double mr = median(rest, o.reps), mdr = median(dd_r, o.reps),
         mdr2 = median(dd_r2, o.reps);
  double mrc = median(rest_c, o.reps), mdrc = median(dd_rc, o.reps);
  printf("bench: ckpt_save_%s ours=%.2f GB/s dd=%.2f GB/s ratio=%.2f (target >= 0.8) "
         "dd_x2=%.2f GB/s ratio_x2=%.2f\n",
         label, ms / 1e9, mw / 1e9, ms / mw, mw2 / 1e9, ms / mw2);
  printf("bench: ckpt_restore_%s ours=%.2f GB/s dd=%.2f GB/s ratio=%.2f (target >= 0.8) "
         "dd_x2=%.2f GB/s ratio_x2=%.2f\n",
         label, mr / 1e9, mdr / 1e9, mr / mdr, mdr2 / 1e9, mr / mdr2);
  printf("bench: ckpt_restore_cached_%s ours=%.2f GB/s dd=%.2f GB/s ratio=%.2f\n", label,
         mrc / 1e9, mdrc / 1e9, mrc / mdrc);
  double mrf = median(rest_f, o.reps);
  printf(
      "bench: ckpt_restore_fresh_%s ours=%.2f GB/s dd=%.2f GB/s ratio=%.2f (into new ps: "
      "new memory)\n",
      label, mrf / 1e9, mdr / 1e9, mrf / mdr);
  if (o.pause)
    printf(
        "bench: ckpt_pause_max_ms=%.2f (save took %.0f ms) baseline_median_step_ms=%.3f "
        "baseline_p99_step_ms=%.2f baseline_max_step_ms=%.2f\n",
        worst.max_ms, worst.save_ms, median(base_med, o.reps), median(base_p99, o.reps),
        base_max);
  fflush(stdout);
  rc = 0;

done:
  free(written);
  ps_client_destroy(c);
  if (grpc_up) ps_rpc_global_shutdown();
  if (harness_up && harness_stop(&h) != 0) {
    fprintf(stderr, "bench_ckpt: ps-server did not stop cleanly\n");
    rc = 1;
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) rc = 1;
  free(save);
  free(dd_w);
  free(dd_w2);
  free(rest);
  free(dd_r);
  free(rest_c);
  free(dd_rc);
  free(base_med);
  free(base_p99);
  free(dd_r2);
  free(rest_f);
  fprintf(stderr, "bench_ckpt: %s in %.1f s\n", rc ? "FAILED" : "done",
          now_s() - t_start);
  return rc;
}
