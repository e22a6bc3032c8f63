/* The examples' record format: one line "attr=label,attr=label" (docs/device-protocol.md). */
#ifndef LDP_EXAMPLES_RECORDS_H
#define LDP_EXAMPLES_RECORDS_H
#include <stdio.h>
#include <string.h>

#include "ldp.h"

/* splits LINE in place into names and labels; 0, or -1 after printing the bad field */
static inline int ldp_parse_record(char *line, const char **names, const char **labels,
                                   size_t *n) {
  *n = 0;
  line[strcspn(line, "\r\n")] = 0;
  for (char *tok = strtok(line, ","); tok && *n < LDP_MAX_ATTRS; tok = strtok(NULL, ",")) {
    char *eq = strchr(tok, '=');
    if (!eq) return fprintf(stderr, "bad record field '%s'\n", tok), -1;
    *eq = 0;
    names[*n] = tok;
    labels[(*n)++] = eq + 1;
  }
  return 0;
}
#endif
