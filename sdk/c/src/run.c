/* The randomization description at report time: labels -> indices, randomize
   (docs/device-protocol.md, "Randomization description" and "Draws"). No allocation. */
#include <string.h>

#include "internal.h"

static const char *attr_name(const ldp_program *p, uint32_t j) { return p->text + p->name_at[j]; }

int ldp_program_encode(const ldp_program *prog, const char *const *names,
                       const char *const *labels, size_t n, uint32_t *x, char *err,
                       size_t errlen) {
  uint32_t seen = 0; /* bit j: attribute j given */
  for (size_t i = 0; i < n; i++) {
    uint32_t j = 0;
    while (j < prog->n_attrs && strcmp(names[i], attr_name(prog, j)) != 0) j++;
    if (j == prog->n_attrs) {
      ldp_errf(err, errlen, "unknown attribute '%s'", names[i]);
      return LDP_E_SCHEMA;
    }
    uint32_t k = 0, d = prog->size[j];
    while (k < d && strcmp(labels[i], prog->text + prog->label_at[prog->label0[j] + k]) != 0) k++;
    if (k == d) {
      ldp_errf(err, errlen, "attribute '%s': unknown category '%s'", names[i], labels[i]);
      return LDP_E_SCHEMA;
    }
    x[j] = k;
    seen |= 1u << j;
  }
  for (uint32_t j = 0; j < prog->n_attrs; j++)
    if (!(seen & (1u << j))) {
      ldp_errf(err, errlen, "missing attribute '%s'", attr_name(prog, j));
      return LDP_E_SCHEMA;
    }
  return LDP_OK;
}

uint64_t ldp_grr_cell(uint64_t cell, uint64_t k, double p, ldp_rng *rng) {
  if (ldp_bernoulli(rng, p)) return cell;
  uint64_t other = ldp_uniform(rng, k - 1);
  return other + (other >= cell);
}

/* GRR on the cell, or OLH: a = uniform(g^r), h = sum of digit_i(a) * digit_i(cell) mod g,
   code a*g + GRR_g(h) */
uint64_t ldp_table_code(const ldp_table *t, uint64_t cell, ldp_rng *rng) {
  if (t->g == 0) return ldp_grr_cell(cell, t->cells, t->p, rng);
  uint64_t seeds = 1, h = 0;
  for (uint32_t k = 0; k < t->r; k++) seeds *= t->g;
  uint64_t a = ldp_uniform(rng, seeds), aa = a, cc = cell;
  for (uint32_t k = 0; k < t->r; k++) {
    h += (aa % t->g) * (cc % t->g);
    aa /= t->g;
    cc /= t->g;
  }
  return a * t->g + ldp_grr_cell(h % t->g, t->g, t->p, rng);
}

uint64_t ldp_step_apply(const ldp_program *p, uint32_t step, uint64_t cell, ldp_rng *rng) {
  const ldp_step *s = &p->steps[step];
  if (s->op == 1) return ldp_grr_cell(cell, s->cells, s->p, rng);
  if (s->op == 5) return ldp_uniform(rng, s->cells);
  return ldp_categorical(rng, p->cum + s->cum + cell * s->cells, (uint32_t)s->cells);
}

static void run(const ldp_program *p, uint32_t step, const uint32_t *x, ldp_rng *rng,
                uint32_t *report) {
  const ldp_step *s = &p->steps[step];
  uint64_t cell = ldp_step_apply(p, step, ldp_ravel(p, s->in, s->n_in, x), rng);
  for (int i = s->n_in - 1; i >= 0; i--) {
    uint32_t d = p->size[s->in[i]];
    report[s->out[i]] = (uint32_t)(cell % d);
    cell /= d;
  }
}

/* slot i: table (first + i) mod K, first = mix64(device id ^ seed) mod K, its oracle code */
static void partition(const ldp_program *p, const ldp_step *s, const uint32_t *x,
                      uint64_t device_id, ldp_rng *rng, uint32_t *report) {
  uint64_t first = ldp_mix64(device_id ^ s->seed) % s->count;
  for (uint8_t i = 0; i < s->n_out; i++) {
    const ldp_table *t = &p->tables[s->first + (first + i) % s->count];
    uint64_t code = ldp_table_code(t, ldp_ravel(p, t->in, t->n_in, x), rng);
    report[s->out[i]] = (uint32_t)(t->offset + code);
  }
}

/* const; copy: column out[0] drawn from the row report[in[0]] (clamped to the rows); keep:
   the flat cell of in kept with p, else drawn from the fake distribution */
static void post(const ldp_program *p, const ldp_step *s, const uint32_t *x, ldp_rng *rng,
                 uint32_t *report) {
  if (s->op == 6) {
    report[s->out[0]] = s->value;
    return;
  }
  if (s->op == 9) {
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
  if (s->op == 8) {
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

void ldp_program_randomize(const ldp_program *prog, const uint32_t *x, uint64_t device_id,
                           ldp_rng *rng, uint32_t *report) {
  memset(report, 0, prog->width * sizeof *report);
  for (uint32_t i = 0; i < prog->n_top; i = ldp_after(prog, i)) {
    const ldp_step *s = &prog->steps[i];
    if (s->op == 4) {
      partition(prog, s, x, device_id, rng, report);
      continue;
    }
    if (s->op >= 6) {
      post(prog, s, x, rng, report);
      continue;
    }
    if (s->op != 3) {
      run(prog, i, x, rng, report);
      continue;
    }
    uint32_t b = (uint32_t)ldp_uniform(rng, s->count);
    if (s->n_out) report[s->out[0]] = b;
    for (uint32_t t = prog->branch_start[s->first + b]; t < prog->branch_start[s->first + b + 1];
         t++)
      if (prog->steps[t].op >= 6) post(prog, &prog->steps[t], x, rng, report);
      else run(prog, t, x, rng, report);
  }
}
