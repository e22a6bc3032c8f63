/* The types the parse layer (parse_*.c: JSON -> ldp_program) and the run layer (run_*.c:
   ldp_program -> randomized report) share, and the only header both include (not installed).
   The program structs and the limits are public (include/ldp.h: callers hold them); this adds
   the step ops and memo kinds by name, the description version, the small pure helpers both
   layers use and ldp_errf (src/errf.c). The two layers never call each other (tests/check_layers.sh). */
#ifndef LDP_PROGRAM_TYPES_H
#define LDP_PROGRAM_TYPES_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ldp.h"

#define LDP_PROGRAM_VERSION 1

/* ldp_step.op */
enum ldp_op {
  LDP_OP_GRR = 1,
  LDP_OP_MATRIX = 2,
  LDP_OP_SELECT = 3,
  LDP_OP_PARTITION = 4,
  LDP_OP_UNIFORM = 5,
  LDP_OP_CONST = 6, /* const and the ops after it write report columns directly */
  LDP_OP_COPY = 7,
  LDP_OP_KEEP = 8,
  LDP_OP_BLOOM = 9,
  LDP_OP_WAVE = 10,
  LDP_OP_ROUND = 11 /* a record's value rounded in place: run before any op that reads it */
};

/* points of a numeric attribute's grid, at most */
#define LDP_MAX_GRID 65536u
/* points of a round step, at most */
#define LDP_MAX_ROUND_POINTS 64u

/* ldp_program.memo_kind */
enum ldp_memo_kind {
  LDP_MEMO_ATTRIBUTE = 0,
  LDP_MEMO_CLUSTER = 1,
  LDP_MEMO_PARTITION = 2,
  LDP_MEMO_SELECT = 3
};

/* snprintf into err (nothing when err is NULL or errlen 0); errf.c, the one function under
   both layers */
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
/* epsilon of GRR over k cells keeping the cell with p */
static inline double ldp_grr_epsilon(double p, uint64_t k) {
  double q = (1.0 - p) / (double)(k - 1);
  double lo = p < q ? p : q, hi = p < q ? q : p;
  return lo <= 0.0 ? INFINITY : log(hi / lo);
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
  return s->op == LDP_OP_SELECT ? p->branch_start[s->first + s->count] : i + 1;
}
#endif
