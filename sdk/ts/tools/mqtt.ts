// A Node device publishing over MQTT (docs/devices.md, "Devices over MQTT"):
//   LDP_MQTT_PASSWORD=... node dist/tools/mqtt.js MQTT_URL CA_FILE FLEET COLLECTION \
//       PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH]
// MQTT_URL is mqtts://USER@HOST:PORT (the broker's certificate checked against CA_FILE and
// HOST); reads the retained signed state, then one JSON record per line from stdin, publishes
// batches at QoS 1 and prints {"sent": n, "batches": b} at the end.
import { readFileSync } from "node:fs";

import { MqttTransport } from "../src/mqtt.js";
import { runRecords } from "./records.js";

const [url, caFile, fleet, collection, publicKey, deviceId, stateDir, batch] =
  process.argv.slice(2);
const mqtt = await MqttTransport.connect(url, fleet, {
  clientId: `${fleet}-${deviceId}`, password: process.env.LDP_MQTT_PASSWORD,
  ...(url.startsWith("mqtts:") ? { ca: readFileSync(caFile) } : {}) });
try {
  await runRecords(mqtt, collection, publicKey, deviceId, stateDir, batch);
} finally {
  await mqtt.close();
}
