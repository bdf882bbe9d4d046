// Realtime's connection handling without a server: a fake socket and mocked
// timers show what the client sends and when it gives up.
import { test, mock, afterEach } from "node:test";
import assert from "node:assert/strict";
import { ApiError, CloseError } from "../errors.js";
import { Tokens } from "../rest.js";
import { WebSocket, WebSocketServer } from "ws";
import { CONNECT_TIMEOUT_MS, FrameBudget, MAX_FRAME_BYTES, Realtime, SUBPROTOCOL, SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC } from "../realtime.js";

// The server's inbound budget (docs/realtime-protocol.md, "Limits").
const SERVER_BURST = 60;
const SERVER_PER_SEC = 20;

class FakeSocket {
  /** @type {FakeSocket[]} */
  static all = [];
  readyState = 1;
  /** @type {{at: number, frame: any}[]} */
  sent = [];
  /** @type {{code?: number, reason?: string} | null} */
  closed = null;
  /** @type {((ev: {data: any}) => void) | null} */
  onmessage = null;
  /** @type {((ev: {code: number, reason: string}) => void) | null} */
  onclose = null;
  /** @type {((ev: any) => void) | null} */
  onerror = null;

  constructor() {
    FakeSocket.all.push(this);
  }

  /** @param {string} data */
  send(data) {
    this.sent.push({ at: Date.now(), frame: JSON.parse(data) });
  }

  /**
   * @param {number} [code]
   * @param {string} [reason]
   */
  close(code, reason) {
    this.closed = { code, reason };
    this.readyState = 3;
  }

  hello() {
    this.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 3600e3 }) });
  }

  /** @param {string} type */
  frames(type) {
    return this.sent.filter((s) => s.frame.type === type);
  }
}

/** lets the client's pending promises (token, ticket) settle; setImmediate is not mocked */
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

/**
 * @param {{auth?: "ticket" | "bearer", ticket?: () => Promise<any>}} [opts]
 */
function realtime(opts = {}) {
  const tokens = new Tokens(() => "token");
  const rest = /** @type {any} */ ({ ticket: opts.ticket || (async () => ({ ticket: "t", expiresAt: 0 })) });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: opts.auth || "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
  /** @type {any[]} */
  const states = [];
  /** @type {Error[]} */
  const errors = [];
  rt.on("state", (s) => states.push(s));
  rt.on("error", (e) => errors.push(e));
  return { rt, states, errors };
}

/** @param {number} n */
const ids = (n) => Array.from({ length: n }, (_, i) => `d${i}`);

/**
 * serverRoom: the fewest frames the server's bucket held in reserve while
 * these frames arrived (below 0: the server closed with 1008 frame rate).
 * @param {{at: number}[]} sent
 */
function serverRoom(sent) {
  let tokens = SERVER_BURST;
  let at = sent.length ? sent[0].at : 0;
  let least = tokens;
  for (const s of sent) {
    tokens = Math.min(SERVER_BURST, tokens + ((s.at - at) * SERVER_PER_SEC) / 1000) - 1;
    at = s.at;
    least = Math.min(least, tokens);
  }
  return least;
}

afterEach(() => {
  mock.timers.reset();
  FakeSocket.all = [];
});

