// What the Node examples share (docs/device-protocol.md "Example programs"): a device over a
// transport reads one record per line from stdin, "attr=label,attr=label" as the C examples do
// (a JSON object {"attr": "label", ...} is read too), and prints {"sent": n, "batches": b}.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";

import { Credential, Device, FileStorage, Ledger, RecordValues, Transport, Trust,
         parseCredential } from "../src/index.js";

/** A record line: "attr=label,attr=label" (empty fields skipped, like the C examples' strtok;
 * a numeric attribute's value as its text, "temp=21.5"), or a JSON object of labels (and
 * numbers). */
export function parseRecord(line: string, index: number): RecordValues {
  const text = line.replace(/[\r\n]+$/, "");
  if (text.trimStart().startsWith("{")) return JSON.parse(text) as RecordValues;
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
  return checkedArgs(usage, required, process.argv.slice(2));
}

function checkedArgs(usage: string, required: number, args: string[]): string[] {
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

/** The device programs' arguments: the positional ones as `argsOrUsage` checks them, and the
 * FILE of an optional `--credential FILE` (anywhere among them). */
export function deviceArgsOrUsage(usage: string, required: number):
    { args: string[]; credentialFile?: string } {
  const args = process.argv.slice(2);
  const at = args.indexOf("--credential");
  let credentialFile: string | undefined;
  if (at >= 0) {
    credentialFile = args[at + 1];
    if (credentialFile === undefined) {
      console.error("--credential needs a FILE");
      process.exit(2);
    }
    args.splice(at, 2);
  }
  return { args: checkedArgs(usage, required, args), credentialFile };
}

/** The credential `ldpstream device-credentials` printed, read from FILE and checked against
 * the program's DEVICE_ID (and FLEET, over MQTT); one line on stderr and exit status 2 when it
 * cannot be read or does not match. No FILE: undefined (batches carry no MAC). */
export function credentialOrExit(file: string | undefined, deviceId: string,
                                 fleet?: string): Credential | undefined {
  if (file === undefined) return undefined;
  try {
    const cred = parseCredential(readFileSync(file, "utf8"));
    if (!/^[0-9]+$/.test(deviceId) || cred.deviceId !== BigInt(deviceId) ||
        (fleet !== undefined && cred.fleet !== fleet)) {
      const ours = fleet === undefined ? `DEVICE_ID ${deviceId}`
        : `FLEET ${fleet} and DEVICE_ID ${deviceId}`;
      const theirs = fleet === undefined ? `${cred.deviceId}` : `${cred.fleet} and ${cred.deviceId}`;
      throw new Error(`${ours} ${fleet === undefined ? "is" : "are"} not the credential's ${theirs}`);
    }
    return cred;
  } catch (exc) {
    console.error(`credential ${file}: ${exc instanceof Error ? exc.message : String(exc)}`);
    process.exit(2);
  }
}

/** An error's message with the chain of its causes ("fetch failed: ... altnames ..."). */
function describe(exc: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = exc, depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    parts.push(e instanceof Error ? e.message : String(e));
    e = e instanceof Error ? (e as Error & { cause?: unknown }).cause : undefined;
  }
  return parts.join(": ");
}

/** Runs ``main``; an error is one line on stderr with its causes (a TLS refusal names the
 *  certificate's problem) and exit status 1, no stack trace. */
export async function runMain(main: () => Promise<void>): Promise<void> {
  try {
    await main();
  } catch (exc) {
    console.error(`error: ${describe(exc)}`);
    process.exit(1);
  }
}

export async function runRecords(transport: Transport, collection: string, publicKey: string,
                                 deviceId: string, stateDir: string,
                                 batch: string | undefined,
                                 credential?: Credential): Promise<void> {
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
                              transport: counting, batchSize,
                              ...(credential ? { credential } : {}) });
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
  console.log(JSON.stringify({ sent, batches, ...(duplicates ? { duplicates } : {}),
                               ...(device.clipped.size ? { clipped: Object.fromEntries(device.clipped) } : {}) }));
}
