/* ldpstream device SDK in C11 (docs/device-protocol.md).
 *
 * A device pins the worker's Ed25519 public key, accepts signed mechanism states
 * (ldp_state_accept), turns records of labels into reports with the randomization description
 * of the state in force (ldp_device_report), keeps its epsilon ledger and batch sequence through
 * a storage callback, and encodes report batches byte-identical to the Python encoder
 * (ldp_device_flush). Nothing on the report path allocates: every structure lives in caller
 * memory. Accepting a state parses JSON (jansson) and may allocate.
 */
#ifndef LDP_H
#define LDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* limits: the protocol's by default, smaller when the integrator defines them (ldp_limits.h) */
#include "ldp_limits.h"
#define LDP_DEFAULT_CEILING 8.0    /* epsilon per report a device accepts by default */

/* results; the state-refusal reasons are named by ldp_reason() */
enum ldp_result {
  LDP_OK = 0,
  LDP_MALFORMED, LDP_UNSIGNED, LDP_WRONG_KEY, LDP_BAD_SIGNATURE, LDP_WRONG_COLLECTION,
  LDP_EXPIRED, LDP_REPLAYED, LDP_OVER_CEILING, LDP_UNUSABLE,
  LDP_E_SCHEMA, LDP_E_BUDGET, LDP_E_NO_STATE, LDP_E_FULL, LDP_E_STORAGE, LDP_E_ARG,
  LDP_DUPLICATE   /* memoized record already reported in this rotation period */
};
const char *ldp_reason(int result);
/* 0 when the caller was compiled with the library's limits (ldp_limits.h): the sizes of
   ldp_state and ldp_ledger agree; LDP_E_ARG otherwise */
#define LDP_ABI_CHECK() ldp_abi_check(sizeof(ldp_state), sizeof(ldp_ledger))
int ldp_abi_check(size_t state_size, size_t ledger_size);

/* --- random words --------------------------------------------------------------------------- */
typedef struct ldp_rng {
  uint64_t (*next_u64)(void *ctx);
  void *ctx;
} ldp_rng;

uint64_t ldp_splitmix64_next(void *state);      /* ctx: a uint64_t state (the seed) */
typedef struct ldp_os_rng { uint64_t buf[LDP_OS_RNG_WORDS]; unsigned pos; } ldp_os_rng;
uint64_t ldp_os_rng_next(void *ctx);            /* ctx: ldp_os_rng (zeroed); getrandom(2) */

uint64_t ldp_uniform(ldp_rng *rng, uint64_t k); /* [0, k), 1 <= k <= 2^32 */
int ldp_bernoulli(ldp_rng *rng, double p);
uint32_t ldp_categorical(ldp_rng *rng, const double *cum, uint32_t k);

/* --- the randomization description ---------------------------------------------------------- */
typedef struct ldp_table {           /* one table of a partition step */
  uint8_t n_in;
  uint16_t in[LDP_MAX_ATTRS];
  uint64_t cells;
  uint32_t offset, g, r;               /* g = 0: GRR over the cells, else OLH(g, r) */
  double p;
} ldp_table;

typedef struct ldp_step {
  uint8_t op;                          /* 1 grr, 2 matrix, 3 select, 4 partition, 5 uniform,
                                          6 const, 7 copy (in[0]: the source column),
                                          8 keep (cum: the fake distribution), 9 bloom,
                                          10 wave (in[0] a numeric attribute; cum: lo, hi,
                                          at0, at1, width; cells, value: the offset, count:
                                          1 rounded, 0 bucketed; docs/numeric.md),
                                          11 round (in[0] a numeric attribute; cum: its
                                          points as grid indices, cells of them) */
  uint8_t n_in;
  uint16_t in[LDP_MAX_ATTRS];
  uint16_t out[LDP_MAX_ATTRS];         /* select: out[0] is the index column */
  uint64_t cells;                      /* product of the input attributes' sizes */
  double p;                            /* grr */
  double eps;                          /* epsilon of the step (select: dearest branch) */
  uint32_t cum;                        /* matrix: offset of cells*cells cumulative sums;
                                          select with weights (value 1): the cumulative
                                          weights of its branches */
  uint16_t first, count;               /* select: branches; first step of branch b is
                                          branch_start[first + b], ends at the next one;
                                          partition: tables[first .. first + count) */
  uint8_t n_out;                       /* partition: slots, columns out[0 .. n_out);
                                          select: 1 when the index is reported in out[0] */
  uint64_t seed;                       /* partition: mix64(assign seed) */
  uint32_t value;                      /* const: the value; copy: the row length */
} ldp_step;