test("a user in 200 dialogs is resubscribed after hello within the server's frame budget, with room to spare", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  for (const id of ids(200)) rt.subscribe(id, { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  assert.equal(ws.frames("subscribe").length, SUBSCRIBE_BURST, "the first burst");
  const fullAfter = Math.ceil(((200 - SUBSCRIBE_BURST) / SUBSCRIBE_PER_SEC) * 1000);
  for (let t = 0; t < fullAfter + 1000; t += 100) mock.timers.tick(100);
  const subs = ws.frames("subscribe").map((s) => s.frame.dialogId);
  assert.deepEqual(subs, ids(200), "every dialog once, in order");
  assert.ok(ws.frames("subscribe").every((s) => s.frame.sinceSeq === 0));
  const room = serverRoom(ws.sent);
  assert.ok(room >= SERVER_BURST - SUBSCRIBE_BURST, `the server's bucket went down to ${room} frames`);
  assert.equal(rt.state.phase, "live");
  rt.stop();
});

test("subscribe and unsubscribe while live share the pace; a subscribe still waiting is dropped by its unsubscribe", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  for (const id of ids(100)) rt.subscribe(id);
  assert.equal(ws.frames("subscribe").length, SUBSCRIBE_BURST);
  rt.unsubscribe("d0"); // already sent: an unsubscribe frame, after the waiting ones
  rt.unsubscribe("d99"); // still waiting: never sent
  for (let t = 0; t < 10000; t += 100) mock.timers.tick(100);
  const sent = ws.sent.map((s) => `${s.frame.type} ${s.frame.dialogId}`);
  assert.deepEqual(sent, [...ids(99).map((id) => `subscribe ${id}`), "unsubscribe d0"]);
  assert.ok(serverRoom(ws.sent) >= SERVER_BURST - SUBSCRIBE_BURST);
  rt.stop();
});

test("the frame budget allows a burst, then its rate", () => {
  const b = new FrameBudget(3, 10, 0);
  assert.deepEqual([b.take(0), b.take(0), b.take(0)], [0, 0, 0]);
  assert.equal(b.take(0), 100, "the next frame in 100 ms");
  assert.equal(b.take(50), 50);
  assert.equal(b.take(100), 0);
  assert.equal(b.take(10_000), 0, "idle time refills up to the burst only");
  assert.equal(b.take(10_000), 0);
  assert.equal(b.take(10_000), 0);
  assert.ok(b.take(10_000) > 0);
});

test("a connection whose hello does not come within the connect timeout is closed with 4000 and retried", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt, states, errors } = realtime();
  rt.start();
  await settle();
  const first = FakeSocket.all[0];
  mock.timers.tick(CONNECT_TIMEOUT_MS - 1);
  assert.equal(first.closed, null);
  assert.equal(rt.state.phase, "connecting");
  mock.timers.tick(1);
  assert.deepEqual(first.closed, { code: 4000, reason: "no hello" });
  assert.equal(rt.state.phase, "reconnecting");
  assert.ok(errors.some((e) => e instanceof CloseError && e.code === 4000), "the close is reported");
  mock.timers.tick(30_000); // the backoff
  await settle();
  assert.equal(FakeSocket.all.length, 2, "a second attempt");
  // The late close event of the abandoned socket changes nothing.
  first.onclose?.({ code: 1006, reason: "" });
  FakeSocket.all[1].hello();
  mock.timers.tick(CONNECT_TIMEOUT_MS * 2);
  assert.equal(FakeSocket.all[1].closed, null, "a connection that said hello is kept");
  assert.equal(rt.state.phase, "live");
  assert.equal(states.filter((s) => s.phase === "reconnecting").length, 1);
  rt.stop();
});

test("a ticket refused with a 4xx stops the client; 408 and 429 are retried", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  for (const [status, code, phase] of /** @type {const} */ ([
    [403, "user_session_required", "stopped"], [404, "not_found", "stopped"],
    [408, "http_408", "reconnecting"], [429, "rate_limited", "reconnecting"], [503, "redis_unavailable", "reconnecting"],
  ])) {
    let asked = 0;
    const { rt, errors } = realtime({ auth: "ticket", ticket: async () => { asked++; throw new ApiError(code, status); } });
    rt.start();
    await settle();
    assert.equal(rt.state.phase, phase, `${status}`);
    if (phase === "stopped") {
      assert.equal(rt.state.reason, code);
      assert.ok(errors.some((e) => e instanceof ApiError && e.status === status), "the refusal is reported");
      mock.timers.tick(60_000);
      await settle();
      assert.equal(asked, 1, `${status}: no second ticket request`);
    }
    rt.stop();
  }
});

