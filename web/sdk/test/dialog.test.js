// DialogState: ordering, dedupe and gap detection without a server.
import { test, mock } from "node:test";
import assert from "node:assert/strict";
import { DialogState, MAX_AHEAD } from "../dialog.js";
import { advisedDelay, backoffDelay, PresenceOrder, refreshDelay, REFRESH_AHEAD_MS, serverClockOffset, subscribeRetryDelay } from "../realtime.js";
import { ApiError } from "../errors.js";
import { Rest, REQUEST_TIMEOUT_MS, RETRY_AFTER_JITTER_MS, retryDelay, Tokens } from "../rest.js";

/** @param {number} seq */
const msg = (seq) => ({ id: `m${seq}`, dialogId: "d", seq, senderId: "u", body: `b${seq}`, createdAt: 0, attachments: [] });

test("messages in order are delivered at once, duplicates dropped", () => {
  const d = new DialogState(0);
  assert.deepEqual(d.offer(msg(1)).map((m) => m.seq), [1]);
  assert.deepEqual(d.offer(msg(1)), []);
  assert.deepEqual(d.offer(msg(2)).map((m) => m.seq), [2]);
  assert.equal(d.known, 2);
  assert.equal(d.hasGap, false);
});

test("a seq jump is held back as a gap until the missing seq arrives", () => {
  const d = new DialogState(3);
  assert.deepEqual(d.offer(msg(6)), []);
  assert.equal(d.hasGap, true);
  assert.deepEqual(d.offer(msg(5)), []);
  assert.deepEqual(d.offer(msg(4)).map((m) => m.seq), [4, 5, 6]);
  assert.equal(d.known, 6);
  assert.equal(d.hasGap, false);
});

test("before lastSeq is known everything waits; then what follows it is delivered", () => {
  const d = new DialogState(null);
  assert.deepEqual(d.offer(msg(7)), []);
  assert.deepEqual(d.offer(msg(8)), []);
  d.known = 7;
  assert.deepEqual(d.drain().map((m) => m.seq), [8]);
});

test("retry and reconnect delays honour the server's advice", () => {
  assert.equal(advisedDelay('{"retryMs":1234}'), 1234);
  assert.equal(advisedDelay("going away"), null);
  assert.equal(retryDelay(new ApiError("dialog_busy", 503, 1000), 1, () => 0), 1000);
  assert.equal(retryDelay(new ApiError("dialog_busy", 503, 1000), 1, () => 1), 1000 + RETRY_AFTER_JITTER_MS);
  assert.equal(retryDelay(new ApiError("dialog_busy", 503, 3600e3), 1, () => 0), 60000, "a Retry-After is followed up to a minute");
  const d = retryDelay(new ApiError("network_error", 0), 3, () => 1);
  assert.equal(d, 1600);
  assert.equal(backoffDelay(0, () => 1), 500);
  assert.equal(backoffDelay(20, () => 1), 30000);
  assert.equal(refreshDelay(10 * REFRESH_AHEAD_MS, 0), 9 * REFRESH_AHEAD_MS);
  assert.equal(refreshDelay(1000, 0), 0);
  assert.equal(serverClockOffset(1_800_000_600_000, 1_800_000_000_000), 600_000, "the server's clock 10 min ahead");
  assert.equal(serverClockOffset(1_800_000_000_000, 1_800_000_600_000), -600_000, "the server's clock 10 min behind");
  for (const v of [-1, Infinity, NaN, 1e300, "1", null, undefined]) assert.equal(serverClockOffset(v, 0), null, String(v));
  for (const v of [0, 1_800_000_000, 1_800_000_000_000_000]) assert.equal(serverClockOffset(v, 1_800_000_000_000), null, `${v}: a year and more off`);
  assert.equal(serverClockOffset(1_800_000_600_000, 1_800_000_000_400, 800), 600_000, "half of an 800 ms round trip added");
  assert.equal(serverClockOffset(1_800_000_600_000, 1_800_000_060_000, 60000), 540_000, "a 60 s round trip is no measure of the network");
  assert.equal(subscribeRetryDelay(0, () => 0), 500);
  assert.equal(subscribeRetryDelay(0, () => 1), 1000);
  assert.equal(subscribeRetryDelay(40, () => 1), 30000);
});

test("retryable errors are the ones a repeat with the same key may fix", () => {
  assert.equal(new ApiError("network_error", 0).retryable, true);
  assert.equal(new ApiError("dialog_busy", 503).retryable, true);
  assert.equal(new ApiError("idempotency_in_progress", 409).retryable, true);
  // A signed upload refused while an earlier upload of the same attachment
  // (one whose answer was lost) is still being received: come back later.
  assert.equal(new ApiError("upload_in_progress", 409).retryable, true);
  assert.equal(new ApiError("idempotency_key_reused", 409).retryable, false);
  assert.equal(new ApiError("invalid_body", 400).retryable, false);
});

test("a presence transition older than the last one reported for its user is dropped", () => {
  const o = new PresenceOrder(2);
  assert.equal(o.accept("u1", 1000), true); // online
  assert.equal(o.accept("u1", 3000), true); // online again, announced first by another instance
  assert.equal(o.accept("u1", 2000), false); // the offline in between, arriving late
  assert.equal(o.accept("u1", 3000), true);
  assert.equal(o.accept("u2", 10), true);
  assert.equal(o.accept("u3", 10), true); // u1 is the longest unseen: forgotten
  assert.equal(o.accept("u1", 5), true);
  assert.equal(o.accept("u3", 9), false);
});

