// BullMQ's delivery lateness, for bench.lateness's BullMQ arm.
// Usage: node lateness.mjs REDIS_URL TASKS WINDOW_S START_IN_S CONCURRENCY
// One Worker (concurrency CONCURRENCY) runs from the start; TASKS jobs are added one
// `await queue.add` at a time in shuffled order, job i due START_IN_S + its offset after the
// start, offsets evenly over WINDOW_S. A job added after its due time gets delay 0 and counts
// as overran. Each job records when the worker started it; prints JSON: schedule calls/s,
// overran, and every job's worker start - due (ms) and start time (ms since the epoch).
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const [url, tasksText, windowText, startInText, concurrencyText] = process.argv.slice(2);
const tasks = Number(tasksText);
const windowMs = Number(windowText) * 1000;
const startInMs = Number(startInText) * 1000;
const name = "bench-lateness";
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const queue = new Queue(name, { connection });
await queue.obliterate({ force: true });

const starts = [];
let done;
const finished = new Promise((resolve) => { done = resolve; });
const workerConnection = new IORedis(url, { maxRetriesPerRequest: null });
const worker = new Worker(name, async (job) => {
  const start = Date.now();
  starts.push([start - job.data.due, start]);
  if (starts.length === tasks) done();
}, { connection: workerConnection, concurrency: Number(concurrencyText) });
await worker.waitUntilReady();

const offsets = Array.from({ length: tasks }, (_, i) => (i * windowMs) / tasks);
for (let i = offsets.length - 1; i > 0; i--) {  // shuffled, as the Python arms' loads are
  const j = Math.floor(Math.random() * (i + 1));
  [offsets[i], offsets[j]] = [offsets[j], offsets[i]];
}
const base = Date.now() + startInMs;
let overran = 0;
const started = process.hrtime.bigint();
for (const offset of offsets) {
  const due = Math.round(base + offset);  // whole ms, as BullMQ counts delays
  const delay = due - Date.now();
  if (delay <= 0) overran += 1;
  await queue.add("close_unpaid_order", { due }, { delay: Math.max(delay, 0),
                                                    removeOnComplete: true });
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await finished;
await worker.close();
await queue.obliterate({ force: true });
await queue.close();
await connection.quit();
await workerConnection.quit();
console.log(JSON.stringify({ schedule_per_s: tasks / seconds, overran,
                             lateness_ms: starts.map(([late]) => late),
                             start_ms: starts.map(([, start]) => start) }));
