/* Shared inside the library (not installed). */
#ifndef LDP_INTERNAL_H
#define LDP_INTERNAL_H
#include <stddef.h>

#include "ldp.h"

#define LDP_PROGRAM_VERSION 1

void ldp_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* json: a jansson json_t * */
int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen);
#endif
