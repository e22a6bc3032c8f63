/** Per-device identity (docs/security.md "Per-device identity", docs/credentials.md): a device's
 * key derived from its fleet's secret, the credential `ldpstream device-credentials` prints, and
 * the MAC that authenticates a batch (flag bit 2 of the wire format, docs/pipeline.md); the same
 * bytes as ldpstream/credentials/device_keys.py and producers/codec.py. */
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";

const KEY_LABEL = new TextEncoder().encode("ldpstream/device-key/v1\n");

/** What one device holds: its fleet, its id and its key (never the fleet's secret). */
export interface Credential {
  fleet: string;
  deviceId: bigint;
  key: Uint8Array;
}

function fleetBytes(fleet: string): Uint8Array {
  const name = new TextEncoder().encode(fleet);
  if (name.length < 1 || name.length > 255) throw new Error("a fleet name is 1..255 bytes");
  return name;
}

/** key = HMAC-SHA256(fleet secret, "ldpstream/device-key/v1\n" ‖ u8 len ‖ fleet ‖ u64 LE id):
 * for provisioning tools; a device loads its credential instead. */
export function deriveCredential(secret: Uint8Array, fleet: string, deviceId: bigint): Credential {
  const name = fleetBytes(fleet);
  if (deviceId < 0n || deviceId >= 1n << 64n) throw new Error("a device id is a u64");
  const msg = new Uint8Array(KEY_LABEL.length + 1 + name.length + 8);
  msg.set(KEY_LABEL);
  msg[KEY_LABEL.length] = name.length;
  msg.set(name, KEY_LABEL.length + 1);
  new DataView(msg.buffer).setBigUint64(msg.length - 8, deviceId, true);
  return { fleet, deviceId, key: hmac(sha256, secret, msg) };
}

/** The JSON `ldpstream device-credentials --fleet F --device-id N` prints. */
export function parseCredential(text: string): Credential {
  // device ids beyond 2^53 must stay exact: read the integer from the text
  const doc = JSON.parse(text) as { fleet?: unknown; key?: unknown };
  const id = /"device_id"\s*:\s*(\d+)/.exec(text);
  if (typeof doc.fleet !== "string" || typeof doc.key !== "string" || !id ||
      !/^[0-9a-f]{64}$/i.test(doc.key))
    throw new Error("a credential has a fleet, an integer device_id and a 32-byte hex key");
  fleetBytes(doc.fleet);
  const key = new Uint8Array(32);
  for (let i = 0; i < 32; i++) key[i] = parseInt(doc.key.slice(2 * i, 2 * i + 2), 16);
  return { fleet: doc.fleet, deviceId: BigInt(id[1]), key };
}

/** A keyed batch authenticated: flag bit 2 set, the fleet and HMAC-SHA256 of every byte before
 * it appended. */
export function authenticateBatch(batch: Uint8Array, c: Credential): Uint8Array<ArrayBuffer> {
  if (batch.length < 7 || !(batch[5] & 2) || batch[5] & 4)
    throw new Error("only a keyed batch not authenticated yet can be authenticated");
  const name = fleetBytes(c.fleet);
  const out = new Uint8Array(batch.length + 1 + name.length + 32);
  out.set(batch);
  out[5] |= 4;
  out[batch.length] = name.length;
  out.set(name, batch.length + 1);
  const body = out.subarray(0, out.length - 32);
  out.set(hmac(sha256, c.key, body), out.length - 32);
  return out;
}
