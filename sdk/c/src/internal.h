/* Shared inside the library (not installed). */
#ifndef LDP_INTERNAL_H
#define LDP_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "ldp.h"

#define LDP_PROGRAM_VERSION 1

void ldp_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* v as `bytes` little-endian bytes at p; returns p + bytes */
static inline uint8_t *ldp_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + bytes;
}
/* a select step's branches follow it: the next step of the same list */
static inline uint32_t ldp_after(const ldp_program *p, uint32_t i) {
  const ldp_step *s = &p->steps[i];
  return s->op == 3 ? p->branch_start[s->first + s->count] : i + 1;
}
/* json: a jansson json_t * */
int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen);
#endif
