// A Node device posting to the HTTP gateway through the package's fetch transport:
//   node dist/tools/post.js URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH]
// reads one JSON record ({"attr": "label", ...}) per line from stdin, prints
// {"sent": n, "batches": b} at the end.
import { FetchTransport } from "../src/index.js";
import { runRecords } from "./records.js";

const [url, token, collection, publicKey, deviceId, stateDir, batch] = process.argv.slice(2);
await runRecords(new FetchTransport(url, token), collection, publicKey, deviceId, stateDir, batch);
