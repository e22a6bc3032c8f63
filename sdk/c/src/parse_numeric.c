/* Numeric attributes, parse layer (docs/device-protocol.md, "Numeric attributes"): an
   attribute's {min, max, grid}, the wave step and its epsilon, a select's weights; run_numeric.c
   quantizes values and runs the wave step. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "parse.h"

static int bad(parser *ps, const char *field, const char *what) {
  ldp_errf(ps->err, ps->errlen, "%s: %s", field, what);
  return -1;
}

static int finite(json_t *v, double *out) {
  if (!json_is_number(v) || !isfinite(json_number_value(v))) return -1;
  *out = json_number_value(v);
  return 0;
}

int ldp_parse_numeric_attr(parser *ps, json_t *d, size_t j) {
  ldp_program *p = ps->p;
  json_t *g = json_object_get(d, "grid");
  double lo, hi;
  if (finite(json_object_get(d, "min"), &lo) || finite(json_object_get(d, "max"), &hi) ||
      !(lo < hi) || !json_is_integer(g) || json_integer_value(g) < 2 ||
      json_integer_value(g) > (json_int_t)LDP_MAX_GRID) {
    ldp_errf(ps->err, ps->errlen, "device.labels[%zu]: a numeric attribute is {min, max, grid}: "
             "finite min < max, grid an integer in [2, %u]", j, LDP_MAX_GRID);
    return -1;
  }
  p->numeric[j] = 1;
  p->range[j][0] = lo;
  p->range[j][1] = hi;
  p->size[j] = p->grid[j] = (uint32_t)json_integer_value(g);
  p->label0[j] = ps->labels_used;
  return 0;
}

/* the wave's epsilon (estimators/kernels/device_program.py wave_epsilon: the same operations) */
static double wave_epsilon(const double *w, double pr, uint64_t cells, int rounded) {
  double lo = w[0], hi = w[1], a = w[2], b = w[3], width = w[4];
  if (width > 0.0) {
    double rest = (hi - lo) - width;
    if (!(pr > 0.0 && pr < 1.0) || rest <= 0.0) return INFINITY;
    return fabs(log((pr / width) / ((1.0 - pr) / rest)));
  }
  if (!rounded || cells != 2) return INFINITY;
  double y0 = b, y1 = a + b;
  if (y1 < y0) {
    double t = y0;
    y0 = y1;
    y1 = t;
  }
  if (y0 <= lo || y1 >= hi) return INFINITY;
  double up = (y1 - lo) / (y0 - lo), down = (hi - y0) / (hi - y1);
  return log(up > down ? up : down);
}

