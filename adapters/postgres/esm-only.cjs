'use strict';
// Every package carries this same file by necessity: an `exports` target must lie inside its
// own package, so one shared copy cannot serve them all.
// This package is an ES module only. Its `exports` map sends require() here so that
// CommonJS callers get this explanation instead of ERR_PACKAGE_PATH_NOT_EXPORTED.
const { name } = require('./package.json');

const error = new Error(
  `${name} is an ES module only package and cannot be loaded with require(). ` +
    `Use \`import ... from '${name}'\` in an ES module (a .mjs file, or "type": "module" in your ` +
    `package.json), or \`const mod = await import('${name}')\` from CommonJS.`,
);
error.code = 'ERR_REQUIRE_ESM';
throw error;
