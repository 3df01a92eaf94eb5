export * from './plain.js';
export { conformanceSuite } from './vitest.js';
