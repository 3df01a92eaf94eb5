import { MemoryStore } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { LEASE_TABLE, Leases, leaseKey } from '../src/observers/lease.js';
import type { Fault } from './support.js';
import { fakeClock, InstrumentedStore } from './support.js';

/**
 * Observer leases (core/src/observers/lease.ts) over lost replies: a lease CAS that landed
 * though its reply was lost is recognised by its token, so the worker neither gives up a
 * lease it holds nor leaves one nobody knows of (every worker would skip the row until it
 * expired).
 */
describe('observer leases and lost replies', () => {
  const KEY = leaseKey('docs', 'a');

  /** Leases over an InstrumentedStore whose lease CASes take their faults from `faults`, in order. */
  function leasesWith(faults: Fault[]) {
    const store = new InstrumentedStore(new MemoryStore());
    store.casFault = (request) => (request.table === LEASE_TABLE ? faults.shift() : undefined);
    const leases = new Leases(store, 10_000, fakeClock());
    return { store, leases };
  }

  test('a renewal that landed though its reply was lost: the next renewal finds the lease still ours, and the release deletes it', async () => {
    const { store, leases } = leasesWith([undefined, 'fail-after']);
    const lease = await leases.acquire('docs', 'a');
    expect(lease).toBeDefined();
    // Landed, reply lost: the worker cannot know yet.
    expect(await lease!.renew()).toBe(true);
    // Refused (its version is not the one it expected): the row holds its token, so still ours.
    expect(await lease!.renew()).toBe(true);
    await lease!.release();
    expect(await store.inner.read(LEASE_TABLE, KEY)).toBeNull();
  });

  test('a renewal that landed though its reply was lost, then the release: the row is still deleted, no orphan', async () => {
    const { store, leases } = leasesWith([undefined, 'fail-after']);
    const lease = await leases.acquire('docs', 'a');
    expect(await lease!.renew()).toBe(true);
    // The row finished before any further renewal: the release expects the version before
    // the lost renewal, is refused, and finds its token there. Before, it gave up, and the
    // lease row kept every worker off the row until it expired.
    await lease!.release();
    expect(await store.inner.read(LEASE_TABLE, KEY)).toBeNull();
  });

  test('a renewal refused because another worker took the lease over: lost, and the release leaves their row', async () => {
    const { store, leases } = leasesWith([]);
    const lease = await leases.acquire('docs', 'a');
    const row = await store.inner.read(LEASE_TABLE, KEY);
    const theirs = new TextEncoder().encode(JSON.stringify({ owner: 'other', token: 't', expiresAt: 1 }));
    expect(
      (await store.inner.checkAndSet({ table: LEASE_TABLE, key: KEY, expected: row!.version, state: theirs }))
        .ok,
    ).toBe(true);
    expect(await lease!.renew()).toBe(false);
    await lease!.release();
    expect((await store.inner.read(LEASE_TABLE, KEY))?.state).toEqual(theirs);
  });

  test('an acquisition whose last attempt landed though its reply was lost: the lease is ours, not an orphan', async () => {
    // Five attempts lost before the store, the sixth and last applied with its reply lost.
    const { store, leases } = leasesWith([
      'fail-before',
      'fail-before',
      'fail-before',
      'fail-before',
      'fail-before',
      'fail-after',
    ]);
    const lease = await leases.acquire('docs', 'a');
    expect(lease).toBeDefined();
    await lease!.release();
    expect(await store.inner.read(LEASE_TABLE, KEY)).toBeNull();
  });
});