test("history paging ends when a page's cursor is missing or does not move on", async () => {
  for (const cursor of [undefined, "same"]) {
    let calls = 0;
    /** @type {typeof fetch} */
    const fetchImpl = async () => {
      calls++;
      const page = cursor === undefined ? { items: [msg(calls)] } : { items: [msg(calls)], nextCursor: cursor };
      return new Response(JSON.stringify(page), { status: 200, headers: { "Content-Type": "application/json" } });
    };
    const rest = new Rest("http://api.invalid", new Tokens(() => "token"), fetchImpl);
    let pages = 0;
    for await (const items of rest.historyPages("d", { afterSeq: 0 })) {
      assert.equal(items.length, 1);
      if (++pages >= 20) break;
    }
    assert.ok(calls <= 2, `cursor ${cursor}: ${calls} requests`);
  }
});

test("a close reason's retryMs is advice only when it is a number of ms from 0 to 5 min", () => {
  assert.equal(advisedDelay('{"retryMs":-5}'), null);
  assert.equal(advisedDelay('{"retryMs":"NaN"}'), null);
  assert.equal(advisedDelay('{"retryMs":"1000"}'), null);
  assert.equal(advisedDelay('{"retryMs":null}'), null);
  assert.equal(advisedDelay("null"), null);
  assert.equal(advisedDelay('{"retryMs":1e300}'), 5 * 60000);
  assert.equal(advisedDelay('{"retryMs":0}'), 0);
});

test("messages held behind a gap are at most MAX_AHEAD; the ones kept follow the gap", () => {
  const d = new DialogState(0);
  for (let seq = 2; seq <= MAX_AHEAD + 5000; seq++) d.offer(msg(seq));
  assert.ok(d.ahead.size <= MAX_AHEAD, `${d.ahead.size} held`);
  const out = d.offer(msg(1));
  const known = d.known ?? 0;
  assert.equal(out.length, known);
  assert.ok(out.every((m, i) => m.seq === i + 1), "delivered in seq order from 1");
  assert.ok(known >= MAX_AHEAD - 1, `delivered through ${known}`);
});

test("a send whose try gets no answer is tried again after REQUEST_TIMEOUT_MS with the same Idempotency-Key", async () => {
  mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_000_000 });
  try {
    /** @type {string[]} */
    const keys = [];
    /** @type {typeof fetch} */
    const fetchImpl = async (_url, init) => {
      keys.push(new Headers(init?.headers).get("Idempotency-Key") || "");
      if (keys.length === 1) {
        // A connection black-holed after a network switch: no answer, and
        // the abort is the only way out.
        return new Promise((_, reject) => init?.signal?.addEventListener("abort", () => reject(init.signal?.reason)));
      }
      return new Response(JSON.stringify(msg(1)), { status: 201, headers: { "Content-Type": "application/json" } });
    };
    const rest = new Rest("http://api.invalid", new Tokens(() => "token"), fetchImpl);
    let done = false;
    const sent = rest.send("d", "hello").finally(() => { done = true; });
    const settle = async () => { for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r)); };
    await settle();
    mock.timers.tick(REQUEST_TIMEOUT_MS - 1);
    await settle();
    assert.equal(keys.length, 1, "still waiting for the first try");
    for (let t = 0; t < 10000 && !done; t += 100) {
      mock.timers.tick(100);
      await settle();
    }
    assert.ok(done, `the send has not ended ${REQUEST_TIMEOUT_MS + 10000} ms after it began (${keys.length} tries)`);
    const res = await sent;
    assert.equal(res.message.seq, 1);
    assert.equal(keys.length, 2, "a second try");
    assert.equal(keys[1], keys[0], "with the same key");
    assert.equal(res.idempotencyKey, keys[0]);
  } finally {
    mock.timers.reset();
  }
});

test("a send that fails after its tries names its Idempotency-Key, so sending it again with that key writes the message at most once", async () => {
  /** @type {string[]} */
  const keys = [];
  let up = false;
  /** @type {Map<string, any>} */
  const written = new Map(); // key → message: the server's idempotency record
  /** @type {typeof fetch} */
  const fetchImpl = async (_url, init) => {
    const key = new Headers(init?.headers).get("Idempotency-Key") || "";
    keys.push(key);
    // The first try commits, and its answer is lost like every other while
    // the network is down.
    if (!written.has(key)) written.set(key, msg(written.size + 1));
    if (!up) throw new TypeError("fetch failed");
    return new Response(JSON.stringify(written.get(key)), { status: 201, headers: { "Content-Type": "application/json" } });
  };
  const rest = new Rest("http://api.invalid", new Tokens(() => "token"), fetchImpl);
  const err = await rest.send("d", "hello", { attempts: 2, onRetry: () => {} }).then(() => null, (e) => e);
  assert.ok(err instanceof ApiError && err.code === "network_error", `the send failed: ${err}`);
  assert.equal(err.idempotencyKey, keys[0], "the error names the key its tries used");
  up = true;
  const again = await rest.send("d", "hello", { idempotencyKey: err.idempotencyKey });
  assert.equal(again.message.seq, 1, "the message the first try wrote");
  assert.equal(written.size, 1, "written once");
});
