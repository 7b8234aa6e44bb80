// The memory inspector: a read-only operator page over the daemon's /v1 API.
//
// Everything stored is hostile text (a caller wrote it): it reaches the page only through
// textContent and text nodes, never as markup, and every id goes into a URL through
// encodeURIComponent. The daemon's CSP allows this page's own files (this module, dom.js,
// diff.js and inspector.css), nothing inline.
import {
  ApiError,
  clear, detail, el, fillKv, formatDate, formatDuration, formatValue, gridTable, hideError, kvTable, showError,
} from "./dom.js";
import { wordDiff } from "./diff.js";

const TOKEN_KEY = "tiered-memory-token";
// The tenant an unrestricted token acts in (X-Tenant); a tenant's own token needs none.
const TENANT_KEY = "tiered-memory-tenant";
const PAGE_SIZE = 20;
const ORIGIN_LABELS = {
  summary: "summary fact",
  snippets: "recall snippet",
  condensed: "earlier turns, condensed",
  salient: "said earlier",
  subject: "subject",
  events: "gateway events",
  carried: "earlier sessions",
  lagging: "turns the summary lags behind",
};

const $ = (id) => document.getElementById(id);

// --- the token and the API ----------------------------------------------------------------

// Kept in sessionStorage: gone with the tab, never in localStorage. A page where storage is
// refused keeps it in memory.
const memory = {};

function stored(key) {
  try {
    return sessionStorage.getItem(key) || "";
  } catch {
    return memory[key] || "";
  }
}

function store(key, value) {
  memory[key] = value;
  try {
    if (value) sessionStorage.setItem(key, value);
    else sessionStorage.removeItem(key);
  } catch {
    // storage refused: the in-memory copy serves this page
  }
}

const getToken = () => stored(TOKEN_KEY);
const getTenant = () => stored(TENANT_KEY);

function setToken(token, tenant = "") {
  store(TOKEN_KEY, token);
  store(TENANT_KEY, tenant);
}

/** The `{"error": {"code", "message"}}` body as one line ("forbidden: session not …"). */
function errorDetail(body) {
  if (!body || typeof body !== "object") return "";
  const err = body.error;
  if (err && typeof err === "object") {
    return [err.code, err.message].filter((x) => typeof x === "string" && x).join(": ");
  }
  if (typeof err === "string") return err;
  return typeof body.message === "string" ? body.message : "";
}

/** GET a daemon path; its JSON, or an ApiError that says the status and the daemon's message. */
async function api(path) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const tenant = getTenant();
  if (tenant) headers["X-Tenant"] = tenant;
  let resp;
  try {
    resp = await fetch(path, { headers, credentials: "omit", cache: "no-store", redirect: "error" });
  } catch (err) {
    throw new Error(`the daemon did not answer (${err && err.message ? err.message : err})`);
  }
  const raw = await resp.text();
  let body = null;
  try {
    body = raw ? JSON.parse(raw) : null;
  } catch {
    body = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, errorDetail(body) || resp.statusText);
  if (body === null || typeof body !== "object") throw new ApiError(resp.status, "the answer is not JSON");
  return body;
}

function query(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined || value === "") continue;
    parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(String(value))}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

const sessionPath = (sid, rest = "") => `/v1/sessions/${encodeURIComponent(sid)}${rest}`;

// --- overview -----------------------------------------------------------------------------

async function loadOverview() {
  const box = $("overview");
  const error = $("overview-error");
  try {
    const body = await api("/v1/overview");
    hideError(error);
    clear(box);
    box.append(kvTable(body));
  } catch (err) {
    clear(box);
    showError(error, err);
  }
}

// --- a user's sessions --------------------------------------------------------------------

let userListing = null; // {userId, cursor}

