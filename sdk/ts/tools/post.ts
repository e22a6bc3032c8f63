// A Node device posting to the HTTP gateway through the package's fetch transport
// (docs/device-protocol.md "Example programs"; the C twin is sdk/c/examples/post.c).
import { FetchTransport } from "../src/index.js";
import { credentialOrExit, deviceArgsOrUsage, runMain, runRecords } from "./records.js";

const USAGE = `usage: node dist/tools/post.js [--credential FILE] URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH] < records

  URL             the gateway, e.g. http://127.0.0.1:8080 (https: trusts NODE_EXTRA_CA_CERTS too)
  TOKEN           the fleet's bearer token (LDP_GATEWAY_TOKENS of the gateway)
  COLLECTION      the collection id, e.g. adult
  PUBLIC_KEY_B64  the pinned public key that signs the collection's state
  DEVICE_ID       this device's id, a whole number (with --credential: the credential's)
  STATE_DIR       directory of the device's ledger (ε spent, memoized answers, batch sequence)
  BATCH           reports per batch, 1 to 1000 (default 100)
  --credential FILE
                  the device's credential, the JSON \`ldpstream device-credentials\` printed:
                  every batch is authenticated with its key (docs/security.md "Per-device
                  identity"); without it batches carry no MAC

Reads one record per line from stdin, attr=label,attr=label (e.g. os=ios,plan=pro), and prints
{"sent": n, "batches": b} at the end ("duplicates": d when memoized records were already sent).
Run from sdk/ts after npm run build.`;

const { args, credentialFile } = deviceArgsOrUsage(USAGE, 6);
const [url, token, collection, publicKey, deviceId, stateDir, batch] = args;
const credential = credentialOrExit(credentialFile, deviceId);
await runMain(() => runRecords(new FetchTransport(url, token), collection, publicKey, deviceId,
                               stateDir, batch, credential));
