// How values read on the page: counts, times, states. Pure functions, plus the few small
// elements (a state badge, a time with its exact value on hover) every view shares.

import { h } from "./dom.js";

export const STATES = [
  "available", "scheduled", "executing", "retryable", "completed", "discarded", "cancelled",
];
export const FINISHED = ["completed", "discarded", "cancelled"];
export const DEPTH = ["available", "scheduled", "executing", "retryable"];

const numbers = new Intl.NumberFormat();

/** A count; `~` in front when the server says it is an estimate. */
export function count(value, exact = true) {
  if (value === null || value === undefined) return "–";
  return `${exact ? "" : "~"}${numbers.format(value)}`;
}

/** "3 s", "4 min", "2 h", "5 d": how long `ms` milliseconds is, coarsely. */
export function span(ms) {
  const seconds = Math.round(Math.abs(ms) / 1000);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.round(minutes / 60);
  if (hours < 48) return `${hours} h`;
  return `${Math.round(hours / 24)} d`;
}

/** "5 min ago" or "in 30 s", relative to `now` (a Date). */
export function relative(iso, now = new Date()) {
  if (!iso) return "–";
  const delta = new Date(iso).getTime() - now.getTime();
  if (Math.abs(delta) < 1000) return "now";
  return delta < 0 ? `${span(delta)} ago` : `in ${span(delta)}`;
}

/** The exact local date and time, for titles and the detail page. */
export function exact(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

/** "14:05", for chart axes. */
export function clock(iso) {
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/** A relative time that shows the exact one on hover. */
export function when(iso, now) {
  return h("time", { datetime: iso || null, title: iso ? exact(iso) : null }, relative(iso, now));
}

/** A coloured badge for a job state. */
export function badge(state) {
  return h("span", { class: ["badge", `state-${state}`] }, state);
}

/** A worker's name without its module path, the full name on hover. */
export function shortWorker(name) {
  const short = String(name || "").split(".").pop();
  return h("span", { class: "worker", title: name }, short);
}

/** JSON pretty-printed for a <pre>; strings stay readable. */
export function json(value) {
  return JSON.stringify(value, null, 2);
}
