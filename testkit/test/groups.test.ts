import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { killListedGroups } from '@percolator/testkit/private';
import { expect, it } from 'vitest';

/** Whether a process is alive (signal 0 checks without sending). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

it("a run's teardown SIGKILLs the process groups its workers listed and left running, then removes the list", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'percolator-groups-test-'));
  // A server's group as a worker stopped by a signal would leave it: detached, still running.
  const child = spawn('sleep', ['60'], { detached: true, stdio: 'ignore' });
  const exited = new Promise<string | null>((resolve) =>
    child.once('exit', (_code, signal) => resolve(signal)),
  );
  writeFileSync(join(dir, String(child.pid)), '');
  writeFileSync(join(dir, 'not-a-pid'), '');
  expect(alive(child.pid!)).toBe(true);
  expect(killListedGroups(dir)).toBe(1);
  expect(await exited).toBe('SIGKILL');
  // The list is gone; a second teardown finds nothing.
  expect(killListedGroups(dir)).toBe(0);
});
