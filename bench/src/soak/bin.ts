#!/usr/bin/env node
/** The installed `percolator-soak` command. */
import { runSoakProcess } from './cli.js';

await runSoakProcess();
