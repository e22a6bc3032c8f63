/* Per-device identity (docs/security.md "Per-device identity", docs/credentials.md): a device's
   key derived from its fleet's secret, the credential `ldpstream device-credentials` prints, and
   the MAC that authenticates a batch (flag bit 2 of the wire format, docs/pipeline.md). The same
   bytes as ldpstream/credentials/device_keys.py and producers/codec.py. */
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "program_types.h"

static const char KEY_LABEL[] = "ldpstream/device-key/v1\n";
#define FLAG_KEY 0x02
#define FLAG_AUTH 0x04

int ldp_credential_derive(ldp_credential *c, const uint8_t *secret, size_t secret_len,
                          const char *fleet, uint64_t device_id) {
  size_t flen = fleet ? strlen(fleet) : 0;
  uint8_t head[1], id[8];
  crypto_auth_hmacsha256_state st;
  if (!c || !secret || flen < 1 || flen > 255) return LDP_E_ARG;
  head[0] = (uint8_t)flen;
  ldp_le(id, device_id, 8);
  crypto_auth_hmacsha256_init(&st, secret, secret_len);
  crypto_auth_hmacsha256_update(&st, (const uint8_t *)KEY_LABEL, sizeof KEY_LABEL - 1);
  crypto_auth_hmacsha256_update(&st, head, 1);
  crypto_auth_hmacsha256_update(&st, (const uint8_t *)fleet, flen);
  crypto_auth_hmacsha256_update(&st, id, 8);
  crypto_auth_hmacsha256_final(&st, c->key);
  memcpy(c->fleet, fleet, flen + 1);
  c->device_id = device_id;
  return LDP_OK;
}

int ldp_credential_parse(ldp_credential *c, const char *text, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
  int r = LDP_MALFORMED;
  if (!doc) {
    ldp_errf(err, errlen, "credential: not JSON: %s", jerr.text);
    return r;
  }
  json_t *fleet = json_object_get(doc, "fleet"), *dev = json_object_get(doc, "device_id"),
         *key = json_object_get(doc, "key");
  const char *f = json_is_string(fleet) ? json_string_value(fleet) : NULL;
  const char *k = json_is_string(key) ? json_string_value(key) : NULL;
  size_t bin = 0;
  if (!f || strlen(f) < 1 || strlen(f) > 255 || !json_is_integer(dev) || !k ||
      strlen(k) != 64 ||
      sodium_hex2bin(c->key, sizeof c->key, k, 64, NULL, &bin, NULL) != 0 || bin != 32) {
    ldp_errf(err, errlen, "credential: needs a fleet (1..255 bytes), an integer device_id and a "
             "32-byte hex key");
  } else {
    /* jansson holds integers as signed 64-bit: ids beyond 2^63 arrive negative, same bits */
    c->device_id = (uint64_t)json_integer_value(dev);
    memcpy(c->fleet, f, strlen(f) + 1);
    r = LDP_OK;
  }
  json_decref(doc);
  return r;
}

size_t ldp_batch_authenticate(uint8_t *buf, size_t len, size_t cap, const ldp_credential *c) {
  size_t flen = strlen(c->fleet);
  if (len < 7 || !(buf[5] & FLAG_KEY) || (buf[5] & FLAG_AUTH) || flen < 1 || flen > 255 ||
      len + 1 + flen + crypto_auth_hmacsha256_BYTES > cap)
    return 0;
  buf[5] |= FLAG_AUTH;
  buf[len] = (uint8_t)flen;
  memcpy(buf + len + 1, c->fleet, flen);
  len += 1 + flen;
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, c->key, sizeof c->key);
  crypto_auth_hmacsha256_update(&st, buf, len);
  crypto_auth_hmacsha256_final(&st, buf + len);
  return len + crypto_auth_hmacsha256_BYTES;
}

size_t ldp_device_flush_auth(ldp_device *d, const ldp_credential *c, double now, uint8_t *out,
                             size_t cap, int *result) {
  size_t room = 1 + strlen(c->fleet) + crypto_auth_hmacsha256_BYTES;
  *result = LDP_OK;
  if (c->device_id != d->device_id || cap < room) {
    *result = LDP_E_ARG;
    return 0;
  }
  /* the batch leaves room for the fleet and the MAC, so nothing is taken (no sequence, no
     buffer) unless it fits */
  size_t len = ldp_device_flush(d, now, out, cap - room, result);
  return len ? ldp_batch_authenticate(out, len, cap, c) : 0;
}
