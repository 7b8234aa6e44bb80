/**
 * One API call with its retries, over any fetch: the part of the client that is safe to retry
 * only because every write carries a `message_id` the retries reuse (the routes in `client.ts`
 * put it in the body before the first attempt).
 *
 * Retried, with exponential backoff and full jitter: a connection that failed or was cut, and a
 * 5xx answer (its Retry-After honoured, up to `maxBackoffMs`). Never a 4xx: the same request
 * gets the same answer. Never a timeout either: the request may still be running, and the caller
 * owns the latency budget (`timeoutMs` per attempt, `deadlineMs` for the whole call). This is the
 * Python client's contract (`tiered_memory/client/aio.py`), plus the deadline.
 */

import { ClientError, Timeout, Unavailable, apiError } from "./errors.js";

/** The part of a fetch Response the client reads (the platform's fetch, undici's, a test's). */
export interface FetchResponse {
  readonly status: number;
  readonly headers: { get(name: string): string | null };
  text(): Promise<string>;
}

/** The request the client makes; the platform's `fetch` fits. */
export interface FetchRequest {
  method: string;
  headers: Record<string, string>;
  body?: string;
  signal: AbortSignal;
}

/** A fetch implementation: `globalThis.fetch` unless one is handed in. */
export type FetchLike = (url: string, init: FetchRequest) => Promise<FetchResponse>;

/** How the transport retries; every field is a ClientOptions one, resolved. */
export interface RetryPolicy {
  timeoutMs: number;
  retries: number;
  backoffMs: number;
  maxBackoffMs: number;
  deadlineMs: number;
}

/** One call as a route method describes it. */
export interface CallSpec {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  /** The path below the base URL, its segments already encoded. */
  path: string;
  /** A list's items go as one parameter each, in order (`kb_snippet`). */
  query?: Record<string, string | number | readonly string[] | undefined>;
  /** Sent as JSON. */
  body?: unknown;
  /** Sent as X-User-ID. */
  userId?: string | undefined;
  headers?: Record<string, string>;
  /** The statuses that are an answer (default 200, 201, 204). */
  ok?: readonly number[];
  /** False: one attempt only (a probe that must say what it sees now). */
  retry?: boolean;
  /** True: the body is text (/metrics), not JSON. */
  text?: boolean;
  signal?: AbortSignal | undefined;
  timeoutMs?: number | undefined;
  deadlineMs?: number | undefined;
}

/** The final status and the decoded body (undefined for an empty one; a string when `text`). */
export interface Answer {
  status: number;
  data: unknown;
}

interface Reply {
  status: number;
  retryAfter: number | null;
  text: string;
}

const DEFAULT_OK: readonly number[] = [200, 201, 204];

/** The headers of the caller's trace context (W3C `traceparent`, `tracestate`), read at each call. */
export type TraceContext = () => Record<string, string> | undefined;

/** The HTTP plumbing of a MemoryClient: base URL, fixed headers, fetch and the retry policy. */
export class Transport {
  readonly #base: string;
  readonly #headers: Record<string, string>;
  readonly #fetch: FetchLike;
  readonly #policy: RetryPolicy;
  readonly #trace: TraceContext | undefined;

  constructor(
    baseUrl: string,
    headers: Record<string, string>,
    fetchImpl: FetchLike,
    policy: RetryPolicy,
    trace?: TraceContext,
  ) {
    this.#base = baseUrl.replace(/\/+$/, "");
    this.#headers = headers;
    this.#fetch = fetchImpl;
    this.#policy = policy;
    this.#trace = trace;
  }

