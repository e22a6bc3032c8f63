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
/* cumulative sums of n_rows rows of one length into s (n_rows 0: square) */
int ldp_parse_rows(parser *ps, json_t *rows, const char *field, uint64_t n_rows, ldp_step *s);
/* const and copy steps */
int ldp_parse_post(parser *ps, json_t *d, const char *field, ldp_step *s, const char *op);
/* json: a jansson json_t * */
int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen);
#endif
