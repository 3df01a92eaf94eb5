import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { LEASE_TABLE, Percolator, type RunEvent } from '@percolator/core';
import { createRedisStore, defaultRedisUrl, type RedisStore } from '@percolator/redis';
import { expect, test } from 'vitest';
import { decodeRow } from '../src/codec.js';
import { leaseKey } from '../src/observers/lease.js';
import { ackColumn } from '../src/observers/reserved.js';
import { crashObserver, TALLY } from './observers-crash-observer.js';
import { spawnTestScript } from './support.js';

/**
 * A worker process really dies mid-run (SIGKILL, no cleanup): its lease row and, past the
 * handler, its locks stay in the store. Another worker then takes the row over once the
 * lease expires, and the change ends up with exactly one committed run: the survivor's if
 * the dead run had not reached its commit point, else the dead one's. Runs against Redis
 * (PERCOLATOR_REDIS_URL, default redis://127.0.0.1:6379), which both processes share.
 */
const TABLE = 'crash_docs';
const ROW = 'doc/1';
/** The dead worker's lease and lock expiry: how long the survivor waits. */
const EXPIRY_MS = 500;

async function openStore(namespace: string): Promise<RedisStore> {
  try {
    return await createRedisStore({ namespace });
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${defaultRedisUrl()}: set PERCOLATOR_REDIS_URL (${(error as Error).message})`,
    );
  }
}

interface Stuck {
  readonly pid: number;
  readonly row: string;
  readonly at: string;
  readonly startTs?: number;
}

/** Starts the crashing worker; resolves once it reports that it is stuck mid-run. */
type Mode = 'handler' | 'prewrite' | 'committed';

function startDoomedWorker(namespace: string, mode: Mode) {
  const child = spawnTestScript(
    'observers-crash-child.ts',
    [namespace, TABLE, mode, String(EXPIRY_MS)],
    'ignore',
  );
  const exited = new Promise<NodeJS.Signals | null>((resolve) =>
    child.once('exit', (_code, signal) => resolve(signal)),
  );
  const stuck = new Promise<Stuck>((resolve, reject) => {
    void exited.then(() => reject(new Error('the worker process exited before it got stuck')));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (!line.startsWith('{')) return;
      const message = JSON.parse(line);
      if (message.stuck) resolve(message.stuck);
      if (message.unexpected) reject(new Error(message.unexpected));
    });
  });
  return { child, stuck, exited };
}

async function rawRow(store: RedisStore, table: string, row: string) {
  const stored = await store.read(table, row);
  return stored ? decodeRow(stored.state) : undefined;
}

test.each<Mode>(['handler', 'prewrite', 'committed'])(
  'a worker process killed mid-run (at: %s) leaves the row to another worker; the change commits exactly once',
  async (mode) => {
    const namespace = `obs_crash_${randomBytes(4).toString('hex')}`;
    const store = await openStore(namespace);
    const writer = new Percolator({ store, observedColumns: [{ table: TABLE, column: 'in' }] });
    const survivorDb = new Percolator({ store });
    const doomed = { child: undefined as ReturnType<typeof startDoomedWorker>['child'] | undefined };
    try {
      await writer.transact(async (tx) => tx.set(TABLE, ROW, 'in', 'v1'));
      const { child, stuck, exited } = startDoomedWorker(namespace, mode);
      doomed.child = child;
      const where = await stuck;
      // The process we kill is the one running the worker (vite-node runs it in-process).
      expect(where).toMatchObject({ pid: child.pid, row: ROW, at: mode });
      // It holds the row's lease. Before its commit point both rows hold its locks (the
      // ack's too); after it, the primary is committed and the other row is still locked.
      expect(await store.read(LEASE_TABLE, leaseKey(TABLE, ROW))).not.toBeNull();
      const ack = ackColumn('crash-copy', 'in');
      const locks = async () => [
        (await rawRow(store, TABLE, ROW))?.cells.get(ack)?.lock?.startTs,
        (await rawRow(store, TALLY.table, TALLY.row))?.cells.get(TALLY.column)?.lock?.startTs,
      ];
      if (mode === 'prewrite') expect(await locks()).toEqual([where.startTs, where.startTs]);
      if (mode === 'committed') expect((await locks()).filter((ts) => ts === where.startTs)).toHaveLength(1);
      child.kill('SIGKILL');
      expect(await exited).toBe('SIGKILL');

      const runs: RunEvent[] = [];
      const survivor = survivorDb.worker({
        observers: [crashObserver(TABLE, async () => undefined)],
        leaseMs: EXPIRY_MS,
        onRun: (e) => runs.push(e),
        onError: () => undefined,
      });
      // Pending until the dead worker's lease (and locks) expire; then it runs the row.
      await survivor.runUntilIdle({ timeoutMs: 30_000 });

      // The run that committed: the survivor's, or the dead one's (then the survivor skips).
      const committedBy = mode === 'committed' ? where.startTs! : runs[0]?.startTs;
      if (mode === 'committed') {
        expect(runs).toEqual([]);
        expect(survivor.stats).toMatchObject({ runs: 0, skipped: 1 });
      } else {
        expect(runs.map((e) => [e.row, e.observer])).toEqual([[ROW, 'crash-copy']]);
        expect(survivor.stats.runs).toBe(1);
      }
      // The handler's effect is there once: one committed run in all.
      const [out, tally] = await writer.transact(async (tx) => [
        await tx.getString(TABLE, ROW, 'out'),
        await tx.getString(TALLY.table, TALLY.row, TALLY.column),
      ]);
      expect(out).toBe('v1');
      expect(tally).toBe('1');
      // The ack was written once, by that run; no lock is left anywhere.
      const row = (await rawRow(store, TABLE, ROW))!;
      const ackCell = row.cells.get(ack)!;
      expect(ackCell.writes.filter((w) => w.kind !== 'rollback').map((w) => w.startTs)).toEqual([
        committedBy,
      ]);
      expect(new TextDecoder().decode(ackCell.data.get(committedBy!))).toBe(String(committedBy));
      for (const cell of row.cells.values()) expect(cell.lock).toBeUndefined();
      expect(await locks()).toEqual([undefined, undefined]);
      // The notification index is empty, the flag cleared, and no lease is left behind.
      expect(await store.scanNotified(TABLE, { limit: 10 })).toEqual([]);
      expect(row.cells.get('in')?.notifyTs).toBe(0);
      expect(await store.read(LEASE_TABLE, leaseKey(TABLE, ROW))).toBeNull();
    } finally {
      if (doomed.child && doomed.child.exitCode === null && doomed.child.signalCode === null)
        doomed.child.kill('SIGKILL');
      await writer.close();
      await survivorDb.close();
      await store.dropNamespace();
      await store.close();
    }
  },
  60_000,
);