  /** The call with its retries: resolves with the answer, or rejects with a ClientError (or the caller's abort reason). */
  async call(spec: CallSpec): Promise<Answer> {
    const { method, path } = spec;
    const ok = spec.ok ?? DEFAULT_OK;
    const deadlineMs = spec.deadlineMs ?? this.#policy.deadlineMs;
    // A monotonic clock: a wall clock set back (NTP) would stretch the deadline, set forward cut it.
    const deadline = performance.now() + deadlineMs;
    const attempts = spec.retry === false ? 1 : this.#policy.retries + 1;
    const url = this.#url(path, spec.query);
    const init = this.#init(spec);
    // What made the previous attempt fail: when a backoff overshoots the deadline, that failure
    // (not a Timeout, which says a request may still be running) is what the caller gets.
    let failure: Unavailable | null = null;
    for (let attempt = 1; ; attempt++) {
      const last = attempt === attempts;
      const left = deadline - performance.now();
      if (left <= 0) {
        if (failure !== null) {
          throw deadlinePassed(failure);
        }
        throw new Timeout(`${method} ${path}: the deadline of ${deadlineMs} ms passed`);
      }
      const attemptMs = Math.min(spec.timeoutMs ?? this.#policy.timeoutMs, left);
      let reply: Reply;
      try {
        reply = await this.#attempt(url, init, attemptMs, spec.signal, `${method} ${path}`);
      } catch (error) {
        if (!(error instanceof Unavailable) || last) {
          throw error;
        }
        failure = error;
        await this.#pause(this.#delay(attempt, null), deadline, spec.signal, error);
        continue;
      }
      if (ok.includes(reply.status)) {
        return { status: reply.status, data: spec.text ? reply.text : decode(reply.text, method, path) };
      }
      if (reply.status >= 500) {
        failure = new Unavailable(
          `${method} ${path}: ${reply.status} after ${attempt} attempt(s): ${errorOf(reply.text).message}`,
          { status: reply.status, retryAfter: reply.retryAfter },
        );
        if (last) {
          throw failure;
        }
        await this.#pause(this.#delay(attempt, reply.retryAfter), deadline, spec.signal, failure);
        continue;
      }
      const error = errorOf(reply.text);
      throw apiError(reply.status, error.code, error.message, reply.retryAfter);
    }
  }

  /** One attempt, connection to last byte within `ms`: the reply, or Unavailable / Timeout. */
  async #attempt(url: string, init: Omit<FetchRequest, "signal">, ms: number, signal: AbortSignal | undefined, what: string): Promise<Reply> {
    signal?.throwIfAborted();
    // One controller per attempt, aborted by the attempt's timer or by the caller's signal; which
    // of the two fired decides the error (AbortSignal.any would do, but Node 18.0 lacks it).
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, ms);
    const onAbort = (): void => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const response = await this.#fetch(url, { ...init, signal: controller.signal });
      // The body is read under the same timer: a daemon that stalls mid-answer times out too.
      const text = await response.text();
      return { status: response.status, retryAfter: retryAfterOf(response.headers.get("Retry-After")), text };
    } catch (error) {
      if (signal?.aborted) {
        throw signal.reason;
      }
      if (timedOut) {
        throw new Timeout(`${what}: no answer within ${ms} ms`, { cause: error });
      }
      throw new Unavailable(`${what}: ${describe(error)}`, { cause: error });
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Wait `ms` before the next attempt; when that would run past the call's deadline, there is
   * no time for another attempt: give up now with the failure that asked for it.
   */
  async #pause(ms: number, deadline: number, signal: AbortSignal | undefined, failure: Unavailable): Promise<void> {
    if (performance.now() + ms >= deadline) {
      throw deadlinePassed(failure);
    }
    await sleep(ms, signal);
  }

  /** Full jitter over an exponential cap; a longer Retry-After wins, up to `maxBackoffMs`. */
  #delay(attempt: number, retryAfter: number | null): number {
    const { backoffMs, maxBackoffMs } = this.#policy;
    const jittered = Math.random() * Math.min(maxBackoffMs, backoffMs * 2 ** (attempt - 1));
    if (retryAfter !== null) {
      return Math.min(maxBackoffMs, Math.max(retryAfter * 1000, jittered));
    }
    return jittered;
  }

  #url(path: string, query: CallSpec["query"]): string {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query ?? {})) {
      if (Array.isArray(value)) {
        value.forEach((item: string) => params.append(key, item));
      } else if (value !== undefined) {
        params.append(key, String(value));
      }
    }
    const search = params.toString();
    return `${this.#base}${path}${search ? `?${search}` : ""}`;
  }

  #init(spec: CallSpec): Omit<FetchRequest, "signal"> {
    // Read once per call, in the caller's async context: every attempt belongs to the same span.
    const headers: Record<string, string> = { ...this.#headers, ...this.#trace?.(), ...spec.headers };
    if (spec.userId !== undefined) {
      headers["X-User-ID"] = spec.userId;
    }
    if (spec.body === undefined) {
      return { method: spec.method, headers };
    }
    // Serialized once: every attempt sends the same bytes, message_id included.
    headers["Content-Type"] = "application/json";
    return { method: spec.method, headers, body: JSON.stringify(spec.body) };
  }
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The last failure of a call that has no time left for another attempt. */
function deadlinePassed(failure: Unavailable): Unavailable {
  return new Unavailable(`${failure.message} (no time for another attempt before the deadline)`, {
    status: failure.status,
    retryAfter: failure.retryAfter,
    cause: failure.cause,
  });
}

/** Retry-After in seconds; an HTTP date (which the daemon never sends) is left to the backoff. */
function retryAfterOf(value: string | null): number | null {
  if (value === null || value.trim() === "") {
    return null;
  }
  const seconds = Number(value);
  return Number.isFinite(seconds) ? Math.max(0, seconds) : null;
}

function decode(text: string, method: string, path: string): unknown {
  if (text === "") {
    return undefined;
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new ClientError(`${method} ${path}: the answer is not JSON: ${text.slice(0, 200)}`, { cause: error });
  }
}

/** The `{"error": {"code", "message"}}` of a refusal, or what can be said of a body that is not one. */
function errorOf(text: string): { code: string; message: string } {
  try {
    const doc = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } } | null;
    const error = doc?.error;
    if (error && typeof error === "object") {
      return { code: String(error.code ?? "error"), message: String(error.message ?? "") };
    }
  } catch {
    // Not JSON (a proxy's HTML page): its first bytes are the best explanation there is.
  }
  return { code: "error", message: text.slice(0, 200) };
}

/** A network error as fetch throws it: undici hides the reason (ECONNREFUSED, "other side closed") in `cause`. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) {
    return String(error);
  }
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.name}: ${error.message}${cause}`;
}
