/* Numeric attributes, run layer (docs/device-protocol.md, "Numeric attributes"): a value's
   text, its grid index (clipped into the range, counted), and the wave step; parse_numeric.c
   parses them. No allocation. */
#include <math.h>
#include <stdlib.h>

#include "run.h"

/* the number's text: [+-] (digits [. digits*] | . digits) [(e|E) [+-] digits], nothing else */
int ldp_number_text(const char *s) {
  const char *c = s;
  int digits = 0;
  if (*c == '+' || *c == '-') c++;
  while (*c >= '0' && *c <= '9') c++, digits++;
  if (*c == '.') {
    c++;
    while (*c >= '0' && *c <= '9') c++, digits++;
  }
  if (!digits) return 0;
  if (*c == 'e' || *c == 'E') {
    int exp = 0;
    c++;
    if (*c == '+' || *c == '-') c++;
    while (*c >= '0' && *c <= '9') c++, exp++;
    if (!exp) return 0;
  }
  return *c == 0;
}

/* the nearest integer, ties to the even one */
static double round_half_even(double v) {
  double f = floor(v), d = v - f;
  return d > 0.5 || (d == 0.5 && fmod(f, 2.0) != 0.0) ? f + 1.0 : f;
}

int ldp_numeric_index(const ldp_program *prog, uint32_t j, double v, uint32_t *index) {
  double lo = prog->range[j][0], hi = prog->range[j][1];
  int clipped = v < lo || v > hi;
  double c = v < lo ? lo : v > hi ? hi : v;
  *index = (uint32_t)round_half_even((c - lo) / (hi - lo) * (double)(prog->grid[j] - 1));
  return clipped;
}

static double unit(ldp_rng *rng) { return (double)(rng->next_u64(rng->ctx) >> 11) * 0x1p-53; }

uint64_t ldp_wave_cell(const ldp_program *p, uint32_t step, uint32_t i, ldp_rng *rng) {
  const ldp_step *s = &p->steps[step];
  const double *w = p->cum + s->cum;
  double lo = w[0], hi = w[1], width = w[4];
  double z = (double)i / (double)(p->grid[s->in[0]] - 1);
  double left_edge = w[2] * z + w[3], y;
  int inner = ldp_bernoulli(rng, s->p);
  double u = unit(rng);
  if (inner) {
    y = left_edge + u * width;
  } else {
    double left = left_edge - lo, right = hi - (left_edge + width);
    if (left < 0.0) left = 0.0;
    if (right < 0.0) right = 0.0;
    double t = u * (left + right);
    y = t < left ? lo + t : (left_edge + width) + (t - left);
  }
  double k;
  if (s->count) { /* rounded without bias to cells points */
    double pos = (y - lo) / (hi - lo) * (double)(s->cells - 1);
    k = floor(pos);
    if (k < 0.0) k = 0.0;
    if (k > (double)(s->cells - 2)) k = (double)(s->cells - 2);
    return (uint64_t)k + (uint64_t)ldp_bernoulli(rng, pos - k);
  }
  k = floor((y - lo) / (hi - lo) * (double)s->cells);
  if (k < 0.0) k = 0.0;
  if (k > (double)(s->cells - 1)) k = (double)(s->cells - 1);
  return (uint64_t)k;
}

uint32_t ldp_round_index(const double *pts, uint32_t n, uint32_t x, double u) {
  uint32_t lo = 0, hi = n - 1; /* binary search: pts[lo] <= x, lo <= n - 2 */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (pts[mid] <= (double)x) lo = mid;
    else hi = mid;
  }
  double frac = ((double)x - pts[lo]) / (pts[lo + 1] - pts[lo]);
  return frac > u ? lo + 1 : lo;
}

void ldp_run_round(const ldp_program *p, const ldp_step *s, uint32_t *x, ldp_rng *rng) {
  double u = unit(rng); /* one word always, even on a point */
  x[s->in[0]] = ldp_round_index(p->cum + s->cum, (uint32_t)s->cells, x[s->in[0]], u);
}

void ldp_run_wave(const ldp_program *p, const ldp_step *s, const uint32_t *x, ldp_rng *rng,
                  uint32_t *report) {
  uint32_t step = (uint32_t)(s - p->steps);
  report[s->out[0]] = (uint32_t)(s->value + ldp_wave_cell(p, step, x[s->in[0]], rng));
}