async function loadUserSessions(userId, cursor) {
  const list = $("user-sessions");
  const more = $("user-sessions-more");
  const error = $("user-sessions-error");
  if (!cursor) clear(list);
  more.hidden = true;
  try {
    const body = await api(`/v1/users/${encodeURIComponent(userId)}/sessions${query({ limit: PAGE_SIZE, cursor })}`);
    hideError(error);
    const sessions = Array.isArray(body.sessions) ? body.sessions : [];
    if (!cursor && sessions.length === 0) list.append(el("li", "muted", "no sessions"));
    for (const s of sessions) list.append(userSessionItem(s));
    userListing = body.next_cursor ? { userId, cursor: body.next_cursor } : null;
    more.hidden = userListing === null;
  } catch (err) {
    showError(error, err);
  }
}

function userSessionItem(s) {
  const open = el("button", "link", String(s.session_id));
  open.type = "button";
  open.dataset.testid = "user-session";
  open.addEventListener("click", () => openSession(String(s.session_id)));
  const facts = [
    `${s.turn_count} turns`,
    `${s.message_count} messages`,
    s.summarized ? `summary covers ${s.covered_turns}` : "no summary",
    `last activity ${formatDate(s.last_activity)}`,
    s.closed_at ? "closed" : null,
  ].filter(Boolean);
  return el("li", null, open, " ", el("span", "muted", facts.join(" · ")));
}

// --- the session view ---------------------------------------------------------------------

// Each opened session is a new generation: answers for an earlier one are dropped, however
// late they arrive.
let current = { sid: null, generation: 0, versions: [], slicesNext: null };

async function openSession(sid) {
  const generation = current.generation + 1;
  current = { sid, generation, versions: [], slicesNext: null };
  $("session-input").value = sid;
  $("session-view").hidden = false;
  $("session-title").textContent = `Session ${sid}`;
  hideError($("session-error"));
  $("session-body").hidden = true;
  clear($("context"));
  hideError($("context-error"));
  closeSliceMessages();
  try {
    const body = await api(sessionPath(sid, "/inspect"));
    if (current.generation !== generation) return;
    renderInspect(body);
    $("session-body").hidden = false;
  } catch (err) {
    if (current.generation !== generation) return;
    showError($("session-error"), err);
    return;
  }
  await loadSlices(generation, 1);
}

const stillCurrent = (generation) => current.generation === generation;

function renderInspect(body) {
  const closed = body.closed ? `yes, ${formatDate(body.closed_at)}` : "no";
  fillKv($("session-facts"), [
    ["user", body.user_id === null || body.user_id === undefined ? "—" : String(body.user_id)],
    ["turns", formatValue(body.turn_count)],
    ["messages", formatValue(body.message_count)],
    ["covered turns", formatValue(body.covered_turns)],
    ["lag (turns)", formatValue(body.lag_turns)],
    ["created", formatDate(body.created_at)],
    ["last activity", formatDate(body.last_activity)],
    ["closed", closed],
  ]);
  renderTiers(body.tiers || {});
  renderSummary(body.summary);
  current.versions = Array.isArray(body.versions) ? body.versions : [];
  renderVersions(current.versions);
}

function renderTiers(tiers) {
  const rows = [];
  for (const name of ["hot", "warm", "cold"]) {
    const t = tiers[name] || {};
    const details = Object.entries(t)
      .filter(([k, v]) => !["present", "ttl_s", "age_s", "error"].includes(k) && v !== null && v !== undefined)
      .map(([k, v]) => detail(k, v))
      .join(" · ");
    const row = el(
      "tr",
      t.error ? "tier-error" : t.present ? "tier-present" : "tier-absent",
      el("th", null, name),
      el("td", null, t.error ? `error: ${formatValue(t.error)}` : t.present ? "yes" : "no"),
      el("td", null, formatDuration(t.age_s)),
      el("td", null, name === "hot" ? (t.ttl_s === null || t.ttl_s === undefined ? "—" : formatDuration(t.ttl_s)) : "—"),
      el("td", "muted", details),
    );
    row.dataset.testid = `tier-${name}`;
    rows.push(row);
  }
  gridTable($("tiers"), ["tier", "present", "age", "TTL", "details"], rows);
}

