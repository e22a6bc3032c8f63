/* The memoized part of a description (docs/device-protocol.md, "Memoized descriptions"), parse
   layer: parse it and compute its fingerprint (run_memo.c runs it). Kinds: attribute (one
   permanent step per attribute), cluster (one per cluster of attributes), partition (one
   partition step, the first table fixed per (device, period), the oracle code memoized, an
   optional instantaneous GRR per table) and select (one select step, the branch fixed per
   (device, period)). Kind attribute may round numeric attributes (round: points and the alpha
   seed) and memoize a numeric one's wave, or the weighted select over its waves; kind
   partition may round them too, its partition step then led by their round steps. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

static void hash_f64(crypto_generichash_state *h, double x) {
  uint8_t buf[8];
  uint64_t bits;
  memcpy(&bits, &x, 8);
  ldp_le(buf, bits, 8);
  crypto_generichash_update(h, buf, 8);
}

/* op byte, cells u32 LE, p or the matrix entries (from its JSON d) as f64 LE */
static void hash_step(crypto_generichash_state *h, const ldp_step *s, json_t *d) {
  uint8_t buf[5];
  json_t *rows = json_object_get(d, "rows");
  buf[0] = s->op;
  ldp_le(buf + 1, s->cells, 4);
  crypto_generichash_update(h, buf, 5);
  for (uint64_t i = 0; i < (s->op == LDP_OP_GRR ? 1 : s->cells * s->cells); i++)
    hash_f64(h, s->op == LDP_OP_GRR ? s->p
                           : json_number_value(json_array_get(json_array_get(rows,
                                                              i / s->cells), i % s->cells)));
}

/* a wave: byte 5, its attribute's grid points, offset and cells u32, round u8, then lo, hi,
   at0, at1, width, p f64 (all LE) */
static void hash_wave(crypto_generichash_state *h, const ldp_program *p, const ldp_step *s) {
  uint8_t buf[14];
  buf[0] = 5;
  ldp_le(ldp_le(ldp_le(buf + 1, p->size[s->in[0]], 4), s->value, 4), s->cells, 4);
  buf[13] = (uint8_t)s->count;
  crypto_generichash_update(h, buf, 14);
  for (int i = 0; i < 5; i++) hash_f64(h, p->cum[s->cum + i]);
  hash_f64(h, s->p);
}

/* BLAKE2b-64 over each permanent step (hash_step, hash_wave); a partition step: per table op
   byte 3, oracle byte (0 grr, 1 olh), cells u32, g u32, p f64; a select step: byte 4 (with
   weights: byte 6, their count u32 and each f64), then its branches' steps */
static void fingerprint(ldp_program *p, json_t *perm) {
  crypto_generichash_state h;
  uint8_t buf[10];
  crypto_generichash_init(&h, NULL, 0, sizeof p->fingerprint);
  for (uint32_t j = 0; j < p->n_units; j++) {
    const ldp_step *s = &p->steps[p->unit_at[j]];
    if (s->op == LDP_OP_WAVE) {
      hash_wave(&h, p, s);
      continue;
    }
    if (s->op == LDP_OP_SELECT) {
      json_t *d = json_array_get(perm, j), *w = json_object_get(d, "weights");
      buf[0] = s->value ? 6 : 4;
      ldp_le(buf + 1, s->count, 4);
      crypto_generichash_update(&h, buf, s->value ? 5 : 1);
      for (uint16_t b = 0; s->value && b < s->count; b++)
        hash_f64(&h, json_number_value(json_array_get(w, b)));
      for (uint16_t b = 0; b < s->count; b++) {
        const ldp_step *t = &p->steps[p->branch_start[s->first + b]];
        if (t->op == LDP_OP_WAVE) hash_wave(&h, p, t);
        else hash_step(&h, t, json_array_get(json_array_get(json_object_get(d, "branches"), b),
                                             0));
      }
      continue;
    }
    if (s->op == LDP_OP_PARTITION) {
      for (uint16_t k = 0; k < s->count; k++) {
        const ldp_table *t = &p->tables[s->first + k];
        buf[0] = 3;
        buf[1] = t->g != 0;
        ldp_le(ldp_le(buf + 2, t->cells, 4), t->g, 4);
        crypto_generichash_update(&h, buf, 10);
        hash_f64(&h, t->p);
      }
      continue;
    }
    hash_step(&h, s, json_array_get(perm, j));
  }
  crypto_generichash_final(&h, p->fingerprint, sizeof p->fingerprint);
}

