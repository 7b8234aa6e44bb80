// A gateway's calls to the daemon with the TypeScript client, as a whole program (plain ESM, so
// Node runs it as it is): per utterance one call before the model (`turn`: the memory to send it,
// and the utterance stored) and one after (`append`: its reply), and `close` at hang-up. The model
// is a stand-in of one line, so that it runs with nothing else.
//
// In a folder where `npm install <path>/tiered-memory-client-0.1.0.tgz` put the client
// (clients/typescript: `npm ci && npm pack`), against the daemon of `scripts/serve`:
//
//     node gateway.mjs [CALL_ID]
//
// TIERED_MEMORY_URL and TIERED_MEMORY_TOKEN (one of its API_TOKENS) point it at another daemon.

import { randomUUID } from "node:crypto";
import { MemoryClient } from "@tiered-memory/client";

const RULES = "You are a travel desk's voice assistant. Answer in one short sentence.";
const UTTERANCES = ["My name is Dana and I fly to Lisbon on May 3.", "When do I fly, and where to?"];

/** Your LLM call goes here: the reply that was spoken, and whether the user cut in (barge-in). */
async function callModel(messages) {
  return { reply: `(a model's answer to "${messages.at(-1).content}", from ${messages.length} messages)`, bargedIn: false };
}

const callId = process.argv[2] ?? `call-${randomUUID().slice(0, 8)}`;
const userId = "u-7";
const memory = new MemoryClient({
  baseUrl: process.env.TIERED_MEMORY_URL ?? "http://127.0.0.1:8080",
  // No token is needed by a daemon without API_TOKENS (it then listens on loopback only).
  token: process.env.TIERED_MEMORY_TOKEN || undefined,
  timeoutMs: 2_000,
  deadlineMs: 6_000,
});

for (const utterance of UTTERANCES) {
  const turn = await memory.turn(callId, utterance, { userId, systemPrompt: RULES, maxChars: 2000 });
  const { reply, bargedIn } = await callModel(turn.context.messages); // system prompt, recent turns, the utterance
  const stored = await memory.append(callId, "assistant", reply, { userId, status: bargedIn ? "interrupted" : "completed" });
  console.log(`turn ${stored.turn_count}: the model saw ${turn.context.messages.length} messages`);
}
// On hang-up: the final summary, persisted (at most about 1 s for a summary pass running).
const closed = await memory.close(callId, { userId, timeoutMs: 5_000 });
console.log(`closed ${callId}: ${closed.turn_count} turns, summary persisted: ${closed.persisted}`);
