/**
 * MemoryClient: the whole v1 API, a method per route, with retries that are safe because writes
 * are idempotent. Every write carries a `message_id` (generated here when the caller gives none)
 * and every retry of it reuses that id, so a request whose answer was lost on the way (a cut
 * connection, a daemon restarted mid-request) is stored exactly once: the daemon answers the
 * retry 200 with the original result. Names are the Python client's (`AsyncClient`) in camelCase.
 */

import { Conflict, NotFound, Timeout, Unavailable, type ClientError } from "./errors.js";
import { Transport, sleep, type CallSpec, type FetchLike, type TraceContext } from "./http.js";
import type {
  AppendResult,
  BatchResult,
  Channel,
  CloseResult,
  Context,
  Erasure,
  GatewayState,
  JsonObject,
  MessageStatus,
  MessagesPage,
  NewMessage,
  PatchResult,
  Readiness,
  RebuildJob,
  RebuildResult,
  RecallMatch,
  Role,
  SessionInfo,
  Slice,
  StoredMessage,
  SummaryResult,
  ToolCall,
  TurnResult,
  UserMemoryMode,
  UserProfile,
  UserSession,
  UserSessionsPage,
  UserSummary,
} from "./types.js";

/** How a MemoryClient reaches the daemon and how hard it tries. */
export interface ClientOptions {
  /** The daemon, e.g. `http://memory.internal:8080`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <token>` (one of the daemon's API_TOKENS). */
  token?: string;
  /** Sent as X-Tenant: the tenant an unrestricted (operator's) token acts for. */
  tenant?: string;
  /** Sent with every call. */
  headers?: Record<string, string>;
  /** One attempt, connection to last byte, in ms (default 10000). */
  timeoutMs?: number;
  /** Further attempts after a connection failure or a 5xx (default 2). */
  retries?: number;
  /** The first backoff cap in ms, doubled each retry, fully jittered (default 100). */
  backoffMs?: number;
  /** The longest wait between attempts in ms, a Retry-After's included (default 5000). */
  maxBackoffMs?: number;
  /** The whole call, every attempt and wait, in ms (default 30000). */
  deadlineMs?: number;
  /** The fetch to use (default `globalThis.fetch`, looked up at each call). */
  fetch?: FetchLike;
  /**
   * The caller's trace context as headers, read at each call, so that the daemon's spans join
   * the gateway's trace. With `@opentelemetry/api`:
   * `() => { const carrier = {}; propagation.inject(context.active(), carrier); return carrier; }`.
   */
  traceContext?: TraceContext;
}

/** What every call may say for itself. */
export interface CallOptions {
  /** Sent as X-User-ID: the user the gateway acts for, which the daemon checks against the session's owner. */
  userId?: string;
  /** Aborts the call (and its retries); it rejects with the signal's reason. */
  signal?: AbortSignal;
  /** This call's attempt timeout in ms, instead of the client's. */
  timeoutMs?: number;
  /** This call's deadline in ms, instead of the client's. */
  deadlineMs?: number;
}

/** The calls on a user (`/v1/users/{user_id}/…`), where the path names the user. */
export interface UserCallOptions extends Omit<CallOptions, "userId"> {
  /** Sent as X-User-ID: the user the gateway acts for (the daemon refuses another than the path's). */
  asUser?: string;
}

/** `append`'s fields beside the role and content. */
export interface AppendOptions extends CallOptions {
  /** The idempotency key (generated when left out); reuse it to retry by hand. */
  messageId?: string;
  channel?: Channel;
  status?: MessageStatus;
  toolCalls?: ToolCall[];
  toolCallId?: string;
  name?: string;
  /** An assistant message's reasoning: stored and listed with it, never put in a context or summary. */
  thinkingContent?: string;
  /** How long the model reasoned, in whole seconds. */
  thinkingDuration?: number;
}

/** `turn`'s fields beside the content. */
export interface TurnOptions extends CallOptions {
  messageId?: string;
  channel?: Channel;
  /** The rules that frame the context's system message. */
  systemPrompt?: string;
  /** The memory's budget in characters (CONTEXT_MAX_CHARS by default). */
  maxChars?: number;
  /** What to carry over from the user's earlier sessions (USER_MEMORY by default). */
  userMemory?: UserMemoryMode;
  /**
   * This turn's knowledge-base (or MCP) snippets, best first (at most 16, 16 KiB in all): shown
   * before the recent turns, counted in `maxChars`, never stored (`context.kb_snippets_used`).
   */
  kbSnippets?: readonly string[];
}

