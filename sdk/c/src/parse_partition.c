/* The partition step of a description, parse layer: its tables (docs/device-protocol.md,
   "Randomization description"); run_partition.c runs it. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

static int parse_table(parser *ps, json_t *d, const char *field, ldp_table *t) {
  char f[200];
  const char *oracle = json_string_value(json_object_get(d, "oracle"));
  json_t *off = json_object_get(d, "offset"), *pv = json_object_get(d, "p");
  json_t *g = json_object_get(d, "g"), *r = json_object_get(d, "r");
  if (!oracle || (strcmp(oracle, "grr") && strcmp(oracle, "olh"))) {
    ldp_errf(ps->err, ps->errlen, "%s.oracle: must be grr or olh", field);
    return -1;
  }
  ldp_errf(f, sizeof f, "%s.in", field);
  if (ldp_int_list(ps, json_object_get(d, "in"), f, ps->p->n_attrs, t->in, &t->n_in)) return -1;
  if (ldp_cells(ps, t->in, t->n_in, f, &t->cells)) return -1;
  if (!json_is_integer(off) || json_integer_value(off) < 0 ||
      json_integer_value(off) >= ((json_int_t)1 << 32)) {
    ldp_errf(ps->err, ps->errlen, "%s.offset: must be an integer in [0, 4294967296)", field);
    return -1;
  }
  t->offset = (uint32_t)json_integer_value(off);
  t->p = json_number_value(pv);
  if (!json_is_number(pv) || !(t->p >= 0.0 && t->p <= 1.0)) {
    ldp_errf(ps->err, ps->errlen, "%s.p: must be a number in [0, 1]", field);
    return -1;
  }
  uint64_t codes = t->cells;
  t->g = t->r = 0;
  if (strcmp(oracle, "olh") == 0) {
    json_int_t gv = json_is_integer(g) ? json_integer_value(g) : 0;
    json_int_t rv = json_is_integer(r) ? json_integer_value(r) : 0;
    uint64_t seeds = 1;
    for (json_int_t k = 0; gv >= 2 && rv >= 1 && k < rv && seeds <= ((uint64_t)1 << 32); k++)
      seeds *= (uint64_t)gv;
    if (gv < 2 || rv < 1 || seeds > ((uint64_t)1 << 32) || seeds < t->cells) {
      ldp_errf(ps->err, ps->errlen, "%s.g: g >= 2 and r >= 1 with cells <= g^r <= 2^32", field);
      return -1;
    }
    t->g = (uint32_t)gv;
    t->r = (uint32_t)rv;
    codes = seeds * t->g;
  }
  if (t->offset + codes > ((uint64_t)1 << 32)) {
    ldp_errf(ps->err, ps->errlen, "%s.offset: codes beyond 2^32", field);
    return -1;
  }
  return 0;
}

int ldp_parse_partition(parser *ps, json_t *d, const char *field, ldp_step *s) {
  ldp_program *p = ps->p;
  char f[200];
  const char *seed = json_string_value(json_object_get(d, "seed"));
  json_t *tabs = json_object_get(d, "tables");
  char *end = NULL;
  unsigned long long sv = seed && *seed >= '0' && *seed <= '9' ? strtoull(seed, &end, 10) : 0;
  if (!seed || !end || *end || strlen(seed) > 20 || (sv == ULLONG_MAX && strcmp(seed,
      "18446744073709551615") != 0)) {
    ldp_errf(ps->err, ps->errlen, "%s.seed: must be a u64 as a decimal string", field);
    return -1;
  }
  ldp_errf(f, sizeof f, "%s.out", field);
  if (ldp_int_list(ps, json_object_get(d, "out"), f, p->width, s->out, &s->n_out)) return -1;
  size_t n = json_is_array(tabs) ? json_array_size(tabs) : 0;
  if (n < 1 || p->n_tables + n > LDP_MAX_TABLES) {
    ldp_errf(ps->err, ps->errlen, "%s.tables: must be a list of 1..%d tables (in all)", field,
             LDP_MAX_TABLES);
    return -1;
  }
  if (s->n_out > n) {
    ldp_errf(ps->err, ps->errlen, "%s.out: more slots than tables", field);
    return -1;
  }
  s->op = LDP_OP_PARTITION;
  s->seed = ldp_mix64((uint64_t)sv);
  s->first = (uint16_t)p->n_tables;
  s->count = (uint16_t)n;
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    ldp_table *t = &p->tables[p->n_tables];
    ldp_errf(f, sizeof f, "%s.tables[%zu]", field, i);
    if (!json_is_object(json_array_get(tabs, i))) {
      ldp_errf(ps->err, ps->errlen, "%s.oracle: must be grr or olh", f);
      return -1;
    }
    if (parse_table(ps, json_array_get(tabs, i), f, t)) return -1;
    double e = ldp_grr_epsilon(t->p, t->g ? t->g : t->cells);
    if (e > worst) worst = e;
    p->n_tables++;
  }
  s->eps = s->n_out * worst;
  p->n_steps++;
  return 0;
}

