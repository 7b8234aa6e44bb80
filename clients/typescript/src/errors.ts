/**
 * The client's error tree: what a caller catches, whatever went wrong on the way. It is the
 * Python client's (`tiered_memory/client/errors.py`), class for class.
 *
 * ```
 * ClientError
 * ├── ApiError            the daemon answered 4xx; `status`, `code` and `message` are the server's
 * │   ├── InvalidRequest  400 (a field is wrong: the message names it) and 413 (body too large)
 * │   ├── Unauthorized    401 (no token, or one the daemon does not know)
 * │   ├── Forbidden       403 (another tenant's or user's session, or a restricted token stating
 * │   │                   another X-Tenant)
 * │   ├── NotFound        404 (no such session, message, rebuild job, profile or erasure)
 * │   └── Conflict        409 (a message_id reused for other content, a rebuild racing a summary,
 * │                       a summarized message patched), 412 (a state written over a stale version)
 * ├── Unavailable         no usable answer after every retry: the daemon was unreachable, cut the
 * │                       connection, or answered 5xx (503: a store is down; `retryAfter` seconds);
 * │                       or a rebuild job failed for a reason a later try may cure (`status` null)
 * └── Timeout             no answer within the attempt's timeout or the call's deadline (not
 *                         retried: the request may still be running)
 * ```
 *
 * Any other 4xx (408, 421, 429 `rate_limited`, ...) is a plain ApiError: a 4xx is never retried,
 * because the same request would get the same answer; a 429's `retryAfter` says when the rate
 * allows another. A caller's own AbortSignal rejects with the signal's reason, not a ClientError,
 * as fetch does.
 */

/** Base of every error the client raises. */
export class ClientError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    // Subclasses name themselves, so a log line says "NotFound: ..." rather than "Error: ...".
    this.name = new.target.name;
  }
}

/**
 * The daemon refused the request (4xx). `message` is the server's own explanation (it names the
 * offending field on a 400); `status` and `code` say which refusal it is.
 */
export class ApiError extends ClientError {
  /** The HTTP status. */
  readonly status: number;
  /** The server's machine-readable code: `invalid_input`, `not_found`, `conflict`, `rate_limited`, ... */
  readonly code: string;
  /** Seconds the answer's Retry-After asked to wait (a 429's), or null. */
  readonly retryAfter: number | null;

  constructor(status: number, code: string, message: string, retryAfter: number | null = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

/** 400 or 413: the request is malformed or too large; nothing was changed. */
export class InvalidRequest extends ApiError {}

/** 401: the daemon requires a bearer token and this one is missing or unknown. */
export class Unauthorized extends ApiError {}

/** 403: the session is not accessible with these credentials (tenant or user). */
export class Forbidden extends ApiError {}

/** 404: the session (or the message, job, profile, erasure) does not exist. */
export class NotFound extends ApiError {}

/**
 * 409: the request contradicts what is stored; 412 (code `precondition_failed`): a state write's
 * If-Match names another version than the stored one.
 */
export class Conflict extends ApiError {}

/**
 * The daemon could not serve the request, after every retry. `status` is the last HTTP status
 * (null when no answer came: connection refused or cut), `retryAfter` its Retry-After in seconds.
 */
export class Unavailable extends ClientError {
  readonly status: number | null;
  readonly retryAfter: number | null;

  constructor(
    message: string,
    options: { status?: number | null; retryAfter?: number | null; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = options.status ?? null;
    this.retryAfter = options.retryAfter ?? null;
  }
}

/**
 * No answer within the timeout. The request may have been carried out: repeat a write with the
 * same message_id (the client's own retries reuse it) and it is stored once.
 */
export class Timeout extends ClientError {}

const BY_STATUS: ReadonlyMap<number, typeof ApiError> = new Map([
  [400, InvalidRequest],
  [401, Unauthorized],
  [403, Forbidden],
  [404, NotFound],
  [409, Conflict],
  [412, Conflict],
  [413, InvalidRequest],
]);

/** The ApiError subclass for a 4xx status (ApiError itself for one the API does not name). */
export function apiError(status: number, code: string, message: string, retryAfter: number | null = null): ApiError {
  const Kind = BY_STATUS.get(status) ?? ApiError;
  return new Kind(status, code, message, retryAfter);
}