test("1008 frame rate reconnects with backoff; the other 1008 closes stop the client", async () => {
  assert.equal(new CloseError(1008, "frame rate").fatal, false);
  assert.equal(new CloseError(1008, "frame too big").fatal, true);
  assert.equal(new CloseError(1008, "too_many_connections").fatal, true);
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.start();
  await settle();
  FakeSocket.all[0].hello();
  FakeSocket.all[0].onclose?.({ code: 1008, reason: "frame rate" });
  assert.equal(rt.state.phase, "reconnecting");
  assert.equal(rt.state.code, 1008);
  mock.timers.tick(30_000);
  await settle();
  FakeSocket.all[1].hello();
  FakeSocket.all[1].onclose?.({ code: 1008, reason: "frame too big" });
  assert.equal(rt.state.phase, "stopped");
  rt.stop();
});

// ---- a hostile or broken server ----------------------------------------------------------

/** real time passes (the timers that are not mocked) */
const wait = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

test("a Retry-After beyond what a timer can hold delays the next ticket request, never to 1 ms", async () => {
  let asked = 0;
  const { rt } = realtime({ auth: "ticket", ticket: async () => { asked++; throw new ApiError("rate_limited", 429, 3e9); } });
  rt.start();
  await wait(150);
  const left = (rt.state.retryAt ?? 0) - Date.now();
  rt.stop();
  assert.equal(asked, 1, "one ticket request in 150 ms");
  assert.ok(left > 0 && left <= 5 * 60000 + 1000, `next attempt in ${left} ms`);
});

test("a server that closes with retryMs right after every hello is retried with growing backoff, first after its advice", async () => {
  for (const code of [1001, 1013]) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    mock.method(Math, "random", () => 0.5);
    const { rt } = realtime();
    rt.start();
    await settle();
    /** @type {number[]} */
    const delays = [];
    for (let i = 0; i < 10; i++) {
      const ws = FakeSocket.all.at(-1);
      assert.ok(ws && !ws.closed, `attempt ${i + 1} opened a socket`);
      ws.hello();
      ws.onclose?.({ code, reason: '{"retryMs":200}' });
      assert.equal(rt.state.phase, "reconnecting");
      const delay = (rt.state.retryAt ?? 0) - Date.now();
      delays.push(delay);
      mock.timers.tick(delay);
      await settle();
    }
    rt.stop();
    mock.restoreAll();
    mock.timers.reset();
    FakeSocket.all = [];
    assert.equal(delays[0], 200 + 500, `${code}: the first wait is the advice plus jitter`);
    assert.ok(delays.every((d) => d >= 700), `${code}: never sooner than the advice: ${delays}`);
    assert.ok(delays[9] >= 15000, `${code}: the tenth wait has backed off: ${delays}`);
  }
});

test("a heartbeatMs a timer cannot hold, or of 1 ms, does not make the client ping in a loop", async () => {
  for (const heartbeatMs of [1e12, 1]) {
    const { rt } = realtime();
    rt.start();
    await settle();
    const ws = FakeSocket.all.at(-1);
    assert.ok(ws);
    ws.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs, expiresAt: Date.now() + 3600e3 }) });
    await wait(100);
    const pings = ws.frames("ping").length;
    rt.stop();
    FakeSocket.all = [];
    assert.equal(pings, 0, `heartbeatMs ${heartbeatMs}: ${pings} pings in 100 ms`);
  }
});

