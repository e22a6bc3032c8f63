/** The MQTT transport (docs/devices.md, "Devices over MQTT"): batches are published at QoS 1
 * to ldp/<fleet>/<collection>/reports, the signed state is read retained from
 * ldp/<fleet>/<collection>/config. Imported as "@ldpstream/device/mqtt" (Node; the npm mqtt
 * package), so browser bundles of the SDK do not carry it. */
import mqtt from "mqtt";
import type { IClientOptions, MqttClient } from "mqtt";

import type { Transport } from "./device.js";

/** the broker keeps a disconnected device's session (its unacknowledged batches) 7 days */
export const SESSION_EXPIRY_S = 604_800;
const RECONNECT_MS = 1000;

export const reportsTopic = (fleet: string, collection: string): string =>
  `ldp/${fleet}/${collection}/reports`;
export const configTopic = (fleet: string, collection: string): string =>
  `ldp/${fleet}/${collection}/config`;

/** A connected MQTT client speaking for one fleet (its user name on the broker). */
export class MqttTransport implements Transport {
  private constructor(readonly client: MqttClient, readonly fleet: string,
                      private readonly timeoutMs: number) {}

  /** Connect with MQTT 5 and a persistent session (options override: clientId, username,
   * password, ca for mqtts:// — the broker's host name is checked against its certificate). */
  static async connect(url: string, fleet: string, options: IClientOptions = {},
                       timeoutMs = 30_000): Promise<MqttTransport> {
    // the first connection fails at once (wrong password, TLS); after it, a dropped connection
    // is retried every second and unacknowledged QoS 1 batches are sent again
    const client = await mqtt.connectAsync(url, {
      protocolVersion: 5, clean: false, properties: { sessionExpiryInterval: SESSION_EXPIRY_S },
      connectTimeout: timeoutMs, reconnectPeriod: 0, ...options }, false);
    client.options.reconnectPeriod = options.reconnectPeriod ?? RECONNECT_MS;
    return new MqttTransport(client, fleet, timeoutMs);
  }

  /** The retained signed state of the collection (re-subscribed each call, so the broker sends
   * the retained message again). */
  fetchState(collection: string): Promise<string> {
    const topic = configTopic(this.fleet, collection);
    return new Promise<string>((resolve, reject) => {
      const done = (error: Error | null, text = ""): void => {
        clearTimeout(timer);
        this.client.off("message", onMessage);
        this.client.unsubscribeAsync(topic).catch(() => undefined);
        if (error) reject(error);
        else resolve(text);
      };
      const onMessage = (t: string, payload: Buffer): void => {
        if (t === topic) done(null, payload.toString("utf8"));
      };
      const timer = setTimeout(() => done(new Error(`no retained state on ${topic} within ` +
                                                    `${this.timeoutMs} ms`)), this.timeoutMs);
      this.client.on("message", onMessage);
      this.client.subscribeAsync(topic, { qos: 1 }).then((grants) => {
        if (grants.some((g) => g.qos >= 0x80))  // an MQTT 5 failure reason (not authorized)
          done(new Error(`the broker refused the subscription to ${topic}`));
      }, (e: Error) => done(e));
    });
  }

  /** Publish one batch at QoS 1; resolves on the PUBACK, rejects on a failure reason. */
  async send(collection: string, batch: Uint8Array<ArrayBuffer>): Promise<void> {
    await this.client.publishAsync(reportsTopic(this.fleet, collection),
                                   Buffer.from(batch.buffer, batch.byteOffset, batch.byteLength),
                                   { qos: 1 });
  }

  async close(): Promise<void> {
    await this.client.endAsync();
  }
}
