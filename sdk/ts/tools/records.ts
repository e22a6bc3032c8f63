// What the Node examples share: a device over a transport reads one JSON record
// ({"attr": "label", ...}) per line from stdin and prints {"sent": n, "batches": b}.
import { createInterface } from "node:readline";

import { Device, FileStorage, Ledger, Transport, Trust } from "../src/index.js";

export async function runRecords(transport: Transport, collection: string, publicKey: string,
                                 deviceId: string, stateDir: string,
                                 batch: string | undefined): Promise<void> {
  let batches = 0;
  const counting = {
    fetchState: (c: string) => transport.fetchState(c),
    send: async (c: string, b: Uint8Array<ArrayBuffer>) => {
      await transport.send(c, b);
      batches++;
    },
  };
  const device = new Device({ collection, deviceId: BigInt(deviceId), trust: new Trust(publicKey),
                              ledger: await Ledger.open(0, 0, new FileStorage(stateDir)),
                              transport: counting, batchSize: batch ? Number(batch) : 100 });
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
}
