// Starts `fp8kv serve` on a free port and stops it with SIGTERM (exit 0 expected).
import { spawn, execFile, spawnSync } from "node:child_process";
import { promisify } from "node:util";
import assert from "node:assert/strict";
import { before, after } from "node:test";
import OpenAI from "openai";

export const BIN = process.env.FP8KV_BIN;
export const MODEL = process.env.FP8KV_MODEL;
if (!BIN || !MODEL) throw new Error("set FP8KV_BIN and FP8KV_MODEL");
// Engine flags that every `serve` and `generate` of the suite gets (and
// `capacity`, which sizes the pools as they do), e.g. "--kv-cache-dtype fp8":
// tests/server/run.sh passes them per model.
export const ENGINE_ARGS = (process.env.FP8KV_ENGINE_ARGS || "").split(/\s+/).filter(Boolean);
// An AddressSanitizer build: its allocator keeps freed memory in quarantine,
// so RSS checks do not apply there.
export const ASAN = (spawnSync("ldd", [BIN]).stdout || "").toString().includes("libasan");

// --threads 1: the CPU engine with one thread is fastest on a loaded CI machine.
export async function startServer(extra = [], model = MODEL) {
  const args = ["serve", model, "--port", "0", "--threads", "1", ...ENGINE_ARGS, ...extra];
  const proc = spawn(BIN, args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("server did not start in 60 s:\n" + stderr)), 60000);
    proc.stderr.on("data", (d) => {
      stderr += d.toString();
      const m = stderr.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}:\n${stderr}`)); });
  });
  proc.removeAllListeners("exit");
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  return {
    url,
    proc,
    log: () => stderr,
    async stop() {
      proc.kill("SIGTERM");
      const r = await exited;
      assert.deepEqual(r, { code: 0, signal: null }, "serve must exit 0 on SIGTERM:\n" + stderr);
    },
  };
}

export async function metrics(url) {
  const text = await (await fetch(url + "/metrics")).text();
  const get = (name) => {
    const m = text.match(new RegExp("^" + name.replace(/[:]/g, "\\:") + "\\{[^}]*\\} (\\S+)$", "m"));
    return m ? Number(m[1]) : undefined;
  };
  return { text, get };
}

export async function waitIdle(url, ms = 20000) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics(url);
    const free = m.get("fp8kv:kv_cache_free_blocks"), total = m.get("fp8kv:kv_cache_total_blocks");
    if (m.get("fp8kv:num_requests_running") === 0 && m.get("fp8kv:num_requests_waiting") === 0 && free === total)
      return m;
    if (Date.now() - t0 > ms) throw new Error("server did not go idle: " + JSON.stringify({ free, total }));
    await new Promise((r) => setTimeout(r, 50));
  }
}

// Asynchronous on purpose: a synchronous child blocks the event loop for
// seconds (a sanitizer build starts slowly), the server closes the client's
// idle keep-alive socket meanwhile, and the client would reuse the dead socket.
export async function generateCli(prompt, maxTokens) {
  const { stdout } = await promisify(execFile)(
      BIN, ["generate", MODEL, "--prompt", prompt, "--max-tokens", String(maxTokens), "--threads", "1", ...ENGINE_ARGS]);
  return stdout.endsWith("\n") ? stdout.slice(0, -1) : stdout;
}

// `fp8kv capacity MODEL --json` with the suite's engine flags and `args`.
export async function capacity(args) {
  const { stdout } = await promisify(execFile)(BIN, ["capacity", MODEL, "--json", ...ENGINE_ARGS, ...args]);
  return JSON.parse(stdout);
}

// The error a promise rejects with (fails when it resolves).
export async function status(promise) {
  try { await promise; } catch (e) { return e; }
  assert.fail("expected an error");
}

// One server for a whole test file, served as "mini": h.srv, h.client.
export function miniServer() {
  const h = {};
  before(async () => {
    h.srv = await startServer(["--served-model-name", "mini"]);
    h.client = new OpenAI({ baseURL: h.srv.url + "/v1", apiKey: "unused", maxRetries: 0 });
  });
  after(async () => { if (h.srv) await h.srv.stop(); });
  return h;
}
