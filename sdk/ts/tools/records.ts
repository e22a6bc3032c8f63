// What the Node examples share (docs/device-protocol.md "Example programs"): a device over a
// transport reads one record per line from stdin, "attr=label,attr=label" as the C examples do
// (a JSON object {"attr": "label", ...} is read too), and prints {"sent": n, "batches": b}.
import { createInterface } from "node:readline";

import { Device, FileStorage, Ledger, Transport, Trust } from "../src/index.js";

/** A record line: "attr=label,attr=label" (empty fields skipped, like the C examples' strtok),
 * or a JSON object of labels. */
export function parseRecord(line: string, index: number): Record<string, string> {
  const text = line.replace(/[\r\n]+$/, "");
  if (text.trimStart().startsWith("{")) return JSON.parse(text) as Record<string, string>;
  const record: Record<string, string> = {};
  for (const field of text.split(",")) {
    if (!field) continue;
    const eq = field.indexOf("=");
    if (eq < 0) throw new Error(`record ${index}: bad record field '${field}' (want attr=label)`);
    record[field.slice(0, eq)] = field.slice(eq + 1);
  }
  return record;
}

/** The program's arguments, or its usage on stderr and exit status 2 when they are missing or
 * -h/--help is given. */
export function argsOrUsage(usage: string, required: number): string[] {
  const args = process.argv.slice(2);
  if (args.includes("-h") || args.includes("--help")) {
    console.log(usage);
    process.exit(0);
  }
  if (args.length < required) {
    console.error(usage);
    process.exit(2);
  }
  return args;
}

/** Runs ``main``; an error is one line on stderr and exit status 1 (no stack trace). */
export async function runMain(main: () => Promise<void>): Promise<void> {
  try {
    await main();
  } catch (exc) {
    console.error(`error: ${exc instanceof Error ? exc.message : String(exc)}`);
    process.exit(1);
  }
}

export async function runRecords(transport: Transport, collection: string, publicKey: string,
                                 deviceId: string, stateDir: string,
                                 batch: string | undefined): Promise<void> {
  if (!/^[0-9]+$/.test(deviceId)) throw new Error(`DEVICE_ID must be a whole number, got '${deviceId}'`);
  const batchSize = batch ? Number(batch) : 100;
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 1000)
    throw new Error(`BATCH must be 1 to 1000, got '${batch}'`);
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
                              transport: counting, batchSize });
  await device.refresh();
  let sent = 0, duplicates = 0;
  for await (const line of createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    const res = await device.report(parseRecord(line, sent + duplicates));
    if (res.status === "duplicate") {  // memoized: nothing sent, nothing spent
      duplicates++;
      continue;
    }
    if (res.status !== "queued") throw new Error(`record ${sent + duplicates}: ${res.reason}`);
    sent++;
  }
  await device.flush();
  console.log(JSON.stringify(duplicates ? { sent, batches, duplicates } : { sent, batches }));
}