typedef struct ldp_program {
  char family[32];
  uint32_t n_attrs, width, n_steps;
  uint32_t n_top;                      /* steps[0..n_top): the steps list (with branches) */
  int memoized;                        /* steps[unit_at[u]]: permanent step of memo unit u */
  uint8_t memo_kind;                   /* 0 attribute, 1 cluster, 2 partition, 3 select */
  uint32_t n_units;                    /* permanent steps (attribute, cluster) or 1 */
  uint64_t memo_seed;                  /* select: mix64(seed) */
  int has_inst;                        /* partition, select: inst_p per table or branch */
  double inst_p[LDP_MAX_TABLES > LDP_MAX_STEPS ? LDP_MAX_TABLES : LDP_MAX_STEPS];
  double rotation_s;                   /* <= 0: never rotated */
  uint8_t fingerprint[8];              /* BLAKE2b-64 of the permanent steps */
  uint32_t size[LDP_MAX_ATTRS];        /* labels, or a numeric attribute's grid points (its
                                          points after a round step) */
  uint32_t grid[LDP_MAX_ATTRS];        /* a numeric attribute's grid points */
  uint8_t numeric[LDP_MAX_ATTRS];      /* 1: a numeric attribute, its range in range[j] */
  double range[LDP_MAX_ATTRS][2];      /* min, max of a numeric attribute */
  uint32_t round_n[LDP_MAX_ATTRS];     /* memoized: alpha-point rounding points of attribute j
                                          (0: not rounded), grid indices in cum from
                                          round_at[j] */
  uint32_t round_at[LDP_MAX_ATTRS];
  uint64_t round_seed[LDP_MAX_ATTRS];  /* mix64(its alpha seed) */
  uint16_t unit_at[LDP_MAX_ATTRS];     /* memoized: the permanent step of memo unit u */
  uint32_t name_at[LDP_MAX_ATTRS];     /* offset of the attribute name in text */
  uint32_t label0[LDP_MAX_ATTRS];      /* first label index of each attribute */
  uint32_t label_at[LDP_MAX_LABELS];   /* offsets of labels in text */
  char text[LDP_LABEL_BYTES];
  ldp_step steps[LDP_MAX_STEPS];
  uint16_t branch_start[LDP_MAX_STEPS + 1];
  double cum[LDP_MAX_MATRIX];
  ldp_table tables[LDP_MAX_TABLES];
  uint32_t n_tables;
  double epsilon;
} ldp_program;

/* parse a description (JSON text of state["device"]); err names the field */
int ldp_program_parse(ldp_program *prog, const char *json, size_t len, char *err, size_t errlen);
/* labels -> indices: record given as n (name, label) pairs; LDP_E_SCHEMA names the attribute */
int ldp_program_encode(const ldp_program *prog, const char *const *names,
                       const char *const *labels, size_t n, uint32_t *x, char *err,
                       size_t errlen);
/* the same, a numeric attribute's value given as its decimal text ("21.5", "-3", "1e3"):
   clipped into its range and put on its grid; clipped[j] (n_attrs entries, or NULL) is 1 when
   attribute j's value was clipped (docs/device-protocol.md, "Numeric attributes") */
int ldp_program_encode_clip(const ldp_program *prog, const char *const *names,
                            const char *const *labels, size_t n, uint32_t *x, uint8_t *clipped,
                            char *err, size_t errlen);
/* a numeric value -> its grid index on attribute j; returns 1 when it was clipped */
int ldp_numeric_index(const ldp_program *prog, uint32_t j, double v, uint32_t *index);
void ldp_program_randomize(const ldp_program *prog, const uint32_t *x, uint64_t device_id,
                           ldp_rng *rng, uint32_t *report);
/* one grr, matrix or uniform step on an input cell (mixed radix of its attributes): the output cell
   (privacy audits sample a channel through it) */
uint64_t ldp_step_apply(const ldp_program *prog, uint32_t step, uint64_t cell, ldp_rng *rng);
/* a wave step's cell (no offset) for grid index i of its attribute (privacy audits) */
uint64_t ldp_wave_cell(const ldp_program *prog, uint32_t step, uint32_t i, ldp_rng *rng);
/* a device's alpha in [0, 1) for attribute j of a memoized description with rounding:
   (mix64(device_id ^ mix64(seed)) >> 11) * 2^-53 (docs/device-protocol.md, "Numeric
   memoization"); 0 when j is not rounded */
