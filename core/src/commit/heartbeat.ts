import { updateRow } from '../row-update.js';
import { type CommitContext, rowId } from './context.js';

/** Keeps the primary lock fresh while a commit runs long, so readers don't roll back a live transaction. */
export class Heartbeat {
  private timer: NodeJS.Timeout | undefined;
  private beat: Promise<unknown> = Promise.resolve();
  private stopped = false;

  constructor(private readonly ctx: CommitContext) {}

  start(): void {
    const interval = Math.max(1, Math.floor(this.ctx.env.lockTtlMs / 3));
    const tick = () => {
      if (this.stopped || this.ctx.crashed !== undefined) return;
      this.beat = this.refresh()
        .catch(() => undefined)
        .finally(() => {
          if (!this.stopped) this.timer = setTimeout(tick, interval).unref();
        });
    };
    this.timer = setTimeout(tick, interval).unref();
  }

  private async refresh(): Promise<void> {
    const { env, startTs, primary } = this.ctx;
    let wrote = false;
    const { stored } = await updateRow(env, primary.table, primary.row, undefined, (state) => {
      const lock = state?.cells.get(primary.column)?.lock;
      wrote = false;
      if (!state || lock?.startTs !== startTs) return { done: undefined };
      lock.wallTimeMs = env.clock();
      wrote = true;
      return { write: state, result: undefined };
    });
    // Only a row this beat wrote is news for the commit point. A row it merely read may
    // predate the primary's prewrite (a beat that read before the lock landed and whose
    // reply came after the prewrite's): kept, it would show the commit point no lock of
    // ours, which it takes as a rollback by another client.
    if (wrote && stored !== undefined) this.ctx.knownRows.set(rowId(primary.table, primary.row), stored);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.beat;
  }
}
