/** Signed mechanism states (docs/device-protocol.md, "Signed state"): the checks and their
 * order are those of producers/signing.py and producers/device.py. */
import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";

import { Program, ProgramError } from "./program.js";

export const DEFAULT_CEILING = 8.0;
const DOMAIN = new TextEncoder().encode("ldpstream/config-state/v1\n");
const CEILING_RTOL = 1e-9;
const MAX_RECORD_BYTES = 4 * 1024 * 1024;

export type Reason = "malformed" | "unsigned" | "wrong_key" | "bad_signature" |
  "wrong_collection" | "expired" | "replayed" | "over_ceiling" | "unusable";

/** A ldp.config record the device must not use. */
export class StateRejected extends Error {
  constructor(readonly reason: Reason, readonly detail: string) {
    super(`${reason}: ${detail}`);
  }
}

/** Verifies an Ed25519 signature (plug a platform verifier here). */
export type Verifier = (sig: Uint8Array, msg: Uint8Array, pub: Uint8Array) => boolean;
export const nobleVerify: Verifier = (sig, msg, pub) => {
  try {
    return ed25519.verify(sig, msg, pub);
  } catch {
    return false;
  }
};

export function fromBase64(text: string): Uint8Array {
  const bin = atob(text.trim());
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The pinned public key, the device's epsilon ceiling and the verifier. */
export class Trust {
  readonly publicKey: Uint8Array;
  readonly keyId: string;

  constructor(publicKeyBase64: string, readonly ceiling = DEFAULT_CEILING,
              readonly verify: Verifier = nobleVerify) {
    this.publicKey = fromBase64(publicKeyBase64);
    if (this.publicKey.length !== 32)
      throw new Error(`an Ed25519 public key is 32 bytes, got ${this.publicKey.length}`);
    this.keyId = hex(sha256(this.publicKey)).slice(0, 16);
  }
}

/** An accepted state. */
export interface State {
  collection: string;
  version: number;
  issuedAt: number;
  expiresAt: number;
  /** the collection's ε cap per budget day (docs/privacy-over-time.md); absent: none */
  maxEpsilonPerDay?: number;
  mechanism: string;
  program: Program;
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** Verify one ldp.config record for `collection` against the state in force (`current`);
 * returns the state to use from now on or throws StateRejected. */
export function acceptState(trust: Trust, collection: string, record: string,
                            current: State | null, now: number): State {
  if (record.length > MAX_RECORD_BYTES) throw new StateRejected("malformed", "record too large");
  let doc: unknown;
  try {
    doc = JSON.parse(record);
  } catch (e) {
    throw new StateRejected("malformed", `not JSON: ${(e as Error).message}`);
  }
  if (!isObj(doc)) throw new StateRejected("malformed", "not a JSON object");
  if (!("signature" in doc) || !("payload" in doc))
    throw new StateRejected("unsigned", "no signature (a state must be signed by the worker)");
  if (doc.alg !== "ed25519")
    throw new StateRejected("malformed", `unknown signature algorithm ${String(doc.alg)}`);
  if (doc.key_id !== trust.keyId)
    throw new StateRejected("wrong_key", `signed by key ${String(doc.key_id)}, pinned key is ` +
                            trust.keyId);
  const { payload, signature } = doc;
  if (typeof payload !== "string" || typeof signature !== "string")
    throw new StateRejected("malformed", "payload and signature must be strings");
  let sig: Uint8Array;
  try {
    sig = fromBase64(signature);
  } catch {
    sig = new Uint8Array(0);
  }
  const body = new TextEncoder().encode(payload);
  const msg = new Uint8Array(DOMAIN.length + body.length);
  msg.set(DOMAIN);
  msg.set(body, DOMAIN.length);
  if (sig.length !== 64 || !trust.verify(sig, msg, trust.publicKey))
    throw new StateRejected("bad_signature", "the signature does not verify");
  let state: unknown;
  try {
    state = JSON.parse(payload);
  } catch {
    state = null;
  }
  if (!isObj(state))
    throw new StateRejected("malformed", "the signed payload is not a JSON object");
  const { version, issued_at: issuedAt, expires_at: expiresAt } = state;
  if (typeof state.collection !== "string" || typeof version !== "number" ||
      !Number.isInteger(version) || version < 0 || version > 0xffffffff ||
      typeof issuedAt !== "number")
    throw new StateRejected("malformed", "signed state lacks collection, version or issued_at");
  if (typeof expiresAt !== "number")
    throw new StateRejected("malformed", "signed state lacks expires_at");
  const perDay = state.max_epsilon_per_day;
  if (perDay !== undefined && perDay !== null && !(typeof perDay === "number" && perDay > 0))
    throw new StateRejected("malformed", "signed state's max_epsilon_per_day is not a " +
                            "positive number");
  if (state.collection !== collection)
    throw new StateRejected("wrong_collection", `state signed for collection ` +
                            `'${state.collection}' published under '${collection}'`);
  if (now > expiresAt)
    throw new StateRejected("expired", `state expired at ${expiresAt}, now is ${now}`);
  if (current && (version < current.version ||
                  (version === current.version && issuedAt < current.issuedAt)))
    throw new StateRejected("replayed", `version ${version} issued at ${issuedAt} is older ` +
                            `than the state in force (version ${current.version} issued at ` +
                            `${current.issuedAt})`);
  const mechanism = String(state.mechanism);
  if (state.device === undefined)
    throw new StateRejected("unusable", `mechanism '${mechanism}' has no randomization ` +
                            "description this SDK can run (docs/device-protocol.md lists the " +
                            "families)");
  let program: Program;
  try {
    program = new Program(state.device);
  } catch (e) {
    if (e instanceof ProgramError) throw new StateRejected("unusable", e.message);
    throw e;
  }
  if (!(program.epsilon <= trust.ceiling * (1 + CEILING_RTOL)))
    throw new StateRejected("over_ceiling", `state version ${version} costs epsilon = ` +
                            `${program.epsilon} per report, above this device's ceiling ` +
                            `${trust.ceiling}`);
  return { collection, version, issuedAt, expiresAt, mechanism, program,
           ...(typeof perDay === "number" ? { maxEpsilonPerDay: perDay } : {}) };
}
