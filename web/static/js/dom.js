// DOM and formatting helpers shared by every view. No state.

// h builds an element: h("button", {class: "btn", onclick: fn}, "Send").
// Props: class, text, dataset, on<event> handlers, boolean attributes
// (true sets, false/null omits), anything else as an attribute.
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

// uuid is a random UUID v4 (crypto.randomUUID needs a secure context; plain
// http on a LAN address is not one).
export function uuid() {
  if (globalThis.crypto && crypto.randomUUID) {
    try { return crypto.randomUUID(); } catch { /* not a secure context */ }
  }
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = Array.from(b, (v) => v.toString(16).padStart(2, "0")).join("");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

export const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// shortId is the last 8 hex digits of an id: UUIDv7 ids start with their
// timestamp, so their first digits are shared by ids made at the same time.
export const shortId = (id) => (id ? String(id).replace(/-/g, "").slice(-8) : "?");

// hue is a stable colour angle for an id (avatars, sender names).
export function hue(id) {
  let x = 0;
  for (const ch of String(id)) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return x % 360;
}

// initials are two characters that tell avatars apart: the first letters
// of the first two words of a name ("Launch plan" → "LP", one word → its
// first two letters), else the first significant characters of the short
// id (leading zeros skipped: the demo ids 00000000-…-00000000a11c and
// …-000000000b0b give "A1" and "B0", not "00" twice).
export function initials(name, id) {
  const words = String(name || "").split(/\s+/).map((w) => w.replace(/[^\p{L}\p{N}]/gu, "")).filter(Boolean);
  if (words.length >= 2) return (Array.from(words[0])[0] + Array.from(words[1])[0]).toUpperCase();
  if (words.length === 1) return Array.from(words[0]).slice(0, 2).join("").toUpperCase();
  return shortId(id).replace(/^0+(?=.)/, "").slice(0, 2).toUpperCase();
}

export function avatar(id, name) {
  const el = h("span", { class: "avatar", "aria-hidden": "true", text: initials(name, id) });
  el.style.setProperty("--hue", String(hue(id)));
  return el;
}

export function formatBytes(n) {
  if (n == null || !Number.isFinite(n)) return "–";
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v >= 10 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const dateTimeFmt = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

const dayFmt = new Intl.DateTimeFormat(undefined, { weekday: "long", day: "numeric", month: "long", year: "numeric" });
const weekdayFmt = new Intl.DateTimeFormat(undefined, { weekday: "short" });
const shortDateFmt = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", year: "numeric" });

// A timestamp is epoch ms within the range of Date; anything else (a
// broken answer) formats as "–" and never throws, so one bad time cannot
// stop a whole list from rendering.
const isTime = (ms) => typeof ms === "number" && Math.abs(ms) <= 8.64e15;

export const formatTime = (ms) => (isTime(ms) ? timeFmt.format(new Date(ms)) : "–");

// isoTime is a timestamp for a datetime attribute ("" when it is none).
export const isoTime = (ms) => (isTime(ms) ? new Date(ms).toISOString() : "");

// dayKey is the local calendar day of a timestamp, "2026-12-02".
export function dayKey(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
}

// daysAgo counts local calendar days between a timestamp and now (0 today).
function daysAgo(ms, now) {
  const a = new Date(ms);
  const b = new Date(now);
  const start = (d) => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
  return Math.round((start(b) - start(a)) / 86400e3);
}

// dayLabel names a day for a separator: "Today", "Yesterday", else the
// full date ("Monday, 30 November 2026" in the browser's locale).
export function dayLabel(ms, now = Date.now()) {
  if (!isTime(ms)) return "–";
  const n = daysAgo(ms, now);
  if (n === 0) return "Today";
  if (n === 1) return "Yesterday";
  return dayFmt.format(new Date(ms));
}

// listTime is a compact time for the dialog list: "14:05" today,
// "Yesterday", a weekday within the week, else a short date.
export function listTime(ms, now = Date.now()) {
  if (!isTime(ms)) return "–";
  const n = daysAgo(ms, now);
  if (n === 0) return formatTime(ms);
  if (n === 1) return "Yesterday";
  if (n > 1 && n < 7) return weekdayFmt.format(new Date(ms));
  return shortDateFmt.format(new Date(ms));
}
// formatDateTime is an epoch-ms timestamp in the browser's local time zone.
export const formatDateTime = (ms) => (isTime(ms) ? dateTimeFmt.format(new Date(ms)) : "–");

// relative: "in 59 min", "3 s ago", "in 2 d".
export function relative(ms, now = Date.now()) {
  if (!isTime(ms)) return "–";
  const d = ms - now;
  const a = Math.abs(d);
  let s;
  if (a < 1000) return "now";
  if (a < 60e3) s = `${Math.round(a / 1e3)} s`;
  else if (a < 3600e3) s = `${Math.round(a / 60e3)} min`;
  else if (a < 86400e3) s = `${Math.round(a / 3600e3)} h`;
  else s = `${Math.round(a / 86400e3)} d`;
  return d > 0 ? `in ${s}` : `${s} ago`;
}

// countdown: "0:59" for a duration in ms (never negative).
export function countdown(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

// limitChars caps what the user enters into a text field at max characters
// as the server counts them: Unicode code points (Go's utf8.RuneCount),
// where maxlength counts UTF-16 units (an emoji is two, so maxlength 4000
// holds 2000 emoji). Like maxlength it limits the user's edits only (a
// value set by script stays as it is) and keeps what an edit inserts up to
// the room left, at the caret, never splitting a character; what was there
// before stays whole.
export function limitChars(el, max) {
  let before = el.value;
  const fit = () => {
    const v = el.value;
    if (codePoints(v) <= max) return;
    // The edit replaced what lies between a common start (p) and a common
    // end (q units from the end) of the value before and after it.
    let p = 0;
    while (p < v.length && p < before.length && v[p] === before[p]) p++;
    let q = 0;
    while (q < v.length - p && q < before.length - p && v[v.length - 1 - q] === before[before.length - 1 - q]) q++;
    if (p > 0 && isHighSurrogate(v.charCodeAt(p - 1))) p--;
    if (q > 0 && isLowSurrogate(v.charCodeAt(v.length - q))) q--;
    const head = v.slice(0, p);
    const tail = v.slice(v.length - q);
    const room = Math.max(0, max - codePoints(head) - codePoints(tail));
    const kept = Array.from(v.slice(p, v.length - q)).slice(0, room).join("");
    el.value = head + kept + tail;
    el.setSelectionRange(p + kept.length, p + kept.length);
  };
  el.addEventListener("beforeinput", () => { before = el.value; });
  el.addEventListener("input", (e) => {
    // An IME's text is limited once composed (compositionend).
    if (e.inputType && !e.isComposing) fit();
  });
  el.addEventListener("compositionend", fit);
}

const codePoints = (s) => [...s].length;

const isHighSurrogate = (c) => c >= 0xd800 && c <= 0xdbff;
const isLowSurrogate = (c) => c >= 0xdc00 && c <= 0xdfff;

// toast shows a short message in the corner; kind: info | error | success.
export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  if (!box) return;
  const el = h("div", { class: `toast toast-${kind}`, role: kind === "error" ? "alert" : "status" }, message);
  box.append(el);
  setTimeout(() => el.remove(), kind === "error" ? 8000 : 4000);
}

// field wraps a labelled control: field("Key", input, "hint").
export function field(label, control, hint) {
  const id = control.id || (control.id = `f-${uuid().slice(0, 8)}`);
  const parts = [h("label", { for: id, text: label }), control];
  if (hint) {
    const hid = `${id}-hint`;
    control.setAttribute("aria-describedby", hid);
    parts.push(h("small", { id: hid, class: "hint", text: hint }));
  }
  return h("div", { class: "field" }, parts);
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}

// Icon paths after Feather icons (MIT licence, feathericons.com).
const ICONS = {
  clip: ["M21.44 11.05l-9.19 9.19a6 6 0 0 1-8.49-8.49l9.19-9.19a4 4 0 0 1 5.66 5.66l-9.2 9.19a2 2 0 0 1-2.83-2.83l8.49-8.48"],
  file: ["M13 2H6a2 2 0 0 0-2 2v16a2 2 0 0 0 2 2h12a2 2 0 0 0 2-2V9z", "M13 2v7h7"],
  download: ["M21 15v4a2 2 0 0 1-2 2H5a2 2 0 0 1-2-2v-4", "M7 10l5 5 5-5", "M12 15V3"],
  send: ["M22 2L11 13", "M22 2l-7 20-4-9-9-4 20-7z"],
  back: ["M19 12H5", "M12 19l-7-7 7-7"],
};

// icon is a decorative SVG icon (stroke follows the text colour).
export function icon(name) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", "icon");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  for (const d of ICONS[name] || []) {
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d);
    svg.append(path);
  }
  return svg;
}
