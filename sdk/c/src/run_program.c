/* The randomization description at report time, run layer: labels -> indices, randomize
   (docs/device-protocol.md, "Randomization description" and "Draws"); the partition step is in
   run_partition.c, const, copy, keep and bloom in run_rows.c. No allocation. */
#include <stdlib.h>
#include <string.h>

#include "run.h"

static const char *attr_name(const ldp_program *p, uint32_t j) { return p->text + p->name_at[j]; }

int ldp_program_encode(const ldp_program *prog, const char *const *names,
                       const char *const *labels, size_t n, uint32_t *x, char *err,
                       size_t errlen) {
  return ldp_program_encode_clip(prog, names, labels, n, x, NULL, err, errlen);
}

int ldp_program_encode_clip(const ldp_program *prog, const char *const *names,
                            const char *const *labels, size_t n, uint32_t *x, uint8_t *clipped,
                            char *err, size_t errlen) {
  uint32_t seen = 0; /* bit j: attribute j given */
  if (clipped) memset(clipped, 0, prog->n_attrs);
  for (size_t i = 0; i < n; i++) {
    uint32_t j = 0;
    while (j < prog->n_attrs && strcmp(names[i], attr_name(prog, j)) != 0) j++;
    if (j == prog->n_attrs) {
      ldp_errf(err, errlen, "unknown attribute '%s'", names[i]);
      return LDP_E_SCHEMA;
    }
    if (prog->numeric[j]) {
      char *end = NULL;
      double v = ldp_number_text(labels[i]) ? strtod(labels[i], &end) : 0.0;
      if (!end || *end) { /* not a number's text (or a locale whose decimal point is not '.') */
        ldp_errf(err, errlen, "attribute '%s': '%s' is not a number", names[i], labels[i]);
        return LDP_E_SCHEMA;
      }
      int c = ldp_numeric_index(prog, j, v, &x[j]);
      if (clipped) clipped[j] = (uint8_t)c;
      seen |= 1u << j;
      continue;
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

uint64_t ldp_step_apply(const ldp_program *p, uint32_t step, uint64_t cell, ldp_rng *rng) {
  const ldp_step *s = &p->steps[step];
  if (s->op == LDP_OP_GRR) return ldp_grr_cell(cell, s->cells, s->p, rng);
  if (s->op == LDP_OP_UNIFORM) return ldp_uniform(rng, s->cells);
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

void ldp_program_randomize(const ldp_program *prog, const uint32_t *x, uint64_t device_id,
                           ldp_rng *rng, uint32_t *report) {
  uint32_t rounded[LDP_MAX_ATTRS]; /* the record after its round steps (they come first) */
  memset(report, 0, prog->width * sizeof *report);
  for (uint32_t i = 0; i < prog->n_top; i = ldp_after(prog, i)) {
    const ldp_step *s = &prog->steps[i];
    if (s->op == LDP_OP_ROUND) {
      if (x != rounded) x = memcpy(rounded, x, prog->n_attrs * sizeof *rounded);
      ldp_run_round(prog, s, rounded, rng);
      continue;
    }
    if (s->op == LDP_OP_PARTITION) {
      ldp_run_partition(prog, s, x, device_id, rng, report);
      continue;
    }
    if (s->op >= LDP_OP_CONST) {
      ldp_run_post(prog, s, x, rng, report);
      continue;
    }
    if (s->op != LDP_OP_SELECT) {
      run(prog, i, x, rng, report);
      continue;
    }
    uint32_t b = s->value ? ldp_categorical(rng, prog->cum + s->cum, s->count)
                          : (uint32_t)ldp_uniform(rng, s->count);
    if (s->n_out) report[s->out[0]] = b;
    for (uint32_t t = prog->branch_start[s->first + b]; t < prog->branch_start[s->first + b + 1];
         t++)
      if (prog->steps[t].op >= LDP_OP_CONST) ldp_run_post(prog, &prog->steps[t], x, rng, report);
      else run(prog, t, x, rng, report);
  }
}