function renderSummary(summary) {
  const box = $("summary");
  clear(box);
  if (!summary) {
    box.append(el("p", "muted", "no summary yet"));
    return;
  }
  const meta = [
    `version ${formatValue(summary.version)}`,
    `source ${formatValue(summary.source)}`,
    `covers ${formatValue(summary.covered_turns)} turns`,
    `updated ${formatDate(summary.updated_at)}`,
  ].join(" · ");
  const text = el("p", "text", summary.text || "");
  text.dataset.testid = "summary-text";
  box.append(el("p", "muted", meta), text);
  if (Array.isArray(summary.topics) && summary.topics.length) {
    box.append(el("p", "topics", "topics: ", ...summary.topics.map((t) => el("span", "tag", String(t)))));
  }
}

function versionLabel(v) {
  return `v${v.version} · ${formatValue(v.source)} · ${formatValue(v.covered_turns)} turns · ${formatDate(v.created_at)}`;
}

function renderVersions(versions) {
  const list = $("versions");
  clear(list);
  if (versions.length === 0) list.append(el("li", "muted", "no versions"));
  for (const v of versions) {
    const item = el("li", null, el("details", null, el("summary", null, versionLabel(v)), el("p", "text", v.text || "")));
    item.dataset.testid = "version";
    list.append(item);
  }
  const from = $("diff-from");
  const to = $("diff-to");
  clear(from);
  clear(to);
  versions.forEach((v, index) => {
    for (const select of [from, to]) {
      const option = el("option", null, `v${v.version} (${formatDate(v.created_at)})`);
      option.value = String(index);
      select.append(option);
    }
  });
  // Newest first: by default, what the newest version changed in the one before it.
  from.value = String(Math.min(1, versions.length - 1));
  to.value = "0";
  renderDiff();
}

function renderDiff() {
  const box = $("diff");
  const stats = $("diff-stats");
  clear(box);
  stats.textContent = "";
  const versions = current.versions;
  if (versions.length < 2) {
    box.append(el("span", "muted", versions.length ? "only one version: nothing to compare" : "no versions"));
    return;
  }
  const before = versions[Number($("diff-from").value)];
  const after = versions[Number($("diff-to").value)];
  if (!before || !after) return;
  let removed = 0;
  let added = 0;
  for (const run of wordDiff(before.text || "", after.text || "")) {
    if (run.op === "removed") {
      removed += 1;
      box.append(el("del", "removed", run.text));
    } else if (run.op === "added") {
      added += 1;
      box.append(el("ins", "added", run.text));
    } else {
      box.append(document.createTextNode(run.text));
    }
  }
  stats.textContent =
    removed || added ? `${removed} passages removed, ${added} added (v${before.version} → v${after.version})` : "no change";
}

// --- slices and their messages ------------------------------------------------------------

async function loadSlices(generation, fromTurn) {
  const table = $("slices");
  const more = $("slices-more");
  const error = $("slices-error");
  more.hidden = true;
  if (fromTurn === 1) gridTable(table, ["turns", "source", "summary version", "created", "text"], []);
  try {
    const body = await api(sessionPath(current.sid, `/slices${query({ from_turn: fromTurn })}`));
    if (!stillCurrent(generation)) return;
    hideError(error);
    const tbody = table.tBodies[0];
    const slices = Array.isArray(body.slices) ? body.slices : [];
    if (fromTurn === 1 && slices.length === 0) tbody.append(el("tr", null, el("td", "muted", "no slices yet")));
    for (const s of slices) tbody.append(sliceRow(s));
    current.slicesNext = typeof body.next_from_turn === "number" ? body.next_from_turn : null;
    more.hidden = current.slicesNext === null;
  } catch (err) {
    if (stillCurrent(generation)) showError(error, err);
  }
}

