// The SDK against a real gateway (started by the Go test TestJavaScriptSDK).
// One file, so the tests run one after another: the last ones restart the
// instance.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { WebSocket } from "ws";
import { ApiError, CloseError, HanClient } from "../index.js";
import { CONNECT_TIMEOUT_MS } from "../realtime.js";
import { spawn } from "node:child_process";
import { client, control, env, newUser, token, next, pair, recordMessages, until } from "./helpers.js";

/** @type {import("../index.js").HanClient[]} */
const open = [];
after(() => { for (const c of open) c.close(); });

/** @param {import("../index.js").HanClient} c */
function connect(c) {
  open.push(c);
  c.connect();
}

/** @param {number[]} seqs */
const range = (seqs) => seqs.join(",");

test("bearer: a subscribed client gets every message once, in order", async () => {
  const { alice, bob, dialog } = await pair();
  const got = recordMessages(bob);
  connect(bob);
  bob.subscribe(dialog.id);
  const sub = await next(bob, "subscribed", (s) => s.dialogId === dialog.id);
  assert.equal(sub.lastSeq, 0);
  for (let i = 1; i <= 3; i++) await alice.send(dialog.id, `hello ${i}`);
  await until(() => got.length >= 3, 10000, "three messages");
  assert.equal(range(got.map((m) => m.seq)), "1,2,3");
  assert.deepEqual(got.map((m) => m.body), ["hello 1", "hello 2", "hello 3"]);
  assert.equal(bob.realtime.known(dialog.id), 3);
});

test("send keeps its Idempotency-Key: a repeat is replayed, not stored twice", async () => {
  const { alice, dialog } = await pair();
  const first = await alice.send(dialog.id, "once");
  assert.equal(first.replayed, false);
  assert.match(first.idempotencyKey, /^[0-9a-f-]{36}$/);
  const again = await alice.send(dialog.id, "once", { idempotencyKey: first.idempotencyKey });
  assert.equal(again.replayed, true);
  assert.equal(again.message.id, first.message.id);
  const page = await alice.history(dialog.id, { afterSeq: 0 });
  assert.equal(page.items.length, 1);
});

test("errors carry the API's codes", async () => {
  const { alice, dialog } = await pair();
  await assert.rejects(alice.send(dialog.id, "   "), (e) => e instanceof ApiError && e.code === "invalid_body" && e.status === 400);
  await assert.rejects(alice.history("00000000-0000-4000-8000-000000000000"),
    (e) => e instanceof ApiError && e.code === "dialog_not_found" && e.status === 404);
  await assert.rejects(alice.send(dialog.id, "x", { idempotencyKey: "k".repeat(256) }),
    (e) => e instanceof ApiError && e.code === "invalid_idempotency_key");
});

test("history pages follow nextCursor to the end", async () => {
  const { alice, dialog } = await pair();
  for (let i = 1; i <= 5; i++) await alice.send(dialog.id, `m${i}`);
  const pages = [];
  for await (const items of alice.historyPages(dialog.id, { afterSeq: 1, limit: 2 })) pages.push(items.map((m) => m.seq));
  assert.deepEqual(pages, [[2, 3], [4, 5]]);
});

test("subscribe with sinceSeq: the server replays what was missed (no REST call), then live", async () => {
  const { alice, bob, dialog } = await pair();
  for (let i = 1; i <= 4; i++) await alice.send(dialog.id, `early ${i}`);
  const got = recordMessages(bob);
  connect(bob);
  bob.subscribe(dialog.id, { sinceSeq: 1 });
  await until(() => got.length >= 3, 10000, "missed messages");
  assert.equal(range(got.map((m) => m.seq)), "2,3,4");
  for (const m of got) assert.equal(m.source, "recovered", `seq ${m.seq} came ${m.source}, not from the server's recovery`);
  await alice.send(dialog.id, "live 5");
  await until(() => got.length >= 4, 10000, "the live message");
  assert.equal(range(got.map((m) => m.seq)), "2,3,4,5");
  assert.equal(got[3].source, "live");
});

test("a seq gap (a lost publish) is filled over REST after the grace period", async () => {
  const { alice, aliceId, bob, dialog } = await pair();
  const got = recordMessages(bob);
  connect(bob);
  bob.subscribe(dialog.id);
  await next(bob, "subscribed", (s) => s.dialogId === dialog.id);
  await alice.send(dialog.id, "one");
  await until(() => got.length >= 1, 10000, "the first message");
  const seq = await control(`/commit-unpublished?dialog=${dialog.id}&sender=${aliceId}&body=two`);
  assert.equal(seq, "2");
  await alice.send(dialog.id, "three");
  await until(() => got.length >= 3, 10000, "the gap filled");
  assert.deepEqual(got.map((m) => m.body), ["one", "two", "three"]);
  assert.equal(got[1].source, "rest");
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(got.length, 3, "nothing twice");
});

