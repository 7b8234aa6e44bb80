/**
 * The answers of the v1 API as typed values: the JSON the daemon sends, keys exactly as in its
 * OpenAPI document (`/openapi.json`, `tiered_memory/openapi.json`), so a field reads as the HTTP
 * API documents it. What the client adds of its own (`created`, from the status code; `ready`)
 * is marked so. Keys a newer daemon adds pass through untyped: an older client keeps working.
 */

/** Who said a message. */
export type Role = "user" | "assistant" | "tool" | "system";
/** Where a message came from. */
export type Channel = "voice" | "chat";
/** How a reply ended: `completed` (the default), `interrupted` (cut by a barge-in: what was spoken),
 * `stopped` and `failed` (kept, never shown), `streaming` (stored at its start, finished by a patch). */
export type MessageStatus = "completed" | "interrupted" | "stopped" | "failed" | "streaming";
/** The tier that answered a summary or context (`none`: no summary). */
export type Tier = "hot" | "warm" | "cold" | "none";
/** Who wrote a summary: the LLM, or the rules when it did not. */
export type SummarySource = "llm" | "deterministic";
/** What a context carries over from the user's earlier sessions (`off`: nothing). */
export type UserMemoryMode = "profile" | "last_session" | "topic" | "off";
/** A tier's health in /readyz. */
export type TierHealth = "ok" | "degraded";
/** Any JSON object (a gateway's own state, the OpenAPI document). */
export type JsonObject = { [key: string]: unknown };

/** One tool call in the chat-completions shape, stored verbatim (keys a provider adds are kept). */
export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
  [key: string]: unknown;
}

/** A message to store (`append`, each message of `appendBatch`). */
export interface NewMessage {
  role: Role;
  /** Null (or left out) only on an assistant message that only calls tools. */
  content?: string | null;
  /** The idempotency key: a retry with it stores nothing twice (generated when left out). */
  message_id?: string;
  user_id?: string;
  channel?: Channel;
  status?: MessageStatus;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
  /** An assistant message's reasoning (the model's chain of thought): stored, never in a context. */
  thinking_content?: string | null;
  /** How long the model reasoned, in whole seconds (0 to 86400); on an assistant message only. */
  thinking_duration?: number | null;
}

/** One message for a chat-completions call: hand a context's `messages` to the model as they are. */
export interface ChatMessage {
  role: Role;
  /** Null only on an assistant message that only calls tools. */
  content: string | null;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
}

/** POST …/messages. */
export interface AppendResult {
  session_id: string;
  message_id: string;
  turn_count: number;
  summary_scheduled: boolean;
  /** The client's: false when the message_id was stored already (a retry, answered 200): nothing was stored twice. */
  created: boolean;
}

/** The structured summary (see the daemon's SUMMARY_FORMAT), made by rules when the LLM did not make it. */
export interface Payload {
  summary: string;
  conversation_goal: string;
  stable_facts: string[];
  user_preferences: string[];
  resolved_points: string[];
  pending_questions: string[];
  retrieval_hints: string[];
}

/** GET …/summary: the best summary and the tier that answered (`none` for an unknown session). */
export interface SummaryResult {
  session_id: string;
  tier: Tier;
  summary: string | null;
  turn_count: number;
  /** Completed turns the summary covers; `turn_count - covered_turns` is its lag. */
  covered_turns: number;
  topics: string[];
  payload: Payload | null;
  source: SummarySource | null;
  version: number;
  updated_at: number | null;
  age_seconds: number | null;
}

/** What a context's planning view holds (the summary's goal, facts, open questions and hints). */
export interface Planning {
  goal: string;
  facts: string[];
  pending_questions: string[];
  retrieval_hints: string[];
}

/** What a context carried over from the user's earlier sessions. */
export interface CarriedMemory {
  mode: "profile" | "last_session" | "topic";
  /** The earlier session whose summary the memory shows; null for none. */
  session_id: string | null;
  /** Whether the memory shows the user's profile. */
  profile: boolean;
}

