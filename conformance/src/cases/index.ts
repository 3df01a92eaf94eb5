import type { ConformanceCase } from '../types.js';
import { PARTS } from '../types.js';
import { argumentCases } from './arguments.js';
import { blindWriteCases } from './blind-writes.js';
import { capabilityCases } from './capabilities.js';
import { faultCases } from './faults.js';
import { fuzzCases } from './fuzz.js';
import { historyCases } from './history.js';
import { leanRowCases } from './lean-rows.js';
import { observerCases } from './observers.js';
import { observerWorkerCases } from './observers-worker.js';
import { onePhaseCases } from './one-phase.js';
import { protocolCases } from './protocol.js';
import { storeCases } from './store.js';

/** Every case of the suite, in run order (parts in PARTS order). */
export function allCases(): ConformanceCase[] {
  const cases = [
    ...storeCases,
    ...argumentCases,
    ...fuzzCases,
    ...capabilityCases,
    ...protocolCases('clean'),
    ...blindWriteCases('clean'),
    ...faultCases,
    ...protocolCases('faulty'),
    ...blindWriteCases('faulty'),
    ...onePhaseCases,
    ...historyCases(),
    ...leanRowCases,
    ...observerCases,
    ...observerWorkerCases,
  ];
  // A stable sort keeps each part's cases in the order they were written.
  return cases.sort((a, b) => PARTS.indexOf(a.part) - PARTS.indexOf(b.part));
}
