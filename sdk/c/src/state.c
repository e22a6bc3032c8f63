/* Signed mechanism states (docs/device-protocol.md, "Signed state"): the checks and their
   order are those of producers/signing.py and producers/device.py. */
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

static const char DOMAIN_TAG[] = "ldpstream/config-state/v1\n";
#define CEILING_RTOL 1e-9

int ldp_abi_check(size_t state_size, size_t ledger_size) {
  return state_size == sizeof(ldp_state) && ledger_size == sizeof(ldp_ledger) ? LDP_OK
                                                                              : LDP_E_ARG;
}

/* No heap while a state is accepted: jansson's values and the signed message come from an
   arena (the static one of LDP_PARSE_ARENA bytes, or memory the caller lends), released as a whole when ldp_state_accept returns (so accepting is not reentrant; the
   allocator in force before is restored). A block freed on the way (jansson's growing token
   buffer and hash tables) goes back to the end of the arena when it is the last one, else to a
   free list that later allocations take the smallest fitting block from. A record whose JSON
   does not fit is malformed ("too large"). */
typedef struct arena_block {
  size_t size;                 /* bytes after the header */
  struct arena_block *next;    /* on the free list */
} arena_block;
#define ARENA_ALIGN 8
#if LDP_PARSE_ARENA > 0
static _Alignas(16) unsigned char arena_static[LDP_PARSE_ARENA];
static unsigned char *arena = arena_static;
static size_t arena_cap = LDP_PARSE_ARENA;
#else
static unsigned char *arena;
static size_t arena_cap;
#endif
static size_t arena_used, arena_peak;
static arena_block *arena_free_list;
static int arena_full;

static void *arena_malloc(size_t n) {
  n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (n < sizeof(arena_block *)) n = sizeof(arena_block *);
  arena_block **best = NULL;
  for (arena_block **b = &arena_free_list; *b; b = &(*b)->next)
    if ((*b)->size >= n && (!best || (*b)->size < (*best)->size)) best = b;
  if (best) {
    arena_block *blk = *best;
    *best = blk->next;
    return &blk->next;
  }
  size_t need = offsetof(arena_block, next) + n;
  if (need > arena_cap - arena_used) {
    arena_full = 1;
    return NULL;
  }
  arena_block *blk = (arena_block *)(void *)(arena + arena_used);
  blk->size = n;
  arena_used += need;
  if (arena_used > arena_peak) arena_peak = arena_used;
  return &blk->next;
}
static void arena_free(void *p) {
  if (!p) return;
  arena_block *blk = (arena_block *)(void *)((unsigned char *)p - offsetof(arena_block, next));
  if ((unsigned char *)p + blk->size == arena + arena_used) {
    arena_used -= offsetof(arena_block, next) + blk->size; /* the last block: give it back */
    return;
  }
  blk->next = arena_free_list;
  arena_free_list = blk;
}
size_t ldp_parse_arena_peak(void) { return arena_peak; }

int ldp_parse_arena_lend(void *buf, size_t len) {
  unsigned char *at = (unsigned char *)(((uintptr_t)buf + 15) & ~(uintptr_t)15);
  if (!buf || len < (size_t)(at - (unsigned char *)buf) + 64) {
#if LDP_PARSE_ARENA > 0
    arena = arena_static, arena_cap = LDP_PARSE_ARENA;
#else
    arena = NULL, arena_cap = 0;
#endif
    return buf ? LDP_E_ARG : LDP_OK;
  }
  arena = at;
  arena_cap = len - (size_t)(at - (unsigned char *)buf);
  arena_peak = 0;
  return LDP_OK;
}
static void *scratch_malloc(size_t n) { return arena_cap ? arena_malloc(n) : malloc(n); }
static void scratch_free(void *p) {
  if (arena_cap) arena_free(p);
  else free(p);
}

const char *ldp_reason(int r) {
  static const char *const names[] = {
      "ok", "malformed", "unsigned", "wrong_key", "bad_signature", "wrong_collection",
      "expired", "replayed", "over_ceiling", "unusable", "schema", "budget", "no_state",
      "full", "storage", "argument", "duplicate"};
  return r >= 0 && r <= LDP_DUPLICATE ? names[r] : "unknown";
}

int ldp_sodium_verify(void *ctx, const uint8_t sig[64], const uint8_t *msg, size_t len,
                      const uint8_t pub[32]) {
  (void)ctx;
  return crypto_sign_verify_detached(sig, msg, len, pub);
}

