/* The run layer (run_*.c): ldp_program -> randomized report (docs/device-protocol.md,
   "Randomization description", "Draws", "Memoized descriptions"). No allocation, no JSON;
   never calls the parse layer. The public part (ldp_program_randomize, ldp_step_apply, ...) is
   declared in ldp.h. */
#ifndef LDP_RUN_H
#define LDP_RUN_H
#include "program_types.h"

/* a partition step: slot i gets table (first + i) mod K, first = mix64(device id ^ seed) mod K,
   its oracle code plus the table's offset (run_partition.c) */
void ldp_run_partition(const ldp_program *p, const ldp_step *s, const uint32_t *x,
                       uint64_t device_id, ldp_rng *rng, uint32_t *report);
/* 1 when s is a number's text (docs/device-protocol.md, "Numeric attributes"; run_numeric.c) */
int ldp_number_text(const char *s);
/* the index of the point (of pts[0..n), increasing grid indices) grid index x rounds to with
   u: k = the last point <= x, at most n - 2, then k + 1 when (x - pts[k]) / (pts[k + 1] -
   pts[k]) > u, else k (run_numeric.c) */
uint32_t ldp_round_index(const double *pts, uint32_t n, uint32_t x, double u);
/* a round step: x[in[0]] = the index of its point, u from one word (run_numeric.c) */
void ldp_run_round(const ldp_program *p, const ldp_step *s, uint32_t *x, ldp_rng *rng);
/* a wave step: report[out[0]] = offset + its cell (run_numeric.c) */
void ldp_run_wave(const ldp_program *p, const ldp_step *s, const uint32_t *x, ldp_rng *rng,
                  uint32_t *report);
/* a const, copy, keep, bloom or wave step (run_rows.c) */
void ldp_run_post(const ldp_program *p, const ldp_step *s, const uint32_t *x, ldp_rng *rng,
                  uint32_t *report);
/* the memo units a record needs (run_memo.c): unit[i] (attribute, cluster, table or branch) and
   the cell of its attributes; returns how many */
uint32_t ldp_memo_keys(const ldp_program *p, const uint32_t *x, uint64_t device_id,
                       int64_t period, uint32_t *unit, uint32_t *cell);
double ldp_memo_unit_eps(const ldp_program *p, uint32_t unit);
uint32_t ldp_memo_draw(const ldp_program *p, uint32_t unit, uint32_t cell, ldp_rng *rng);
/* the report from the units' memoized responses */
void ldp_memo_emit(const ldp_program *p, const uint32_t *unit, const uint32_t *resp, uint32_t n,
                   ldp_rng *rng, uint32_t *report);
#endif
