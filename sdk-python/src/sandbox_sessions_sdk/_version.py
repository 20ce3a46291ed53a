"""The package version (read by setuptools at build time).

The Python and TypeScript SDKs are one product, sandgate-sdk, released
together under one version: this one, sdk-typescript/package.json's
"version" and SDK_VERSION in sdk-typescript/src/common.ts. `make sdk-version
V=X.Y.Z` sets all three; `make sdk-dist` (CI) fails when they differ."""

__version__ = "0.1.0"
