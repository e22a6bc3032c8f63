/* Matrix rows (matrix, copy and keep steps) and the steps const, copy, keep and bloom of a
   description, parse layer (docs/device-protocol.md, "Randomization description"); run_rows.c
   runs the four steps. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "parse.h"

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

/* bloom: in[0] the attribute, out[0] the first column, value the bits, p = f; the pool from
   cum holds d + 1 offsets (relative to cum + d + 1) then every value's set bit positions */
static int parse_bloom(parser *ps, json_t *d, const char *field, ldp_step *s) {
  char f[200];
  json_t *bits = json_object_get(d, "bits"), *start = json_object_get(d, "out");
  json_t *fv = json_object_get(d, "f"), *filters = json_object_get(d, "filters");
  ldp_errf(f, sizeof f, "%s.in", field);
  if (ldp_int_list(ps, json_object_get(d, "in"), f, ps->p->n_attrs, s->in, &s->n_in)) return -1;
  if (!json_is_integer(bits) || !json_is_integer(start) || json_integer_value(bits) < 1 ||
      json_integer_value(start) < 0 ||
      json_integer_value(start) + json_integer_value(bits) > (json_int_t)ps->p->width) {
    ldp_errf(ps->err, ps->errlen, "%s.bits: out and bits must place the filter inside the %u "
             "report columns", field, ps->p->width);
    return -1;
  }
  s->p = json_number_value(fv);
  if (!json_is_number(fv) || !(s->p >= 0.0 && s->p <= 1.0)) {
    ldp_errf(ps->err, ps->errlen, "%s.f: must be a number in [0, 1]", field);
    return -1;
  }
  uint32_t dv = ps->p->size[s->in[0]];
  size_t need = dv + 1;
  for (size_t v = 0; json_is_array(filters) && v < json_array_size(filters); v++)
    need += json_array_size(json_array_get(filters, v));
  int ok = s->n_in == 1 && json_is_array(filters) && json_array_size(filters) == dv &&
           ps->cum_used + need <= LDP_MAX_MATRIX;
  double *pool = ps->p->cum + ps->cum_used;
  uint8_t mark[(LDP_MAX_WIDTH + 7) / 8]; /* the bits of one filter (bits <= width) */
  size_t at = 0;
  memset(mark, 0, sizeof mark);
  for (uint32_t v = 0; ok && v < dv; v++) {
    json_t *pos = json_array_get(filters, v);
    size_t from = at;
    pool[v] = (double)at;
    ok = json_is_array(pos);
    for (size_t i = 0; ok && i < json_array_size(pos); i++) {
      json_t *b = json_array_get(pos, i);
      ok = json_is_integer(b) && json_integer_value(b) >= 0 &&
           json_integer_value(b) < json_integer_value(bits);
      if (!ok) break;
      uint32_t bit = (uint32_t)json_integer_value(b);
      if (mark[bit / 8] & (1u << (bit % 8))) continue; /* a position listed twice: once */
      mark[bit / 8] |= (uint8_t)(1u << (bit % 8));
      pool[dv + 1 + at++] = (double)bit;
    }
    for (size_t i = from; i < at; i++) mark[(uint32_t)pool[dv + 1 + i] / 8] = 0;
  }
  if (!ok) {
    ldp_errf(ps->err, ps->errlen, "%s.filters: must list, per value of one attribute, bit "
             "positions below %lld (values + 1 + positions count against the %d matrix entries "
             "in all)", field, (long long)json_integer_value(bits), LDP_MAX_MATRIX);
    return -1;
  }
  pool[dv] = (double)at;
  s->op = LDP_OP_BLOOM;
  s->cells = dv;
  s->cum = ps->cum_used;
  s->out[0] = (uint16_t)json_integer_value(start);
  s->value = (uint32_t)json_integer_value(bits);
  ps->cum_used += (uint32_t)need;
  /* the largest Hamming distance between two values' filters, |A| + |B| - 2 |A & B| with the
     filter of u marked: O(values^2 + values x positions), never values^2 x bits x positions */
  uint32_t ham = 0;
  const double *posn = pool + dv + 1;
  for (uint32_t u = 0; u + 1 < dv; u++) {
    size_t u0 = (size_t)pool[u], u1 = (size_t)pool[u + 1];
    for (size_t i = u0; i < u1; i++)
      mark[(uint32_t)posn[i] / 8] |= (uint8_t)(1u << ((uint32_t)posn[i] % 8));
    for (uint32_t v = u + 1; v < dv; v++) {
      size_t v0 = (size_t)pool[v], v1 = (size_t)pool[v + 1], both = 0;
      for (size_t i = v0; i < v1; i++)
        both += (mark[(uint32_t)posn[i] / 8] >> ((uint32_t)posn[i] % 8)) & 1u;
      uint32_t h = (uint32_t)((u1 - u0) + (v1 - v0) - 2 * both);
      if (h > ham) ham = h;
    }
    for (size_t i = u0; i < u1; i++) mark[(uint32_t)posn[i] / 8] = 0;
  }
  s->eps = ham == 0 ? 0.0 : s->p <= 0.0 ? INFINITY : log((2.0 - s->p) / s->p) * ham;
  ps->p->n_steps++;
  return 0;
}

