/* Shared inside the library (not installed). */
#ifndef LDP_INTERNAL_H
#define LDP_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ldp.h"

#define LDP_PROGRAM_VERSION 1

void ldp_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* v as `bytes` little-endian bytes at p; returns p + bytes */
static inline uint8_t *ldp_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + bytes;
}
/* the SplitMix64 finalizer (the partition assignment's hash) */
static inline uint64_t ldp_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
/* the cell of the attributes in[0..n) of x (mixed radix, first most significant) */
static inline uint64_t ldp_ravel(const ldp_program *p, const uint16_t *in, uint8_t n,
                                 const uint32_t *x) {
  uint64_t cell = 0;
  for (uint8_t i = 0; i < n; i++) cell = cell * p->size[in[i]] + x[in[i]];
  return cell;
}
/* a select step's branches follow it: the next step of the same list */
static inline uint32_t ldp_after(const ldp_program *p, uint32_t i) {
  const ldp_step *s = &p->steps[i];
  return s->op == 3 ? p->branch_start[s->first + s->count] : i + 1;
}
/* the state of parsing one description (program.c, partition.c) */
typedef struct parser {
  ldp_program *p;
  uint32_t text_used, labels_used, cum_used, branches_used;
  char *err;
  size_t errlen;
} parser;
/* -1 with ps->err set on a bad list */
int ldp_int_list(parser *ps, json_t *json, const char *field, uint32_t below, uint16_t *out,
                 uint8_t *n);
double ldp_grr_epsilon(double p, uint64_t k);
int ldp_parse_partition(parser *ps, json_t *json, const char *field, ldp_step *s);
/* a list of steps at depth (0: top level) into steps[*first .. *first + *count) */
int ldp_parse_steps(parser *ps, json_t *arr, const char *field, int depth, uint16_t *first,
                    uint16_t *count);
/* the memoize object (memo.c) */
int ldp_parse_memo(parser *ps, json_t *memo);
/* the memo units a record needs (memo.c): unit[i] (attribute, cluster or table) and the cell
   of its attributes; returns how many */
uint32_t ldp_memo_keys(const ldp_program *p, const uint32_t *x, uint64_t device_id,
                       int64_t period, uint32_t *unit, uint32_t *cell);
double ldp_memo_unit_eps(const ldp_program *p, uint32_t unit);
uint32_t ldp_memo_draw(const ldp_program *p, uint32_t unit, uint32_t cell, ldp_rng *rng);
/* the report from the units' memoized responses */
void ldp_memo_emit(const ldp_program *p, const uint32_t *unit, const uint32_t *resp, uint32_t n,
                   ldp_rng *rng, uint32_t *report);
/* cumulative sums of n_rows rows of one length into s (n_rows 0: square) */
int ldp_parse_rows(parser *ps, json_t *rows, const char *field, uint64_t n_rows, ldp_step *s);
/* const and copy steps */
int ldp_parse_post(parser *ps, json_t *d, const char *field, ldp_step *s, const char *op);
/* json: a jansson json_t * */
int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen);
#endif