function sliceRow(s) {
  const range = s.from_turn === s.to_turn ? `turn ${s.from_turn}` : `turns ${s.from_turn}–${s.to_turn}`;
  const open = el("button", "link", range);
  open.type = "button";
  const row = el(
    "tr",
    "clickable",
    el("td", null, open),
    el("td", null, formatValue(s.source)),
    el("td", null, formatValue(s.summary_version)),
    el("td", null, formatDate(s.created_at)),
    el("td", "text", s.summary || ""),
  );
  row.dataset.testid = "slice-row";
  row.addEventListener("click", () => openSliceMessages(s));
  return row;
}

function closeSliceMessages() {
  const box = $("slice-messages");
  clear(box);
  box.hidden = true;
}

async function openSliceMessages(slice, fromSeq = slice.first_seq) {
  const generation = current.generation;
  const box = $("slice-messages");
  if (fromSeq === slice.first_seq) {
    clear(box);
    box.append(el("h4", null, `Messages of turns ${slice.from_turn}–${slice.to_turn} (seq ${slice.first_seq}–${slice.last_seq})`));
    box.append(el("ol", "message-list"));
    box.hidden = false;
  }
  const list = box.querySelector("ol");
  const old = box.querySelector("button.more");
  if (old) old.remove();
  try {
    const path = sessionPath(current.sid, `/messages${query({ from_seq: fromSeq, to_seq: slice.last_seq })}`);
    const body = await api(path);
    if (!stillCurrent(generation)) return;
    for (const m of Array.isArray(body.messages) ? body.messages : []) list.append(messageItem(m));
    if (typeof body.next_from_seq === "number") {
      const more = el("button", "more", "More messages");
      more.type = "button";
      more.addEventListener("click", () => openSliceMessages(slice, body.next_from_seq));
      box.append(more);
    }
  } catch (err) {
    if (!stillCurrent(generation)) return;
    const line = el("p", "error");
    showError(line, err);
    box.append(line);
  }
}

function messageItem(m) {
  const meta = [`seq ${m.seq}`, `turn ${m.turn}`, formatValue(m.role), formatValue(m.status), formatDate(m.created_at)];
  const item = el("li", `message role-${String(m.role).replace(/[^a-z]/g, "")}`, el("div", "muted", meta.join(" · ")));
  item.dataset.testid = "slice-message";
  item.append(el("div", "text", m.content === null || m.content === undefined ? "" : String(m.content)));
  if (m.tool_calls) item.append(el("div", "text muted", `tool calls: ${JSON.stringify(m.tool_calls)}`));
  return item;
}

// --- the context preview ------------------------------------------------------------------

async function previewContext() {
  const generation = current.generation;
  const box = $("context");
  const error = $("context-error");
  clear(box);
  hideError(error);
  const maxChars = $("context-max-chars").value.trim();
  const question = $("context-question").value;
  try {
    const body = await api(
      sessionPath(current.sid, `/context${query({ max_chars: maxChars, question, explain: "true" })}`),
    );
    if (stillCurrent(generation)) renderContext(body);
  } catch (err) {
    if (stillCurrent(generation)) showError(error, err);
  }
}

function part(origin, label, meta, text) {
  const badge = el("span", `badge origin-${String(origin).replace(/[^a-z_]/g, "")}`, label);
  badge.dataset.testid = "origin-badge";
  const item = el("li", "part", badge, meta ? el("span", "muted", meta) : null, el("div", "text", text));
  item.dataset.testid = "context-part";
  item.dataset.origin = String(origin);
  return item;
}