/* const (a fixed value), copy (a row of a matrix chosen by a reported value) and keep (the
   cell kept with p, else a fake cell) */
int ldp_parse_post(parser *ps, json_t *d, const char *field, ldp_step *s, const char *op) {
  json_t *out = json_object_get(d, "out");
  if (!json_is_integer(out) || json_integer_value(out) < 0 ||
      json_integer_value(out) >= (json_int_t)ps->p->width) {
    ldp_errf(ps->err, ps->errlen, "%s.out: must be an integer in [0, %u)", field, ps->p->width);
    return -1;
  }
  s->out[0] = (uint16_t)json_integer_value(out);
  s->eps = 0.0;
  if (strcmp(op, "bloom") == 0) return parse_bloom(ps, d, field, s);
  if (strcmp(op, "keep") == 0) {
    json_t *pv = json_object_get(d, "p"), *fake = json_object_get(d, "fake");
    char f[200];
    ldp_errf(f, sizeof f, "%s.in", field);
    if (ldp_int_list(ps, json_object_get(d, "in"), f, ps->p->n_attrs, s->in, &s->n_in))
      return -1;
    if (ldp_cells(ps, s->in, s->n_in, f, &s->cells)) return -1;
    s->p = json_number_value(pv);
    if (!json_is_number(pv) || !(s->p >= 0.0 && s->p <= 1.0)) {
      ldp_errf(ps->err, ps->errlen, "%s.p: must be a number in [0, 1]", field);
      return -1;
    }
    if (!json_is_array(fake) || json_array_size(fake) != s->cells) {
      ldp_errf(ps->err, ps->errlen, "%s.fake: must hold %llu probabilities", field,
               (unsigned long long)s->cells);
      return -1;
    }
    json_t *rows = json_array();
    json_array_append(rows, fake);
    ldp_errf(f, sizeof f, "%s.fake", field);
    int r = ldp_parse_rows(ps, rows, f, 1, s);
    json_decref(rows);
    if (r) return -1;
    double lo = INFINITY;
    for (size_t i = 0; i < json_array_size(fake); i++)
      if (json_number_value(json_array_get(fake, i)) < lo)
        lo = json_number_value(json_array_get(fake, i));
    s->op = LDP_OP_KEEP;
    s->eps = s->p == 0.0 ? 0.0 : (s->p >= 1.0 || lo <= 0.0) ? INFINITY
                                 : log1p(s->p / ((1.0 - s->p) * lo));
  } else if (strcmp(op, "const") == 0) {
    json_t *v = json_object_get(d, "value");
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= ((json_int_t)1 << 32)) {
      ldp_errf(ps->err, ps->errlen, "%s.value: must be an integer in [0, 4294967296)", field);
      return -1;
    }
    s->op = LDP_OP_CONST;
    s->value = (uint32_t)json_integer_value(v);
  } else {
    json_t *from = json_object_get(d, "from"), *rows = json_object_get(d, "rows");
    if (!json_is_integer(from) || json_integer_value(from) < 0 ||
        json_integer_value(from) >= (json_int_t)ps->p->width) {
      ldp_errf(ps->err, ps->errlen, "%s.from: must be an integer in [0, %u)", field,
               ps->p->width);
      return -1;
    }
    s->op = LDP_OP_COPY;
    s->in[0] = (uint16_t)json_integer_value(from);
    s->cells = json_is_array(rows) ? json_array_size(rows) : 0;
    if (s->cells < 1 || ldp_parse_rows(ps, rows, field, s->cells, s)) {
      if (s->cells < 1) ldp_errf(ps->err, ps->errlen, "%s.rows: must be 1 or more rows", field);
      return -1;
    }
  }
  ps->p->n_steps++;
  return 0;
}

