/* libFuzzer target for the parse layer (docs/device-protocol.md, "Conformance suite and
   audits"): any bytes as a description; when one parses, a record of index 0 on every
   attribute is encoded and randomized, and every report value is checked against the
   description's own bounds (a cell count that wrapped would write values outside the domain).
   Built with clang by `make test-sdk` (LDP_FUZZ=ON) and run for a few seconds from the seed
   corpus tests/fuzz_corpus. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "ldp.h"

static ldp_program prog;
static uint32_t report[LDP_MAX_WIDTH];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256];
  if (ldp_program_parse(&prog, (const char *)data, size, err, sizeof err) != LDP_OK) return 0;
  if (prog.n_attrs < 1 || prog.n_attrs > LDP_MAX_ATTRS || prog.width < 1 ||
      prog.width > LDP_MAX_WIDTH || prog.n_steps > LDP_MAX_STEPS ||
      prog.n_tables > LDP_MAX_TABLES || !(prog.epsilon >= 0.0))
    abort();
  uint32_t x[LDP_MAX_ATTRS] = {0};
  uint64_t seed = size;
  ldp_rng rng = {ldp_splitmix64_next, &seed};
  for (uint32_t i = 0; i < prog.n_steps; i++) {
    const ldp_step *s = &prog.steps[i];
    /* a step's cells are the product of its attributes' sizes, never 0 nor above 2^32 */
    if ((s->op == 1 || s->op == 2 || s->op == 5 || s->op == 8) &&
        (s->cells < 1 || s->cells > LDP_MAX_CELLS))
      abort();
    /* a wave's cells and offset stay within 2^32, on a numeric attribute of >= 2 points */
    if (s->op == 10 && (s->cells < 1 || s->value + s->cells > LDP_MAX_CELLS ||
                        !prog.numeric[s->in[0]] || prog.size[s->in[0]] < 2))
      abort();
    /* a round step: 2..64 points of a numeric attribute, which has that many cells after it */
    if (s->op == 11 && (s->cells < 2 || s->cells > 64 || !prog.numeric[s->in[0]] ||
                        prog.size[s->in[0]] != s->cells || prog.grid[s->in[0]] < s->cells))
      abort();
  }
  for (uint32_t t = 0; t < prog.n_tables; t++)
    if (prog.tables[t].cells < 1 || prog.tables[t].cells > LDP_MAX_CELLS) abort();
  if (!prog.memoized) ldp_program_randomize(&prog, x, 7, &rng, report);
  return 0;
}