int ldp_trust_init(ldp_trust *t, const char *public_key_b64) {
  size_t n = 0;
  uint8_t digest[crypto_hash_sha256_BYTES];
  if (sodium_init() < 0) return LDP_E_ARG;
  memset(t, 0, sizeof *t);
  if (sodium_base642bin(t->pub, sizeof t->pub, public_key_b64, strlen(public_key_b64), " \n",
                        &n, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 || n != 32)
    return LDP_E_ARG;
  crypto_hash_sha256(digest, t->pub, sizeof t->pub);
  sodium_bin2hex(t->key_id, sizeof t->key_id, digest, 8);
  t->ceiling = LDP_DEFAULT_CEILING;
  t->verify = ldp_sodium_verify;
  return LDP_OK;
}

static int check_signature(const ldp_trust *t, const char *payload, size_t plen,
                           const char *sig_b64) {
  uint8_t sig[64];
  size_t n = 0;
  if (sodium_base642bin(sig, sizeof sig, sig_b64, strlen(sig_b64), NULL, &n, NULL,
                        sodium_base64_VARIANT_ORIGINAL) != 0 || n != sizeof sig)
    return -1;
  size_t mlen = sizeof DOMAIN_TAG - 1 + plen;
  uint8_t *msg = scratch_malloc(mlen);
  if (!msg) return -1;
  memcpy(msg, DOMAIN_TAG, sizeof DOMAIN_TAG - 1);
  memcpy(msg + sizeof DOMAIN_TAG - 1, payload, plen);
  int r = t->verify(t->verify_ctx, sig, msg, mlen, t->pub);
  scratch_free(msg);
  return r;
}

static int order_before(const ldp_state *a, const ldp_state *b) {
  return a->version < b->version || (a->version == b->version && a->issued_at < b->issued_at);
}

static int fail(int reason, char *detail, size_t dlen, const char *what) {
  ldp_errf(detail, dlen, "%s: %s", ldp_reason(reason), what);
  return reason;
}

static int open_payload(ldp_state *cand, const ldp_trust *t, const char *collection,
                        json_t *state, double now, char *detail, size_t dlen) {
  json_t *coll = json_object_get(state, "collection"), *ver = json_object_get(state, "version");
  json_t *iss = json_object_get(state, "issued_at"), *exp = json_object_get(state, "expires_at");
  if (!json_is_string(coll) || !json_is_integer(ver) || json_integer_value(ver) < 0 ||
      json_integer_value(ver) > 0xFFFFFFFFLL || !json_is_number(iss))
    return fail(LDP_MALFORMED, detail, dlen, "signed state lacks collection, version or "
                "issued_at");
  if (!json_is_number(exp))
    return fail(LDP_MALFORMED, detail, dlen, "signed state lacks expires_at");
  snprintf(cand->collection, sizeof cand->collection, "%s", json_string_value(coll));
  cand->version = (uint32_t)json_integer_value(ver);
  cand->issued_at = json_number_value(iss);
  cand->expires_at = json_number_value(exp);
  json_t *day = json_object_get(state, "max_epsilon_per_day");
  if (day && !json_is_null(day) && !(json_is_number(day) && json_number_value(day) > 0.0))
    return fail(LDP_MALFORMED, detail, dlen, "signed state's max_epsilon_per_day is not a "
                "positive number");
  cand->max_epsilon_per_day = day && json_is_number(day) ? json_number_value(day) : 0.0;
  if (strcmp(cand->collection, collection) != 0) {
    ldp_errf(detail, dlen, "wrong_collection: state signed for collection '%s' published under "
             "'%s'", cand->collection, collection);
    return LDP_WRONG_COLLECTION;
  }
  if (now > cand->expires_at) {
    ldp_errf(detail, dlen, "expired: state expired at %.3f, now is %.3f", cand->expires_at, now);
    return LDP_EXPIRED;
  }
  (void)t;
  return LDP_OK;
}

static int accept(ldp_state *state, ldp_state *cand, const ldp_trust *t,
                  const char *collection, const char *record, size_t len, double now,
                  char *detail, size_t dlen) {
  json_error_t je;
  int r;
  if (len > LDP_MAX_RECORD) return fail(LDP_MALFORMED, detail, dlen, "record too large");
  json_t *doc = json_loadb(record, len, 0, &je), *state_doc = NULL;
  if (!doc || !json_is_object(doc)) {
    r = fail(LDP_MALFORMED, detail, dlen, "not a JSON object");
    goto out;
  }
  json_t *payload = json_object_get(doc, "payload"), *sig = json_object_get(doc, "signature");
  if (!payload || !sig) {
    r = fail(LDP_UNSIGNED, detail, dlen, "no signature (a state must be signed by the worker)");
    goto out;
  }
  const char *alg = json_string_value(json_object_get(doc, "alg"));
  if (!alg || strcmp(alg, "ed25519") != 0) {
    r = fail(LDP_MALFORMED, detail, dlen, "unknown signature algorithm");
    goto out;
  }
  const char *kid = json_string_value(json_object_get(doc, "key_id"));
  if (!kid || strcmp(kid, t->key_id) != 0) {
    ldp_errf(detail, dlen, "wrong_key: signed by key '%s', pinned key is %s", kid ? kid : "",
             t->key_id);
    r = LDP_WRONG_KEY;
    goto out;
  }
  if (!json_is_string(payload) || !json_is_string(sig)) {
    r = fail(LDP_MALFORMED, detail, dlen, "payload and signature must be strings");
    goto out;
  }
  if (check_signature(t, json_string_value(payload), json_string_length(payload),
                      json_string_value(sig)) != 0) {
    r = fail(LDP_BAD_SIGNATURE, detail, dlen, "the signature does not verify");
    goto out;
  }
  state_doc = json_loadb(json_string_value(payload), json_string_length(payload), 0, &je);
  if (!state_doc || !json_is_object(state_doc)) {
    r = fail(LDP_MALFORMED, detail, dlen, "the signed payload is not a JSON object");
    goto out;
  }
  memset(cand, 0, offsetof(ldp_state, program));
  r = open_payload(cand, t, collection, state_doc, now, detail, dlen);
  if (r != LDP_OK) goto out;
  if (state->present && order_before(cand, state)) {
    ldp_errf(detail, dlen, "replayed: version %u issued at %.3f is older than the state in "
             "force (version %u issued at %.3f)", cand->version, cand->issued_at,
             state->version, state->issued_at);
    r = LDP_REPLAYED;
    goto out;
  }
  json_t *dev = json_object_get(state_doc, "device");
  if (!dev) {
    const char *fam = json_string_value(json_object_get(state_doc, "mechanism"));
    ldp_errf(detail, dlen, "unusable: mechanism '%s' has no randomization description this SDK "
             "can run (docs/device-protocol.md lists the families)", fam ? fam : "?");
    r = LDP_UNUSABLE;
    goto out;
  }
  char err[200];
  if (ldp_program_from_json(&cand->program, dev, err, sizeof err) != LDP_OK) {
    ldp_errf(detail, dlen, "unusable: %s", err);
    r = LDP_UNUSABLE;
    goto out;
  }
  if (!(cand->program.epsilon <= t->ceiling * (1 + CEILING_RTOL))) {
    ldp_errf(detail, dlen, "over_ceiling: state version %u costs epsilon = %g per report, above "
             "this device's ceiling %g", cand->version, cand->program.epsilon, t->ceiling);
    r = LDP_OVER_CEILING;
    goto out;
  }
  cand->present = 1;
  memcpy(state, cand, sizeof *state);
  r = LDP_OK;
out:
  if (state_doc) json_decref(state_doc);
  if (doc) json_decref(doc);
  return r;
}

int ldp_state_accept(ldp_state *state, ldp_state *cand, const ldp_trust *t,
                     const char *collection, const char *record, size_t len, double now,
                     char *detail, size_t dlen) {
  if (!arena_cap) return accept(state, cand, t, collection, record, len, now, detail, dlen);
  json_malloc_t was_malloc;
  json_free_t was_free;
  json_get_alloc_funcs(&was_malloc, &was_free);
  json_set_alloc_funcs(arena_malloc, arena_free);
  arena_used = 0;
  arena_free_list = NULL;
  arena_full = 0;
  int r = accept(state, cand, t, collection, record, len, now, detail, dlen);
  json_set_alloc_funcs(was_malloc, was_free);
  if (arena_full && r == LDP_MALFORMED)
    ldp_errf(detail, dlen, "malformed: record too large for the parse arena (%zu bytes)",
             arena_cap);
  return r;
}
