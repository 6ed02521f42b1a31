// Shared by the *.test.mjs files: a Client for the server the Python fixture started
// (tests/serving/test_js_sdk.py passes its URL and two tenants' keys in the
// environment), and small helpers to read streams and refused calls.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { Client } from "@langchain/langgraph-sdk";

export const API_URL = required("SWITCHYARD_URL");
export const KEY = required("SWITCHYARD_KEY"); // tenant "acme": every graph
export const OTHER_KEY = required("SWITCHYARD_OTHER_KEY"); // tenant "globex": chat and ticker only
export const PROBE_LOG = required("SWITCHYARD_PROBE_LOG");

export const HELLO = "Hello from the fake"; // every answer of the FAKE backend
export const HI = { messages: [{ role: "user", content: "Hi" }] };

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through tests/serving/test_js_sdk.py`);
  return value;
}

/** A Client as an application builds one. No retries: a 5xx must fail the test, not be retried away. */
export function client(apiKey = KEY) {
  return new Client({ apiUrl: API_URL, apiKey, callerOptions: { maxRetries: 0 } });
}

/** Every part of an SDK stream, as plain {event, data, id} objects. */
export async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

export function events(parts) {
  return parts.map((part) => part.event);
}

/**
 * The `detail` of the error a refused SDK call throws (the SDK's HTTPError has the
 * status and the body's text); `status` is one code or a list of acceptable ones.
 */
export async function refused(promise, status) {
  const statuses = [status].flat();
  const error = await promise.then(
    (value) => assert.fail(`expected HTTP ${statuses}, got a result: ${JSON.stringify(value)}`),
    (err) => err,
  );
  assert.ok(statuses.includes(error.status), `expected HTTP ${statuses}, got ${error.status}: ${error.text ?? error.stack}`);
  let body;
  try {
    body = JSON.parse(error.text);
  } catch {
    assert.fail(`the ${error.status} body is not JSON: ${error.text}`);
  }
  assert.equal(typeof body.detail, "string", `a {"detail": ...} body: ${error.text}`);
  return body.detail;
}

/** A fresh tag, so a test only ever counts what it made. */
export function tag() {
  return randomUUID();
}

/** The text of a message dict (string content or a list of text blocks). */
export function text(message) {
  const { content } = message;
  if (typeof content === "string") return content;
  return content.map((block) => block.text ?? "").join("");
}

/** Lines the probe tool wrote (one per real run), see tests/fakes/graphs.py. */
export function probeRuns(line) {
  return readFileSync(PROBE_LOG, "utf8").split("\n").filter((l) => l === line).length;
}

/** A raw request, for what the SDK hides (status of a 204, headers). */
export async function raw(method, path, { body, key = KEY, headers = {} } = {}) {
  const response = await fetch(API_URL + path, {
    method,
    headers: { "x-api-key": key, ...(body ? { "content-type": "application/json" } : {}), ...headers },
    body: body ? JSON.stringify(body) : undefined,
  });
  return response;
}