static int bad(parser *ps, const char *field, const char *msg) {
  ldp_errf(ps->err, ps->errlen, "%s: %s", field, msg);
  return -1;
}

/* a u64 as a decimal string into *out; -1 otherwise */
static int u64_text(json_t *v, uint64_t *out) {
  const char *seed = json_string_value(v);
  char *end = NULL;
  unsigned long long sv = seed && *seed >= '0' && *seed <= '9' ? strtoull(seed, &end, 10) : 0;
  if (!seed || !end || *end || strlen(seed) > 20 || (sv == ULLONG_MAX && strcmp(seed,
      "18446744073709551615") != 0))
    return -1;
  *out = (uint64_t)sv;
  return 0;
}

/* instantaneous_p: null or n keep probabilities (partition: per table; select: per branch) */
static int parse_inst(parser *ps, json_t *inst, uint16_t n) {
  ldp_program *p = ps->p;
  p->has_inst = inst && !json_is_null(inst);
  if (p->has_inst && (!json_is_array(inst) || json_array_size(inst) != n))
    return bad(ps, "device.memoize.instantaneous_p", "must be null or one number in [0, 1] "
               "per table or branch");
  for (uint16_t k = 0; p->has_inst && k < n; k++) {
    json_t *v = json_array_get(inst, k);
    p->inst_p[k] = json_number_value(v);
    if (!json_is_number(v) || !(p->inst_p[k] >= 0.0 && p->inst_p[k] <= 1.0))
      return bad(ps, "device.memoize.instantaneous_p", "must be null or one number in [0, 1] "
                 "per table or branch");
  }
  return 0;
}

/* partition: one partition step after a round step per attribute round alpha-point rounds,
   with the same points (it maps the rounded value, a point, to the point's index) */
static int parse_partition_memo(parser *ps, json_t *memo, uint16_t first, uint16_t count) {
  ldp_program *p = ps->p;
  uint16_t at = (uint16_t)(first + count - 1);
  const ldp_step *s = &p->steps[at];
  uint32_t rounded = 0, want = 0;
  int ok = s->op == LDP_OP_PARTITION;
  for (uint16_t i = first; ok && i < at; i++) ok = p->steps[i].op == LDP_OP_ROUND;
  if (!ok)
    return bad(ps, "device.memoize.permanent", "kind partition: one partition step, after a "
               "round step per attribute memoize.round rounds");
  for (uint16_t i = first; i < at; i++) {
    const ldp_step *r = &p->steps[i];
    uint32_t j = r->in[0];
    ok = ok && p->round_n[j] == r->cells &&
         memcmp(p->cum + p->round_at[j], p->cum + r->cum, sizeof(double) * r->cells) == 0;
    rounded |= 1u << j;
  }
  for (uint32_t j = 0; j < p->n_attrs; j++)
    if (p->round_n[j]) want |= 1u << j;
  if (!ok || rounded != want)
    return bad(ps, "device.memoize.round", "kind partition: one entry per attribute a "
               "permanent round step rounds, with its points");
  p->unit_at[0] = at;
  p->n_units = 1;
  return parse_inst(ps, json_object_get(memo, "instantaneous_p"), s->count);
}

