// The inspector's DOM helpers: every piece of data becomes a text node, never markup (the
// stored text is hostile: a caller wrote it), and the formatting of times, durations and values.

// --- DOM, text only ---------------------------------------------------------------------

/** An element with a class and children (strings become text nodes). */
export function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
}

/** A daemon's refusal: its status and message, shown as they are. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(`HTTP ${status}`);
    this.status = status;
    this.text = detail ? `HTTP ${status}: ${detail}` : `HTTP ${status}`;
  }
}

export function showError(node, err) {
  node.textContent = err instanceof ApiError ? err.text : `Error: ${err && err.message ? err.message : err}`;
  node.hidden = false;
}

export function hideError(node) {
  node.textContent = "";
  node.hidden = true;
}

// --- formatting ---------------------------------------------------------------------------

export function formatDate(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "—";
  const d = new Date(seconds * 1000);
  if (Number.isNaN(d.getTime())) return "—";
  return `${d.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

/** Seconds as a person says them: "45 s", "2 min", "3 h 5 min", "2 d 4 h". */
export function formatDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const minutes = Math.round(s / 60);
  if (minutes < 60) return `${minutes} min`;
  if (minutes < 24 * 60) {
    const m = minutes % 60;
    return m ? `${Math.floor(minutes / 60)} h ${m} min` : `${Math.floor(minutes / 60)} h`;
  }
  const hours = Math.round(s / 3600);
  const h = hours % 24;
  return h ? `${Math.floor(hours / 24)} d ${h} h` : `${Math.floor(hours / 24)} d`;
}

export function formatValue(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map(formatValue).join(", ");
  if (typeof value === "object") {
    return Object.entries(value)
      .map(([k, v]) => `${k.replace(/_/g, " ")} ${formatValue(v)}`)
      .join(", ");
  }
  return String(value);
}

/** One field as words: a `…_s` field (or each field of it) as a duration. */
export function detail(key, value) {
  const seconds = key.endsWith("_s");
  const name = key.replace(/_s$/, "").replace(/_/g, " ");
  const one = (v) => (seconds && typeof v === "number" ? formatDuration(v) : formatValue(v));
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    const fields = Object.entries(value).map(([k, v]) => `${k.replace(/_/g, " ")} ${one(v)}`);
    return `${name}: ${fields.join(", ")}`;
  }
  return `${name} ${one(value)}`;
}

/** A key/value table of any JSON object, nested objects as nested tables (a shape that grows
 * a field shows it without a change here). */
export function kvTable(obj, depth = 0) {
  const table = el("table", "kv");
  const body = el("tbody");
  const entries = Object.entries(obj);
  if (entries.length === 0) body.append(el("tr", null, el("td", "muted", "(none)")));
  for (const [key, value] of entries) {
    const nested = value !== null && typeof value === "object" && !Array.isArray(value) && depth < 3;
    body.append(el("tr", null, el("th", null, key), el("td", null, nested ? kvTable(value, depth + 1) : formatValue(value))));
  }
  table.append(body);
  return table;
}

export function fillKv(table, rows) {
  clear(table);
  const body = el("tbody");
  for (const [key, value] of rows) body.append(el("tr", null, el("th", null, key), el("td", null, value)));
  table.append(body);
}

export function gridTable(table, headers, rows) {
  clear(table);
  table.append(el("thead", null, el("tr", null, ...headers.map((h) => el("th", null, h)))));
  const body = el("tbody");
  for (const row of rows) body.append(row);
  table.append(body);
}
