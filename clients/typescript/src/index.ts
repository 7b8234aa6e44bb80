/**
 * @tiered-memory/client: a client of the tiered-memory v1 API for gateways, on fetch alone
 * (Node ≥ 18 and browsers). `MemoryClient` has a method per route, `types` the typed answers,
 * `errors` the one error tree.
 */

export { MemoryClient, newMessageId } from "./client.js";
export type {
  AppendOptions,
  CallOptions,
  ClientOptions,
  ContextOptions,
  RebuildOptions,
  TurnOptions,
  UserCallOptions,
} from "./client.js";
export { ApiError, ClientError, Conflict, Forbidden, InvalidRequest, NotFound, Timeout, Unauthorized, Unavailable } from "./errors.js";
export type { FetchLike, FetchRequest, FetchResponse, TraceContext } from "./http.js";
export type * from "./types.js";
