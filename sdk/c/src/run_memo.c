/* The memoized part of a description (docs/device-protocol.md, "Memoized descriptions"), run
   layer: the memo units a record needs, their draws and the report made from them, alpha-point
   rounding (parse_memo.c parses it). No allocation. */
#include <string.h>

#include "run.h"

/* select: the step of branch b */
static const ldp_step *branch(const ldp_program *p, uint32_t b) {
  return &p->steps[p->branch_start[p->steps[p->n_top].first + b]];
}

uint32_t ldp_memo_keys(const ldp_program *p, const uint32_t *x, uint64_t device_id,
                       int64_t period, uint32_t *unit, uint32_t *cell) {
  if (p->memo_kind == LDP_MEMO_SELECT) {
    unit[0] = (uint32_t)(ldp_mix64(ldp_mix64(device_id ^ p->memo_seed) ^ (uint64_t)period) %
                         p->steps[p->n_top].count);
    cell[0] = (uint32_t)ldp_ravel(p, branch(p, unit[0])->in, branch(p, unit[0])->n_in, x);
    return 1;
  }
  if (p->memo_kind != LDP_MEMO_PARTITION) {
    for (uint32_t u = 0; u < p->n_units; u++) {
      const ldp_step *s = &p->steps[p->unit_at[u]];
      unit[u] = u;
      cell[u] = (uint32_t)ldp_ravel(p, s->in, s->n_in, x);
    }
    return p->n_units;
  }
  const ldp_step *s = &p->steps[p->unit_at[0]];
  uint32_t y[LDP_MAX_ATTRS]; /* a rounded value (a point) its point's index: no draw */
  memcpy(y, x, sizeof(uint32_t) * p->n_attrs);
  for (uint32_t i = p->n_top; i < p->unit_at[0]; i++) {
    const ldp_step *r = &p->steps[i];
    y[r->in[0]] = ldp_round_index(p->cum + r->cum, (uint32_t)r->cells, y[r->in[0]], 0.0);
  }
  uint64_t first = ldp_mix64(ldp_mix64(device_id ^ s->seed) ^ (uint64_t)period) % s->count;
  for (uint8_t i = 0; i < s->n_out; i++) {
    unit[i] = (uint32_t)((first + i) % s->count);
    const ldp_table *t = &p->tables[s->first + unit[i]];
    cell[i] = (uint32_t)ldp_ravel(p, t->in, t->n_in, y);
  }
  return s->n_out;
}

double ldp_memo_unit_eps(const ldp_program *p, uint32_t unit) {
  if (p->memo_kind == LDP_MEMO_SELECT) return branch(p, unit)->eps;
  if (p->memo_kind != LDP_MEMO_PARTITION) return p->steps[p->unit_at[unit]].eps;
  const ldp_table *t = &p->tables[p->steps[p->unit_at[0]].first + unit];
  return ldp_grr_epsilon(t->p, t->g ? t->g : t->cells);
}

uint32_t ldp_memo_draw(const ldp_program *p, uint32_t unit, uint32_t cell, ldp_rng *rng) {
  if (p->memo_kind == LDP_MEMO_SELECT)
    return (uint32_t)ldp_step_apply(p, p->branch_start[p->steps[p->n_top].first + unit], cell,
                                    rng);
  if (p->memo_kind != LDP_MEMO_PARTITION) {
    uint32_t at = p->unit_at[unit];
    const ldp_step *s = &p->steps[at];
    if (s->op == LDP_OP_SELECT) { /* a numeric unit: the task, then its wave */
      uint32_t b = s->value ? ldp_categorical(rng, p->cum + s->cum, s->count)
                            : (uint32_t)ldp_uniform(rng, s->count);
      at = p->branch_start[s->first + b];
    }
    if (p->steps[at].op == LDP_OP_WAVE) /* the column's value: offset + the wave's cell */
      return (uint32_t)(p->steps[at].value + ldp_wave_cell(p, at, cell, rng));
    return (uint32_t)ldp_step_apply(p, at, cell, rng);
  }
  return (uint32_t)ldp_table_code(&p->tables[p->steps[p->unit_at[0]].first + unit], cell, rng);
}

void ldp_memo_emit(const ldp_program *p, const uint32_t *unit, const uint32_t *resp, uint32_t n,
                   ldp_rng *rng, uint32_t *report) {
  if (p->memo_kind == LDP_MEMO_PARTITION) {
    const ldp_step *s = &p->steps[p->unit_at[0]];
    memset(report, 0, sizeof(uint32_t) * p->width);
    for (uint32_t i = 0; i < n; i++) {
      const ldp_table *t = &p->tables[s->first + unit[i]];
      uint64_t code = resp[i];
      if (p->has_inst && t->g == 0) code = ldp_grr_cell(code, t->cells, p->inst_p[unit[i]], rng);
      else if (p->has_inst)
        code = code / t->g * t->g + ldp_grr_cell(code % t->g, t->g, p->inst_p[unit[i]], rng);
      report[s->out[i]] = (uint32_t)(t->offset + code);
    }
    return;
  }
  if (p->memo_kind == LDP_MEMO_SELECT) {  /* the index, then the branch's output cell */
    const ldp_step *b = branch(p, unit[0]);
    uint64_t c = p->has_inst ? ldp_grr_cell(resp[0], b->cells, p->inst_p[unit[0]], rng) : resp[0];
    memset(report, 0, sizeof(uint32_t) * p->width);
    report[p->steps[p->n_top].out[0]] = unit[0];
    for (int i = b->n_in - 1; i >= 0; i--) {
      report[b->out[i]] = (uint32_t)(c % p->size[b->in[i]]);
      c /= p->size[b->in[i]];
    }
    return;
  }
  uint32_t y[LDP_MAX_ATTRS];
  for (uint32_t u = 0; u < n; u++) {
    const ldp_step *s = &p->steps[p->unit_at[unit[u]]];
    uint64_t c = resp[u];
    if (s->op == LDP_OP_WAVE || s->op == LDP_OP_SELECT) { /* a numeric unit: its column */
      y[s->in[0]] = resp[u];
      continue;
    }
    for (int i = s->n_in - 1; i >= 0; i--) {
      y[s->out[i]] = (uint32_t)(c % p->size[s->in[i]]);
      c /= p->size[s->in[i]];
    }
  }
  if (p->n_top) ldp_program_randomize(p, y, 0, rng, report);
  else memcpy(report, y, sizeof(uint32_t) * p->n_attrs);
}

double ldp_alpha(const ldp_program *p, uint32_t j, uint64_t device_id) {
  if (!p->round_n[j]) return 0.0;
  return (double)(ldp_mix64(device_id ^ p->round_seed[j]) >> 11) * 0x1p-53;
}

void ldp_memo_round(const ldp_program *p, const uint32_t *x, uint64_t device_id,
                    uint32_t *rounded) {
  for (uint32_t j = 0; j < p->n_attrs; j++) {
    rounded[j] = x[j];
    if (!p->round_n[j]) continue;
    const double *pts = p->cum + p->round_at[j];
    rounded[j] = (uint32_t)pts[ldp_round_index(pts, p->round_n[j], x[j], ldp_alpha(p, j,
                                                                                   device_id))];
  }
}
