/* Error messages: under both layers (program_types.h), calls neither. */
#include <stdarg.h>
#include <stdio.h>

#include "program_types.h"

void ldp_errf(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}
