#!/usr/bin/env node
// The `percolator` bin: always runs the CLI, however it was linked or invoked.
import { main } from './cli.js';

await main();
