// Shared helpers of the SDK's tests against a real gateway. The Go test
// TestJavaScriptSDK (cmd/han-gateway) starts the gateway and sets:
//   HAN_SDK_API_URL       REST base (a proxy in front of the instance)
//   HAN_SDK_REALTIME_URL  the WebSocket URL of the instance
//   HAN_SDK_CONTROL_URL   /token?sub=&ttl=[&kind=service], /dialogs?n=&owner=&member=,
//                         /restart, /drop-next-send, /stalled (see sdk_test.go)
//   HAN_SDK_ORIGIN        an Origin the gateway allows (for ticket connections)
//   HAN_SDK_STALL_URL     a WebSocket URL whose path passes nothing back (a hung instance)
import { randomUUID } from "node:crypto";
import { WebSocket } from "ws";
import { HanClient } from "../index.js";

/** @param {string} name */
function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through go test ./cmd/han-gateway -run TestJavaScriptSDK`);
  return v;
}

export const env = {
  get api() { return required("HAN_SDK_API_URL"); },
  get realtime() { return required("HAN_SDK_REALTIME_URL"); },
  get control() { return required("HAN_SDK_CONTROL_URL"); },
  get origin() { return required("HAN_SDK_ORIGIN"); },
};

/**
 * @param {string} path
 * @returns {Promise<string>}
 */
export async function control(path) {
  const res = await fetch(env.control + path, { method: "POST" });
  if (!res.ok) throw new Error(`control ${path}: ${res.status}`);
  return res.text();
}

/**
 * @param {string} sub
 * @param {number} [ttlSec]
 */
export function token(sub, ttlSec = 3600) {
  return control(`/token?sub=${sub}&ttl=${ttlSec}`);
}

/**
 * client makes an SDK client for user sub; getToken mints tokens of ttlSec
 * and records every reason it was asked with.
 * @param {string} sub
 * @param {{auth?: "ticket" | "bearer", ttlSec?: number}} [opts]
 */
export function client(sub, opts = {}) {
  /** @type {string[]} */
  const asked = [];
  const c = new HanClient({
    baseUrl: env.api,
    realtimeUrl: env.realtime,
    auth: opts.auth || "bearer",
    WebSocket: /** @type {any} */ (WebSocket),
    // Ticket connections need an Origin the gateway allows (browsers send their own).
    headers: opts.auth === "ticket" ? { Origin: env.origin } : undefined,
    getToken: async ({ reason }) => {
      asked.push(reason);
      return token(sub, opts.ttlSec);
    },
  });
  return { c, asked };
}

/** @returns {string} a new user id */
export function newUser() {
  return randomUUID();
}

/**
 * until polls fn every 20 ms until it returns a truthy value, or fails after timeoutMs.
 * @template T
 * @param {() => T | Promise<T>} fn
 * @param {number} timeoutMs
 * @param {string} what
 * @returns {Promise<T>}
 */
export async function until(fn, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * next resolves with the next value of event type that matches pred.
 * @template {keyof import("../realtime.js").RealtimeEvents} K
 * @param {HanClient} c
 * @param {K} type
 * @param {(v: import("../realtime.js").RealtimeEvents[K]) => boolean} [pred]
 * @param {number} [timeoutMs]
 * @returns {Promise<import("../realtime.js").RealtimeEvents[K]>}
 */
export function next(c, type, pred = () => true, timeoutMs = 15000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no ${String(type)} event within ${timeoutMs} ms`));
    }, timeoutMs);
    const off = c.on(type, (v) => {
      if (!pred(v)) return;
      clearTimeout(timer);
      off();
      resolve(v);
    });
  });
}

/**
 * messages records the message events of a client, per dialog.
 * @param {HanClient} c
 */
export function recordMessages(c) {
  /** @type {{dialogId: string, seq: number, body: string, source: string}[]} */
  const got = [];
  c.on("message", ({ dialogId, message, source }) => got.push({ dialogId, seq: message.seq, body: message.body, source }));
  return got;
}

/**
 * pair: two users who share a dialog, each with a client (not connected).
 * @param {{auth?: "ticket" | "bearer", ttlSec?: number}} [opts]
 */
export async function pair(opts = {}) {
  const aliceId = newUser();
  const bobId = newUser();
  const alice = client(aliceId, opts);
  const bob = client(bobId, opts);
  await bob.c.rest.me(); // a member must have signed in once
  const dialog = await alice.c.rest.createDialog([bobId]);
  return { aliceId, bobId, alice: alice.c, bob: bob.c, aliceAsked: alice.asked, dialog };
}