/** GET …/context: the memory to send the model; `messages` is ready for a chat-completions call. */
export interface Context {
  session_id: string;
  summary_tier: Tier;
  summary: string | null;
  covered_turns: number;
  topics: string[];
  /** At most one leading system message, then alternating turns from a user message, then the question. */
  messages: ChatMessage[];
  turn_count: number;
  recent_transcript: string;
  answer_transcript: string;
  estimated_tokens: { context: number; full_history: number };
  planning: Planning | null;
  planning_history: string;
  /** How many times the session's turns were merged into its summary (0: no summary). */
  compressions: number;
  /** Whether this context's memory holds text of the session's summary. */
  compression_applied: boolean;
  /** The gateway's own state of the session (`putState`), null when it has none; left out only when neither tier could say. */
  state?: JsonObject | null;
  /** The state's version (give it back as `ifMatch`); 0 when it has none. */
  state_version?: number;
  /** What the memory carried over from the user's earlier sessions; null for nothing. */
  user_memory: CarriedMemory | null;
  /** How many of the call's `kbSnippets` the messages show, the first ones; left out when it gave none. */
  kb_snippets_used?: number;
}

/**
 * POST …/turns: the context as it was before the user's message (ending with it as the question),
 * and the append of that message.
 */
export interface TurnResult {
  context: Context;
  message_id: string;
  summary_scheduled: boolean;
  /** The session's completed turns after the append (a user's message completes none); `context.turn_count` too. */
  turn_count: number;
  /** The client's: false when the message_id was stored already (a retry, answered 200). */
  created: boolean;
}

/** POST …/close. `persisted`: the warm row covers every turn; `cached`: the hot tier holds it too. */
export interface CloseResult {
  session_id: string;
  persisted: boolean;
  cached: boolean;
  turn_count: number;
}

/** GET /v1/sessions/{id}: the session's bookkeeping. */
export interface SessionInfo {
  session_id: string;
  user_id: string | null;
  turn_count: number;
  message_count: number;
  covered_turns: number;
  created_at: number;
  last_activity: number;
  closed: boolean;
  closed_at: number | null;
}

/** One message of the cold tier, as stored: `seq` numbers the session's messages from 1. */
export interface StoredMessage {
  seq: number;
  turn: number;
  role: Role;
  content: string;
  status: MessageStatus;
  message_id: string;
  channel: Channel;
  created_at: number;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
  /** An assistant reply's reasoning, as appended (left out when it had none). */
  thinking_content?: string;
  /** How long the model reasoned, in seconds (left out when unknown). */
  thinking_duration?: number;
}

/** GET …/messages: one page of stored messages, and where the next begins (null after the last). */
export interface MessagesPage {
  session_id: string;
  messages: StoredMessage[];
  next_from_seq: number | null;
}

/** One message of a batch: its place, and whether it was stored before (a retried batch). */
export interface BatchMessage {
  message_id: string;
  seq: number;
  turn: number;
  duplicate: boolean;
}

/** POST …/messages/batch: each message's place, in order. */
export interface BatchResult {
  session_id: string;
  messages: BatchMessage[];
  turn_count: number;
  summary_scheduled: boolean;
  /** The client's: true when any message was new (201), false when every one was stored before (200). */
  created: boolean;
}

/** PATCH …/messages/{message_id}: the message as stored now, and whether it changed. */
export interface PatchResult {
  session_id: string;
  message: StoredMessage;
  turn_count: number;
  changed: boolean;
  summary_scheduled: boolean;
}

/** GET or PUT …/state: the gateway's own state of the session and its version (null and 0 before any PUT). */
export interface GatewayState {
  session_id: string;
  state: JsonObject | null;
  /** Give it back as `ifMatch` to write over exactly this version. */
  version: number;
}

/** One summarization: the turns and message seqs it covered and a digest of that range. */
export interface Slice {
  from_turn: number;
  to_turn: number;
  first_seq: number;
  last_seq: number;
  summary: string;
  source: SummarySource;
  model: string | null;
  prompt_id: string | null;
  summary_version: number;
  created_at: number;
  /** The slice's raw messages (GET …/messages with its seq range). */
  messages_url: string;
}