/* select (smp): one select step with a reported index, each branch one grr or matrix step */
static int parse_select_memo(parser *ps, json_t *memo, uint16_t first, uint16_t count) {
  ldp_program *p = ps->p;
  const ldp_step *s = &p->steps[first];
  int ok = count == 1 && s->op == LDP_OP_SELECT && s->n_out == 1 && s->value == 0;
  for (uint16_t b = 0; ok && b < s->count; b++) {
    uint16_t at = p->branch_start[s->first + b];
    ok = p->branch_start[s->first + b + 1] == at + 1 && (p->steps[at].op == LDP_OP_GRR ||
                                                          p->steps[at].op == LDP_OP_MATRIX);
  }
  if (!ok)
    return bad(ps, "device.memoize.permanent", "kind select: one select step with a reported "
               "index and no weights, each branch one grr or matrix step");
  uint64_t sv;
  if (u64_text(json_object_get(memo, "seed"), &sv))
    return bad(ps, "device.memoize.seed", "must be a u64 as a decimal string");
  p->memo_seed = ldp_mix64(sv);
  return parse_inst(ps, json_object_get(memo, "instantaneous_p"), s->count);
}

/* round: null, or per attribute null or a numeric one's {points, seed}: grid indices from 0 to
   the last, increasing (each a matrix entry, kept in cum), the alpha seed a u64 as text */
static int parse_round(parser *ps, json_t *r) {
  ldp_program *p = ps->p;
  char f[64];
  if (!r || json_is_null(r)) return 0;
  if (!json_is_array(r) || json_array_size(r) != p->n_attrs) {
    ldp_errf(ps->err, ps->errlen, "device.memoize.round: must be null or %u entries, one per "
             "attribute", p->n_attrs);
    return -1;
  }
  for (uint32_t j = 0; j < p->n_attrs; j++) {
    json_t *e = json_array_get(r, j), *pts = json_object_get(e, "points");
    if (json_is_null(e)) continue;
    ldp_errf(f, sizeof f, "device.memoize.round[%u]", j);
    if (!json_is_object(e) || !p->numeric[j] || !json_is_array(pts))
      return bad(ps, f, "must be null or, for a numeric attribute, {points, seed}");
    size_t n = ldp_round_points(ps, pts, j, SIZE_MAX);
    if (!n) {
      ldp_errf(ps->err, ps->errlen, "%s.points: must be increasing grid indices from 0 to %u "
               "(each counts against the %d matrix entries in all)", f, p->grid[j] - 1,
               LDP_MAX_MATRIX);
      return -1;
    }
    uint64_t seed;
    if (u64_text(json_object_get(e, "seed"), &seed)) {
      ldp_errf(ps->err, ps->errlen, "%s.seed: must be a u64 as a decimal string", f);
      return -1;
    }
    p->round_n[j] = (uint32_t)n;
    p->round_at[j] = ps->cum_used;
    p->round_seed[j] = ldp_mix64(seed);
    ps->cum_used += (uint32_t)n;
  }
  return 0;
}

/* a numeric attribute's permanent step: a wave writing its own column, or a select whose index
   is not reported over one such wave per branch (its in[0] then set to their attribute) */
static int numeric_unit(ldp_program *p, ldp_step *s) {
  if (s->op == LDP_OP_WAVE) return s->out[0] == s->in[0];
  if (s->op != LDP_OP_SELECT || s->n_out) return 0;
  for (uint16_t b = 0; b < s->count; b++) {
    uint16_t at = p->branch_start[s->first + b];
    const ldp_step *t = &p->steps[at];
    if (p->branch_start[s->first + b + 1] != at + 1 || t->op != LDP_OP_WAVE ||
        t->out[0] != t->in[0] || t->in[0] != p->steps[p->branch_start[s->first]].in[0])
      return 0;
  }
  s->n_in = 1;
  s->in[0] = p->steps[p->branch_start[s->first]].in[0];
  return 1;
}

