// Line and stacked-area charts drawn as plain SVG: the overview needs two small charts of an
// hour of per-minute samples, which does not earn a charting library. Scales and paths are
// pure functions (`scale`, `ticks`, `stack`); `chart` turns them into elements.

import { h, s } from "./dom.js";
import { clock, count } from "./format.js";

const WIDTH = 640;
const HEIGHT = 220;
const MARGIN = { top: 12, right: 12, bottom: 26, left: 48 };
const HOUR_MS = 60 * 60 * 1000;

/** A "round" step (1, 2 or 5 times a power of ten, at least 1) that cuts `max` in about four. */
export function niceStep(max) {
  const rough = Math.max(max, 1) / 4;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= rough);
  return Math.max(1, step);
}

/** The ticks of a y axis from 0 to the first step at or above `max`. */
export function ticks(max) {
  const step = niceStep(max);
  const top = Math.max(step, Math.ceil(max / step) * step);
  const marks = [];
  for (let t = 0; t <= top; t += step) marks.push(t);
  return marks;
}

/** A linear map from [d0, d1] to [r0, r1]. */
export function scale(d0, d1, r0, r1) {
  const span = d1 - d0 || 1;
  return (value) => r0 + ((value - d0) / span) * (r1 - r0);
}

/** For each key, the [bottom, top] of its band at every point, stacked in key order. */
export function stack(points, keys) {
  const base = points.map(() => 0);
  return keys.map((key) => points.map((point, i) => {
    const bottom = base[i];
    base[i] += Number(point[key]) || 0;
    return [bottom, base[i]];
  }));
}

function linePath(xs, ys) {
  return xs.map((x, i) => `${i ? "L" : "M"}${x.toFixed(1)},${ys[i].toFixed(1)}`).join("");
}

function areaPath(xs, bottoms, tops) {
  const upper = linePath(xs, tops);
  const lower = xs.map((x, i) => [x, bottoms[i]]).reverse()
    .map(([x, y]) => `L${x.toFixed(1)},${y.toFixed(1)}`).join("");
  return `${upper}${lower}Z`;
}

function axes(x, y, marks, end) {
  const grid = marks.map((t) => s("g", { class: "tick" },
    s("line", { x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(t), y2: y(t) }),
    s("text", { x: MARGIN.left - 6, y: y(t) + 4, "text-anchor": "end" }, count(t)),
  ));
  const labels = [60, 45, 30, 15, 0].map((minutes) => {
    const at = end - minutes * 60 * 1000;
    return s("text", { class: "time", x: x(at), y: HEIGHT - 6, "text-anchor": "middle" },
      minutes ? clock(new Date(at).toISOString()) : "now");
  });
  return s("g", { class: "axes" }, grid, labels);
}

function series(points, keys, stacked, x, y) {
  const xs = points.map((p) => x(new Date(p.at).getTime()));
  if (stacked) {
    return stack(points, keys).map((bands, k) => s("path", {
      class: ["series", "area", `series-${keys[k]}`], "data-series": keys[k],
      d: areaPath(xs, bands.map((b) => y(b[0])), bands.map((b) => y(b[1]))),
    }));
  }
  return keys.map((key) => s("path", {
    class: ["series", "line", `series-${key}`], "data-series": key,
    d: linePath(xs, points.map((p) => y(Number(p[key]) || 0))),
  }));
}

function legend(points, keys) {
  const last = points[points.length - 1] || {};
  return h("ul", { class: "legend" }, keys.map((key) => h("li", null,
    h("span", { class: ["swatch", `series-${key}`], "aria-hidden": "true" }),
    h("span", { class: "legend-key" }, key),
    h("span", { class: "legend-value" }, count(last[key] ?? 0)),
  )));
}

/**
 * A figure holding one chart of `points` (objects with `at` and a number per key) over the
 * hour ending at `now`. `stacked` draws areas on top of each other (depth adds up), otherwise
 * one line per key (throughput per outcome).
 */
export function chart({ name, title, caption, points, keys, stacked = false, now }) {
  const end = now ? new Date(now).getTime() : Date.now();
  const x = scale(end - HOUR_MS, end, MARGIN.left, WIDTH - MARGIN.right);
  const totals = stacked
    ? points.map((p) => keys.reduce((sum, k) => sum + (Number(p[k]) || 0), 0))
    : points.flatMap((p) => keys.map((k) => Number(p[k]) || 0));
  const marks = ticks(Math.max(0, ...totals));
  const y = scale(0, marks[marks.length - 1], HEIGHT - MARGIN.bottom, MARGIN.top);
  const svg = s("svg", {
    "data-chart": name, viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img",
    "aria-label": title, class: "chart",
    "data-points": points.length,
  }, s("title", null, title), axes(x, y, marks, end));
  if (points.length) {
    svg.append(s("g", { class: "plot" }, series(points, keys, stacked, x, y)));
  } else {
    svg.append(s("text", { class: "empty", x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle" },
      "No samples yet: a running runner records one every minute"));
  }
  return h("figure", { class: "chart-card" },
    h("figcaption", null, h("strong", null, title), caption ? h("span", null, caption) : null),
    svg, legend(points, keys));
}