function renderContext(body) {
  const box = $("context");
  const explain = body.explain && typeof body.explain === "object" ? body.explain : null;
  const facts = el("table", "kv");
  facts.dataset.testid = "context-facts";
  fillKv(facts, [
    ["summary tier", formatValue(body.summary_tier)],
    ["estimated tokens", formatValue(body.estimated_tokens)],
    ["turns", formatValue(body.turn_count)],
    ["layout", explain ? formatValue(explain.layout) : "—"],
  ]);
  box.append(facts);
  const list = el("ol", "parts");
  list.dataset.testid = "context-parts";
  const messages = Array.isArray(body.messages) ? body.messages : [];
  const spoken = messages.filter((m) => m.role !== "system");
  if (explain) {
    for (const item of Array.isArray(explain.memory) ? explain.memory : []) {
      const origin = String(item.origin);
      list.append(part(origin, ORIGIN_LABELS[origin] || origin, null, String(item.text ?? "")));
    }
    const raw = Array.isArray(explain.raw) ? explain.raw : [];
    raw.forEach((r, i) => {
      const meta = `turn ${r.turn} · seq ${r.seq} · ${r.role} · ${r.chars} chars`;
      const said = spoken[i] ? spoken[i].content : null;
      list.append(part("raw", "raw turn", meta, said === null || said === undefined ? "" : String(said)));
    });
    // What follows the raw turns is the question, closing the messages.
    for (const m of spoken.slice(raw.length)) {
      list.append(part("question", "question", formatValue(m.role), m.content === null ? "" : String(m.content)));
    }
  } else {
    box.append(el("p", "muted", "the daemon gave no explain: the messages as they are"));
    for (const m of spoken) list.append(part(m.role, String(m.role), null, m.content === null ? "" : String(m.content)));
  }
  box.append(list);
  const system = messages.find((m) => m.role === "system");
  if (system) {
    const details = el("details", "system", el("summary", null, "the system message, whole"), el("pre", "text", String(system.content ?? "")));
    details.dataset.testid = "context-system";
    box.append(details);
  }
}

// --- wiring -------------------------------------------------------------------------------

function tokenStatus() {
  const tenant = getTenant();
  $("token-status").textContent =
    (getToken() ? "token set for this tab" : "no token") + (tenant ? `, tenant ${tenant}` : "");
}

function forgetAll() {
  // What was read with the token goes with it.
  current = { sid: null, generation: current.generation + 1, versions: [], slicesNext: null };
  $("session-view").hidden = true;
  clear($("overview"));
  clear($("user-sessions"));
  $("user-sessions-more").hidden = true;
  userListing = null;
}

function onSubmit(id, handler) {
  $(id).addEventListener("submit", (event) => {
    // form-action 'none': nothing is ever submitted, every form is handled here.
    event.preventDefault();
    handler();
  });
}

function start() {
  onSubmit("token-form", () => {
    const input = $("token-input");
    setToken(input.value.trim(), $("tenant-input").value.trim());
    input.value = "";
    tokenStatus();
    loadOverview();
    if (current.sid) openSession(current.sid);
  });
  $("token-forget").addEventListener("click", () => {
    setToken("");
    $("token-input").value = "";
    $("tenant-input").value = "";
    tokenStatus();
    forgetAll();
  });
  $("overview-refresh").addEventListener("click", loadOverview);
  onSubmit("session-form", () => {
    const sid = $("session-input").value.trim();
    if (sid) openSession(sid);
  });
  onSubmit("user-form", () => {
    const userId = $("user-input").value.trim();
    if (userId) loadUserSessions(userId, null);
  });
  $("user-sessions-more").addEventListener("click", () => {
    if (userListing) loadUserSessions(userListing.userId, userListing.cursor);
  });
  $("slices-more").addEventListener("click", () => {
    if (current.slicesNext !== null) loadSlices(current.generation, current.slicesNext);
  });
  $("diff-from").addEventListener("change", renderDiff);
  $("diff-to").addEventListener("change", renderDiff);
  onSubmit("context-form", () => {
    if (current.sid) previewContext();
  });
  tokenStatus();
  loadOverview();
}

start();
