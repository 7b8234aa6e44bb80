/**
 * What the tests stand on: one real daemon process for the run (`python -m tiered_memory serve`,
 * the embedded default with tokens on), and two small servers put in front of it to make the
 * network fail on purpose: a TCP proxy that cuts a reply after the daemon sent it, and an HTTP
 * server that answers from a script (503, 429, silence) before handing requests on to the daemon.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The package's folder (this file runs from build/test/). */
const PACKAGE_DIR = fileURLToPath(new URL("../../", import.meta.url));
const REPO_DIR = join(PACKAGE_DIR, "..", "..");

// The operator's unrestricted token, and a token restricted to the tenant "acme" (at least 16 characters each).
export const OPERATOR_TOKEN = "op-ts-client-0123456789abcdef";
export const TENANT = "acme";
export const TENANT_TOKEN = "acme-ts-client-0123456789abcd";
/** The daemon summarizes every this many turns (the least the default window of 3 turns allows). */
export const SUMMARY_EVERY = 3;

export interface Daemon {
  url: string;
  stop(): Promise<void>;
}

/** A session id nobody used: each test works in sessions of its own. */
export function newSid(): string {
  return `ts-${randomUUID().replace(/-/g, "").slice(0, 12)}`;
}

/** A port nothing listens on now. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * `<python> -m tiered_memory serve` on a free port with its data in a fresh folder, ready (GET
 * /readyz 200) when this resolves. `<python>` is TIERED_MEMORY_PYTHON, else the project's venv.
 */
export async function startDaemon(): Promise<Daemon> {
  const python = process.env["TIERED_MEMORY_PYTHON"] ?? join(REPO_DIR, ".venv", "bin", "python");
  const root = mkdtempSync(join(tmpdir(), "tm-ts-client-"));
  const port = await freePort();
  const logPath = join(root, "daemon.log");
  const log = openSync(logPath, "a");
  const child = spawn(python, ["-m", "tiered_memory", "serve"], {
    cwd: REPO_DIR,
    env: {
      ...process.env,
      PORT: String(port),
      DATA_DIR: join(root, "data"),
      API_TOKENS: `${OPERATOR_TOKEN},${TENANT}:${TENANT_TOKEN}`,
      LOG_FORMAT: "json",
      SUMMARY_EVERY_N_TURNS: String(SUMMARY_EVERY),
    },
    stdio: ["ignore", log, log],
  });
  // A test run that dies before its `after` hook must not leave the daemon behind.
  const reap = (): void => void child.kill("SIGKILL");
  process.once("exit", reap);
  const url = `http://127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    process.removeListener("exit", reap);
    await terminate(child);
    rmSync(root, { recursive: true, force: true });
  };
  // Start-up imports the daemon's whole stack: on a loaded 2-core machine that takes seconds.
  const deadline = Date.now() + 90_000;
  while (!(await ready(url))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      const output = readFileSync(logPath, "utf8");
      await stop();
      throw new Error(`the daemon did not become ready (${python}):\n${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { url, stop };
}

async function ready(url: string): Promise<boolean> {
  try {
    const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(1_000) });
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}

/** SIGTERM (a graceful shutdown), SIGKILL when that takes longer than 30 s. */
async function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const killer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(killer);
}

/**
 * A TCP proxy in front of the daemon. Armed with `cutNextReply()`, it lets the next request
 * through, waits for the daemon's reply to begin (so the daemon has done the work and
 * committed it), and then destroys the client's connection instead of relaying that reply:
 * the client sees a connection cut with no answer, as on a network failure after the commit.
 */
export class CutReplyProxy {
  /** Connections the proxy accepted. */
  connections = 0;
  /** Replies it cut. */
  cuts = 0;
  #armed = 0;
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();