/**
 * GET …/recall: one earlier message that matches the query, with its turn's raw messages and the
 * slice that covers it (null while no summary covers it yet).
 */
export interface RecallMatch {
  seq: number;
  turn: number;
  score: number;
  slice: Slice | null;
  messages: StoredMessage[];
}

/** What a done rebuild job made. */
export interface RebuildOutcome {
  /** The new summary's version (0: the session had no completed turn, and has no summary). */
  version: number;
  covered_turns: number;
  source: SummarySource | null;
  /** The slices it wrote (read them at `slices_url`). */
  slice_count: number;
  slices_url: string;
}

/** Why a rebuild job failed; try again after any but `not_found`. */
export interface RebuildError {
  code: "conflict" | "sql_unavailable" | "not_found" | "lost" | "cancelled" | "superseded" | "overloaded" | "internal";
  message: string;
}

/**
 * POST or GET …/summary/rebuild: a rebuild job. `state` is queued, running, done (`result`) or
 * failed (`error`). `started` (POST only) is false when the POST answered with the session's job
 * still going instead of starting one.
 */
export interface RebuildJob {
  session_id: string;
  job_id: string;
  state: "queued" | "running" | "done" | "failed";
  url: string;
  queued_at: number;
  started_at: number | null;
  ended_at: number | null;
  result: RebuildOutcome | null;
  error: RebuildError | null;
  started?: boolean;
}

/**
 * `rebuildSummary`'s answer once its job is done (the client's): the new summary as read right
 * after (`summary` null when a newer summary was written meanwhile, or there is none), and every slice.
 */
export interface RebuildResult {
  session_id: string;
  summary: string | null;
  covered_turns: number;
  version: number;
  source: SummarySource | null;
  slices: Slice[];
  job_id: string;
}

/** GET /v1/users/{uid}/summaries: one of the user's session summaries. */
export interface UserSummary {
  session_id: string;
  summary: string;
  turn_count: number;
  covered_turns: number;
  topics: string[];
  source: SummarySource;
  updated_at: number;
  age_seconds: number;
}

/** A fact or preference of a user's profile: how many of the user's sessions said it, first and last. */
export interface ProfileItem {
  text: string;
  count: number;
  first_seen: number;
  last_seen: number;
}

/** A topic of a user's profile. */
export interface ProfileTopic {
  topic: string;
  count: number;
  first_seen: number;
  last_seen: number;
}

/**
 * GET /v1/users/{uid}/profile: what the user's sessions said, aggregated; `text` is the profile
 * as a context shows it, by language.
 */
export interface UserProfile {
  user_id: string;
  facts: ProfileItem[];
  preferences: ProfileItem[];
  topics: ProfileTopic[];
  /** The sessions whose summaries were merged. */
  sessions: number;
  updated_at: number;
  text: { en: string; zh: string };
}

/** One session of a user, summarized or not. */
export interface UserSession {
  session_id: string;
  turn_count: number;
  message_count: number;
  created_at: number;
  last_activity: number;
  closed_at: number | null;
  summarized: boolean;
  covered_turns: number;
  topics: string[];
  summary_updated_at: number | null;
}

/** GET /v1/users/{uid}/sessions: one page of the user's sessions, newest first, and the next page's cursor. */
export interface UserSessionsPage {
  user_id: string;
  sessions: UserSession[];
  next_cursor: string | null;
}

/** DELETE /v1/users/{uid} or GET …/erasure: `running` or `finished`, and what it removed. */
export interface Erasure {
  user_id: string;
  state: "running" | "finished";
  sessions: number;
  messages: number;
  requested_at?: number;
  finished_at?: number | null;
  /** Where to follow a running erasure (GET …/erasure). */
  url?: string;
}

/**
 * GET /readyz. `ready` (the client's) is false when the daemon answered 503 (SQL unreachable or
 * its schema not migrated); `tiers` says which tier is `ok` or `degraded`.
 */
export interface Readiness {
  ready: boolean;
  status: TierHealth;
  tiers: { hot: TierHealth; sql: TierHealth };
}