test("a second hello on the same socket starts no second ping timer and resubscribes nothing", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.subscribe("d1", { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.hello();
  mock.timers.tick(25000);
  assert.equal(ws.frames("ping").length, 1, "one ping per heartbeat");
  assert.equal(ws.frames("subscribe").length, 1, "one subscribe");
  rt.stop();
});

test("a seq gap REST cannot fill is read again with backoff, not every 500 ms; once REST has the messages they arrive", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  let reads = 0;
  /** @type {any[]} */
  let stored = [];
  const rest = /** @type {any} */ ({
    ticket: async () => ({ ticket: "t", expiresAt: 0 }),
    async *historyPages(/** @type {string} */ _id, /** @type {{afterSeq: number}} */ { afterSeq }) {
      reads++;
      yield stored.filter((m) => m.seq > afterSeq);
    },
  });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, new Tokens(() => "token"));
  /** @type {number[]} */
  const got = [];
  rt.on("message", ({ message }) => got.push(message.seq));
  rt.subscribe("d", { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.onmessage?.({ data: JSON.stringify({ type: "subscribed", dialogId: "d", lastSeq: 0, recovered: true }) });
  const msg = (/** @type {number} */ seq) => ({ id: `m${seq}`, dialogId: "d", seq, senderId: "u", body: `b${seq}`, createdAt: 0, attachments: [] });
  ws.onmessage?.({ data: JSON.stringify({ type: "event", channel: "c", id: "e5", event: "message.created", entityId: "m5", dialogId: "d", seq: 5, data: msg(5) }) });
  for (let t = 0; t < 60000; t += 100) {
    mock.timers.tick(100);
    await settle();
  }
  assert.ok(reads >= 2 && reads <= 10, `${reads} REST reads in a minute`);
  assert.deepEqual(got, []);
  stored = [1, 2, 3, 4, 5].map(msg);
  for (let t = 0; t < 60000 && got.length < 5; t += 100) {
    mock.timers.tick(100);
    await settle();
  }
  assert.deepEqual(got, [1, 2, 3, 4, 5], "the gap is filled");
  rt.stop();
});

test("a credential that keeps ending within a minute, or a refresh the server keeps refusing, is renewed at most every 10 s", async () => {
  for (const answer of ["refreshed", "error"]) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    let asked = 0;
    const tokens = new Tokens(() => { asked++; return `token${asked}`; });
    tokens.set("token0");
    const rest = /** @type {any} */ ({ ticket: async () => ({ ticket: "t", expiresAt: 0 }) });
    const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
    rt.on("error", () => {});
    rt.start();
    await settle();
    const ws = FakeSocket.all[0];
    // Credentials that last 30 s (a short-lived token, or a server that
    // says so), then every refresh answered with another 30 s, or refused.
    ws.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 30000 }) });
    let answered = 0;
    for (let t = 0; t < 20000; t += 100) {
      mock.timers.tick(100);
      await settle();
      for (; answered < ws.frames("refresh").length; answered++) {
        const f = answer === "refreshed" ? { type: "refreshed", expiresAt: Date.now() + 30000 } : { type: "error", error: "unauthorized" };
        ws.onmessage?.({ data: JSON.stringify(f) });
      }
      await settle();
    }
    const phase = rt.state.phase;
    rt.stop();
    mock.timers.reset();
    FakeSocket.all = [];
    assert.ok(asked >= 2 && asked <= 3, `${answer}: getToken was asked ${asked} times in 20 s`);
    assert.equal(phase, "live", answer);
  }
});

test("stop and start while a ticket request is under way leave one socket, and frames of a socket given up change nothing", async () => {
  /** @type {((v: any) => void)[]} */
  const pending = [];
  const { rt } = realtime({ auth: "ticket", ticket: () => new Promise((r) => pending.push(r)) });
  rt.start();
  await settle();
  rt.stop();
  rt.start();
  await settle();
  for (const r of pending) r({ ticket: "t", expiresAt: 0 });
  await settle();
  const open = FakeSocket.all.filter((s) => !s.closed);
  assert.equal(open.length, 1, `${open.length} sockets open`);
  rt.stop();
  FakeSocket.all = [];

  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const late = realtime();
  late.rt.start();
  // The socket (and its connect timer, armed with it) comes after the
  // token's promise chain: wait for it rather than for a fixed number of turns.
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const first = FakeSocket.all[0];
  assert.ok(first, "no socket was opened");
  mock.timers.tick(CONNECT_TIMEOUT_MS); // given up: no hello in time
  assert.equal(late.rt.state.phase, "reconnecting");
  first.hello(); // arrives after all
  assert.equal(late.rt.state.phase, "reconnecting", "a hello on the abandoned socket does not make the client live");
  late.rt.stop();
});

