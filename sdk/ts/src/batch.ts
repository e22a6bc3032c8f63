/** Report batches, byte-identical to producers/codec.py encode_batch (docs/pipeline.md,
 * "Wire format"). */

export interface BatchInput {
  collection: string;
  version: number;
  sentAt: number;
  /** n rows of width values */
  reports: ArrayLike<number>[];
  deviceIds?: bigint[];
  key?: { sender: bigint; sequence: bigint };
}

export function encodeBatch(b: BatchInput): Uint8Array<ArrayBuffer> {
  const cid = new TextEncoder().encode(b.collection);
  const n = b.reports.length;
  const width = n ? b.reports[0].length : 0;
  if (cid.length < 1 || cid.length > 255) throw new Error("collection id must be 1..255 bytes");
  if (n < 1 || width < 1 || width > 0xffff) throw new Error("a batch needs n >= 1 reports of " +
                                                           "width >= 1");
  if (!Number.isInteger(b.version) || b.version < 0 || b.version > 0xffffffff)
    throw new Error("version must fit in u32");
  if (!Number.isFinite(b.sentAt)) throw new Error("sent_at must be finite");
  let hi = 0;
  for (const r of b.reports) {
    if (r.length !== width) throw new Error("reports must all have one width");
    for (let j = 0; j < width; j++) {
      if (!Number.isInteger(r[j]) || r[j] < 0 || r[j] > 0xffffffff)
        throw new Error("report values must be integers in [0, 2^32)");
      hi = Math.max(hi, r[j]);
    }
  }
  if (b.deviceIds && b.deviceIds.length !== n) throw new Error(`device ids must number ${n}`);
  const code = hi < 0x100 ? 1 : hi < 0x10000 ? 2 : 4;
  const size = 7 + cid.length + 19 + (b.key ? 16 : 0) + (b.deviceIds ? 8 * n : 0) +
    n * width * code;
  const out = new Uint8Array(size);
  const v = new DataView(out.buffer);
  out.set([0x4c, 0x44, 0x50, 0x42, 1, (b.deviceIds ? 1 : 0) | (b.key ? 2 : 0), cid.length]);
  out.set(cid, 7);
  let p = 7 + cid.length;
  v.setUint32(p, b.version, true);
  v.setFloat64(p + 4, b.sentAt, true);
  v.setUint32(p + 12, n, true);
  v.setUint16(p + 16, width, true);
  v.setUint8(p + 18, code);
  p += 19;
  if (b.key) {
    v.setBigUint64(p, b.key.sender, true);
    v.setBigUint64(p + 8, b.key.sequence, true);
    p += 16;
  }
  for (const id of b.deviceIds ?? []) {
    v.setBigUint64(p, id, true);
    p += 8;
  }
  for (const r of b.reports)
    for (let j = 0; j < width; j++) {
      if (code === 1) v.setUint8(p, r[j]);
      else if (code === 2) v.setUint16(p, r[j], true);
      else v.setUint32(p, r[j], true);
      p += code;
    }
  return out;
}