  private constructor(upstreamPort: number) {
    this.#server = net.createServer((client) => {
      this.connections += 1;
      const upstream = net.connect(upstreamPort, "127.0.0.1");
      this.#sockets.add(client).add(upstream);
      client.on("data", (chunk) => upstream.write(chunk));
      upstream.on("data", (chunk) => {
        if (this.#armed > 0) {
          this.#armed -= 1;
          this.cuts += 1;
          client.destroy();
          upstream.destroy();
          return;
        }
        client.write(chunk);
      });
      const close = (): void => {
        client.destroy();
        upstream.destroy();
        this.#sockets.delete(client);
        this.#sockets.delete(upstream);
      };
      client.on("close", close).on("error", close);
      upstream.on("close", close).on("error", close);
    });
  }

  static async start(upstreamUrl: string): Promise<CutReplyProxy & { url: string }> {
    const proxy = new CutReplyProxy(Number(new URL(upstreamUrl).port));
    await new Promise<void>((resolve) => proxy.#server.listen(0, "127.0.0.1", resolve));
    const { port } = proxy.#server.address() as net.AddressInfo;
    return Object.assign(proxy, { url: `http://127.0.0.1:${port}` });
  }

  /** Cut the next reply the daemon sends through the proxy. */
  cutNextReply(): void {
    this.#armed += 1;
  }

  async close(): Promise<void> {
    for (const socket of this.#sockets) {
      socket.destroy();
    }
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/** What the scripted server does with one request. */
export type Step =
  | { answer: number; code?: string; retryAfter?: string }
  | { hang: true }
  | { forward: true };

/** One request as the scripted server received it. */
export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
  at: number;
}

/**
 * An HTTP server in front of the daemon that answers each request by the next step of its
 * script (an error status with a Retry-After, or no answer at all) and, once the script is
 * used up, forwards it to the daemon and relays the daemon's answer. `seen` records every
 * request, so a test counts the client's attempts and compares what each sent.
 */
export class ScriptedServer {
  readonly seen: Seen[] = [];
  readonly #script: Step[] = [];
  readonly #server: http.Server;
  readonly #upstream: string;

  private constructor(upstream: string) {
    this.#upstream = upstream;
    this.#server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        const body = Buffer.concat(chunks);
        this.seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: body.toString("utf8"), at: Date.now() });
        this.#serve(this.#script.shift() ?? { forward: true }, req, body, res);
      });
    });
  }

  static async start(upstream: string): Promise<ScriptedServer & { url: string }> {
    const server = new ScriptedServer(upstream);
    await new Promise<void>((resolve) => server.#server.listen(0, "127.0.0.1", resolve));
    const { port } = server.#server.address() as net.AddressInfo;
    return Object.assign(server, { url: `http://127.0.0.1:${port}` });
  }

  /** Steps for the next requests, in order; the requests after them are forwarded. */
  script(...steps: Step[]): void {
    this.#script.push(...steps);
  }

  /** The JSON bodies received, in order. */
  bodies(): Record<string, unknown>[] {
    return this.seen.map((s) => JSON.parse(s.body) as Record<string, unknown>);
  }

  async close(): Promise<void> {
    // Hung requests hold their connections: drop them, or close() waits for them forever.
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #serve(step: Step, req: http.IncomingMessage, body: Buffer, res: http.ServerResponse): void {
    if ("hang" in step) {
      return;
    }
    if ("answer" in step) {
      const headers: http.OutgoingHttpHeaders = { "Content-Type": "application/json" };
      if (step.retryAfter !== undefined) {
        headers["Retry-After"] = step.retryAfter;
      }
      res.writeHead(step.answer, headers);
      res.end(JSON.stringify({ error: { code: step.code ?? "unavailable", message: `scripted ${step.answer}` } }));
      return;
    }
    const target = new URL(req.url ?? "/", this.#upstream);
    const headers = { ...req.headers, host: target.host };
    const forwarded = http.request(target, { method: req.method, headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    forwarded.on("error", () => res.destroy());
    forwarded.end(body);
  }
}

/** The marker of each key of T: `optional` exactly where T's key is optional. */
export type Shape<T> = { [K in keyof T]-?: undefined extends T[K] ? "optional" : "required" };

/**
 * Asserts that `value` (an answer the daemon sent) has every required key of its interface and
 * no key the interface lacks. `shape` must name every key of T with the right marker, or the
 * test does not compile: together they hold the hand-written interfaces to the real answers.
 */
export function assertShape<T extends object>(value: T, shape: Shape<T>, what: string): void {
  const declared = shape as Record<string, "optional" | "required">;
  const got = Object.keys(value);
  const unknown = got.filter((key) => !(key in declared));
  const missing = Object.keys(declared).filter((key) => declared[key] === "required" && !got.includes(key));
  if (unknown.length > 0 || missing.length > 0) {
    throw new Error(`${what}: keys the interface lacks: [${unknown.join(", ")}]; required keys missing: [${missing.join(", ")}]`);
  }
}
