/* The parse layer (parse_*.c): a description's JSON -> ldp_program (docs/device-protocol.md,
   "Randomization description", "Memoized descriptions"). Never calls the run layer. */
#ifndef LDP_PARSE_H
#define LDP_PARSE_H
#include <jansson.h>

#include "program_types.h"

/* the state of parsing one description */
typedef struct parser {
  ldp_program *p;
  uint32_t text_used, labels_used, cum_used, branches_used;
  uint32_t selects;      /* select steps so far: each keeps one more branch_start, its end */
  uint32_t rounded;      /* bit j: attribute j has a round step */
  int memo;              /* the description is memoized (no round step) */
  char *err;
  size_t errlen;
} parser;

/* the whole description (json: a jansson json_t *); state.c parses a state's "device" with it
   (parse_program.c) */
int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen);
/* a list of steps at depth (0: top level) into steps[*first .. *first + *count)
   (parse_program.c) */
int ldp_parse_steps(parser *ps, json_t *arr, const char *field, int depth, uint16_t *first,
                    uint16_t *count);
/* -1 with ps->err set on a bad list (parse_program.c) */
int ldp_int_list(parser *ps, json_t *json, const char *field, uint32_t below, uint16_t *out,
                 uint8_t *n);
/* the product of the sizes of the attributes in[0..n) into *cells; -1 with ps->err naming
   field when it exceeds 2^32 (checked after every factor: it never wraps) (parse_program.c) */
int ldp_cells(parser *ps, const uint16_t *in, uint8_t n, const char *field, uint64_t *cells);
/* the memoize object, its fingerprint (parse_memo.c) */
int ldp_parse_memo(parser *ps, json_t *memo);
/* a partition step and its tables (parse_partition.c) */
int ldp_parse_partition(parser *ps, json_t *json, const char *field, ldp_step *s);
/* cumulative sums of n_rows rows of one length into s (n_rows 0: square) (parse_rows.c) */
int ldp_parse_rows(parser *ps, json_t *rows, const char *field, uint64_t n_rows, ldp_step *s);
/* const, copy, keep and bloom steps (parse_rows.c) */
int ldp_parse_post(parser *ps, json_t *d, const char *field, ldp_step *s, const char *op);
/* a numeric attribute's {min, max, grid} as attribute j (parse_numeric.c) */
int ldp_parse_numeric_attr(parser *ps, json_t *d, size_t j);
/* a wave step (parse_numeric.c) */
int ldp_parse_wave(parser *ps, json_t *d, const char *field, ldp_step *s);
/* numeric attribute j's rounding points (2..max_n grid indices strictly increasing from 0 to
   its last) into the cumulative pool at cum_used, not yet claimed: their count, 0 when bad
   (the caller names the field) (parse_numeric.c) */
size_t ldp_round_points(parser *ps, json_t *pts, uint32_t j, size_t max_n);
/* a round step at depth (parse_numeric.c) */
int ldp_parse_round(parser *ps, json_t *d, const char *field, ldp_step *s, int depth);
/* a select's weights (null: uniform) into the cumulative pool, s->value = 1 (parse_numeric.c) */
int ldp_parse_weights(parser *ps, json_t *w, size_t n, const char *field, ldp_step *s);
#endif
