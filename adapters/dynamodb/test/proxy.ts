import { connect, createServer, type Socket } from 'node:net';

/**
 * A TCP proxy in front of the real DynamoDB endpoint, for failure tests. Requests always
 * reach the real service (except in `throttle-once`), so a write "lost" here really
 * was applied:
 * - `pass`: forward both ways;
 * - `drop-replies`: forward the request, swallow the reply (the client times out);
 * - `reset-on-reply`: forward the request, reset the client connection when the reply comes;
 * - `reply-500`: forward the request, replace the reply by an HTTP 500 InternalServerError;
 * - `reply-500-once`: the same for one request, then back to `pass`;
 * - `truncate-reply`: forward the request, pass on the reply's status line, headers and
 *   one byte of its body, then reset the connection (a 2xx the SDK cannot parse);
 * - `throttle-once`: answer the next request with a 400 ThrottlingException without
 *   forwarding it, then go back to `pass`;
 * - `slow-replies`: forward the request, pass on a reply's status line and headers at once
 *   and its body in 10 pieces 150 ms apart (a reply still arriving, 1.5 s in all, with the
 *   socket never quiet for long);
 * - `stall-after-headers`: forward the request, pass on a reply's status line and headers,
 *   swallow its body (the connection stays open and quiet).
 * Independently of the mode, a request containing `throttleMarker` is never forwarded
 * and is answered with a 400 ThrottlingException.
 */
export type ProxyMode =
  | 'pass'
  | 'drop-replies'
  | 'reset-on-reply'
  | 'reply-500'
  | 'reply-500-once'
  | 'truncate-reply'
  | 'throttle-once'
  | 'slow-replies'
  | 'stall-after-headers';

export interface TestProxy {
  readonly endpoint: string;
  mode: ProxyMode;
  /** Requests whose bytes contain this text are throttled (never forwarded). */
  throttleMarker: string | undefined;
  /** Requests forwarded to the service (counted by their first line). */
  readonly forwarded: number;
  close(): Promise<void>;
}

function jsonReply(status: string, type: string, message: string): string {
  const body = JSON.stringify({ __type: `com.amazonaws.dynamodb.v20120810#${type}`, message });
  return (
    `HTTP/1.1 ${status}\r\nContent-Type: application/x-amz-json-1.0\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`
  );
}

export async function startProxy(target: { host: string; port: number }): Promise<TestProxy> {
  const sockets = new Set<Socket>();
  const state = { mode: 'pass' as ProxyMode, forwarded: 0, throttleMarker: undefined as string | undefined };
  const server = createServer((client) => {
    const upstream = connect(target.port, target.host);
    sockets.add(client);
    sockets.add(upstream);
    const closeBoth = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', closeBoth);
    upstream.on('error', closeBoth);
    client.on('close', () => {
      sockets.delete(client);
      upstream.destroy();
    });
    upstream.on('close', () => {
      sockets.delete(upstream);
      client.end();
    });
    // Reply bytes held back in `truncate-reply` until the end of the headers is seen.
    let held: Buffer | undefined = Buffer.alloc(0);
    client.on('data', (chunk) => {
      const marked = state.throttleMarker !== undefined && chunk.includes(state.throttleMarker);
      if (state.mode === 'throttle-once' || marked) {
        if (!marked) state.mode = 'pass';
        client.end(jsonReply('400 Bad Request', 'ThrottlingException', 'injected by the test proxy'));
        upstream.destroy();
        return;
      }
      if (chunk.subarray(0, 5).toString('latin1') === 'POST ') state.forwarded++;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      switch (state.mode) {
        case 'drop-replies':
          return;
        case 'reset-on-reply':
          client.resetAndDestroy();
          upstream.destroy();
          return;
        case 'truncate-reply': {
          if (held === undefined) return; // already cut off
          held = Buffer.concat([held, chunk]);
          const end = held.indexOf('\r\n\r\n');
          if (end < 0) return;
          const head = held.subarray(0, end + 5);
          held = undefined;
          client.write(head, () => {
            client.resetAndDestroy();
            upstream.destroy();
          });
          return;
        }
        case 'reply-500':
        case 'reply-500-once':
          if (state.mode === 'reply-500-once') state.mode = 'pass';
          client.end(
            jsonReply('500 Internal Server Error', 'InternalServerError', 'injected by the test proxy'),
          );
          upstream.destroy();
          return;
        case 'stall-after-headers': {
          const headEnd = chunk.indexOf('\r\n\r\n');
          if (headEnd >= 0) client.write(chunk.subarray(0, headEnd + 4));
          return;
        }
        case 'slow-replies': {
          const headEnd = chunk.indexOf('\r\n\r\n');
          const body = headEnd < 0 ? chunk : chunk.subarray(headEnd + 4);
          if (headEnd >= 0) client.write(chunk.subarray(0, headEnd + 4));
          if (body.length === 0) return;
          upstream.pause();
          const step = Math.max(1, Math.ceil(body.length / 10));
          let at = 0;
          const drip = () => {
            if (client.destroyed) return;
            client.write(body.subarray(at, at + step));
            at += step;
            if (at < body.length) setTimeout(drip, 150);
            else upstream.resume();
          };
          setTimeout(drip, 150);
          return;
        }
        default:
          client.write(chunk);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address !== 'object') throw new Error('proxy did not bind');
  return {
    endpoint: `http://127.0.0.1:${address.port}`,
    get mode() {
      return state.mode;
    },
    set mode(mode: ProxyMode) {
      state.mode = mode;
    },
    get throttleMarker() {
      return state.throttleMarker;
    },
    set throttleMarker(marker: string | undefined) {
      state.throttleMarker = marker;
    },
    get forwarded() {
      return state.forwarded;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
