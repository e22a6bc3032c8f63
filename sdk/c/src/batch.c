/* Report batches, byte-identical to producers/codec.py encode_batch (docs/pipeline.md, "Wire
   format"). */
#include <string.h>

#include "program_types.h"

static int code_of(uint32_t max_value) {
  return max_value < 0x100u ? 1 : max_value < 0x10000u ? 2 : 4;
}

size_t ldp_batch_size(size_t collection_len, uint32_t n, uint16_t width, uint32_t max_value,
                      int device_ids, int key) {
  return 7 + collection_len + 19 + (key ? 16 : 0) + (device_ids ? 8 * (size_t)n : 0) +
         (size_t)n * width * (size_t)code_of(max_value);
}

size_t ldp_batch_encode(uint8_t *buf, size_t cap, const char *collection, uint32_t version,
                        double sent_at, const uint32_t *reports, uint32_t n, uint16_t width,
                        const uint64_t *device_ids, const uint64_t *key) {
  size_t clen = strlen(collection);
  uint32_t hi = 0;
  uint64_t bits;
  if (clen < 1 || clen > 255 || n < 1 || width < 1 || sent_at != sent_at ||
      sent_at - sent_at != 0.0)
    return 0;
  for (size_t i = 0; i < (size_t)n * width; i++)
    if (reports[i] > hi) hi = reports[i];
  size_t need = ldp_batch_size(clen, n, width, hi, device_ids != NULL, key != NULL);
  if (need > cap) return 0;
  int code = code_of(hi);
  uint8_t *p = buf;
  memcpy(p, "LDPB", 4);
  p[4] = 1;
  p[5] = (uint8_t)((device_ids ? 1 : 0) | (key ? 2 : 0));
  p[6] = (uint8_t)clen;
  memcpy(p + 7, collection, clen);
  p += 7 + clen;
  p = ldp_le(p, version, 4);
  memcpy(&bits, &sent_at, 8);
  p = ldp_le(p, bits, 8);
  p = ldp_le(p, n, 4);
  p = ldp_le(p, width, 2);
  *p++ = (uint8_t)code;
  if (key) {
    p = ldp_le(p, key[0], 8);
    p = ldp_le(p, key[1], 8);
  }
  if (device_ids)
    for (uint32_t i = 0; i < n; i++) p = ldp_le(p, device_ids[i], 8);
  for (size_t i = 0; i < (size_t)n * width; i++) p = ldp_le(p, reports[i], code);
  return need;
}
