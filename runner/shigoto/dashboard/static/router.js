// Hash routes: `#/overview`, `#/queues`, `#/jobs?queue=...`, `#/jobs/<id>`, `#/failures`,
// `#/cron`, `#/nodes`. Pure: a hash in, a route out, and back; the page's state lives in the
// URL, so reloading, the back button and a pasted link all show the same thing.

export const PAGES = ["overview", "queues", "jobs", "failures", "cron", "nodes"];

/** `{name, id, params}` for a location hash; unknown paths fall back to the overview. */
export function parse(hash) {
  const raw = (hash || "").replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?", 2);
  const params = Object.fromEntries(
    [...new URLSearchParams(query)].filter(([, value]) => value !== ""),
  );
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "jobs" && parts.length === 2 && /^\d+$/.test(parts[1])) {
    return { name: "job", id: parts[1], params };
  }
  if (parts.length === 1 && PAGES.includes(parts[0])) return { name: parts[0], id: null, params };
  return { name: "overview", id: null, params: {} };
}

/** The hash for a page and its parameters; empty parameters are left out. */
export function href(name, params = {}) {
  const query = new URLSearchParams(
    Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""),
  ).toString();
  const path = name === "job" ? `jobs/${params.id}` : name;
  if (name === "job") return `#/${path}`;
  return query ? `#/${path}?${query}` : `#/${path}`;
}

/** The nav link that a route belongs under (a job's detail sits under Jobs). */
export function section(route) {
  return route.name === "job" ? "jobs" : route.name;
}
