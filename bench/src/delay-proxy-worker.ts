/**
 * The worker thread of `startProxies` (delay-proxy.ts): starts one delay proxy per target,
 * posts their ports, and closes them when told to.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { type DelayProxy, type ProxyTarget, startDelayProxy } from './delay-proxy.js';

const { targets, rttMs } = workerData as { targets: ProxyTarget[]; rttMs: number };
let proxies: DelayProxy[] = [];
try {
  proxies = await Promise.all(targets.map((t) => startDelayProxy(t, rttMs)));
  parentPort!.postMessage({ ports: proxies.map((p) => p.port) });
} catch (error) {
  parentPort!.postMessage({ error: error instanceof Error ? error.message : String(error) });
}
parentPort!.on('message', async (message) => {
  if (message !== 'close') return;
  await Promise.all(proxies.map((p) => p.close()));
  parentPort!.close();
});
