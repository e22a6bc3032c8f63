// A Node device posting to the HTTP gateway through the package's fetch transport:
//   node dist/tools/post.js URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH]
// reads one JSON record ({"attr": "label", ...}) per line from stdin, prints
// {"sent": n, "batches": b} at the end.
import { createInterface } from "node:readline";

import { Device, FetchTransport, FileStorage, Ledger, Trust } from "../src/index.js";

const [url, token, collection, publicKey, deviceId, stateDir, batch] = process.argv.slice(2);
let batches = 0;
const http = new FetchTransport(url, token);
const transport = {
  fetchState: (c: string) => http.fetchState(c),
  send: async (c: string, b: Uint8Array<ArrayBuffer>) => {
    await http.send(c, b);
    batches++;
  },
};
const device = new Device({ collection, deviceId: BigInt(deviceId), trust: new Trust(publicKey),
                            ledger: await Ledger.open(0, 0, new FileStorage(stateDir)), transport,
                            batchSize: batch ? Number(batch) : 100 });
await device.refresh();
let sent = 0;
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const res = await device.report(JSON.parse(line));
  if (res.status !== "queued") throw new Error(`record ${sent}: ${res.reason}`);
  sent++;
}
await device.flush();
console.log(JSON.stringify({ sent, batches }));