/** `context`'s query. */
export interface ContextOptions extends CallOptions {
  maxChars?: number;
  systemPrompt?: string;
  /** The question the context ends with; earlier turns that hold its words are recalled. */
  question?: string;
  userMemory?: UserMemoryMode;
  /** As `turn`'s, sent in the URL (one `kb_snippet` each): keep them short, or use `turn`. */
  kbSnippets?: readonly string[];
}

/** `rebuildSummary`'s wait. */
export interface RebuildOptions extends CallOptions {
  /** How long to wait for the job in ms (default 600000); past it, Timeout (the job goes on). */
  waitTimeoutMs?: number;
  /** The longest pause between two polls in ms (default 1000); the first polls come sooner. */
  pollIntervalMs?: number;
}

// The daemon answers at most this many messages per page of GET …/messages.
const PAGE = 1000;
// A rebuild job is polled this soon first, then twice as late each time up to the poll interval:
// a short session's rebuild is done in a moment, a long one's takes minutes.
const FIRST_POLL_MS = 50;

/**
 * A fresh idempotency key for one message (what the client uses when the caller gives none):
 * 32 hex digits, as the Python client's.
 */
export function newMessageId(): string {
  const crypto = globalThis.crypto;
  if (crypto?.randomUUID) {
    return crypto.randomUUID().replace(/-/g, "");
  }
  // Node 18 without the global Web Crypto: uniqueness is all a message_id needs.
  let out = "";
  for (let i = 0; i < 32; i++) {
    out += Math.floor(Math.random() * 16).toString(16);
  }
  return out;
}

/**
 * A client of one tiered-memory daemon. One instance serves any number of concurrent calls
 * (fetch pools the connections); it holds no resource to close.
 *
 * ```ts
 * const memory = new MemoryClient({ baseUrl: "http://memory:8080", token: TOKEN });
 * const turn = await memory.turn(callId, utterance, { userId, systemPrompt: RULES });
 * const reply = await llm(turn.context.messages);
 * await memory.append(callId, "assistant", reply, { userId });
 * await memory.close(callId);
 * ```
 */
export class MemoryClient {
  readonly #http: Transport;

