// Bounded load test (CTest label slow): 128 concurrent clients, 2000
// requests with max_tokens <= 16, a tenth disconnecting mid-stream, on a KV
// pool small enough that the scheduler preempts (counted in /metrics). Passes
// when every request not cancelled has a finish_reason, there is no 5xx but
// 503, the free blocks equal the pool again, RSS after the run is within 10%
// of RSS after a warm-up that filled the pool, the run took <= 90 s, and the
// server exits 0 by itself on SIGTERM (docs/server.md "Tests").
import { readFileSync } from "node:fs";
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, waitIdle } from "./harness.mjs";

// FP8KV_LOAD_REQUESTS / FP8KV_LOAD_LIMIT_S shrink or relax the run by hand on
// a loaded machine; CTest runs the defaults.
const CLIENTS = 128;
const REQUESTS = Number(process.env.FP8KV_LOAD_REQUESTS ?? 2000);
const LIMIT_S = Number(process.env.FP8KV_LOAD_LIMIT_S ?? 90);
// 128 clients x (prompt <= ~20 tokens + 16) need ~4,000 tokens of KV at once;
// the pool holds far fewer, so the newest requests are preempted.
const KV_MEMORY = process.env.FP8KV_LOAD_KV_MEMORY ?? "4MiB";
const WARMUP = CLIENTS;
const WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "over", "old", "town", "and", "we", "sang"];

test("load: 128 clients, 2000 requests, a tenth disconnecting", async () => {
  const srv = await startServer(["--served-model-name", "mini", "--max-model-len", "128", "--kv-memory", KV_MEMORY]);
  const rssKiB = () => Number(readFileSync(`/proc/${srv.proc.pid}/status`, "utf8").match(/^VmRSS:\s+(\d+)/m)[1]);
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

  async function one(i, fixedMax = 0) {
    const prompt = Array.from({ length: 3 + rand(12) }, () => WORDS[rand(WORDS.length)]).join(" ");
    const max_tokens = fixedMax || 1 + rand(16);
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
  // Warm-up: one streamed request of 16 tokens per client at once (~3,300
  // tokens of KV), which fills the pool (it preempts);
  // RSS is taken when the server is idle again.
  await Promise.all(Array.from({ length: WARMUP }, (_, i) => one(2 * i + 1, 16)));
  const warm = await waitIdle(srv.url, 20000);
  const rssWarm = rssKiB();
  await Promise.all(Array.from({ length: CLIENTS }, worker));
  const seconds = (Date.now() - t0) / 1000;
  const m = await waitIdle(srv.url, 20000);
  const rssAfter = rssKiB();
  console.log(JSON.stringify({ seconds, ...counts, errors: counts.errors.length, finishes,
                               generation_tokens: m.get("fp8kv:generation_tokens_total"),
                               total_blocks: m.get("fp8kv:kv_cache_total_blocks"),
                               preemptions_warmup: warm.get("fp8kv:num_preemptions_total"),
                               preemptions: m.get("fp8kv:num_preemptions_total"), rss_warm_kib: rssWarm,
                               rss_after_kib: rssAfter }));
  assert.deepEqual(counts.errors.slice(0, 5), []);
  assert.equal(counts.done + counts.cancelled + counts.rejected503, REQUESTS + WARMUP);
  assert.ok(counts.cancelled > 0);
  assert.ok(m.get("fp8kv:num_preemptions_total") > 0, `no preemption with --kv-memory ${KV_MEMORY}`);
  assert.ok(warm.get("fp8kv:num_preemptions_total") > 0, `the warm-up did not fill the pool (--kv-memory ${KV_MEMORY})`);
  assert.ok(Math.abs(rssAfter - rssWarm) <= 0.1 * rssWarm, `RSS ${rssWarm} KiB after the warm-up, ${rssAfter} KiB after the run`);
  assert.ok(seconds <= LIMIT_S, `took ${seconds} s (limit ${LIMIT_S})`);
  assert.equal(m.get("fp8kv:kv_cache_free_blocks"), m.get("fp8kv:kv_cache_total_blocks"));
  await srv.stop();  // exits 0 by itself
});

// Fairness (issue 37 C11): closed-loop clients on a KV pool small enough to
// preempt; every request is non-streamed with an exact size (ignore_eos).
// No request may take more than 4x the median time of its size (the first
// wave, all arriving at once on a cold server, is not counted).
test("fairness: no request waits more than 4x the median for its size", async () => {
  const CLIENTS_F = 64;
  const N = Number(process.env.FP8KV_FAIR_REQUESTS ?? 480);
  const SIZES = [4, 16];
  const srv = await startServer(["--served-model-name", "mini", "--max-model-len", "128", "--kv-memory", KV_MEMORY]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
    const times = Object.fromEntries(SIZES.map((s) => [s, []]));
    let next = 0;
    const t0 = Date.now();
    async function worker() {
      while (next < N) {
        const i = next++;
        const size = SIZES[i % SIZES.length];
        const prompt = Array.from({ length: 8 }, (_, k) => WORDS[(i * 7 + k * 3) % WORDS.length]).join(" ");
        const a = Date.now();
        const r = await client.completions.create({ model: "mini", prompt, max_tokens: size, ignore_eos: true,
                                                    temperature: 0.8, seed: i });
        assert.equal(r.usage.completion_tokens, size);
        if (i >= CLIENTS_F) times[size].push({ ms: Date.now() - a, i, start: a - t0 });  // the first wave warms up
      }
    }
    await Promise.all(Array.from({ length: CLIENTS_F }, worker));
    const m = await waitIdle(srv.url, 20000);
    const report = {};
    for (const s of SIZES) {
      const ms = times[s].map((x) => x.ms).sort((x, y) => x - y);
      const median = ms[Math.floor(ms.length / 2)];
      const worst = times[s].reduce((w, x) => (x.ms > w.ms ? x : w));
      report[s] = { n: ms.length, median, p90: ms[Math.floor(ms.length * 0.9)], max: worst.ms, worst_i: worst.i,
                    worst_start_ms: worst.start };
    }
    console.log(JSON.stringify({ seconds: (Date.now() - t0) / 1000, report,
                                 preemptions: m.get("fp8kv:num_preemptions_total") }));
    assert.ok(m.get("fp8kv:num_preemptions_total") > 0, `no preemption with --kv-memory ${KV_MEMORY}`);
    for (const s of SIZES)
      assert.ok(report[s].max <= 4 * report[s].median, `max_tokens ${s}: ${JSON.stringify(report[s])}`);
  } finally {
    await srv.stop();
  }
});
