// A Node device publishing over MQTT (docs/devices.md "Devices over MQTT"; the C twin is
// sdk/c/examples/mqtt.c).
import { readFileSync } from "node:fs";

import { MqttTransport } from "../src/mqtt.js";
import { credentialOrExit, deviceArgsOrUsage, runMain, runRecords } from "./records.js";

const USAGE = `usage: LDP_MQTT_PASSWORD=... node dist/tools/mqtt.js [--credential FILE] MQTT_URL CA_FILE FLEET COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH] < records

  MQTT_URL        mqtts://USER@HOST:PORT (TLS, the broker's certificate checked against CA_FILE
                  and HOST) or mqtt://USER@HOST:PORT (loopback only, e.g. make up MQTT=1)
  CA_FILE         the broker's CA certificate (PEM); ignored for mqtt:// (pass -)
  FLEET           the fleet the user belongs to (topics ldp/FLEET/COLLECTION/...)
  COLLECTION      the collection id, e.g. adult
  PUBLIC_KEY_B64  the pinned public key that signs the collection's state
  DEVICE_ID       this device's id, a whole number (client id FLEET-DEVICE_ID)
  STATE_DIR       directory of the device's ledger (ε spent, memoized answers, batch sequence)
  BATCH           reports per batch, 1 to 1000 (default 100)
  --credential FILE
                  the device's credential, the JSON \`ldpstream device-credentials\` printed:
                  every batch is authenticated with its key (docs/security.md "Per-device
                  identity"); FLEET and DEVICE_ID must be the credential's

The password comes from LDP_MQTT_PASSWORD (kept out of the process list). Reads the retained
signed state, then one record per line from stdin, attr=label,attr=label (e.g. os=ios,plan=pro),
publishes batches at QoS 1 and prints {"sent": n, "batches": b} at the end ("duplicates": d when
memoized records were already sent). Run from sdk/ts after npm run build.`;

const { args, credentialFile } = deviceArgsOrUsage(USAGE, 7);
const [url, caFile, fleet, collection, publicKey, deviceId, stateDir, batch] = args;
const credential = credentialOrExit(credentialFile, deviceId, fleet);
await runMain(async () => {
  const mqtt = await MqttTransport.connect(url, fleet, {
    clientId: `${fleet}-${deviceId}`, password: process.env.LDP_MQTT_PASSWORD,
    ...(url.startsWith("mqtts:") ? { ca: readFileSync(caFile) } : {}) });
  try {
    await runRecords(mqtt, collection, publicKey, deviceId, stateDir, batch, credential);
  } finally {
    await mqtt.close();
  }
});
