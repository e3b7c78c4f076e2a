/* A .meta announcing a variable of [2^40] floats (4 TiB; issue 21 point
 * 19): the import takes it (a variable on a ps may be larger than a
 * worker's memory), and a session that must hold it locally fails its
 * initializer with RESOURCE_EXHAUSTED "out of memory" and goes on working,
 * under ASan + UBSan too: no size larger than this machine's memory is
 * asked of the allocator (ps_buf_create), where ASan would abort. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static char base[200], dir[256];
static void setup_base(void) {
  harness_scratch_base(base, sizeof base, "hugemeta");
}
static void teardown_base(void) {
  harness_scratch_remove(base);
}
static void setup(void) {
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
}
static void teardown(void) {
  ck_assert_int_eq(harness_scratch_remove(dir), 0);
}

START_TEST(a_meta_with_a_2p40_variable) {
  ps_status st;
  ps_status_clear(&st);
  ps_graph *g = ps_graph_create();
  ps_shape big = {.rank = 1, .dim = {(int64_t)1 << 40}}, one = {.rank = 0};
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ck_assert_ptr_nonnull(ps_get_variable(g, "big", PS_DT_FLOAT, &big, &z, NULL, &st));
  ck_assert_ptr_nonnull(ps_get_variable(g, "small", PS_DT_FLOAT, &one, &z, NULL, &st));
  size_t len;
  uint8_t *bytes = ps_meta_graph_serialize(g, NULL, &len, &st);
  ck_assert_msg(bytes != NULL, "%s", st.msg);
  char path[300];
  snprintf(path, sizeof path, "%s/big.meta", dir);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  free(bytes);
  ps_graph_destroy(g);

  ps_saver *sv = NULL;
  ps_graph *g2 = ps_import_meta_graph(path, &sv, &st);
  ck_assert_msg(g2 != NULL, "%s", st.msg);
  ps_session *s = ps_session_create(g2, NULL, &st);
  ck_assert_msg(s != NULL, "%s", st.msg);
  size_t nv;
  ps_variable *const *vars = ps_collection_variables(g2, PS_GLOBAL_VARIABLES, &nv);
  ps_variable *vb = NULL, *vs = NULL;
  for (size_t i = 0; i < nv; i++) {
    if (!strcmp(ps_variable_name(vars[i]), "big")) vb = vars[i];
    if (!strcmp(ps_variable_name(vars[i]), "small")) vs = vars[i];
  }
  ck_assert_ptr_nonnull(vb);
  ck_assert_ptr_nonnull(vs);
  ps_node *ib = ps_variable_initializer(vb);
  PS_ASSERT_STATUS(ps_session_run(s, NULL, 0, NULL, 0, &ib, 1, NULL, &st), st,
                   PS_RESOURCE_EXHAUSTED, "out of memory");
  /* the session goes on */
  ps_node *is = ps_variable_initializer(vs), *rs = ps_variable_value(vs);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &is, 1, NULL, &st), st);
  ps_tensor *out = NULL;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &rs, 1, NULL, 0, &out, &st), st);
  ck_assert_float_eq(*(float *)ps_tensor_data(out), 0.0f);
  ps_tensor_destroy(out);
  ps_session_destroy(s);
  ps_saver_destroy(sv);
  ps_graph_destroy(g2);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("huge_meta");
  TCase *tc = tcase_create("huge_meta");
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_meta_with_a_2p40_variable);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
