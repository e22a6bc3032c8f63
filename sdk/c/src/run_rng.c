/* Random words and the draws every SDK makes from them (docs/device-protocol.md, "Draws"). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>

#include "run.h"

uint64_t ldp_splitmix64_next(void *state) {
  uint64_t *s = (uint64_t *)state;
  return ldp_mix64(*s += 0x9E3779B97F4A7C15ULL);
}

uint64_t ldp_os_rng_next(void *ctx) {
  ldp_os_rng *r = (ldp_os_rng *)ctx;
  if (r->pos == 0 || r->pos >= sizeof r->buf / sizeof r->buf[0]) {
    size_t got = 0;
    while (got < sizeof r->buf) {
      ssize_t k = getrandom((char *)r->buf + got, sizeof r->buf - got, 0);
      if (k < 0) {
        if (errno == EINTR) continue;
        abort(); /* no entropy: never report with a predictable generator */
      }
      got += (size_t)k;
    }
    r->pos = 0;
  }
  return r->buf[r->pos++];
}

uint64_t ldp_uniform(ldp_rng *rng, uint64_t k) {
  /* reject words >= 2^64 - (2^64 mod k); (2^64 mod k) == (-k) mod k in 64-bit arithmetic */
  uint64_t rem = (0 - k) % k;
  for (;;) {
    uint64_t w = rng->next_u64(rng->ctx);
    if (rem == 0 || w < 0 - rem) return w % k;
  }
}

static double fraction(ldp_rng *rng) { return (double)(rng->next_u64(rng->ctx) >> 11); }

int ldp_bernoulli(ldp_rng *rng, double p) { return fraction(rng) < p * 9007199254740992.0; }

uint32_t ldp_categorical(ldp_rng *rng, const double *cum, uint32_t k) {
  double u = fraction(rng);
  for (uint32_t j = 0; j + 1 < k; j++)
    if (u < cum[j] * 9007199254740992.0) return j;
  return k - 1;
}