double ldp_alpha(const ldp_program *prog, uint32_t j, uint64_t device_id);
/* the record a memoized description keys its memos by: x with every rounded attribute's grid
   index alpha-point rounded with the device's alpha (a copy of x otherwise) */
void ldp_memo_round(const ldp_program *prog, const uint32_t *x, uint64_t device_id,
                    uint32_t *rounded);
/* a partition table's oracle code of a cell (no offset) */
uint64_t ldp_table_code(const ldp_table *t, uint64_t cell, ldp_rng *rng);
/* GRR over k cells with keep p */
uint64_t ldp_grr_cell(uint64_t cell, uint64_t k, double p, ldp_rng *rng);

/* --- signed states -------------------------------------------------------------------------- */
typedef int (*ldp_verify_fn)(void *ctx, const uint8_t sig[64], const uint8_t *msg, size_t len,
                             const uint8_t pub[32]);   /* 0: valid */
int ldp_sodium_verify(void *ctx, const uint8_t sig[64], const uint8_t *msg, size_t len,
                      const uint8_t pub[32]);

typedef struct ldp_trust {
  uint8_t pub[32];
  char key_id[17];                     /* first 16 hex digits of SHA-256(pub) */
  double ceiling;                      /* epsilon per report */
  ldp_verify_fn verify;
  void *verify_ctx;
} ldp_trust;
/* pinned key from base64; libsodium verifier, LDP_DEFAULT_CEILING */
int ldp_trust_init(ldp_trust *t, const char *public_key_b64);

typedef struct ldp_state {
  int present;
  char collection[256];
  uint32_t version;
  double issued_at, expires_at;
  double max_epsilon_per_day;          /* the collection's daily cap (0: none) */
  ldp_program program;
} ldp_state;

/* verify one ldp.config record for collection; on LDP_OK *state holds it (an older or refused
   record leaves it unchanged); scratch holds the parsed candidate */
int ldp_state_accept(ldp_state *state, ldp_state *scratch, const ldp_trust *t,
                     const char *collection, const char *record, size_t len, double now,
                     char *detail, size_t detail_len);

/* Accepting a state without the heap: ldp_state_accept parses in an arena, the static one of
   LDP_PARSE_ARENA bytes (ldp_limits.h; the firmware profile's default) or len bytes at buf lent
   here (memory idle while a state is verified, a receive buffer say; NULL: back to the static
   arena, or to the heap when LDP_PARSE_ARENA is 0). LDP_E_ARG: under 64 bytes. */
int ldp_parse_arena_lend(void *buf, size_t len);
/* the most arena bytes one ldp_state_accept has used since the arena was set (sizing) */
size_t ldp_parse_arena_peak(void);

/* --- storage, ledger, sequence -------------------------------------------------------------- */
typedef struct ldp_storage {
  /* load: 0 and *len set, 1 when the key is absent, < 0 on error */
  int (*load)(void *ctx, const char *key, uint8_t *buf, size_t cap, size_t *len);
  int (*save)(void *ctx, const char *key, const uint8_t *buf, size_t len);
  void *ctx;
} ldp_storage;
/* files named <dir>/<key>, replaced atomically (rename) */
void ldp_file_storage(ldp_storage *s, const char *dir);

typedef struct ldp_memo {
  uint8_t fingerprint[8];
  uint32_t attribute, value, response; /* attribute: the memo unit (attribute, cluster, table) */
} ldp_memo;

typedef struct ldp_ledger {
  double budget, window_s;             /* budget <= 0: no budget */
  double max_epsilon_per_day;          /* the collection's cap per UTC day (<= 0: none), set
                                          from the state in force before each report */
  uint32_t n;
  double at[LDP_LEDGER_CAP], eps[LDP_LEDGER_CAP];
  uint64_t next_sequence;
  int64_t period;                      /* the newest rotation period committed (-1: none) */
  uint32_t n_memo, n_sent;
  ldp_memo memo[LDP_MEMO_CAP];         /* memoized responses of that period */
  uint64_t sent_key[LDP_MEMO_CAP];     /* records sent in it: BLAKE2b-64(fingerprint, x) */
  double sent_at[LDP_MEMO_CAP];
  const ldp_storage *storage;          /* NULL: memory only */
} ldp_ledger;