test("resync after the server's Pub/Sub link came back: every dialog is reconciled", async () => {
  const { alice, bob, dialog } = await pair();
  const got = recordMessages(bob);
  connect(bob);
  bob.subscribe(dialog.id);
  await next(bob, "subscribed", (s) => s.dialogId === dialog.id);
  await alice.send(dialog.id, "before");
  await until(() => got.length >= 1, 10000, "the first message");
  const resync = next(bob, "resync", () => true, 30000);
  await control("/restart-realtime-redis");
  assert.equal((await resync).reason, "pubsub_reconnect");
  await alice.send(dialog.id, "after", { attempts: 10 });
  await until(() => got.length >= 2, 10000, "the message after the resync");
  assert.deepEqual(got.map((m) => m.body), ["before", "after"]);
});

test("ticket auth: typing reaches the other member, presence is readable", async () => {
  const { alice, bob, bobId, dialog } = await pair({ auth: "ticket" });
  const subscribed = [alice, bob].map((c) => next(c, "subscribed", (s) => s.dialogId === dialog.id));
  connect(alice);
  connect(bob);
  alice.subscribe(dialog.id);
  bob.subscribe(dialog.id);
  await Promise.all(subscribed);
  const typing = next(alice, "typing", (e) => e.userId === bobId);
  bob.typing(dialog.id);
  assert.equal((await typing).dialogId, dialog.id);
  const p = await until(async () => { const v = await alice.presence(bobId); return v.online ? v : null; }, 10000, "bob online");
  assert.ok(p && p.connections >= 1);
});

test("in-band refresh: a token about to expire is replaced without reconnecting", async () => {
  // A 65 s token: the client asks for a new one 60 s before its exp.
  const { alice, aliceAsked } = await pair({ ttlSec: 65 });
  const opened = [];
  alice.on("open", (h) => opened.push(h));
  connect(alice);
  const hello = await next(alice, "open");
  const refreshed = await next(alice, "refreshed", () => true, 20000);
  assert.ok(refreshed.expiresAt > hello.expiresAt, "the expiry moved forward");
  assert.ok(aliceAsked.includes("expiring"));
  assert.equal(opened.length, 1, "no reconnect");
});

test("without a token the client stops with unauthorized instead of looping", async () => {
  const c = new HanClient({ baseUrl: env.api, realtimeUrl: env.realtime, WebSocket: /** @type {any} */ (WebSocket), getToken: () => null });
  const err = next(c, "error");
  connect(c);
  const e = await err;
  assert.ok(e instanceof ApiError && e.code === "unauthorized" && e.status === 401, String(e));
  assert.equal(c.realtime.state.phase, "stopped");
});

test("a user following 150 dialogs stays live: subscribes keep under the server's frame rate", async () => {
  const bobId = newUser();
  const dialogIds = JSON.parse(await control(`/dialogs?n=150&owner=${newUser()}&member=${bobId}`));
  const { c: bob } = client(bobId);
  /** @type {string[]} */
  const closes = [];
  bob.on("error", (e) => { if (e instanceof CloseError) closes.push(`${e.code} ${e.reason}`); });
  const subscribed = new Set();
  bob.on("subscribed", (s) => subscribed.add(s.dialogId));
  // 100 followed before the connection (sent after hello), 50 more once live.
  for (const id of dialogIds.slice(0, 100)) bob.subscribe(id, { sinceSeq: 0 });
  const open = next(bob, "open");
  connect(bob);
  await open;
  for (const id of dialogIds.slice(100)) bob.subscribe(id, { sinceSeq: 0 });
  await until(() => subscribed.size === dialogIds.length || closes.length > 0, 30000, "every dialog subscribed, or a close");
  await new Promise((r) => setTimeout(r, 1000));
  assert.deepEqual(closes, [], `closed; state ${JSON.stringify(bob.realtime.state)}`);
  assert.equal(bob.realtime.state.phase, "live");
  assert.equal(subscribed.size, dialogIds.length);
});

test("a ticket refused with 403 (a service token) stops the client instead of retrying", async () => {
  const svc = await control(`/token?sub=${newUser()}&kind=service`);
  const c = new HanClient({ baseUrl: env.api, realtimeUrl: env.realtime, WebSocket: /** @type {any} */ (WebSocket),
    headers: { Origin: env.origin }, getToken: () => svc });
  /** @type {string[]} */
  const phases = [];
  c.on("state", (s) => phases.push(s.phase));
  const err = next(c, "error");
  connect(c);
  const e = await err;
  assert.ok(e instanceof ApiError && e.status === 403, String(e));
  await new Promise((r) => setTimeout(r, 3000));
  assert.deepEqual(c.realtime.state, { phase: "stopped", reason: e.code });
  assert.equal(phases.filter((p) => p === "connecting").length, 1, `one attempt: ${phases.join(" → ")}`);
});

