/** ldpstream device SDK for browsers, Node and React Native (docs/device-protocol.md). */
export { DrawSource, OsRandom, SplitMix64, bernoulli, categorical, uniform } from "./rng.js";
export { Program, ProgramError, RecordValues, SchemaError, PROGRAM_VERSION } from "./program.js";
export { DEFAULT_CEILING, Reason, State, StateRejected, Trust, Verifier, acceptState,
         nobleVerify } from "./state.js";
export { FileStorage, IndexedDbStorage, Ledger, LocalStorage, MemoryStorage, Storage } from
  "./ledger.js";
export { BatchInput, encodeBatch } from "./batch.js";
export { Credential, authenticateBatch, deriveCredential, parseCredential } from "./identity.js";
export { Device, DeviceOptions, FetchTransport, ReportResult, Transport } from "./device.js";