int ldp_parse_memo(parser *ps, json_t *memo) {
  ldp_program *p = ps->p;
  uint16_t first, count;
  if (!json_is_object(memo)) return bad(ps, "device.memoize", "must be an object");
  json_t *rot = json_object_get(memo, "rotation_s"), *perm = json_object_get(memo, "permanent");
  json_t *kind = json_object_get(memo, "kind");
  const char *k = kind ? json_string_value(kind) : "attribute";
  if (!k || (strcmp(k, "attribute") && strcmp(k, "cluster") && strcmp(k, "partition") &&
             strcmp(k, "select")))
    return bad(ps, "device.memoize.kind", "must be attribute, cluster, partition or select");
  p->memo_kind = strcmp(k, "attribute") == 0 ? LDP_MEMO_ATTRIBUTE
                 : strcmp(k, "cluster") == 0   ? LDP_MEMO_CLUSTER
                 : strcmp(k, "partition") == 0 ? LDP_MEMO_PARTITION
                                               : LDP_MEMO_SELECT;
  if (rot && !json_is_null(rot) && !(json_is_number(rot) && json_number_value(rot) > 0 &&
                                     isfinite(json_number_value(rot))))
    return bad(ps, "device.memoize.rotation_s", "must be a number > 0 or null");
  p->rotation_s = rot && !json_is_null(rot) ? json_number_value(rot) : 0.0;
  json_t *rnd = json_object_get(memo, "round");
  if (p->memo_kind != LDP_MEMO_ATTRIBUTE && p->memo_kind != LDP_MEMO_PARTITION && rnd &&
      !json_is_null(rnd))
    return bad(ps, "device.memoize.round", "only with kind attribute or partition");
  if (parse_round(ps, rnd)) return -1;
  ps->memo = p->memo_kind != LDP_MEMO_PARTITION; /* a partition's round steps lead it */
  if (ldp_parse_steps(ps, perm, "device.memoize.permanent",
                      p->memo_kind == LDP_MEMO_CLUSTER ? 1 : 0, &first, &count))
    return -1;
  p->n_units = count;
  p->unit_at[0] = first;
  if (p->memo_kind == LDP_MEMO_PARTITION) {
    if (parse_partition_memo(ps, memo, first, count)) return -1;
  } else if (p->memo_kind == LDP_MEMO_SELECT) {
    if (parse_select_memo(ps, memo, first, count)) return -1;
  } else {
    uint32_t covered = 0, ok = p->width == p->n_attrs;
    for (uint32_t j = 0, u = first; ok && j < count; j++, u = ldp_after(p, u)) {
      ldp_step *s = &p->steps[u];
      int num = p->memo_kind == LDP_MEMO_ATTRIBUTE && numeric_unit(p, s);
      ok = (s->op == LDP_OP_GRR || s->op == LDP_OP_MATRIX || num) &&
           (p->memo_kind == LDP_MEMO_CLUSTER || (s->n_in == 1 && s->in[0] == j));
      for (uint8_t i = 0; ok && i < s->n_in; i++) {
        ok = (num || s->out[i] == s->in[i]) && !(covered & (1u << s->in[i]));
        covered |= 1u << s->in[i];
      }
      if (ok) p->unit_at[j] = (uint16_t)u; /* each unit covers a new attribute: j < n_attrs */
    }
    if (!ok || covered != (p->n_attrs == 32 ? 0xFFFFFFFFu : (1u << p->n_attrs) - 1))
      return bad(ps, "device.memoize.permanent", "must hold one grr or matrix step per "
                 "attribute j, in and out [j], in order (a numeric one: its wave, or a select "
                 "with out null over one wave per branch, in [j] and out j; kind cluster: grr "
                 "or matrix per cluster, the clusters covering every attribute once; width "
                 "must be the attribute count)");
  }
  p->memoized = 1;
  p->epsilon = 0.0;
  for (uint32_t j = 0, u = first; j < count; j++, u = ldp_after(p, u)) p->epsilon +=
      p->steps[u].eps;
  fingerprint(p, perm);
  return 0;
}
