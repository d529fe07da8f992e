// Talking to the dashboard's JSON API. The token lives in sessionStorage (gone when the tab
// closes) and travels only in the Authorization header: never in a cookie, which a cross-site
// form would carry along, and never in a URL, which logs and referrers would keep.

const TOKEN_KEY = "shigoto.dashboard.token";

/** The database this page looks at (`?db=` in the page's own URL), or null for the default. */
export function database() {
  return new URLSearchParams(window.location.search).get("db");
}

export function token() {
  return window.sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  window.sessionStorage.setItem(TOKEN_KEY, value);
}

export function clearToken() {
  window.sessionStorage.removeItem(TOKEN_KEY);
}

/** A failed request: the HTTP status, the server's message and the field it names, if any. */
export class ApiError extends Error {
  constructor(status, message, field = null) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

/** `path` with the query `params` (empty ones dropped) and the page's database. */
export function url(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const db = database();
  if (db) query.set("db", db);
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

function headers(candidate) {
  const result = { Accept: "application/json" };
  const bearer = candidate ?? token();
  if (bearer) result.Authorization = `Bearer ${bearer}`;
  return result;
}

async function parse(response) {
  const type = response.headers.get("Content-Type") || "";
  const body = type.includes("json") ? await response.json().catch(() => null) : null;
  if (response.ok) return body;
  const message = (body && body.error) || `${response.status} ${response.statusText}`.trim();
  throw new ApiError(response.status, message, body && body.field);
}

/** GET a read endpoint. The token goes along when signed in: it may reveal job args. */
export async function get(path, params = {}, { signal, bearer } = {}) {
  const response = await fetch(url(path, params), {
    headers: headers(bearer), signal, cache: "no-store", credentials: "omit",
  });
  return parse(response);
}

/** POST an action with an empty body. */
export async function post(path) {
  const response = await fetch(url(path), {
    method: "POST", headers: headers(), cache: "no-store", credentials: "omit",
  });
  return parse(response);
}