test("a frame over MAX_FRAME_BYTES from the server ends the socket and the client reconnects", async () => {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, handleProtocols: () => SUBPROTOCOL });
  await new Promise((r) => wss.once("listening", r));
  let connections = 0;
  wss.on("connection", (sock) => {
    connections++;
    sock.send(JSON.stringify({ type: "hello", connectionId: `c${connections}`, instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 3600e3 }));
    if (connections === 1) sock.send(JSON.stringify({ type: "pong", pad: "x".repeat(MAX_FRAME_BYTES) }));
  });
  const { port } = /** @type {import("node:net").AddressInfo} */ (wss.address());
  const rt = new Realtime({ url: `ws://127.0.0.1:${port}/v1/realtime`, auth: "bearer", WebSocket: /** @type {any} */ (WebSocket) },
    /** @type {any} */ ({}), new Tokens(() => "token"));
  /** @type {number[]} */
  const closes = [];
  rt.on("error", (e) => { if (e instanceof CloseError) closes.push(e.code); });
  const second = new Promise((resolve) => rt.on("state", (s) => { if (s.phase === "live" && connections === 2) resolve(null); }));
  rt.start();
  try {
    await Promise.race([second, new Promise((_, reject) => setTimeout(() => reject(new Error(`no second connection; closes ${closes}`)), 10000))]);
    // ws answers the frame with 1009 and drops the connection, so the local
    // close reads 1006 (abnormal).
    assert.equal(closes.length, 1, `one socket ended: ${closes}`);
    assert.ok([1006, 1009].includes(closes[0]), `the oversized frame ended the first socket: ${closes}`);
  } finally {
    rt.stop();
    wss.close();
  }
});

test("after token_expired and a getToken that gives up, the client is stopped for good and start() connects again", async () => {
  let answer = /** @type {string | null} */ (null);
  const reasons = /** @type {string[]} */ ([]);
  const tokens = new Tokens(({ reason }) => {
    reasons.push(reason);
    return reason === "initial" ? "t1" : answer;
  });
  const rest = /** @type {any} */ ({ ticket: async () => ({ ticket: "t", expiresAt: 0 }) });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const first = FakeSocket.all[0];
  first.hello();
  first.readyState = 3;
  first.onclose?.({ code: 4001, reason: "token_expired" });
  for (let i = 0; i < 20 && rt.state.phase !== "stopped"; i++) await settle();
  assert.equal(rt.state.phase, "stopped");
  assert.equal(rt.state.reason, "token_expired");
  assert.equal(FakeSocket.all.length, 1, "no reconnect with the expired token");

  answer = "t2";
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 1; i++) await settle();
  assert.equal(FakeSocket.all.length, 2, "start() after the client gave up opens a new connection");
  rt.stop();
});

test("a resync of every dialog reads at most 4 dialogs over REST at once, and reads each of them", async () => {
  let inFlight = 0;
  let most = 0;
  const read = new Set();
  const rest = /** @type {any} */ ({
    ticket: async () => ({ ticket: "t", expiresAt: 0 }),
    async *historyPages(/** @type {string} */ id) {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((r) => setTimeout(r, 5));
      inFlight--;
      read.add(id);
      yield [];
    },
  });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, new Tokens(() => "token"));
  for (const id of ids(200)) rt.subscribe(id, { sinceSeq: 0 });
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.onmessage?.({ data: JSON.stringify({ type: "resync", reason: "pubsub_reconnect" }) });
  for (let i = 0; i < 2000 && read.size < 200; i++) await new Promise((r) => setTimeout(r, 1));
  assert.equal(read.size, 200, "every dialog is reconciled");
  assert.ok(most <= 4, `${most} REST reads at once`);
  rt.stop();
});