  constructor(options: ClientOptions) {
    const timeoutMs = options.timeoutMs ?? 10_000;
    const retries = options.retries ?? 2;
    const backoffMs = options.backoffMs ?? 100;
    const maxBackoffMs = options.maxBackoffMs ?? 5_000;
    const deadlineMs = options.deadlineMs ?? 30_000;
    if (!Number.isInteger(retries) || retries < 0 || !(timeoutMs > 0) || !(backoffMs >= 0) || !(deadlineMs > 0)) {
      throw new RangeError("expected an integer retries >= 0, timeoutMs > 0, backoffMs >= 0 and deadlineMs > 0");
    }
    const headers: Record<string, string> = { ...options.headers };
    if (options.token !== undefined) {
      headers["Authorization"] = `Bearer ${options.token}`;
    }
    if (options.tenant !== undefined) {
      headers["X-Tenant"] = options.tenant;
    }
    // Looked up per call rather than captured: a test or polyfill may install fetch later, and a
    // browser's fetch must be called unbound from window, not as a method of this object.
    const fetchImpl: FetchLike = options.fetch ?? ((url, init) => globalThis.fetch(url, init));
    this.#http = new Transport(
      options.baseUrl,
      headers,
      fetchImpl,
      { timeoutMs, retries, backoffMs, maxBackoffMs, deadlineMs },
      options.traceContext,
    );
  }

  // --- writes ---------------------------------------------------------------------------

  /**
   * Store one message (`status` completed, interrupted, stopped, failed or streaming for a reply).
   * An assistant message may carry `toolCalls` (then `content` may be null); a `tool` message
   * answers one of them by its `toolCallId`; an assistant message may carry the model's reasoning
   * (`thinkingContent`, `thinkingDuration` in seconds). Durable when this resolves; stored once however
   * often it is retried. `userId` goes as X-User-ID and as the body's user_id.
   */
  async append(sessionId: string, role: Role, content: string | null, options: AppendOptions = {}): Promise<AppendResult> {
    const body = compact({
      role,
      content,
      message_id: options.messageId ?? newMessageId(),
      user_id: options.userId,
      channel: options.channel,
      status: options.status,
      tool_calls: options.toolCalls,
      tool_call_id: options.toolCallId,
      name: options.name,
      thinking_content: options.thinkingContent,
      thinking_duration: options.thinkingDuration,
    });
    const { status, data } = await this.#call(options, { method: "POST", path: `${session(sessionId)}/messages`, body });
    return { ...(data as Omit<AppendResult, "created">), created: status === 201 };
  }

  /**
   * Store up to 500 messages in one transaction, all or none: a bulk import. Each message
   * without a `message_id` gets one here, so a retried batch stores nothing twice.
   */
  async appendBatch(sessionId: string, messages: readonly NewMessage[], options: CallOptions = {}): Promise<BatchResult> {
    const items = messages.map((m) => ({ ...m, message_id: m.message_id ?? newMessageId() }));
    const { status, data } = await this.#call(options, {
      method: "POST",
      path: `${session(sessionId)}/messages/batch`,
      body: { messages: items },
    });
    return { ...(data as Omit<BatchResult, "created">), created: status === 201 };
  }

  /**
   * Correct a stored message while no summary covers it: a transcript's `content`, or a reply's
   * `status` (a streaming reply finalized, a reply cut by a barge-in, with the part that was
   * spoken as `content`). Repeating it changes nothing (`changed` false).
   */
  async patchMessage(
    sessionId: string,
    messageId: string,
    options: CallOptions & { content?: string; status?: MessageStatus },
  ): Promise<PatchResult> {
    const path = `${session(sessionId)}/messages/${encodeURIComponent(messageId)}`;
    const body = compact({ content: options.content, status: options.status });
    const { data } = await this.#call(options, { method: "PATCH", path, body });
    return data as PatchResult;
  }

  /**
   * Remove the session's newest message while no summary covers its turn (an agent framework
   * taking back its last item): the turn it completed is open again. True when this call removed
   * it; false when the session has no such message (any more: a retry whose first attempt's
   * answer was lost, or an unknown session), so repeating it is safe. Conflict with code
   * `already_summarized` once a summary covers its turn, `conflict` when it is not the newest (or
   * a summary of the session is being made: try again).
   */
  async deleteMessage(sessionId: string, messageId: string, options: CallOptions = {}): Promise<boolean> {
    const path = `${session(sessionId)}/messages/${encodeURIComponent(messageId)}`;
    try {
      await this.#call(options, { method: "DELETE", path });
    } catch (error) {
      if (error instanceof NotFound) {
        return false;
      }
      throw error;
    }
    return true;
  }

  /** The gateway's own state of the session (what it needs back after a reconnect). NotFound for an unknown session. */
  async state(sessionId: string, options: CallOptions = {}): Promise<GatewayState> {
    const { data } = await this.#call(options, { method: "GET", path: `${session(sessionId)}/state` });
    return data as GatewayState;
  }

  /**
   * Replace the gateway's state of the session (a JSON object of at most 8 KB); with `ifMatch`
   * (the version read; 0: only while there is none), only over that version: Conflict (412,
   * code `precondition_failed`) when another writer came first.
   */
  async putState(
    sessionId: string,
    state: JsonObject,
    options: CallOptions & { ifMatch?: number } = {},
  ): Promise<GatewayState> {
    const headers: Record<string, string> = options.ifMatch === undefined ? {} : { "If-Match": `"${options.ifMatch}"` };
    const { data } = await this.#call(options, { method: "PUT", path: `${session(sessionId)}/state`, body: state, headers });
    return data as GatewayState;
  }

  /**
   * Load-then-append, the per-utterance call: the context to send the model (ending with the
   * user's `content` as the question, framed by `systemPrompt`, led by what `userMemory` carries
   * over from the user's earlier sessions), and the message stored.
   */
  async turn(sessionId: string, content: string, options: TurnOptions = {}): Promise<TurnResult> {
    const body = compact({
      content,
      message_id: options.messageId ?? newMessageId(),
      user_id: options.userId,
      channel: options.channel,
      system_prompt: options.systemPrompt,
      kb_snippets: options.kbSnippets,
    });
    const query = { max_chars: options.maxChars, user_memory: options.userMemory };
    const { status, data } = await this.#call(options, { method: "POST", path: `${session(sessionId)}/turns`, body, query });
    const { message_id, summary_scheduled, ...context } = data as Context & { message_id: string; summary_scheduled: boolean };
    return { context, message_id, summary_scheduled, turn_count: context.turn_count, created: status === 201 };
  }

  /**
   * Persist the final summary and mark the session closed (idempotent; call it at hang-up).
   * It may wait about 1 s for a running summary pass: give it a `timeoutMs` above that.
   */
  async close(sessionId: string, options: CallOptions = {}): Promise<CloseResult> {
    const { data } = await this.#call(options, { method: "POST", path: `${session(sessionId)}/close` });
    return data as CloseResult;
  }

  /** Remove the session from every tier (idempotent: an unknown session is no error). */
  async delete(sessionId: string, options: CallOptions = {}): Promise<void> {
    await this.#call(options, { method: "DELETE", path: session(sessionId) });
  }

  /** Forget the session's summary in both tiers; its messages stay. NotFound for an unknown session. */
  async deleteSummary(sessionId: string, options: CallOptions = {}): Promise<void> {
    await this.#call(options, { method: "DELETE", path: `${session(sessionId)}/summary` });
  }

  /**
   * Start recomputing every slice and the summary from the stored messages, with the daemon's
   * current prompt and model, as a job, and answer at once; while the session's rebuild is still
   * going, that job (`started` false). Follow it with `rebuildJob`.
   */
  async startRebuild(sessionId: string, options: CallOptions = {}): Promise<RebuildJob> {
    const { data } = await this.#call(options, { method: "POST", path: `${session(sessionId)}/summary/rebuild`, ok: [202] });
    return data as RebuildJob;
  }

  /** A rebuild job as it is now (from any replica). NotFound past an hour after it ended. */
  async rebuildJob(sessionId: string, jobId: string, options: CallOptions = {}): Promise<RebuildJob> {
    const path = `${session(sessionId)}/summary/rebuild/${encodeURIComponent(jobId)}`;
    const { data } = await this.#call(options, { method: "GET", path });
    return data as RebuildJob;
  }

  /**
   * Recompute every slice and the summary from the stored messages and wait for it: start the
   * job, poll it (soon at first, then at most every `pollIntervalMs`) until it ended, then read
   * the summary and every slice. Rejects with Timeout when it has not ended within
   * `waitTimeoutMs` (it goes on: `rebuildJob` follows it); when it failed, with Conflict (code
   * `conflict`: a summary of the session was being written; try again), NotFound (the session is
   * unknown, or was deleted meanwhile) or Unavailable (the store was down, or the daemon running
   * it stopped: try again).
   */
  async rebuildSummary(sessionId: string, options: RebuildOptions = {}): Promise<RebuildResult> {
    const { waitTimeoutMs = 600_000, pollIntervalMs = 1_000, ...call } = options;
    if (!(waitTimeoutMs > 0) || !(pollIntervalMs > 0)) {
      throw new RangeError("expected waitTimeoutMs > 0 and pollIntervalMs > 0");
    }
    const deadline = performance.now() + waitTimeoutMs;
    let job = await this.startRebuild(sessionId, call);
    let delay = Math.min(FIRST_POLL_MS, pollIntervalMs);
    while (job.state !== "done" && job.state !== "failed") {
      const left = deadline - performance.now();
      if (left <= 0) {
        throw new Timeout(
          `rebuild ${job.job_id} of ${sessionId}: still ${job.state} after ${waitTimeoutMs} ms; it goes on (rebuildJob follows it)`,
        );
      }
      await sleep(Math.min(delay, left), call.signal);
      delay = Math.min(delay * 2, pollIntervalMs);
      job = await this.rebuildJob(sessionId, job.job_id, call);
    }
    if (job.result === null) {
      throw rebuildError(job);
    }
    const summary = await this.summary(sessionId, call);
    return {
      session_id: sessionId,
      // A summary written after the job's (a background pass) is not what the rebuild made.
      summary: summary.version === job.result.version ? summary.summary : null,
      covered_turns: job.result.covered_turns,
      version: job.result.version,
      source: job.result.source,
      slices: await this.slices(sessionId, call),
      job_id: job.job_id,
    };
  }

  // --- reads ----------------------------------------------------------------------------

  /**
   * The memory to send the model, within `maxChars` (CONTEXT_MAX_CHARS by default); with
   * `userMemory` (USER_MEMORY by default), led by what the session carries over from its user's
   * earlier sessions. An unknown session answers an empty context (tier `none`).
   */
  async context(sessionId: string, options: ContextOptions = {}): Promise<Context> {
    const query = {
      max_chars: options.maxChars,
      system_prompt: options.systemPrompt,
      question: options.question,
      user_memory: options.userMemory,
      kb_snippet: options.kbSnippets,
    };
    const { data } = await this.#call(options, { method: "GET", path: `${session(sessionId)}/context`, query });
    return data as Context;
  }

  /** The best summary and the tier that answered; tier `none` for an unknown session. */
  async summary(sessionId: string, options: CallOptions = {}): Promise<SummaryResult> {
    const { data } = await this.#call(options, { method: "GET", path: `${session(sessionId)}/summary` });
    return data as SummaryResult;
  }

  /** The session's bookkeeping; NotFound for an unknown session. */
  async session(sessionId: string, options: CallOptions = {}): Promise<SessionInfo> {
    const { data } = await this.#call(options, { method: "GET", path: session(sessionId) });
    return data as SessionInfo;
  }

  /** Every summarization of the session, oldest first (read a page at a time). NotFound for an unknown session. */
  async slices(sessionId: string, options: CallOptions = {}): Promise<Slice[]> {
    const out: Slice[] = [];
    let following: number | null = 1;
    while (following !== null) {
      // The first page asks as an older daemon understands (it knows no from_turn).
      const query = { from_turn: following > 1 ? following : undefined };
      const { data } = await this.#call(options, { method: "GET", path: `${session(sessionId)}/slices`, query });
      const page = data as { slices: Slice[]; next_from_turn?: number | null };
      out.push(...page.slices);
      following = page.next_from_turn ?? null;
    }
    return out;
  }

  /** The session's earlier messages that best match `query` (at most `k`, 5 by default), best first. */
  async recall(sessionId: string, query: string, options: CallOptions & { k?: number } = {}): Promise<RecallMatch[]> {
    const { data } = await this.#call(options, {
      method: "GET",
      path: `${session(sessionId)}/recall`,
      query: { q: query, k: options.k },
    });
    return (data as { matches: RecallMatch[] }).matches;
  }

  /**
   * Stored messages by seq range, oldest first: one page (at most 1000, and at most 1 MiB of
   * text, so it may hold fewer than `limit`; `iterMessages` follows the pages). NotFound for an
   * unknown session.
   */
  async messages(
    sessionId: string,
    options: CallOptions & { fromSeq?: number; toSeq?: number; limit?: number } = {},
  ): Promise<StoredMessage[]> {
    return (await this.messagesPage(sessionId, options)).messages;
  }

  /**
   * One page of messages (from `fromSeq`), and where the next begins (`next_from_seq`, null after
   * the last). A daemon older than the cursors says nothing of the next page: a full page means more.
   */
  async messagesPage(
    sessionId: string,
    options: CallOptions & { fromSeq?: number; toSeq?: number; limit?: number } = {},
  ): Promise<MessagesPage> {
    const query = { from_seq: options.fromSeq, to_seq: options.toSeq, limit: options.limit };
    const { data } = await this.#call(options, { method: "GET", path: `${session(sessionId)}/messages`, query });
    const page = data as MessagesPage;
    if (page.next_from_seq !== undefined) {
      return page;
    }
    const last = page.messages.at(-1);
    const full = page.messages.length === (options.limit ?? PAGE);
    return { ...page, next_from_seq: full && last ? last.seq + 1 : null };
  }

  /** Every stored message of the session, oldest first, fetched a page at a time. */
  async *iterMessages(sessionId: string, options: CallOptions = {}): AsyncGenerator<StoredMessage, void, undefined> {
    let following: number | null = 1;
    while (following !== null) {
      const page: MessagesPage = await this.messagesPage(sessionId, { ...options, fromSeq: following, limit: PAGE });
      yield* page.messages;
      following = page.next_from_seq;
    }
  }

  /** The user's most recent session summaries, newest first (`limit` 1–100, 10 by default). */
  async userSummaries(userId: string, options: UserCallOptions & { limit?: number } = {}): Promise<UserSummary[]> {
    const { data } = await this.#call(asUser(options), {
      method: "GET",
      path: `${user(userId)}/summaries`,
      query: { limit: options.limit },
    });
    return (data as { summaries: UserSummary[] }).summaries;
  }

  /** What the user's sessions said, aggregated; NotFound before any summary of the user. */
  async profile(userId: string, options: UserCallOptions = {}): Promise<UserProfile> {
    const { data } = await this.#call(asUser(options), { method: "GET", path: `${user(userId)}/profile` });
    return data as UserProfile;
  }

  /** Every session of the user, newest first, read a page at a time. */
  async *userSessions(userId: string, options: UserCallOptions = {}): AsyncGenerator<UserSession, void, undefined> {
    let cursor: string | null | undefined;
    while (cursor !== null) {
      const page: UserSessionsPage = await this.userSessionsPage(userId, { ...options, cursor });
      yield* page.sessions;
      cursor = page.next_cursor;
    }
  }

  /** One page of the user's sessions from `cursor` (left out: the first), and the next page's cursor. */
  async userSessionsPage(
    userId: string,
    options: UserCallOptions & { cursor?: string | null | undefined; limit?: number } = {},
  ): Promise<UserSessionsPage> {
    const { data } = await this.#call(asUser(options), {
      method: "GET",
      path: `${user(userId)}/sessions`,
      query: { cursor: options.cursor ?? undefined, limit: options.limit },
    });
    return data as UserSessionsPage;
  }

  /**
   * Erase the user (every session, message, summary, the profile); `state` is `running` while
   * it goes on (ask `erasure`). Safe to repeat.
   */
  async eraseUser(userId: string, options: UserCallOptions = {}): Promise<Erasure> {
    const { data } = await this.#call(asUser(options), { method: "DELETE", path: user(userId), ok: [200, 202] });
    return data as Erasure;
  }

  /** The state of the user's erasure; NotFound when none was asked for. */
  async erasure(userId: string, options: UserCallOptions = {}): Promise<Erasure> {
    const { data } = await this.#call(asUser(options), { method: "GET", path: `${user(userId)}/erasure` });
    return data as Erasure;
  }

  // --- operations -----------------------------------------------------------------------

  /** True when the daemon process answers (liveness); rejects with Unavailable when it does not. */
  async healthz(options: Omit<CallOptions, "userId"> = {}): Promise<boolean> {
    await this.#call(options, { method: "GET", path: "/healthz" });
    return true;
  }

  /**
   * Whether the daemon can take writes (SQL reachable and migrated) and each tier's state: one
   * attempt, since a probe must say what it sees now.
   */
  async readyz(options: Omit<CallOptions, "userId"> = {}): Promise<Readiness> {
    const { status, data } = await this.#call(options, { method: "GET", path: "/readyz", ok: [200, 503], retry: false });
    const ready = data as Omit<Readiness, "ready">;
    return { ready: status === 200, status: ready.status, tiers: ready.tiers };
  }

  /** The OpenAPI 3.1 document the daemon serves. */
  async openapi(options: Omit<CallOptions, "userId"> = {}): Promise<JsonObject> {
    const { data } = await this.#call(options, { method: "GET", path: "/openapi.json" });
    return data as JsonObject;
  }

  /** The Prometheus exposition of /metrics. */
  async metricsText(options: Omit<CallOptions, "userId"> = {}): Promise<string> {
    const { data } = await this.#call(options, { method: "GET", path: "/metrics", text: true });
    return data as string;
  }

  // --- plumbing -------------------------------------------------------------------------

  #call(options: CallOptions, spec: Omit<CallSpec, "userId" | "signal" | "timeoutMs" | "deadlineMs">) {
    return this.#http.call({
      ...spec,
      userId: options.userId,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      deadlineMs: options.deadlineMs,
    });
  }
}

function session(sessionId: string): string {
  return `/v1/sessions/${encodeURIComponent(sessionId)}`;
}

function user(userId: string): string {
  return `/v1/users/${encodeURIComponent(userId)}`;
}

/** A user route's options as a call's: `asUser` is its X-User-ID. */
function asUser(options: UserCallOptions): CallOptions {
  const { asUser: userId, ...rest } = options;
  return userId === undefined ? rest : { ...rest, userId };
}

/** The fields that are given: the daemon takes a missing field as its default, a null as null. */
function compact<T extends object>(fields: T): Partial<T> {
  return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** The error a failed rebuild job raises: by its code, as the daemon would answer it. */
function rebuildError(job: RebuildJob): ClientError {
  const code = job.error?.code ?? "internal";
  const message = `rebuild ${job.job_id} failed: ${job.error?.message ?? "no reason given"}`;
  if (code === "conflict") {
    return new Conflict(409, code, message);
  }
  if (code === "not_found") {
    return new NotFound(404, code, message);
  }
  return new Unavailable(`${message} (${code})`);
}