int ldp_ledger_open(ldp_ledger *l, double budget, double window_s, const ldp_storage *s);
/* LDP_OK (charged and saved) or LDP_E_BUDGET (the window budget or max_epsilon_per_day) */
int ldp_ledger_charge(ldp_ledger *l, double cost, double now);
/* the next batch sequence, saved as used before it is returned */
int ldp_ledger_take_sequence(ldp_ledger *l, uint64_t *seq);
/* epsilon spent in the budget day (UTC calendar day) of the ledger's time, and in the window */
double ldp_ledger_spent_today(const ldp_ledger *l, double now);
double ldp_ledger_spent_window(const ldp_ledger *l, double now);
/* one memoized report (docs/device-protocol.md, "Ledger"): LDP_OK with the report and *cost,
   LDP_DUPLICATE, LDP_E_BUDGET (*cost: what it would cost) or LDP_E_FULL; resend_every_s <= 0:
   never resend */
int ldp_memo_report(ldp_ledger *l, const ldp_program *p, const uint32_t *x, uint64_t device_id,
                    double now, double resend_every_s, ldp_rng *rng, uint32_t *report,
                    double *cost);

/* --- batches -------------------------------------------------------------------------------- */
/* the wire format of producers/codec.py; returns bytes written, 0 on error (cap too small,
   bad arguments); device_ids may be NULL, key NULL or {sender, sequence} */
size_t ldp_batch_encode(uint8_t *buf, size_t cap, const char *collection, uint32_t version,
                        double sent_at, const uint32_t *reports, uint32_t n, uint16_t width,
                        const uint64_t *device_ids, const uint64_t *key);
size_t ldp_batch_size(size_t collection_len, uint32_t n, uint16_t width, uint32_t max_value,
                      int device_ids, int key);

/* --- per-device identity (docs/security.md "Per-device identity") --------------------------- */
/* what one device holds: its fleet, its id and its key (never the fleet's secret) */
typedef struct ldp_credential {
  char fleet[256];
  uint64_t device_id;
  uint8_t key[32];
} ldp_credential;
/* key = HMAC-SHA256(fleet secret, "ldpstream/device-key/v1\n" || u8 len || fleet || u64 LE id):
   provisioning tools; a device loads what `ldpstream device-credentials` printed instead */
int ldp_credential_derive(ldp_credential *c, const uint8_t *secret, size_t secret_len,
                          const char *fleet, uint64_t device_id);
/* parse {"device_id": N, "fleet": "...", "key": "<64 hex>"}: LDP_OK or LDP_MALFORMED */
int ldp_credential_parse(ldp_credential *c, const char *json, char *err, size_t errlen);
/* authenticate a keyed batch of len bytes in buf: flag bit 2, the fleet and HMAC-SHA256 of every
   byte before it appended; returns the new length (len + 1 + strlen(fleet) + 32), 0 when cap is
   too small, the batch has no key or is authenticated already */
size_t ldp_batch_authenticate(uint8_t *buf, size_t len, size_t cap, const ldp_credential *c);

/* --- a device ------------------------------------------------------------------------------- */
typedef struct ldp_device {
  ldp_state *state;
  ldp_ledger *ledger;
  ldp_rng rng;
  uint64_t device_id;
  uint32_t *reports;                   /* caller buffer: capacity * LDP_MAX_WIDTH values */
  uint64_t *ids;                       /* caller buffer: capacity device ids */
  uint32_t capacity, n, version, width;
  double resend_every_s;               /* memoized: resend a record after this (<= 0: never) */
} ldp_device;

/* randomize one record (n name/label pairs) into the buffer, charged to the ledger */
int ldp_device_report(ldp_device *d, const char *const *names, const char *const *labels,
                      size_t n, double now, double *cost, char *err, size_t errlen);
/* the same; on LDP_OK clipped[j] (one per attribute) is 1 when numeric attribute j's value was
   clipped into its range: the caller counts them (docs/device-protocol.md, "Numeric
   attributes") */
int ldp_device_report_clip(ldp_device *d, const char *const *names, const char *const *labels,
                           size_t n, double now, double *cost, uint8_t *clipped, char *err,
                           size_t errlen);
/* encode the buffered reports as one batch with the batch key (device id, next sequence) into
   out; returns bytes (0: nothing buffered or error, see *result) and empties the buffer */
size_t ldp_device_flush(ldp_device *d, double now, uint8_t *out, size_t cap, int *result);
/* the same, authenticated with the device's credential (whose device_id must be d->device_id;
   docs/security.md "Per-device identity") */
size_t ldp_device_flush_auth(ldp_device *d, const ldp_credential *c, double now, uint8_t *out,
                             size_t cap, int *result);

#ifdef __cplusplus
}
#endif
#endif
