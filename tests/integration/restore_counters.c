/* restore-counters: the training program of test_restore_recovery.sh, as
 * small as it gets, through the public API only.
 *   restore-counters SPEC create [--parts]
 *       ack/c0..ack/c7 (float scalars, value I + 1) round robin over the
 *       ps tasks, as replica_device_setter places them; --parts: then
 *       ack/w (float [4,2], values 0..7) in two parts of 2 rows, on the
 *       next two tasks
 *   restore-counters SPEC add X [TASK]
 *       adds X to the counters of ps/TASK (default 0)
 *   restore-counters SPEC wrong NAME TASK
 *       creates NAME on ps/TASK as a float [3] of ones (not a counter)
 *   restore-counters SPEC part NAME FULL TASK
 *       creates NAME on ps/TASK as rows 0..1 (zeros) of FULL, a float [4,2]
 *       partitioned variable (its other rows on no ps)
 *   restore-counters SPEC uninit NAME TASK
 *       creates NAME on ps/TASK as a float scalar, not initialized
 *   restore-counters SPEC restore PREFIX
 *       ps_client_restore_opts without options, then ps_client_restore:
 *       prints what each reports (status, counts)
 * Exit 0, or 1 after printing the error. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <paramserver/paramserver.h>

static int oom(ps_status *st) {
  st->code = PS_RESOURCE_EXHAUSTED;
  snprintf(st->msg, sizeof st->msg, "out of memory");
  return st->code;
}

static int create(ps_client *c, bool parts, ps_status *st) {
  int nps = ps_client_num_ps(c);
  ps_shape scalar = {0, {0}}, rows = {2, {2, 2}}, full = {2, {4, 2}};
  char names[8][16];
  int rc = 0;
  for (int i = 0; i < 8 && rc == 0; i++) {
    snprintf(names[i], sizeof names[i], "ack/c%d", i);
    ps_var_spec s = {.name = names[i], .dtype = PS_DT_FLOAT, .shape = scalar};
    ps_tensor *v = ps_tensor_create(PS_DT_FLOAT, &scalar, true);
    if (v == NULL) return oom(st);
    *(float *)ps_tensor_data(v) = (float)(i + 1);
    ps_update u = {.name = names[i], .op = PS_ASSIGN, .value = v};
    rc = ps_client_create_vars(c, i % nps, &s, 1, st);
    if (rc == 0) rc = ps_client_update(c, i % nps, &u, 1, st);
    ps_tensor_destroy(v);
  }
  const char *pn[2] = {"ack/w/part_0", "ack/w/part_1"};
  for (int p = 0; parts && p < 2 && rc == 0; p++) {
    int task = (8 + p) % nps;
    ps_var_spec s = {.name = pn[p],
                     .dtype = PS_DT_FLOAT,
                     .shape = rows,
                     .full_name = "ack/w",
                     .full_shape = &full,
                     .offset = 4 * p};
    ps_tensor *v = ps_tensor_create(PS_DT_FLOAT, &rows, true);
    if (v == NULL) return oom(st);
    for (int k = 0; k < 4; k++)
      ((float *)ps_tensor_data(v))[k] = (float)(4 * p + k);
    ps_update u = {.name = pn[p], .op = PS_ASSIGN, .value = v};
    rc = ps_client_create_vars(c, task, &s, 1, st);
    if (rc == 0) rc = ps_client_update(c, task, &u, 1, st);
    ps_tensor_destroy(v);
  }
  return rc;
}

static int add(ps_client *c, float x, int task, ps_status *st) {
  ps_shape scalar = {0, {0}};
  ps_tensor *v = ps_tensor_create(PS_DT_FLOAT, &scalar, true);
  if (v == NULL) return oom(st);
  *(float *)ps_tensor_data(v) = x;
  int nps = ps_client_num_ps(c), rc = 0;
  for (int i = task; i < 8 && rc == 0; i += nps) {
    char name[16];
    snprintf(name, sizeof name, "ack/c%d", i);
    ps_update u = {.name = name, .op = PS_ASSIGN_ADD, .value = v};
    rc = ps_client_update(c, task, &u, 1, st);
  }
  ps_tensor_destroy(v);
  return rc;
}

static int wrong(ps_client *c, const char *name, int task, ps_status *st) {
  ps_init_spec ones;
  ps_init_spec_default(&ones, PS_INIT_ONES);
  ps_var_spec s = {.name = name, .dtype = PS_DT_FLOAT, .shape = {1, {3}}, .init = &ones};
  if (ps_client_create_vars(c, task, &s, 1, st) != 0) return st->code;
  return ps_client_initialize(c, task, &name, 1, false, NULL, st);
}

static int part(ps_client *c, const char *name, const char *full, int task,
                ps_status *st) {
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_shape fs = {2, {4, 2}};
  ps_var_spec s = {.name = name,
                   .dtype = PS_DT_FLOAT,
                   .shape = {2, {2, 2}},
                   .init = &zeros,
                   .full_name = full,
                   .full_shape = &fs,
                   .offset = 0};
  if (ps_client_create_vars(c, task, &s, 1, st) != 0) return st->code;
  return ps_client_initialize(c, task, &name, 1, false, NULL, st);
}

static int uninit(ps_client *c, const char *name, int task, ps_status *st) {
  ps_var_spec s = {.name = name, .dtype = PS_DT_FLOAT, .shape = {0, {0}}};
  return ps_client_create_vars(c, task, &s, 1, st);
}

static int restore(ps_client *c, const char *prefix, ps_status *st) {
  ps_restore_result r;
  int rc = ps_client_restore_opts(c, prefix, NULL, &r, st);
  printf("restore_opts: %s restored=%zu total=%zu absent=%zu created=%zu\n",
         ps_status_code_name(rc), r.restored, r.total, r.absent, r.created);
  ps_restore_result_fini(&r);
  size_t n = 99;
  rc = ps_client_restore(c, prefix, &n, st);
  printf("restore: %s restored=%zu: %s\n", ps_status_code_name(rc), n, st->msg);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3 || (strcmp(argv[2], "create") && argc < 4)) {
    fprintf(stderr, "usage: restore-counters SPEC create [--parts] | add X [TASK] | "
                    "wrong NAME TASK | part NAME FULL TASK | uninit NAME TASK | "
                    "restore P\n");
    return 2;
  }
  ps_status st;
  ps_status_clear(&st);
  ps_library_init();
  ps_cluster *cl = ps_cluster_load_file(argv[1], &st);
  ps_client *c = cl ? ps_client_create(cl, "ps", NULL, &st) : NULL;
  int rc = c == NULL;
  bool parts = argc > 3 && !strcmp(argv[3], "--parts");
  if (c && !strcmp(argv[2], "create"))
    rc = create(c, parts, &st);
  else if (c && !strcmp(argv[2], "wrong") && argc > 4)
    rc = wrong(c, argv[3], atoi(argv[4]), &st);
  else if (c && !strcmp(argv[2], "part") && argc > 5)
    rc = part(c, argv[3], argv[4], atoi(argv[5]), &st);
  else if (c && !strcmp(argv[2], "uninit") && argc > 4)
    rc = uninit(c, argv[3], atoi(argv[4]), &st);
  else if (c && !strcmp(argv[2], "restore"))
    rc = restore(c, argv[3], &st);
  else if (c)
    rc = add(c, strtof(argv[3], NULL), argc > 4 ? atoi(argv[4]) : 0, &st);
  if (rc) fprintf(stderr, "restore-counters: %s\n", st.msg);
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return rc ? 1 : 0;
}
