#!/usr/bin/env node
/**
 * What clock skew between clients costs: a table by skew (0, ±TTL/4, ±TTL/2, ±TTL).
 *
 *   pnpm build && node scripts/skew-cost.mjs [--backend memory|postgres|mysql|redis] [--ttl MS] [--seconds S]
 *
 * For each skew, four clients on one store: two with the true clock, two whose clock is
 * off by the skew. Eight workers run list-append transactions on six lists (reads, then
 * appends), each retried up to ten times by hand so every failed attempt is seen. Commits
 * take a while (a pause of TTL/10 before the commit point, like a slow network), and 2 %
 * of transactions are abandoned after their prewrites (the client "dies"), so readers
 * meet both live locks and dead ones. Measured:
 * - spurious rollbacks: commits that failed because another client rolled back their
 *   primary lock while they were alive (a fast clock judged a live lock expired);
 * - read waits: time spent in reads (a reader waits on a lock until it expires by its own
 *   clock; a slow clock waits longer for a dead lock);
 * - LockNotResolvedError: reads that gave up waiting (lockWaitMs, 2 × TTL);
 * - retries per commit, and committed transactions per second.
 * Every run's history goes through the conformance suite's Elle-style checker, and every
 * acknowledged append must be in the final lists: skew may cost liveness, never safety.
 * Exits 1 if any run has an anomaly or loses a commit.
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { checkListAppend, describeCheck } from '@percolator/conformance';
import { ClientCrash, ConflictError, LockNotResolvedError, MemoryStore, Percolator } from '@percolator/core';

const { values } = parseArgs({
  options: {
    backend: { type: 'string', default: 'memory' },
    ttl: { type: 'string', default: '500' },
    seconds: { type: 'string', default: '4' },
  },
});
const TTL = Number(values.ttl);
const SECONDS = Number(values.seconds);
const KEYS = ['k0', 'k1', 'k2', 'k3', 'k4', 'k5'];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function openStore(backend) {
  const namespace = `skew_${randomBytes(4).toString('hex')}`;
  switch (backend) {
    case 'memory':
      return new MemoryStore();
    case 'postgres':
      return (await import('@percolator/postgres')).createPostgresStore({ namespace });
    case 'mysql':
      return (await import('@percolator/mysql')).createMySqlStore({ namespace });
    case 'redis':
      return (await import('@percolator/redis')).createRedisStore({ namespace });
    default:
      throw new Error(`--backend must be memory, postgres, mysql or redis, not ${backend}`);
  }
}

/** Deterministic enough for a measurement: a small LCG per worker. */
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/**
 * How long a reader whose clock is off by `skew` waits on a dead lock: a client with the
 * true clock prewrites two rows and dies before its commit point; the reader reads the
 * primary at once. By design the wait is about TTL − skew (none once skew ≥ TTL), and a
 * reader gives up after lockWaitMs (2 × TTL) with LockNotResolvedError. Median of three.
 */
async function deadLockWait(store, skew) {
  const owner = new Percolator({
    store,
    lockTtlMs: TTL,
    hooks: {
      onCommitStep: (e) => {
        if (e.step === 'beforeCommitPrimary') throw new ClientCrash('dies before its commit point');
      },
    },
  });
  const reader = new Percolator({ store, clock: () => Date.now() + skew, lockTtlMs: TTL });
  const waits = [];
  for (let i = 0; i < 3; i++) {
    const tx = await owner.begin();
    tx.set('dead', `a${i}`, 'v', 'x');
    tx.set('dead', `b${i}`, 'v', 'x');
    await tx.commit().catch(() => undefined);
    const t0 = performance.now();
    try {
      await reader.transact((t) => t.getString('dead', `a${i}`, 'v'), { maxAttempts: 1 });
      waits.push(performance.now() - t0);
    } catch (error) {
      if (!(error instanceof LockNotResolvedError)) throw error;
      waits.push(Number.POSITIVE_INFINITY);
    }
  }
  await Promise.all([owner.close(), reader.close()]);
  return waits.sort((a, b) => a - b)[1];
}