test("a connection whose hello never comes (a hung path) is given up after the connect timeout and retried", async () => {
  const bobId = newUser();
  const before = Number(await control("/stalled"));
  const c = new HanClient({ baseUrl: env.api, realtimeUrl: /** @type {string} */ (process.env.HAN_SDK_STALL_URL), auth: "bearer",
    WebSocket: /** @type {any} */ (WebSocket), getToken: () => token(bobId) });
  /** @type {CloseError[]} */
  const closes = [];
  c.on("error", (e) => { if (e instanceof CloseError) closes.push(e); });
  const start = Date.now();
  connect(c);
  await until(async () => Number(await control("/stalled")) >= before + 2, CONNECT_TIMEOUT_MS + 5000, "a second attempt");
  const took = Date.now() - start;
  assert.ok(took >= CONNECT_TIMEOUT_MS - 500, `the first attempt was given up after ${took} ms`);
  assert.ok(closes.some((e) => e.code === 4000 && e.reason === "no hello"), closes.map(String).join(", "));
  c.close();
});

test("the documented example prints the dialog and sends what is typed", async () => {
  const { alice, aliceId, dialog } = await pair();
  await alice.send(dialog.id, "already there");
  const tok = await token(aliceId);
  const child = spawn(process.execPath, ["examples/chat.js"], {
    cwd: new URL("..", import.meta.url),
    env: { ...process.env, HAN_URL: env.api, HAN_TOKEN: tok, HAN_DIALOG: dialog.id },
  });
  let out = "";
  child.stdout.on("data", (b) => { out += b; });
  child.stderr.on("data", (b) => { out += b; });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  try {
    await until(() => out.includes("[live]"), 20000, "the example to connect");
    child.stdin.end("typed in the example\n");
    const code = await Promise.race([exited, new Promise((r) => { timer = setTimeout(() => r("did not exit within 15 s"), 15000); })]);
    assert.equal(code, 0, out);
  } finally {
    clearTimeout(timer);
    child.kill(); // a failed wait must not leave it holding this file's process open
  }
  assert.match(out, /#1 [0-9a-f]{8}: already there/);
  const page = await alice.history(dialog.id);
  assert.deepEqual(page.items.map((m) => m.body), ["already there", "typed in the example"]);
});

test("after an instance restart the client reconnects, resubscribes and misses nothing", async () => {
  const { alice, bob, dialog } = await pair();
  const got = recordMessages(bob);
  const opens = [];
  bob.on("open", (h) => opens.push(h));
  /** @type {number[]} */
  const closes = [];
  bob.on("error", (e) => { if (e instanceof CloseError) closes.push(e.code); });
  connect(bob);
  bob.subscribe(dialog.id);
  await next(bob, "subscribed", (s) => s.dialogId === dialog.id);
  await alice.send(dialog.id, "before");
  await until(() => got.length >= 1, 10000, "the first message");

  await control("/restart");
  // Sent while bob waits to reconnect (the drain asks for 0.5–5 s).
  await alice.send(dialog.id, "during 1", { attempts: 10 });
  await alice.send(dialog.id, "during 2", { attempts: 10 });
  await until(() => opens.length >= 2, 20000, "the reconnect");
  await next(bob, "subscribed", (s) => s.dialogId === dialog.id, 10000).catch(() => null);
  await alice.send(dialog.id, "after");
  await until(() => got.length >= 4, 15000, "every message");
  assert.equal(range(got.map((m) => m.seq)), "1,2,3,4");
  assert.deepEqual(got.map((m) => m.body), ["before", "during 1", "during 2", "after"]);
  assert.ok(closes.includes(1001), `closed with 1001 by the drain, got ${closes}`);
});

test("a send whose answer is lost in a restart is retried with its key: exactly one message", async () => {
  const { alice, bob, dialog } = await pair();
  const got = recordMessages(bob);
  connect(bob);
  bob.subscribe(dialog.id);
  await next(bob, "subscribed", (s) => s.dialogId === dialog.id);

  await control("/drop-next-send");
  /** @type {string[]} */
  const retries = [];
  const res = await alice.send(dialog.id, "exactly once", { attempts: 10, onRetry: (e) => retries.push(e.code) });
  assert.ok(retries.length >= 1 && retries[0] === "network_error", `retried after the lost answer: ${retries}`);
  assert.equal(res.replayed, true, "the retry was answered from the first attempt's record");

  const all = [];
  for await (const items of alice.historyPages(dialog.id)) all.push(...items);
  assert.deepEqual(all.map((m) => m.body), ["exactly once"]);
  assert.equal(all[0].id, res.message.id);
  // The subscriber, reconnected after the restart, holds it once too.
  await until(() => got.length >= 1, 20000, "the message at the subscriber");
  await new Promise((r) => setTimeout(r, 300));
  assert.deepEqual(got.map((m) => m.body), ["exactly once"]);
});
