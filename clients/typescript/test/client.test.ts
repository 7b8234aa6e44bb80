/**
 * MemoryClient against a real daemon process (one for the run, started here): the gateway loop,
 * every route with its typed answer, the error tree, and the retry contract — a write retried
 * after its reply was cut is stored exactly once, Retry-After is waited for, a 4xx is never
 * retried, and an attempt's timeout, the call's deadline and the caller's signal stop it.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  ApiError,
  ClientError,
  Conflict,
  Forbidden,
  InvalidRequest,
  MemoryClient,
  NotFound,
  Timeout,
  Unauthorized,
  Unavailable,
  newMessageId,
  type AppendResult,
  type BatchMessage,
  type BatchResult,
  type ChatMessage,
  type CloseResult,
  type Context,
  type Erasure,
  type GatewayState,
  type MessagesPage,
  type PatchResult,
  type ProfileItem,
  type ProfileTopic,
  type Readiness,
  type RebuildJob,
  type RebuildResult,
  type RecallMatch,
  type Role,
  type SessionInfo,
  type Slice,
  type StoredMessage,
  type SummaryResult,
  type TurnResult,
  type UserProfile,
  type UserSession,
  type UserSessionsPage,
  type UserSummary,
} from "@tiered-memory/client";

import {
  CutReplyProxy,
  OPERATOR_TOKEN,
  ScriptedServer,
  SUMMARY_EVERY,
  TENANT,
  TENANT_TOKEN,
  assertShape,
  freePort,
  newSid,
  startDaemon,
  type Daemon,
  type Shape,
} from "./support.js";

// Each interface's keys, marked as the interface marks them: the compiler holds these to the
// interfaces, assertShape holds the daemon's answers to these.
const CONTEXT: Shape<Context> = {
  session_id: "required",
  summary_tier: "required",
  summary: "required",
  covered_turns: "required",
  topics: "required",
  messages: "required",
  turn_count: "required",
  recent_transcript: "required",
  answer_transcript: "required",
  estimated_tokens: "required",
  planning: "required",
  planning_history: "required",
  compressions: "required",
  compression_applied: "required",
  state: "optional",
  state_version: "optional",
  user_memory: "required",
  kb_snippets_used: "optional",
};
const CHAT_MESSAGE: Shape<ChatMessage> = {
  role: "required",
  content: "required",
  tool_calls: "optional",
  tool_call_id: "optional",
  name: "optional",
};
const TURN: Shape<TurnResult> = {
  context: "required",
  message_id: "required",
  summary_scheduled: "required",
  turn_count: "required",
  created: "required",
};
const APPEND: Shape<AppendResult> = {
  session_id: "required",
  message_id: "required",
  turn_count: "required",
  summary_scheduled: "required",
  created: "required",
};
const SUMMARY: Shape<SummaryResult> = {
  session_id: "required",
  tier: "required",
  summary: "required",
  turn_count: "required",
  covered_turns: "required",
  topics: "required",
  payload: "required",
  source: "required",
  version: "required",
  updated_at: "required",
  age_seconds: "required",
};
const SESSION: Shape<SessionInfo> = {
  session_id: "required",
  user_id: "required",
  turn_count: "required",
  message_count: "required",
  covered_turns: "required",
  created_at: "required",
  last_activity: "required",
  closed: "required",
  closed_at: "required",
};
const STORED: Shape<StoredMessage> = {
  seq: "required",
  turn: "required",
  role: "required",
  content: "required",
  status: "required",
  message_id: "required",
  channel: "required",
  created_at: "required",
  tool_calls: "optional",
  tool_call_id: "optional",
  name: "optional",
  thinking_content: "optional",
  thinking_duration: "optional",
};
const PAGE: Shape<MessagesPage> = { session_id: "required", messages: "required", next_from_seq: "required" };
const SLICE: Shape<Slice> = {
  from_turn: "required",
  to_turn: "required",
  first_seq: "required",
  last_seq: "required",
  summary: "required",
  source: "required",
  model: "required",
  prompt_id: "required",
  summary_version: "required",
  created_at: "required",
  messages_url: "required",
};
const MATCH: Shape<RecallMatch> = { seq: "required", turn: "required", score: "required", slice: "required", messages: "required" };
const STATE: Shape<GatewayState> = { session_id: "required", state: "required", version: "required" };
const PATCH: Shape<PatchResult> = {
  session_id: "required",
  message: "required",
  turn_count: "required",
  changed: "required",
  summary_scheduled: "required",
};
const BATCH: Shape<BatchResult> = {
  session_id: "required",
  messages: "required",
  turn_count: "required",
  summary_scheduled: "required",
  created: "required",
};
const BATCH_MESSAGE: Shape<BatchMessage> = { message_id: "required", seq: "required", turn: "required", duplicate: "required" };
const JOB: Shape<RebuildJob> = {
  session_id: "required",
  job_id: "required",
  state: "required",
  url: "required",
  queued_at: "required",
  started_at: "required",
  ended_at: "required",
  result: "required",
  error: "required",
  started: "optional",
};
const REBUILT: Shape<RebuildResult> = {
  session_id: "required",
  summary: "required",
  covered_turns: "required",
  version: "required",
  source: "required",
  slices: "required",
  job_id: "required",
};
const CLOSE: Shape<CloseResult> = { session_id: "required", persisted: "required", cached: "required", turn_count: "required" };
const USER_SUMMARY: Shape<UserSummary> = {
  session_id: "required",
  summary: "required",
  turn_count: "required",
  covered_turns: "required",
  topics: "required",
  source: "required",
  updated_at: "required",
  age_seconds: "required",
};
const PROFILE: Shape<UserProfile> = {
  user_id: "required",
  facts: "required",
  preferences: "required",
  topics: "required",
  sessions: "required",
  updated_at: "required",
  text: "required",
};
const PROFILE_ITEM: Shape<ProfileItem> = { text: "required", count: "required", first_seen: "required", last_seen: "required" };
const PROFILE_TOPIC: Shape<ProfileTopic> = { topic: "required", count: "required", first_seen: "required", last_seen: "required" };
const USER_SESSION: Shape<UserSession> = {
  session_id: "required",
  turn_count: "required",
  message_count: "required",
  created_at: "required",
  last_activity: "required",
  closed_at: "required",
  summarized: "required",
  covered_turns: "required",
  topics: "required",
  summary_updated_at: "required",
};
const USER_SESSIONS: Shape<UserSessionsPage> = { user_id: "required", sessions: "required", next_cursor: "required" };
const ERASURE: Shape<Erasure> = {
  user_id: "required",
  state: "required",
  sessions: "required",
  messages: "required",
  requested_at: "optional",
  finished_at: "optional",
  url: "optional",
};
const READINESS: Shape<Readiness> = { ready: "required", status: "required", tiers: "required" };

const CONVERSATION: [string, string][] = [
  ["Hi, I'm Dana. I want to order the Vitaboost multivitamin.", "Hello Dana! Vitaboost costs 39 dollars a box."],
  ["How often do I take Vitaboost?", "Take one Vitaboost tablet twice a day after meals."],
  ["Can you ship it to Lisbon by Friday?", "Yes, express shipping to Lisbon arrives by Thursday."],
];

/** Requests the daemon has answered, by `METHOD route`, from its own request histogram. */
async function routeCounts(memory: MemoryClient): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  // Greedy to the last brace: route labels hold braces of their own ({session_id}).
  const sample = /^tiered_memory_request_duration_seconds_count\{(.*)\} (\S+)$/;
  for (const line of (await memory.metricsText()).split("\n")) {
    const found = sample.exec(line);
    if (!found) {
      continue;
    }
    const labels = Object.fromEntries([...found[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    const key = `${labels["method"]} ${labels["route"]}`;
    counts.set(key, (counts.get(key) ?? 0) + Number(found[2]));
  }
  return counts;
}

/**
 * The stored summary once it covers `turns` turns (the daemon writes it in the background). Until
 * then the cold tier answers one made on the read (version 0, no slices): it does not count.
 */
async function summaryCovering(memory: MemoryClient, sid: string, turns: number): Promise<SummaryResult> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const summary = await memory.summary(sid);
    const stored = summary.tier === "hot" || summary.tier === "warm";
    if ((stored && summary.covered_turns >= turns) || Date.now() > deadline) {
      return summary;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * A close that says `persisted`. Close waits about 1 s for a background summary pass still
 * running (longer on a loaded machine); it is idempotent, and a later one says `persisted`
 * once that pass is done.
 */
async function closeUntilPersisted(close: () => Promise<CloseResult>): Promise<CloseResult> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const closed = await close();
    if (closed.persisted || Date.now() > deadline) {
      return closed;
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** The rejection of `call`, which must be one. */
async function rejection(call: Promise<unknown>): Promise<unknown> {
  try {
    await call;
  } catch (error) {
    return error;
  }
  assert.fail("expected the call to reject");
}

describe("MemoryClient against a real daemon", () => {
  let daemon: Daemon;
  let memory: MemoryClient;

  before(async () => {
    daemon = await startDaemon();
    memory = new MemoryClient({ baseUrl: daemon.url, token: TENANT_TOKEN });
  });

  after(async () => {
    await daemon?.stop();
  });

  test("kbSnippets on turn (the body) and on context (one kb_snippet each, in order)", async () => {
    const sid = newSid();
    const userId = `u-${sid}`;
    const snippets = ["Vitaboost: twice a day, after meals.", "Vitaboost & water? 30 sachets a box."];
    const turn = await memory.turn(sid, "How do I take it?", { userId, kbSnippets: snippets });
    assert.equal(turn.context.kb_snippets_used, 2);
    const first = turn.context.messages[0]?.content ?? "";
    assert.match(first, /^<reference>\n/);
    assert.ok(first.includes(`[1] ${snippets[0]}\n[2] ${snippets[1]}\n</reference>\nHow do I take it?`), first);
    await memory.append(sid, "assistant", "Twice a day.", { userId });
    const context = await memory.context(sid, { userId, kbSnippets: [...snippets].reverse() });
    assert.equal(context.kb_snippets_used, 2);
    assert.ok((context.messages[0]?.content ?? "").includes(`[1] ${snippets[1]}\n[2] ${snippets[0]}`));
    assert.equal((await memory.context(sid, { userId })).kb_snippets_used, undefined);
  });

  test("the gateway loop: turn, the reply, context, close, summary", async () => {
    const sid = newSid();
    const userId = `u-${sid}`;
    for (const [n, [utterance, reply]] of CONVERSATION.entries()) {
      const turn = await memory.turn(sid, utterance, { userId, systemPrompt: "You are a pharmacy assistant.", maxChars: 2000 });
      assert.equal(turn.created, true);
      assert.equal(turn.context.messages[0]?.role, "system");
      assert.match(turn.context.messages[0]?.content ?? "", /pharmacy assistant/);
      assert.deepEqual(turn.context.messages.at(-1), { role: "user", content: utterance });
      assert.equal(turn.context.turn_count, n);
      assert.equal(turn.turn_count, n);
      const stored = await memory.append(sid, "assistant", reply, { userId });
      assert.deepEqual([stored.created, stored.turn_count, stored.summary_scheduled], [true, n + 1, (n + 1) % SUMMARY_EVERY === 0]);
    }
    const context = await memory.context(sid, { userId, question: "When does my order arrive?" });
    assert.equal(context.turn_count, CONVERSATION.length);
    assert.equal(context.messages.at(-1)?.content, "When does my order arrive?");
    assert.match(JSON.stringify(context.messages), /Lisbon/);
    const closed = await closeUntilPersisted(() => memory.close(sid, { userId }));
    assert.deepEqual([closed.persisted, closed.turn_count], [true, CONVERSATION.length]);
    const summary = await memory.summary(sid, { userId });
    assert.ok(summary.tier === "hot" || summary.tier === "warm", summary.tier);
    assert.equal(summary.covered_turns, CONVERSATION.length);
    assert.match(summary.summary ?? "", /Vitaboost/);
  });

  test("every route of the OpenAPI document, each with its typed answer", async () => {
    const seenBefore = await routeCounts(memory);
    const sid = newSid();
    const userId = `u-${sid}`;
    const mine = { userId };

    assert.equal(await memory.healthz(), true);
    const ready = await memory.readyz();
    assertShape(ready, READINESS, "readyz");
    assert.deepEqual(ready, { ready: true, status: "ok", tiers: { hot: "ok", sql: "ok" } });

    for (const [n, [utterance, reply]] of CONVERSATION.entries()) {
      const turn = await memory.turn(sid, utterance, { ...mine, systemPrompt: "Be brief.", maxChars: 2000 });
      assertShape(turn, TURN, "turn");
      assertShape(turn.context, CONTEXT, "turn.context");
      turn.context.messages.forEach((m) => assertShape(m, CHAT_MESSAGE, "turn.context.messages[]"));
      const appended = await memory.append(sid, "assistant", reply, mine);
      assertShape(appended, APPEND, "append");
      assert.equal(appended.turn_count, n + 1);
    }
    const summary = await summaryCovering(memory, sid, SUMMARY_EVERY);
    assertShape(summary, SUMMARY, "summary");
    assert.equal(summary.covered_turns, SUMMARY_EVERY);

    const context = await memory.context(sid, { ...mine, maxChars: 3000, question: "And the price?" });
    assertShape(context, CONTEXT, "context");
    assert.deepEqual([context.turn_count, context.messages.at(-1)?.content], [3, "And the price?"]);

    const info = await memory.session(sid, mine);
    assertShape(info, SESSION, "session");
    assert.deepEqual([info.user_id, info.turn_count, info.message_count, info.closed], [userId, 3, 6, false]);

    const stored = await memory.messages(sid, { fromSeq: 3, toSeq: 4 });
    stored.forEach((m) => assertShape(m, STORED, "messages[]"));
    assert.deepEqual(stored.map((m) => [m.seq, m.role]), [[3, "user"], [4, "assistant"]]);
    const page = await memory.messagesPage(sid, { limit: 2 });
    assertShape(page, PAGE, "messagesPage");
    assert.deepEqual([page.messages.length, page.next_from_seq], [2, 3]);
    const everything: StoredMessage[] = [];
    for await (const m of memory.iterMessages(sid)) {
      everything.push(m);
    }
    assert.deepEqual(everything.map((m) => m.content), CONVERSATION.flat());

    const slices = await memory.slices(sid);
    slices.forEach((s) => assertShape(s, SLICE, "slices[]"));
    assert.deepEqual(slices.map((s) => [s.from_turn, s.to_turn]), [[1, 3]]);
    const found = await memory.recall(sid, "Lisbon shipping", { k: 2 });
    assert.ok(found.length > 0 && found.length <= 2);
    found.forEach((m) => assertShape(m, MATCH, "recall[]"));
    assert.ok(found.some((m) => m.messages.some((x) => x.content.includes("Lisbon"))));

    const empty = await memory.state(sid);
    assertShape(empty, STATE, "state");
    assert.deepEqual([empty.state, empty.version], [null, 0]);
    const written = await memory.putState(sid, { kb_topic: "vitamins" }, { ifMatch: 0 });
    assert.deepEqual(written, { session_id: sid, state: { kb_topic: "vitamins" }, version: 1 });
    assert.deepEqual(await memory.state(sid), written);
    const stale = await rejection(memory.putState(sid, { kb_topic: "other" }, { ifMatch: 0 }));
    assert.ok(stale instanceof Conflict);
    assert.deepEqual([stale.status, stale.code], [412, "precondition_failed"]);
    const withState = await memory.context(sid);
    assert.deepEqual([withState.state, withState.state_version], [{ kb_topic: "vitamins" }, 1]);

    // A streaming reply, stored at its start and finalized by a patch (no summary covers it yet).
    const streamed = newSid();
    await memory.append(streamed, "user", "Tell me a story.");
    const start = await memory.append(streamed, "assistant", "Once", { status: "streaming" });
    assert.equal(start.turn_count, 0);
    const patched = await memory.patchMessage(streamed, start.message_id, { content: "Once upon a time.", status: "completed" });
    assertShape(patched, PATCH, "patchMessage");
    assertShape(patched.message, STORED, "patchMessage.message");
    assert.deepEqual([patched.changed, patched.turn_count, patched.message.status], [true, 1, "completed"]);
    const again = await memory.patchMessage(streamed, start.message_id, { content: "Once upon a time.", status: "completed" });
    assert.equal(again.changed, false);
    // Taking the reply back opens its turn again; a repeat finds nothing to remove.
    assert.equal(await memory.deleteMessage(streamed, start.message_id), true);
    assert.equal(await memory.deleteMessage(streamed, start.message_id), false);
    assert.deepEqual([(await memory.session(streamed)).turn_count, (await memory.messages(streamed)).length], [0, 1]);

    // A reply's reasoning is stored and listed with it, and never shown to the model again.
    const reasoned = newSid();
    await memory.append(reasoned, "user", "Is 91 prime?");
    await memory.append(reasoned, "assistant", "No: 7 times 13.", { thinkingContent: "Try 7: 7 x 13 = 91.", thinkingDuration: 4 });
    const listed = await memory.messages(reasoned);
    listed.forEach((m) => assertShape(m, STORED, "messages[] with reasoning"));
    assert.deepEqual(
      listed.map((m) => [m.thinking_content, m.thinking_duration]),
      [[undefined, undefined], ["Try 7: 7 x 13 = 91.", 4]],
    );
    assert.ok(!JSON.stringify(await memory.context(reasoned)).includes("7 x 13"));

    const imported = newSid();
    const history = [
      { role: "user" as Role, content: "An old question", message_id: `${imported}-1` },
      { role: "assistant" as Role, content: "An old answer", message_id: `${imported}-2` },
    ];
    const batch = await memory.appendBatch(imported, history);
    assertShape(batch, BATCH, "appendBatch");
    batch.messages.forEach((m) => assertShape(m, BATCH_MESSAGE, "appendBatch.messages[]"));
    assert.deepEqual([batch.created, batch.turn_count, batch.messages.map((m) => m.seq)], [true, 1, [1, 2]]);
    const replayed = await memory.appendBatch(imported, history);
    assert.deepEqual([replayed.created, replayed.messages.map((m) => m.duplicate)], [false, [true, true]]);

    const rebuilt = await memory.rebuildSummary(sid, { pollIntervalMs: 100 });
    assertShape(rebuilt, REBUILT, "rebuildSummary");
    assert.deepEqual([rebuilt.covered_turns, rebuilt.version > summary.version], [3, true]);
    assert.equal(rebuilt.summary, (await memory.summary(sid)).summary);
    const job = await memory.rebuildJob(sid, rebuilt.job_id);
    assertShape(job, JOB, "rebuildJob");
    assert.deepEqual([job.state, job.result?.version, job.error], ["done", rebuilt.version, null]);
    let next = await memory.startRebuild(sid);
    assertShape(next, JOB, "startRebuild");
    assert.deepEqual([next.started, next.job_id !== rebuilt.job_id], [true, true]);
    while (next.state !== "done" && next.state !== "failed") {
      // Not a busy loop: the daemon needs the CPU for the job itself.
      await new Promise((resolve) => setTimeout(resolve, 20));
      next = await memory.rebuildJob(sid, next.job_id);
    }

    const summaries = await memory.userSummaries(userId, { limit: 5 });
    summaries.forEach((s) => assertShape(s, USER_SUMMARY, "userSummaries[]"));
    assert.deepEqual(summaries.map((s) => s.session_id), [sid]);
    await memory.deleteSummary(sid);
    assert.equal((await memory.summary(sid)).tier, "cold");

    const closed = await closeUntilPersisted(() => memory.close(sid, { ...mine, timeoutMs: 30_000 }));
    assertShape(closed, CLOSE, "close");
    assert.deepEqual([closed.persisted, closed.turn_count], [true, 3]);
    assert.equal((await memory.session(sid)).closed, true);

    // The user's next session carries this one over; the user's profile and sessions.
    const later = await memory.turn(`${sid}-2`, "What did I order last time?", { ...mine, userMemory: "last_session" });
    assert.deepEqual(later.context.user_memory, { mode: "last_session", session_id: sid, profile: false });
    assert.equal((await memory.context(`${sid}-2`, { userMemory: "off" })).user_memory, null);
    const profile = await memory.profile(userId);
    assertShape(profile, PROFILE, "profile");
    profile.facts.concat(profile.preferences).forEach((i) => assertShape(i, PROFILE_ITEM, "profile item"));
    profile.topics.forEach((t) => assertShape(t, PROFILE_TOPIC, "profile topic"));
    assert.ok(profile.sessions >= 1);
    const sessions: string[] = [];
    for await (const s of memory.userSessions(userId)) {
      assertShape(s, USER_SESSION, "userSessions[]");
      sessions.push(s.session_id);
    }
    assert.deepEqual(sessions, [`${sid}-2`, sid]);
    const first = await memory.userSessionsPage(userId, { limit: 1 });
    assertShape(first, USER_SESSIONS, "userSessionsPage");
    assert.equal(first.sessions.length, 1);
    assert.notEqual(first.next_cursor, null);
    const rest = await memory.userSessionsPage(userId, { cursor: first.next_cursor, limit: 1 });
    assert.deepEqual(rest.sessions.map((s) => s.session_id), [sid]);

    assert.match(await memory.metricsText(), /tiered_memory_request_duration_seconds_count/);
    const document = await memory.openapi();

    await memory.delete(sid);
    assert.ok((await rejection(memory.session(sid))) instanceof NotFound);
    const erased = await memory.eraseUser(userId);
    assertShape(erased, ERASURE, "eraseUser");
    const erasure = await memory.erasure(userId);
    assertShape(erasure, ERASURE, "erasure");
    assert.equal(erasure.state, "finished");
    assert.ok((await rejection(memory.profile(userId))) instanceof NotFound);

    // Every route the daemon documents was answered during this test.
    const seenAfter = await routeCounts(memory);
    // The inspector's routes (tagged `inspector`) serve an operator's browser, not a gateway.
    const paths = document["paths"] as Record<string, Record<string, { tags?: string[] }>>;
    const documented = Object.entries(paths).flatMap(([path, ops]) =>
      Object.entries(ops)
        .filter(([, op]) => !(op.tags ?? []).includes("inspector"))
        .map(([m]) => `${m.toUpperCase()} ${path}`),
    );
    const missed = documented.filter((route) => (seenAfter.get(route) ?? 0) <= (seenBefore.get(route) ?? 0));
    assert.deepEqual(missed, []);
  });

  test("each refusal is its own error, with the daemon's code and message", async () => {
    const sid = newSid();
    await memory.append(sid, "user", "Hello", { messageId: `${sid}-1`, userId: "u-1" });

    const unknown = await rejection(memory.session(newSid()));
    assert.ok(unknown instanceof NotFound && unknown instanceof ApiError && unknown instanceof ClientError);
    assert.deepEqual([unknown.status, unknown.code, unknown.name], [404, "not_found", "NotFound"]);

    const bad = await rejection(memory.append(sid, "robot" as Role, "Hello"));
    assert.ok(bad instanceof InvalidRequest);
    assert.deepEqual([bad.status, bad.code], [400, "invalid_input"]);
    assert.match(bad.message, /role/);

    const huge = await rejection(memory.append(sid, "user", "x".repeat(1_000_000)));
    assert.ok(huge instanceof InvalidRequest);
    assert.equal(huge.status, 413);

    const reused = await rejection(memory.append(sid, "user", "Something else", { messageId: `${sid}-1` }));
    assert.ok(reused instanceof Conflict);
    assert.equal(reused.code, "conflict");

    const otherUser = await rejection(memory.context(sid, { userId: "u-2" }));
    assert.ok(otherUser instanceof Forbidden);
    assert.equal(otherUser.code, "forbidden");

    const anonymous = new MemoryClient({ baseUrl: daemon.url });
    const noToken = await rejection(anonymous.summary(sid));
    assert.ok(noToken instanceof Unauthorized);
    assert.deepEqual([noToken.status, noToken.code], [401, "unauthorized"]);
    const stranger = new MemoryClient({ baseUrl: daemon.url, token: "not-a-configured-token-000" });
    assert.ok((await rejection(stranger.summary(sid))) instanceof Unauthorized);

    // A token restricted to acme that states another tenant is refused, whatever the session.
    const trespasser = new MemoryClient({ baseUrl: daemon.url, token: TENANT_TOKEN, tenant: "globex" });
    const otherTenant = await rejection(trespasser.summary(sid));
    assert.ok(otherTenant instanceof Forbidden);
    assert.deepEqual([otherTenant.status, otherTenant.code], [403, "forbidden"]);
  });

  test("X-Tenant puts an operator's token in the tenant's namespace; userId goes as X-User-ID and user_id", async () => {
    const sid = newSid();
    const front = await ScriptedServer.start(daemon.url);
    try {
      const operator = new MemoryClient({ baseUrl: front.url, token: OPERATOR_TOKEN, tenant: TENANT });
      const stored = await operator.append(sid, "user", "Operator note", { userId: "u-7" });
      const [request] = front.seen;
      assert.equal(request?.headers["authorization"], `Bearer ${OPERATOR_TOKEN}`);
      assert.equal(request?.headers["x-tenant"], TENANT);
      assert.equal(request?.headers["x-user-id"], "u-7");
      assert.deepEqual(front.bodies()[0], { role: "user", content: "Operator note", message_id: stored.message_id, user_id: "u-7" });
    } finally {
      await front.close();
    }
    // The tenant's own token sees the session; the operator without X-Tenant is in no tenant's namespace.
    assert.deepEqual((await memory.messages(sid)).map((m) => m.content), ["Operator note"]);
    const unscoped = new MemoryClient({ baseUrl: daemon.url, token: OPERATOR_TOKEN });
    assert.ok((await rejection(unscoped.messages(sid))) instanceof NotFound);
  });

  test("a write repeated with its message_id is answered 200 and stored once", async () => {
    const sid = newSid();
    const messageId = newMessageId();
    assert.match(messageId, /^[0-9a-f]{32}$/);
    const first = await memory.append(sid, "user", "Is it vegan?", { messageId });
    const second = await memory.append(sid, "user", "Is it vegan?", { messageId });
    assert.deepEqual([first.created, second.created], [true, false]);
    assert.deepEqual({ ...second, created: true }, first);
    const turnId = newMessageId();
    const turn = await memory.turn(sid, "And gluten free?", { messageId: turnId });
    const turnAgain = await memory.turn(sid, "And gluten free?", { messageId: turnId });
    assert.deepEqual([turn.created, turnAgain.created, turnAgain.message_id], [true, false, turnId]);
    assert.deepEqual((await memory.messages(sid)).map((m) => m.message_id), [messageId, turnId]);
  });

  test("a retry whose first reply was cut after the daemon stored the message stores it once", async () => {
    const sid = newSid();
    const proxy = await CutReplyProxy.start(daemon.url);
    try {
      const client = new MemoryClient({ baseUrl: proxy.url, token: TENANT_TOKEN, retries: 3, backoffMs: 10 });
      await client.append(sid, "user", "Where is my parcel?");
      proxy.cutNextReply();
      const reply = await client.append(sid, "assistant", "It left the depot this morning.");
      assert.equal(proxy.cuts, 1);
      // The retry found the message stored by the attempt whose answer was lost: 200, not 201.
      assert.deepEqual([reply.created, reply.turn_count], [false, 1]);
      proxy.cutNextReply();
      const turn = await client.turn(sid, "When will it arrive?");
      assert.equal(proxy.cuts, 2);
      assert.deepEqual([turn.created, turn.context.messages.at(-1)?.content], [false, "When will it arrive?"]);
      const stored = await memory.messages(sid);
      assert.deepEqual(
        stored.map((m) => [m.content, m.message_id]),
        [
          ["Where is my parcel?", stored[0]?.message_id],
          ["It left the depot this morning.", reply.message_id],
          ["When will it arrive?", turn.message_id],
        ],
      );
    } finally {
      await proxy.close();
    }
  });

  describe("retries", () => {
    let front: ScriptedServer & { url: string };

    before(async () => {
      front = await ScriptedServer.start(daemon.url);
    });

    after(async () => {
      await front.close();
    });

    function client(options: Partial<ConstructorParameters<typeof MemoryClient>[0]> = {}): MemoryClient {
      front.seen.length = 0;
      return new MemoryClient({ baseUrl: front.url, token: TENANT_TOKEN, backoffMs: 10, ...options });
    }

    test("the caller's trace context goes with each attempt, read once per call", async () => {
      const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
      let reads = 0;
      const mem = client({ traceContext: () => (reads++, { traceparent, tracestate: "gw=1" }) });
      front.script({ answer: 503, retryAfter: "0" });
      await mem.append(newSid(), "user", "Trace me");
      assert.equal(front.seen.length, 2);
      for (const seen of front.seen) {
        assert.deepEqual([seen.headers["traceparent"], seen.headers["tracestate"]], [traceparent, "gw=1"]);
      }
      assert.equal(reads, 1);
      // Nothing is sent without it.
      front.seen.length = 0;
      await client().append(newSid(), "user", "No trace");
      assert.equal(front.seen[0]!.headers["traceparent"], undefined);
    });

    test("a 503's Retry-After is waited for, and the retry sends the same message_id", async () => {
      const sid = newSid();
      const mem = client();
      front.script({ answer: 503, code: "sql_unavailable", retryAfter: "1" });
      const started = Date.now();
      const stored = await mem.append(sid, "user", "Hello again");
      const waited = front.seen[1]!.at - front.seen[0]!.at;
      assert.ok(waited >= 950, `the retry came ${waited} ms after the 503`);
      assert.ok(Date.now() - started < 5_000);
      assert.deepEqual(front.bodies().map((b) => b["message_id"]), [stored.message_id, stored.message_id]);
      assert.equal(stored.created, true);
      assert.deepEqual((await memory.messages(sid)).map((m) => m.message_id), [stored.message_id]);
    });

    test("a Retry-After longer than maxBackoffMs is cut to it", async () => {
      const mem = client({ maxBackoffMs: 200 });
      front.script({ answer: 503, retryAfter: "30" });
      const started = Date.now();
      await mem.summary(newSid());
      const took = Date.now() - started;
      assert.ok(took >= 190 && took < 5_000, `took ${took} ms`);
      assert.equal(front.seen.length, 2);
    });

    test("5xx answers are retried until the retries are used up, then Unavailable", async () => {
      const mem = client({ retries: 2 });
      front.script({ answer: 503, retryAfter: "0" }, { answer: 500, code: "internal" }, { answer: 503, retryAfter: "0" });
      const error = await rejection(mem.append(newSid(), "user", "Anyone there?"));
      assert.ok(error instanceof Unavailable);
      assert.deepEqual([error.status, error.retryAfter], [503, 0]);
      assert.equal(front.seen.length, 3);
      assert.equal(new Set(front.bodies().map((b) => b["message_id"])).size, 1);
    });

    test("a 4xx is never retried: the daemon's 400, a 429 with its Retry-After", async () => {
      const mem = client({ retries: 3 });
      const bad = await rejection(mem.messages(newSid(), { limit: 5000 }));
      assert.ok(bad instanceof InvalidRequest);
      assert.deepEqual([bad.status, bad.code, front.seen.length], [400, "invalid_input", 1]);

      front.seen.length = 0;
      // A retry would wait the Retry-After (5 s, maxBackoffMs): far beyond what one refusal takes, even on a loaded machine.
      front.script({ answer: 429, code: "rate_limited", retryAfter: "5" });
      const started = Date.now();
      const limited = await rejection(mem.append(newSid(), "user", "Too fast"));
      assert.ok(limited instanceof ApiError && !(limited instanceof InvalidRequest));
      assert.deepEqual([limited.status, limited.code, limited.retryAfter], [429, "rate_limited", 5]);
      assert.equal(front.seen.length, 1);
      assert.ok(Date.now() - started < 4_000);
    });

    test("an attempt without an answer within timeoutMs is a Timeout, not retried", async () => {
      const mem = client({ timeoutMs: 300, retries: 3 });
      front.script({ hang: true });
      const started = Date.now();
      const error = await rejection(mem.append(newSid(), "user", "Hello?"));
      const took = Date.now() - started;
      assert.ok(error instanceof Timeout, String(error));
      assert.ok(took >= 280 && took < 3_000, `took ${took} ms`);
      assert.equal(front.seen.length, 1);
    });

    test("the deadline bounds the whole call: attempts, waits and retries", async () => {
      // An attempt is cut at the deadline, whatever its own timeout.
      let mem = client({ timeoutMs: 10_000, deadlineMs: 400 });
      front.script({ hang: true });
      let started = Date.now();
      const hung = await rejection(mem.summary(newSid()));
      assert.ok(hung instanceof Timeout);
      assert.ok(Date.now() - started < 3_000);

      // A Retry-After that ends past the deadline leaves no time for another attempt.
      mem = client({ retries: 5, deadlineMs: 2_000 });
      front.script({ answer: 503, retryAfter: "5" });
      started = Date.now();
      const refused = await rejection(mem.summary(newSid()));
      assert.ok(refused instanceof Unavailable);
      assert.equal(refused.status, 503);
      assert.equal(front.seen.length, 1);
      assert.ok(Date.now() - started < 2_000);

      // Connection failures are retried until the deadline, then the last one is raised.
      const nowhere = new MemoryClient({
        baseUrl: `http://127.0.0.1:${await freePort()}`,
        retries: 1000,
        backoffMs: 20,
        maxBackoffMs: 20,
        deadlineMs: 600,
      });
      started = Date.now();
      const unreachable = await rejection(nowhere.healthz());
      const took = Date.now() - started;
      assert.ok(unreachable instanceof Unavailable);
      assert.equal(unreachable.status, null);
      assert.ok(took >= 500 && took < 3_000, `took ${took} ms`);
    });

    test("the caller's AbortSignal stops an attempt and a backoff, rejecting with its reason", async () => {
      const mem = client({ timeoutMs: 10_000 });
      front.script({ hang: true });
      const during = await rejection(mem.append(newSid(), "user", "Hello?", { signal: AbortSignal.timeout(100) }));
      assert.ok(during instanceof Error && during.name === "TimeoutError" && !(during instanceof ClientError), String(during));

      front.seen.length = 0;
      front.script({ answer: 503, retryAfter: "5" });
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 100);
      const started = Date.now();
      const waiting = await rejection(mem.summary(newSid(), { signal: controller.signal }));
      assert.ok(waiting instanceof Error && waiting.name === "AbortError", String(waiting));
      assert.ok(Date.now() - started < 2_000);
      assert.equal(front.seen.length, 1);
    });

    test("a bad option is refused at once", () => {
      assert.throws(() => new MemoryClient({ baseUrl: front.url, retries: -1 }), RangeError);
      assert.throws(() => new MemoryClient({ baseUrl: front.url, timeoutMs: 0 }), RangeError);
    });
  });
});
