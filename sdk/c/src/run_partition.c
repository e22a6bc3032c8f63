/* The partition step of a description, run layer: each slot's table and its oracle code
   (docs/device-protocol.md, "Randomization description"; parse_partition.c parses it). */
#include "run.h"

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

/* slot i: table (first + i) mod K, first = mix64(device id ^ seed) mod K, its oracle code */
void ldp_run_partition(const ldp_program *p, const ldp_step *s, const uint32_t *x,
                       uint64_t device_id, ldp_rng *rng, uint32_t *report) {
  uint64_t first = ldp_mix64(device_id ^ s->seed) % s->count;
  for (uint8_t i = 0; i < s->n_out; i++) {
    const ldp_table *t = &p->tables[s->first + (first + i) % s->count];
    uint64_t code = ldp_table_code(t, ldp_ravel(p, t->in, t->n_in, x), rng);
    report[s->out[i]] = (uint32_t)(t->offset + code);
  }
}
