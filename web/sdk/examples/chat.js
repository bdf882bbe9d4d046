// A terminal chat in Node 20: follows one dialog and sends each typed line.
//   HAN_URL=http://localhost:8080 HAN_TOKEN=<user JWT> HAN_DIALOG=<dialog id> node examples/chat.js
import { createInterface } from "node:readline";
import { WebSocket } from "ws";
import { HanClient, CloseError } from "../index.js";

const { HAN_URL = "http://localhost:8080", HAN_TOKEN = "", HAN_DIALOG = "" } = process.env;
const han = new HanClient({
  baseUrl: HAN_URL,
  auth: "bearer", // browsers: the default "ticket", and no WebSocket option
  WebSocket: /** @type {any} */ (WebSocket),
  getToken: async () => HAN_TOKEN, // return a fresh token here when yours can expire
});
han.on("state", (s) => console.error(`[${s.phase}${s.reason ? ` ${s.reason}` : ""}]`));
han.on("message", ({ message }) => console.log(`#${message.seq} ${message.senderId.slice(0, 8)}: ${message.body}`));
han.on("typing", ({ userId }) => console.error(`${userId.slice(0, 8)} is typing…`));
han.on("error", (e) => { if (!(e instanceof CloseError)) console.error(`error: ${e.message}`); });

const { items } = await han.history(HAN_DIALOG, { afterSeq: 0, limit: 20 });
for (const m of items) console.log(`#${m.seq} ${m.senderId.slice(0, 8)}: ${m.body}`);
han.subscribe(HAN_DIALOG, { sinceSeq: items.at(-1)?.seq ?? 0 }); // delivery resumes after what we printed
han.connect();
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim()) await han.send(HAN_DIALOG, line); // retried with one Idempotency-Key
}
han.close();
