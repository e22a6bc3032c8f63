/* Matrix rows (matrix and copy steps) and the post-processing steps const and copy of a
   description (docs/device-protocol.md, "Randomization description"). */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "internal.h"

/* cumulative sums of n_rows rows of one length (n_rows 0: as many as the row length) */
int ldp_parse_rows(parser *ps, json_t *rows, const char *field, uint64_t n_rows, ldp_step *s) {
  json_t *r0 = json_array_get(rows, 0);
  uint64_t k = json_is_array(r0) ? json_array_size(r0) : 0, n = json_array_size(rows);
  if (!json_is_array(rows) || k < 1 || n != (n_rows ? n_rows : k) ||
      ps->cum_used + n * k > LDP_MAX_MATRIX) {
    ldp_errf(ps->err, ps->errlen, "%s.rows: must be %llux%llu (at most %d matrix entries in all)",
             field, (unsigned long long)(n_rows ? n_rows : k), (unsigned long long)k,
             LDP_MAX_MATRIX);
    return -1;
  }
  s->cum = ps->cum_used;
  s->value = (uint32_t)k;
  for (uint64_t i = 0; i < n; i++) {
    json_t *r = json_array_get(rows, i);
    double acc = 0.0;
    if (!json_is_array(r) || json_array_size(r) != k) {
      ldp_errf(ps->err, ps->errlen, "%s.rows[%llu]: must have %llu entries", field,
               (unsigned long long)i, (unsigned long long)k);
      return -1;
    }
    for (uint64_t j = 0; j < k; j++) {
      json_t *x = json_array_get(r, j);
      if (!json_is_number(x) || !(json_number_value(x) >= 0.0)) {
        ldp_errf(ps->err, ps->errlen, "%s.rows[%llu]: must hold non-negative numbers", field,
                 (unsigned long long)i);
        return -1;
      }
      acc += json_number_value(x);
      ps->p->cum[ps->cum_used++] = acc;
    }
    if (!(fabs(acc - 1.0) <= 1e-9)) {
      ldp_errf(ps->err, ps->errlen, "%s.rows[%llu]: sums to %.17g, not 1", field,
               (unsigned long long)i, acc);
      return -1;
    }
  }
  return 0;
}

/* const (a fixed value) and copy (a row of a matrix chosen by a reported value) */
int ldp_parse_post(parser *ps, json_t *d, const char *field, ldp_step *s, const char *op) {
  json_t *out = json_object_get(d, "out");
  if (!json_is_integer(out) || json_integer_value(out) < 0 ||
      json_integer_value(out) >= (json_int_t)ps->p->width) {
    ldp_errf(ps->err, ps->errlen, "%s.out: must be an integer in [0, %u)", field, ps->p->width);
    return -1;
  }
  s->out[0] = (uint8_t)json_integer_value(out);
  s->eps = 0.0;
  if (strcmp(op, "const") == 0) {
    json_t *v = json_object_get(d, "value");
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= ((json_int_t)1 << 32)) {
      ldp_errf(ps->err, ps->errlen, "%s.value: must be an integer in [0, 4294967296)", field);
      return -1;
    }
    s->op = 6;
    s->value = (uint32_t)json_integer_value(v);
  } else {
    json_t *from = json_object_get(d, "from"), *rows = json_object_get(d, "rows");
    if (!json_is_integer(from) || json_integer_value(from) < 0 ||
        json_integer_value(from) >= (json_int_t)ps->p->width) {
      ldp_errf(ps->err, ps->errlen, "%s.from: must be an integer in [0, %u)", field,
               ps->p->width);
      return -1;
    }
    s->op = 7;
    s->in[0] = (uint8_t)json_integer_value(from);
    s->cells = json_is_array(rows) ? json_array_size(rows) : 0;
    if (s->cells < 1 || ldp_parse_rows(ps, rows, field, s->cells, s)) {
      if (s->cells < 1) ldp_errf(ps->err, ps->errlen, "%s.rows: must be 1 or more rows", field);
      return -1;
    }
  }
  ps->p->n_steps++;
  return 0;
}

