import { InvalidArgumentError } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { DEFAULT_CLUSTER_NODES, parseNodes } from '../src/index.js';

describe('parseNodes', () => {
  it('reads host:port lists, names, IPv4 and bracketed IPv6', () => {
    expect(parseNodes(DEFAULT_CLUSTER_NODES)).toEqual([
      { host: '127.0.0.1', port: 7001 },
      { host: '127.0.0.1', port: 7002 },
      { host: '127.0.0.1', port: 7003 },
    ]);
    expect(parseNodes(' redis-a.example:6379 , [::1]:7001,[2001:db8::5]:65535,node_2:1')).toEqual([
      { host: 'redis-a.example', port: 6379 },
      { host: '::1', port: 7001 },
      { host: '2001:db8::5', port: 65535 },
      { host: 'node_2', port: 1 },
    ]);
  });

  it.each([
    'localhost',
    '',
    ' , ',
    '127.0.0.1:',
    ':7001',
    '127.0.0.1:0',
    '127.0.0.1:65536',
    '127.0.0.1:70a',
    '127.0.0.1:7001,',
    '::1:7001',
    '[::1]',
    '[localhost]:7001',
    'redis://127.0.0.1:7001',
    'a b:7001',
  ])('rejects %j with an error naming PERCOLATOR_REDIS_CLUSTER_NODES', (list) => {
    expect(() => parseNodes(list)).toThrow(InvalidArgumentError);
    expect(() => parseNodes(list)).toThrow(/PERCOLATOR_REDIS_CLUSTER_NODES/);
  });
});
