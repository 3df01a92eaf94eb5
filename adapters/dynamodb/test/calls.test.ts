import { describe, expect, it } from 'vitest';
import { classify } from '../src/calls.js';

/**
 * What a network error proves about a write. Pure logic on error objects shaped like the
 * ones the SDK rejects with (Node's error as the HTTP handler got it, plus the `$metadata`
 * the SDK adds): a route lost in the middle of a request (EHOSTUNREACH, ENETUNREACH on a
 * connection that was open) cannot be produced on loopback, so no real server is used
 * here. The refused connection and the lost replies are tested for real in
 * failures.test.ts. A write classified 'lost' is StoreError 'unknown' (Caller.write).
 */
function nodeError(code: string, syscall: string, message = `${syscall} ${code}`) {
  return Object.assign(new Error(message), { code, syscall, $metadata: { attempts: 1, totalRetryDelay: 0 } });
}

describe('dynamodb classify: sent or not', () => {
  it('an unreachable host or network on a connection that was open may follow a sent request: lost', () => {
    expect(classify(nodeError('EHOSTUNREACH', 'read'))).toBe('lost');
    expect(classify(nodeError('EHOSTUNREACH', 'write'))).toBe('lost');
    expect(classify(nodeError('ENETUNREACH', 'read'))).toBe('lost');
    // A port unreachable kept as a soft error on an open connection.
    expect(classify(nodeError('ECONNREFUSED', 'read'))).toBe('lost');
    // No syscall: nothing says when it happened.
    expect(classify(Object.assign(new Error('EHOSTUNREACH'), { code: 'EHOSTUNREACH' }))).toBe('lost');
  });

  it('the same codes while connecting, and a failed DNS lookup, were never sent', () => {
    expect(classify(nodeError('EHOSTUNREACH', 'connect', 'connect EHOSTUNREACH 10.0.0.1:8000'))).toBe(
      'not-sent',
    );
    expect(classify(nodeError('ENETUNREACH', 'connect'))).toBe('not-sent');
    expect(classify(nodeError('ECONNREFUSED', 'connect', 'connect ECONNREFUSED 127.0.0.1:1'))).toBe(
      'not-sent',
    );
    expect(classify(nodeError('ENOTFOUND', 'getaddrinfo', 'getaddrinfo ENOTFOUND dynamodb.invalid'))).toBe(
      'not-sent',
    );
    expect(classify(nodeError('EAI_AGAIN', 'getaddrinfo'))).toBe('not-sent');
  });

  it("autoSelectFamily's AggregateError: not sent only if every address failed to connect", () => {
    // As Node builds it: the first inner error's code, no syscall of its own.
    const aggregate = (...inner: Error[]) =>
      Object.assign(new AggregateError(inner), { code: (inner[0] as { code?: string }).code, $metadata: {} });
    expect(
      classify(aggregate(nodeError('ECONNREFUSED', 'connect'), nodeError('EHOSTUNREACH', 'connect'))),
    ).toBe('not-sent');
    expect(classify(aggregate(nodeError('ECONNREFUSED', 'connect'), nodeError('EHOSTUNREACH', 'read')))).toBe(
      'lost',
    );
  });

  it('an abort (the SDK AbortError, the store deadline) is lost', () => {
    expect(classify(Object.assign(new Error('Request aborted'), { name: 'AbortError' }))).toBe('lost');
    expect(
      classify(
        Object.assign(new Error('no reply within 800 ms (requestTimeoutMs), the call was aborted'), {
          name: 'TimeoutError',
        }),
      ),
    ).toBe('lost');
  });
});
