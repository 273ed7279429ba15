// rate-limiter-flexible's RateLimiterRedis (ioredis) under the same load as
// `bench --store redis` (examples/bench.rs): CONCURRENCY loops share REQUESTS
// decisions, each drawing its key uniformly from KEYS keys ("k<i>", xorshift),
// LIMIT points per WINDOW_SECS; prints the same JSON line.
//
// Usage (scripts/bench-peers installs the packages into a scratch directory):
//   NODE_PATH=<dir>/node_modules node rate-limiter-flexible.js \
//       REDIS_PORT KEYS CONCURRENCY REQUESTS [LIMIT] [WINDOW_SECS]
'use strict';

const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

async function main() {
  const [port, keys, concurrency, requests, limit = 1000, windowSecs = 1] =
    process.argv.slice(2).map(Number);
  if (!port || !keys || !concurrency || !requests) {
    console.error('usage: rate-limiter-flexible.js REDIS_PORT KEYS CONCURRENCY REQUESTS [LIMIT] [WINDOW_SECS]');
    process.exit(2);
  }
  const redis = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true });
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'peer-rlf',
    points: limit,
    duration: windowSecs,
  });
  const names = Array.from({ length: keys }, (_, i) => `k${i}`);
  let next = 0;
  let allowed = 0;
  let denied = 0;
  let errors = 0;
  const latencies = new Float64Array(requests);
  const started = process.hrtime.bigint();
  async function worker(task) {
    // The same xorshift as bench.rs, in BigInt to keep its 64 bits.
    const mask = (1n << 64n) - 1n;
    let rng = (0x9e3779b97f4a7c15n ^ ((BigInt(task) + 1n) * 0x2545f4914f6cdd1dn & mask)) & mask;
    while (next < requests) {
      const i = next++;
      rng ^= (rng << 13n) & mask;
      rng ^= rng >> 7n;
      rng ^= (rng << 17n) & mask;
      const key = names[Number(rng % BigInt(keys))];
      const begun = process.hrtime.bigint();
      try {
        await limiter.consume(key, 1);
        allowed++;
      } catch (e) {
        if (e instanceof Error) {
          if (errors++ === 0) console.error(`peer: first error: ${e.message}`);
        } else {
          denied++; // a RateLimiterRes: the limit was reached
        }
      }
      latencies[i] = Number(process.hrtime.bigint() - begun) / 1000;
    }
  }
  await Promise.all(Array.from({ length: concurrency }, (_, t) => worker(t)));
  const secs = Number(process.hrtime.bigint() - started) / 1e9;
  latencies.sort();
  const at = (percent) => Math.round(latencies[Math.ceil((latencies.length - 1) * percent / 100)]);
  console.log(JSON.stringify({
    store: 'rate-limiter-flexible', algorithm: 'fixed-window', keys, concurrency,
    decisions: requests, allowed, denied, secs: Number(secs.toFixed(3)),
    per_sec: Math.round(requests / secs), p50_us: at(50), p99_us: at(99),
  }));
  redis.disconnect();
}

main().catch((e) => { console.error(e); process.exit(1); });
