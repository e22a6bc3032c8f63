/* The steps const, copy, keep and bloom of a description (and the dispatch of wave, run_numeric.c), run layer (docs/device-protocol.md,
   "Randomization description"; parse_rows.c parses them and the matrix rows they draw from). */
#include <string.h>

#include "run.h"

/* const; copy: column out[0] drawn from the row report[in[0]] (clamped to the rows); keep:
   the flat cell of in kept with p, else drawn from the fake distribution */
void ldp_run_post(const ldp_program *p, const ldp_step *s, const uint32_t *x, ldp_rng *rng,
                  uint32_t *report) {
  if (s->op == LDP_OP_CONST) {
    report[s->out[0]] = s->value;
    return;
  }
  if (s->op == LDP_OP_WAVE) {
    ldp_run_wave(p, s, x, rng, report);
    return;
  }
  if (s->op == LDP_OP_BLOOM) {
    const double *pool = p->cum + s->cum;
    uint32_t dv = (uint32_t)s->cells, start = s->out[0], x0 = x[s->in[0]];
    memset(report + start, 0, s->value * sizeof *report);
    for (size_t i = (size_t)pool[x0]; i < (size_t)pool[x0 + 1]; i++)
      report[start + (uint32_t)pool[dv + 1 + i]] = 1;
    for (uint32_t b = 0; b < s->value; b++) {
      double u = (double)(rng->next_u64(rng->ctx) >> 11);
      if (u < s->p * 0.5 * 9007199254740992.0) report[start + b] = 1;
      else if (u < s->p * 9007199254740992.0) report[start + b] = 0;
    }
    return;
  }
  if (s->op == LDP_OP_KEEP) {
    uint64_t cell = 0;
    for (uint8_t i = 0; i < s->n_in; i++) cell = cell * p->size[s->in[i]] + x[s->in[i]];
    report[s->out[0]] = (uint32_t)(ldp_bernoulli(rng, s->p)
                                       ? cell : ldp_categorical(rng, p->cum + s->cum,
                                                                (uint32_t)s->cells));
    return;
  }
  uint64_t row = report[s->in[0]] < s->cells ? report[s->in[0]] : s->cells - 1;
  report[s->out[0]] = ldp_categorical(rng, p->cum + s->cum + row * s->value, s->value);
}