async function measure(skew) {
  const store = await openStore(values.backend);
  const deadWait = await deadLockWait(store, skew);
  const clocks = [0, 0, skew, skew].map((offset) => () => Date.now() + offset);
  let crashNext = 0;
  const clients = clocks.map(
    (clock) =>
      new Percolator({
        store,
        clock,
        lockTtlMs: TTL,
        hooks: {
          onCommitStep: async (e) => {
            if (e.step === 'afterPrewrite' && e.isPrimary === false && crashNext > 0) {
              crashNext--;
              throw new ClientCrash('abandoned after its prewrites');
            }
            if (e.step === 'beforeCommitPrimary') await sleep(TTL / 10);
          },
        },
      }),
  );
  const m = { committed: 0, attempts: 0, spurious: 0, conflicts: 0, notResolved: 0, abandoned: 0, reads: [] };
  const history = [];
  let value = 1;
  const deadline = Date.now() + SECONDS * 1000;
  const worker = async (w) => {
    const db = clients[w % clients.length];
    const random = rng(w + 1);
    while (Date.now() < deadline) {
      const plan = Array.from(
        { length: 1 + Math.floor(random() * 3) },
        () => KEYS[Math.floor(random() * KEYS.length)],
      );
      const abandon = random() < 0.02 && new Set(plan).size > 1;
      let outcome = 'fail';
      let mops = [];
      for (let attempt = 0; attempt < 10 && outcome === 'fail'; attempt++) {
        m.attempts++;
        mops = [];
        const tx = await db.begin();
        try {
          for (const key of plan) {
            const t0 = performance.now();
            const list = JSON.parse((await tx.getString('lists', key, 'l')) ?? '[]');
            m.reads.push(performance.now() - t0);
            mops.push({ f: 'r', key, value: list });
            const v = value++;
            tx.set('lists', key, 'l', JSON.stringify([...list, v]));
            mops.push({ f: 'append', key, value: v });
          }
          if (abandon) crashNext++;
          await tx.commit();
          outcome = 'ok';
        } catch (error) {
          await tx.rollback().catch(() => undefined);
          if (error instanceof ClientCrash) {
            m.abandoned++;
            outcome = 'info';
          } else if (error instanceof ConflictError) {
            if (/rolled back by another client/.test(error.message)) m.spurious++;
            else m.conflicts++;
          } else if (error instanceof LockNotResolvedError) {
            m.notResolved++;
          } else {
            outcome = 'info';
          }
          if (outcome === 'fail')
            history.push({ type: 'fail', txn: mops.map((x) => (x.f === 'r' ? { ...x, value: null } : x)) });
          if (outcome === 'fail') await sleep(random() * 5);
        }
      }
      if (outcome === 'ok') m.committed++;
      if (outcome !== 'fail')
        history.push({
          type: outcome,
          txn: outcome === 'ok' ? mops : mops.map((x) => (x.f === 'r' ? { ...x, value: null } : x)),
        });
    }
  };
  await Promise.all(Array.from({ length: 8 }, (_, w) => worker(w)));
  // The final read, by a client whose clock is past every lock the run left.
  const reader = new Percolator({
    store,
    clock: () => Date.now() + Math.abs(skew) + TTL + 1000,
    lockTtlMs: TTL,
  });
  const final = await reader.transact(async (tx) => {
    const out = [];
    for (const key of KEYS)
      out.push({ f: 'r', key, value: JSON.parse((await tx.getString('lists', key, 'l')) ?? '[]') });
    return out;
  });
  history.push({ type: 'ok', txn: final });
  const result = checkListAppend(history.map((op, id) => ({ ...op, id })));
  const finalLists = new Map(final.map((x) => [x.key, new Set(x.value)]));
  const lost = history
    .filter((op) => op.type === 'ok')
    .flatMap((op) => op.txn.filter((x) => x.f === 'append' && !finalLists.get(x.key).has(x.value)));
  await Promise.all([...clients, reader].map((c) => c.close()));
  await store.dropNamespace?.().catch(() => undefined);
  await store.close();
  m.reads.sort((a, b) => a - b);
  const readMs = m.reads.reduce((a, b) => a + b, 0);
  return {
    skew,
    deadWait,
    perSecond: m.committed / SECONDS,
    committed: m.committed,
    spurious: m.spurious,
    retries: (m.attempts - m.committed - m.abandoned) / Math.max(1, m.committed),
    notResolved: m.notResolved,
    meanRead: readMs / Math.max(1, m.reads.length),
    p99Read: m.reads[Math.floor(m.reads.length * 0.99)] ?? 0,
    waitPerCommit: readMs / Math.max(1, m.committed),
    anomalies: result.anomalies.length,
    lost: lost.length,
    describe: result.valid ? '' : describeCheck(result),
  };
}

const skews = [0, TTL / 4, TTL / 2, TTL, -TTL / 4, -TTL / 2, -TTL];
const label = (s) =>
  s === 0
    ? '0'
    : `${s > 0 ? '+' : '−'}TTL/${TTL / Math.abs(s) === 1 ? '1' : TTL / Math.abs(s)}`.replace('/1', '');
console.log(
  `backend ${values.backend}, lockTtlMs ${TTL}, ${SECONDS} s per skew; 4 clients (2 skewed), 8 workers, 6 lists; commits pause TTL/10; 2 % abandoned\n`,
);
console.log(
  '| skew (2 of 4 clients) | wait on a dead lock, ms | commits/s | spurious rollbacks | retries per commit | LockNotResolved | mean read ms | p99 read ms | anomalies | lost |',
);
console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
let failed = false;
for (const skew of skews) {
  const r = await measure(skew);
  failed ||= r.anomalies > 0 || r.lost > 0;
  console.log(
    `| ${label(skew)} (${skew > 0 ? '+' : ''}${skew} ms) | ${Number.isFinite(r.deadWait) ? r.deadWait.toFixed(0) : 'gave up (lockWaitMs)'} | ${r.perSecond.toFixed(0)} | ${r.spurious} | ${r.retries.toFixed(2)} | ${r.notResolved} | ${r.meanRead.toFixed(1)} | ${r.p99Read.toFixed(0)} | ${r.anomalies} | ${r.lost} |`,
  );
  if (r.describe) console.error(r.describe);
}
process.exit(failed ? 1 : 0);