int ldp_parse_wave(parser *ps, json_t *d, const char *field, ldp_step *s) {
  ldp_program *p = ps->p;
  char f[200];
  json_t *in = json_object_get(d, "in"), *out = json_object_get(d, "out");
  json_t *rnd = json_object_get(d, "round"), *cells = json_object_get(d, "cells");
  json_t *off = json_object_get(d, "offset"), *range = json_object_get(d, "range");
  json_t *at = json_object_get(d, "at"), *pv = json_object_get(d, "p");
  json_t *c0 = json_array_get(in, 0);
  if (!json_is_array(in) || json_array_size(in) != 1 || !json_is_integer(c0) ||
      json_integer_value(c0) < 0 || json_integer_value(c0) >= (json_int_t)p->n_attrs ||
      !p->numeric[json_integer_value(c0)] || (ps->rounded >> json_integer_value(c0) & 1u)) {
    ldp_errf(f, sizeof f, "%s.in", field);
    return bad(ps, f, "must be [j], j a numeric attribute not rounded by a round step");
  }
  if (!json_is_integer(out) || json_integer_value(out) < 0 ||
      json_integer_value(out) >= (json_int_t)p->width) {
    ldp_errf(ps->err, ps->errlen, "%s.out: must be a non-empty list of integers in [0, %u)",
             field, p->width);
    return -1;
  }
  if (!json_is_boolean(rnd)) {
    ldp_errf(f, sizeof f, "%s.round", field);
    return bad(ps, f, "must be true or false");
  }
  int rounded = json_is_true(rnd);
  if (!json_is_integer(cells) || json_integer_value(cells) < (rounded ? 2 : 1) ||
      (uint64_t)json_integer_value(cells) > LDP_MAX_CELLS) {
    ldp_errf(ps->err, ps->errlen, "%s.cells: must be an integer in [%d, %llu]", field,
             rounded ? 2 : 1, (unsigned long long)LDP_MAX_CELLS);
    return -1;
  }
  if (!json_is_integer(off) || json_integer_value(off) < 0 ||
      (uint64_t)json_integer_value(off) + (uint64_t)json_integer_value(cells) > LDP_MAX_CELLS) {
    ldp_errf(ps->err, ps->errlen, "%s.offset: must be an integer >= 0 with offset + cells <= "
             "%llu", field, (unsigned long long)LDP_MAX_CELLS);
    return -1;
  }
  double w[5], pr;
  if (!json_is_array(range) || json_array_size(range) != 2 ||
      finite(json_array_get(range, 0), &w[0]) || finite(json_array_get(range, 1), &w[1]) ||
      !(w[0] < w[1])) {
    ldp_errf(f, sizeof f, "%s.range", field);
    return bad(ps, f, "must be [lo, hi], finite, lo < hi");
  }
  if (!json_is_array(at) || json_array_size(at) != 2 || finite(json_array_get(at, 0), &w[2]) ||
      finite(json_array_get(at, 1), &w[3])) {
    ldp_errf(f, sizeof f, "%s.at", field);
    return bad(ps, f, "must be [a, b], finite");
  }
  if (finite(json_object_get(d, "width"), &w[4])) {
    ldp_errf(f, sizeof f, "%s.width", field);
    return bad(ps, f, "must be a finite number");
  }
  pr = json_number_value(pv);
  if (!json_is_number(pv) || !(pr >= 0.0 && pr <= 1.0)) {
    ldp_errf(f, sizeof f, "%s.p", field);
    return bad(ps, f, "must be a number in [0, 1]");
  }
  if (w[4] < 0.0 || (w[4] == 0.0 && pr != 1.0)) {
    ldp_errf(f, sizeof f, "%s.width", field);
    return bad(ps, f, "must be >= 0 (0: a point, with p 1)");
  }
  double tol = 1e-9 * (w[1] - w[0]);
  for (int z = 0; z <= 1; z++) {
    double left = w[2] * (double)z + w[3];
    if (!(left >= w[0] - tol && left + w[4] <= w[1] + tol)) {
      ldp_errf(ps->err, ps->errlen, "%s.at: the window at z = %d must lie inside the range",
               field, z);
      return -1;
    }
  }
  if (ps->cum_used + 5 > LDP_MAX_MATRIX) {
    ldp_errf(f, sizeof f, "%s.range", field);
    return bad(ps, f, "beyond the matrix entries in all (a wave holds 5)");
  }
  s->op = LDP_OP_WAVE;
  s->n_in = 1;
  s->in[0] = (uint16_t)json_integer_value(c0);
  s->n_out = 1;
  s->out[0] = (uint16_t)json_integer_value(out);
  s->cells = (uint64_t)json_integer_value(cells);
  s->value = (uint32_t)json_integer_value(off);
  s->count = (uint16_t)rounded;
  s->p = pr;
  s->cum = ps->cum_used;
  memcpy(p->cum + ps->cum_used, w, sizeof w);
  ps->cum_used += 5;
  s->eps = wave_epsilon(w, pr, s->cells, rounded);
  p->n_steps++;
  return 0;
}

