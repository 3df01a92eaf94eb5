#!/usr/bin/env node
/** The installed `percolator-bench` command: runs the CLI, whatever path or link it is started through. */
import { runAsProcess } from './cli.js';

await runAsProcess();
