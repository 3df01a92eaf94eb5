import { context } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { afterAll, beforeAll } from 'vitest';

/**
 * Registers an AsyncLocalStorage context manager for the calling test file, so a span made
 * active (`startActiveSpan`) is the parent of the transactions begun inside it.
 */
export function useAsyncContext(): void {
  const contextManager = new AsyncLocalStorageContextManager();
  beforeAll(() => {
    context.setGlobalContextManager(contextManager.enable());
  });
  afterAll(() => {
    contextManager.disable();
    context.disable();
  });
}
