// BullMQ's scheduling paths, for bench.scheduling. Usage: node add.mjs REDIS_URL COUNT MODE
//   one:   COUNT Queue.add calls, each awaited before the next (as apply_delayed is called)
//   bulk:  Queue.addBulk of CHUNK jobs at a time (as apply_delayed_many is called)
// Checks that COUNT delayed jobs are stored; prints {"per_s", "bytes_per_job"} as JSON.
import { Queue } from "bullmq";
import IORedis from "ioredis";

const CHUNK = 1000;
const [url, countText, mode] = process.argv.slice(2);
const count = Number(countText);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const queue = new Queue("bench-add", { connection });
const job = (n) => ({ name: "close_unpaid_order", data: { orderId: n },
                      opts: { delay: 3_600_000 + (n % 86_400) * 1000 } });
const usedMemory = async () =>
  Number((await connection.info("memory")).match(/used_memory:(\d+)/)[1]);

await queue.obliterate({ force: true });
await queue.add("close_unpaid_order", { orderId: -1 }, { delay: 3_600_000 });  // warm up
const before = await usedMemory();
const started = process.hrtime.bigint();
if (mode === "bulk") {
  for (let first = 0; first < count; first += CHUNK) {
    const chunk = [];
    for (let n = first; n < Math.min(first + CHUNK, count); n++) chunk.push(job(n));
    await queue.addBulk(chunk);
  }
} else {
  for (let n = 0; n < count; n++) {
    const { name, data, opts } = job(n);
    await queue.add(name, data, opts);
  }
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
const after = await usedMemory();
const delayed = await queue.getDelayedCount();
if (delayed !== count + 1) throw new Error(`expected ${count + 1} delayed jobs, found ${delayed}`);
await queue.obliterate({ force: true });
await queue.close();
await connection.quit();
console.log(JSON.stringify({ per_s: count / seconds, bytes_per_job: (after - before) / count }));
