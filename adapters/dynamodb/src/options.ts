// One unknown-option check for every package: it lives in core.
export { checkOptionKeys, type OptionKeys } from '@percolator/core';
