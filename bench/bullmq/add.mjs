// BullMQ's one-call path: `count` Queue.add calls, each awaited before the next, as
// bench.schedule_one makes apply_delayed calls. Usage: node add.mjs REDIS_URL COUNT
// Prints {"per_s": N, "bytes_per_job": N} as JSON on stdout.
import { Queue } from "bullmq";
import IORedis from "ioredis";

const [url, countText] = process.argv.slice(2);
const count = Number(countText);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const queue = new Queue("bench-add", { connection });
await queue.obliterate({ force: true });
await queue.add("close_unpaid_order", { orderId: -1 }, { delay: 3_600_000 });  // warm up
const before = Number((await connection.info("memory")).match(/used_memory:(\d+)/)[1]);
const started = process.hrtime.bigint();
for (let n = 0; n < count; n++) {
  await queue.add("close_unpaid_order", { orderId: n }, { delay: 3_600_000 + (n % 86_400) * 1000 });
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
const after = Number((await connection.info("memory")).match(/used_memory:(\d+)/)[1]);
const delayed = await queue.getDelayedCount();
if (delayed !== count + 1) throw new Error(`expected ${count + 1} delayed jobs, found ${delayed}`);
await queue.obliterate({ force: true });
await queue.close();
await connection.quit();
console.log(JSON.stringify({ per_s: count / seconds, bytes_per_job: (after - before) / count }));