size_t ldp_round_points(parser *ps, json_t *pts, uint32_t j, size_t max_n) {
  ldp_program *p = ps->p;
  size_t n = json_is_array(pts) ? json_array_size(pts) : 0;
  int ok = n >= 2 && n <= max_n && ps->cum_used + n <= LDP_MAX_MATRIX;
  for (size_t i = 0; ok && i < n; i++) {
    json_t *v = json_array_get(pts, i);
    json_int_t k = json_is_integer(v) ? json_integer_value(v) : -1;
    ok = k >= 0 && (i == 0 ? k == 0 : (double)k > p->cum[ps->cum_used + i - 1]) &&
         (i + 1 < n || k == (json_int_t)p->grid[j] - 1);
    if (ok) p->cum[ps->cum_used + i] = (double)k;
  }
  return ok ? n : 0;
}

int ldp_parse_round(parser *ps, json_t *d, const char *field, ldp_step *s, int depth) {
  ldp_program *p = ps->p;
  char f[200];
  int leading = depth == 0 && !ps->memo;
  for (uint32_t i = 0; leading && i < p->n_steps; i++) leading = p->steps[i].op == LDP_OP_ROUND;
  if (!leading) {
    ldp_errf(f, sizeof f, "%s.op", field);
    return bad(ps, f, "round steps come first, at the top level of a description without "
               "memoize");
  }
  json_t *in = json_object_get(d, "in"), *pts = json_object_get(d, "points");
  json_t *c0 = json_array_get(in, 0);
  json_int_t j = json_is_integer(c0) ? json_integer_value(c0) : -1;
  if (!json_is_array(in) || json_array_size(in) != 1 || j < 0 || j >= (json_int_t)p->n_attrs ||
      !p->numeric[j] || (ps->rounded >> j & 1u)) {
    ldp_errf(f, sizeof f, "%s.in", field);
    return bad(ps, f, "must be [j], j a numeric attribute not rounded yet");
  }
  size_t n = ldp_round_points(ps, pts, (uint32_t)j, LDP_MAX_ROUND_POINTS);
  if (!n) {
    ldp_errf(ps->err, ps->errlen, "%s.points: must be 2..%u grid indices strictly increasing "
             "from 0 to %u (each counts against the %d matrix entries in all)", field,
             LDP_MAX_ROUND_POINTS, p->grid[j] - 1, LDP_MAX_MATRIX);
    return -1;
  }
  s->op = LDP_OP_ROUND;
  s->n_in = 1;
  s->in[0] = (uint16_t)j;
  s->cells = n;
  s->cum = ps->cum_used;
  s->eps = 0.0; /* pre-processing: every point is a grid value */
  ps->cum_used += (uint32_t)n;
  ps->rounded |= 1u << j;
  p->size[j] = (uint32_t)n; /* every later step sees the point's index */
  p->n_steps++;
  return 0;
}

int ldp_parse_weights(parser *ps, json_t *wv, size_t n, const char *field, ldp_step *s) {
  if (!wv || json_is_null(wv)) return 0;
  if (!json_is_array(wv) || json_array_size(wv) != n || ps->cum_used + n > LDP_MAX_MATRIX) {
    ldp_errf(ps->err, ps->errlen, "%s: must be null or %zu numbers > 0 (one per branch)", field,
             n);
    return -1;
  }
  double acc = 0.0;
  s->cum = ps->cum_used;
  for (size_t i = 0; i < n; i++) {
    json_t *x = json_array_get(wv, i);
    if (!json_is_number(x) || !(json_number_value(x) > 0.0)) {
      ldp_errf(ps->err, ps->errlen, "%s: must be null or %zu numbers > 0 (one per branch)",
               field, n);
      return -1;
    }
    acc += json_number_value(x);
    ps->p->cum[ps->cum_used++] = acc;
  }
  if (!(fabs(acc - 1.0) <= 1e-9)) {
    ldp_errf(ps->err, ps->errlen, "%s: sums to %.17g, not 1", field, acc);
    return -1;
  }
  s->value = 1;
  return 0;
}
