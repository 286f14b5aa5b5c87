// Bounded load test (CTest label slow): 128 concurrent clients, 2000
// requests with max_tokens <= 16, a tenth disconnecting mid-stream.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, waitIdle } from "./harness.mjs";

// FP8KV_LOAD_REQUESTS / FP8KV_LOAD_LIMIT_S shrink or relax the run by hand on
// a loaded machine; CTest runs the defaults.
const CLIENTS = 128;
const REQUESTS = Number(process.env.FP8KV_LOAD_REQUESTS ?? 2000);
const LIMIT_S = Number(process.env.FP8KV_LOAD_LIMIT_S ?? 90);
const WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "over", "old", "town", "and", "we", "sang"];

test("load: 128 clients, 2000 requests, a tenth disconnecting", async () => {
  const srv = await startServer(["--served-model-name", "mini"]);
  const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
  let seed = 12345;  // mulberry32: a reproducible mix of prompts and lengths
  const rand = (n) => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
  };
  const counts = { done: 0, cancelled: 0, rejected503: 0, errors: [] };
  const finishes = {};
  let next = 0;
  const t0 = Date.now();

  async function one(i) {
    const prompt = Array.from({ length: 3 + rand(12) }, () => WORDS[rand(WORDS.length)]).join(" ");
    const max_tokens = 1 + rand(16);
    const mode = i % 10 === 0 ? "disconnect" : i % 2 ? "stream" : "plain";
    try {
      if (mode === "plain") {
        const r = await client.completions.create({ model: "mini", prompt, max_tokens, temperature: 0.8, seed: i });
        finishes[r.choices[0].finish_reason] = (finishes[r.choices[0].finish_reason] ?? 0) + 1;
        assert.ok(["length", "stop"].includes(r.choices[0].finish_reason), JSON.stringify(r));
        counts.done++;
      } else {
        const ac = new AbortController();
        const s = await client.completions.create({ prompt, model: "mini", stream: true, seed: i,
                                                   max_tokens: mode === "disconnect" ? 16 : max_tokens },
                                                  { signal: ac.signal });
        let finish = null;
        try {
          for await (const c of s) {
            finish = c.choices[0]?.finish_reason ?? finish;
            if (mode === "disconnect") ac.abort();
          }
        } catch (e) {
          if (mode !== "disconnect" || e.name !== "APIUserAbortError") throw e;
        }
        if (mode === "disconnect" && finish === null) { counts.cancelled++; return; }
        assert.ok(["length", "stop"].includes(finish), `finish_reason ${finish}`);
        finishes[finish] = (finishes[finish] ?? 0) + 1;
        counts.done++;
      }
    } catch (e) {
      if (e.status === 503) counts.rejected503++;
      else counts.errors.push(`${mode}: ${e.status ?? ""} ${e.message}`);
    }
  }
  async function worker() {
    while (next < REQUESTS) await one(next++);
  }
  // Warm-up, then the run.
  await Promise.all(Array.from({ length: 8 }, (_, i) => one(1 + 2 * i)));
  await Promise.all(Array.from({ length: CLIENTS }, worker));
  const seconds = (Date.now() - t0) / 1000;
  const m = await waitIdle(srv.url, 20000);
  console.log(JSON.stringify({ seconds, ...counts, errors: counts.errors.length, finishes,
                               generation_tokens: m.get("fp8kv:generation_tokens_total") }));
  assert.deepEqual(counts.errors.slice(0, 5), []);
  assert.equal(counts.done + counts.cancelled + counts.rejected503, REQUESTS + 8);
  assert.ok(counts.cancelled > 0);
  assert.ok(seconds <= LIMIT_S, `took ${seconds} s (limit ${LIMIT_S})`);
  assert.equal(m.get("fp8kv:kv_cache_free_blocks"), m.get("fp8kv:kv_cache_total_blocks"));
  await srv.stop();  // exits 0 by itself
});
