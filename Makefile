# sandgate: `make build` installs nothing outside ./bin; `make test` runs every suite.
GO      ?= go
BIN     ?= bin/sandgate
# make install puts sandgate in $(DESTDIR)$(PREFIX)/bin.
PREFIX  ?= /usr/local
# The Python that creates the virtualenvs the SDK tests run in (.venv/, .venv-oldest/).
PYTHON  ?= python3
# npm for the TypeScript SDK (sdk-typescript/; Node.js >= 20).
NPM     ?= npm
TS_SDK  := sdk-typescript
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: console console-check chart-check dist build install test test-tour example-offline sdk-dist sdk-version test-go test-python test-python-oldest test-schema test-ts test-examples test-e2b ts-deps venv check vet fmt-check cross-check bench bench-check clean xcrypto-check

# Static (no cgo): the binary also runs as sftp-server inside image
# sandboxes, whose root has no host C library.
# The sandbox's init is a small binary of its own (cmd/sandgate-init), built
# first and embedded in sandgate through go build -overlay (initexe_build:
# it never lands in the source tree, so no later build embeds a stale one;
# sandbox/linuxns/initexe). Without it (go install) sandgate runs itself as
# the init, slower to start and heavier per sandbox.
INITEXE_BLOB := sandbox/linuxns/initexe/blob/sandgate-init
# $(call initexe_build,GOENV,GOFLAGS,OUT): the init for GOENV, then sandgate
# embedding it, both built with GOFLAGS.
define initexe_build
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(1) CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o "$$tmp/sandgate-init" ./cmd/sandgate-init; \
	printf '{"Replace":{"%s":"%s"}}' "$(CURDIR)/$(INITEXE_BLOB)" "$$tmp/sandgate-init" > "$$tmp/overlay.json"; \
	$(1) CGO_ENABLED=0 $(GO) build -overlay "$$tmp/overlay.json" $(2) -o $(3) ./cmd/sandgate
endef

build:
	$(call initexe_build,,-ldflags "-X main.version=$(VERSION)",$(BIN))

# The web console (package console, served at /ui/): its third-party files
# (xterm.js and its fit addon) come from npm through the committed
# console/web/package-lock.json, and are copied into console/dist, which
# git keeps and the binary embeds beside the console's own files
# (console/web/src): a plain copy, no bundler. make console-check (CI) fails when the
# committed console/dist is not what make console makes.
CONSOLE_WEB  := console/web
CONSOLE_DIST := console/dist
console: $(CONSOLE_WEB)/node_modules/.installed
	rm -rf $(CONSOLE_DIST) && mkdir -p $(CONSOLE_DIST)
	cp $(CONSOLE_WEB)/node_modules/@xterm/xterm/lib/xterm.js $(CONSOLE_WEB)/node_modules/@xterm/xterm/css/xterm.css \
		$(CONSOLE_WEB)/node_modules/@xterm/addon-fit/lib/addon-fit.js $(CONSOLE_DIST)/
	{ echo "@xterm/xterm (xterm.js, xterm.css):"; echo; cat $(CONSOLE_WEB)/node_modules/@xterm/xterm/LICENSE; echo; \
	  echo "@xterm/addon-fit (addon-fit.js):"; echo; cat $(CONSOLE_WEB)/node_modules/@xterm/addon-fit/LICENSE; } > $(CONSOLE_DIST)/THIRD-PARTY-LICENSES.txt

$(CONSOLE_WEB)/node_modules/.installed: $(CONSOLE_WEB)/package-lock.json $(CONSOLE_WEB)/package.json
	cd $(CONSOLE_WEB) && $(NPM) ci --ignore-scripts --no-audit --no-fund
	@touch $@

console-check: console
	@git diff --exit-code --stat -- $(CONSOLE_DIST) && [ -z "$$(git status --porcelain -- $(CONSOLE_DIST))" ] || { \
		echo "console/dist differs from what make console makes: run make console and commit console/dist" >&2; exit 1; }

# make dist: static release binaries for each of DIST_PLATFORMS in DIST_DIR,
# sandgate-VERSION-OS-ARCH, each with a CycloneDX SBOM (.cdx.json, from the
# module information in the binary) and a container image of it
# (.image.tar, built without a Docker daemon, for docker/podman load), a
# SHA256SUMS file over them all, and the systemd unit (dist/sandgate.service;
# docs/operator-guide.md).
DIST_DIR       ?= bin/dist
DIST_PLATFORMS ?= linux/amd64 linux/arm64
dist:
	rm -rf $(DIST_DIR) && mkdir -p $(DIST_DIR)
	set -e; for p in $(DIST_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(DIST_DIR)/sandgate-$(VERSION)-$$os-$$arch; \
		echo "build $$out"; \
		( $(call initexe_build,GOOS=$$os GOARCH=$$arch,-trimpath -ldflags "-s -w -X main.version=$(VERSION)",$$out) ); \
		$(GO) run ./internal/sbom -version $(VERSION) $$out > $$out.cdx.json; \
		$(GO) run ./internal/ociimage -arch $$arch -version $(VERSION) -o $$out.image.tar $$out; \
	done
	cp dist/sandgate.service $(DIST_DIR)/
	cd $(DIST_DIR) && sha256sum sandgate-* sandgate.service > SHA256SUMS
	@echo "verify with: (cd $(DIST_DIR) && sha256sum -c SHA256SUMS)"

# BIN set (as the tests do) installs that binary instead of building one.
install: $(if $(filter command line,$(origin BIN)),,build)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/sandgate

# The Go suites build and use the real binary (SANDGATE_BIN) for the OpenSSH tests.
test: build test-go test-python test-schema test-ts test-examples test-e2b

test-go: build
	SANDGATE_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 45m ./...

# The README's 60-second tour, run as a fresh user: its shell block (then
# both SDK READMEs' install lines and examples; pip and npm need their registries),
# verbatim but for the few lines listed in cmd/sandgate/tour_test.go, as a
# new account (useradd, when root; else a fresh HOME) with no ~/.ssh,
# against a gateway it starts; any failing line fails it. CI runs it.
test-tour: build
	SANDGATE_TOUR=1 SANDGATE_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^TestReadmeTour$$' -v ./cmd/sandgate/

# The patched golang.org/x/crypto (third_party/README.md): is it on the newest
# upstream release, is it upstream plus the patch, and do upstream's own ssh
# tests pass on it. Needs the module proxy (or cache); CI runs it.
xcrypto-check:
	third_party/check-upstream
	$(GO) test -count=1 ./third_party/
	third_party/test-upstream -count=1

# The SDK tests run in a virtualenv (a stock Debian python3 refuses pip
# installs, PEP 668): .venv/ holds the pinned test dependencies with the newest
# Paramiko the SDK allows, .venv-oldest/ the same with the oldest. Each is
# (re)filled when its requirements file changes.
venv: .venv/.installed

define fill-venv
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
		echo "$(PYTHON) cannot create a virtualenv: install Debian's python3-venv (apt-get install python3-venv)" >&2; exit 1; }
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install -q --disable-pip-version-check -r $<
	@touch $@
endef

.venv/.installed: sdk-python/requirements-test.txt
	$(fill-venv)

.venv-oldest/.installed: sdk-python/requirements-oldest.txt
	$(fill-venv)

.venv-schema/.installed: api-spec/requirements-schemathesis.txt
	$(fill-venv)

.venv-build/.installed: sdk-python/requirements-build.txt
	$(fill-venv)

# The SDKs as they would be published, one product (sandgate-sdk on PyPI,
# @sandgate/sdk on npm) under one version: python -m build (sdist and wheel)
# and npm pack, into SDK_DIST; fails when the three version strings differ
# (make sdk-version V=X.Y.Z sets them) or an artifact lacks what it must
# carry. CI runs it.
SDK_DIST ?= bin/sdk-dist
SDK_VERSION_FILES := sdk-python/src/sandbox_sessions_sdk/_version.py sdk-typescript/package.json sdk-typescript/src/common.ts
sdk-dist: .venv-build/.installed $(TS_SDK)/node_modules/.installed
	@py=$$(sed -n 's/^__version__ = "\(.*\)"$$/\1/p' sdk-python/src/sandbox_sessions_sdk/_version.py); \
	ts=$$(node -p 'require("./$(TS_SDK)/package.json").version'); \
	tsc=$$(sed -n 's/^export const SDK_VERSION = "\(.*\)";$$/\1/p' $(TS_SDK)/src/common.ts); \
	if [ -z "$$py" ] || [ "$$py" != "$$ts" ] || [ "$$py" != "$$tsc" ]; then \
		echo "SDK versions differ: Python $$py, package.json $$ts, common.ts $$tsc (make sdk-version V=X.Y.Z)" >&2; exit 1; fi; \
	echo "sandgate-sdk $$py"
	rm -rf $(SDK_DIST) sdk-python/build && mkdir -p $(SDK_DIST)
	.venv-build/bin/python -m build --outdir $(SDK_DIST) sdk-python
	rm -rf sdk-python/build sdk-python/src/*.egg-info
	cd $(TS_SDK) && $(NPM) run build && $(NPM) pack --pack-destination $(CURDIR)/$(SDK_DIST)
	@v=$$(node -p 'require("./$(TS_SDK)/package.json").version'); cd $(SDK_DIST) && \
	$(CURDIR)/.venv-build/bin/python -m zipfile -l sandgate_sdk-$$v-py3-none-any.whl | grep -q 'sandbox_sessions_sdk/py.typed' && \
	tar tzf sandgate_sdk-$$v.tar.gz | grep -q 'sandgate_sdk-'$$v'/README.md' && \
	tar tzf sandgate-sdk-$$v.tgz | grep -q 'package/dist/index.d.ts' && \
	tar tzf sandgate-sdk-$$v.tgz | grep -q 'package/README.md' && \
	tar tzf sandgate-sdk-$$v.tgz | grep -q 'package/LICENSE' && \
	tar tzf sandgate_sdk-$$v.tar.gz | grep -q 'sandgate_sdk-'$$v'/LICENSE' && \
	$(CURDIR)/.venv-build/bin/python -m zipfile -l sandgate_sdk-$$v-py3-none-any.whl | grep -q 'licenses/LICENSE' && \
	ls -l || { echo "an SDK artifact lacks a file it must carry" >&2; exit 1; }

# make sdk-version V=X.Y.Z: the SDKs' one version, set in all three places.
sdk-version:
	@[ -n "$(V)" ] || { echo "usage: make sdk-version V=X.Y.Z" >&2; exit 2; }
	sed -i 's/^__version__ = ".*"$$/__version__ = "$(V)"/' sdk-python/src/sandbox_sessions_sdk/_version.py
	sed -i 's/^export const SDK_VERSION = ".*";$$/export const SDK_VERSION = "$(V)";/' $(TS_SDK)/src/common.ts
	cd $(TS_SDK) && $(NPM) version --no-git-tag-version --allow-same-version $(V) >/dev/null

# The agent examples' venv: the pinned Agents SDK and anthropic, and the SDK
# from this checkout (-e ./sdk-python: pip runs from the repository root).
examples/.venv/.installed: examples/requirements-test.txt sdk-python/pyproject.toml
	$(fill-venv)

test-python: build .venv/.installed
	@.venv/bin/python -c 'import paramiko, sys; print("SDK tests: Python", sys.version.split()[0], "Paramiko", paramiko.__version__)'
	SANDGATE_BIN=$(CURDIR)/$(BIN) .venv/bin/python -m pytest -q sdk-python/tests

test-python-oldest: build .venv-oldest/.installed
	@.venv-oldest/bin/python -c 'import paramiko, sys; print("SDK tests: Python", sys.version.split()[0], "Paramiko", paramiko.__version__)'
	SANDGATE_BIN=$(CURDIR)/$(BIN) .venv-oldest/bin/python -m pytest -q sdk-python/tests

# The TypeScript SDK: its dependencies come from the committed lockfile (npm
# ci, install scripts off: ssh2 runs without its optional native parts) into
# sdk-typescript/node_modules/, refilled when package.json or the lockfile
# changes; then it is built (tsc) and its tests run against the real binary.
ts-deps: $(TS_SDK)/node_modules/.installed

$(TS_SDK)/node_modules/.installed: $(TS_SDK)/package-lock.json $(TS_SDK)/package.json
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' 2>/dev/null || { \
		echo "the TypeScript SDK needs Node.js 20 or newer (found: $$(node --version 2>&1))" >&2; exit 1; }
	cd $(TS_SDK) && $(NPM) ci --ignore-scripts --no-audit --no-fund
	@touch $@

test-ts: build $(TS_SDK)/node_modules/.installed
	@echo "SDK tests: Node $$(node --version)"
	cd $(TS_SDK) && $(NPM) run build
	cd $(TS_SDK) && SANDGATE_BIN=$(CURDIR)/$(BIN) $(NPM) test

# The agent examples (examples/): their tools and loops, driven by scripted
# models (no API key, no network), against the real binary.
test-examples: build examples/.venv/.installed
	SANDGATE_BIN=$(CURDIR)/$(BIN) examples/.venv/bin/python -m pytest -q -p no:cacheprovider examples/tests

# The agent examples offline: each main.py runs as a program against a local
# fake of the model's API (no key, no network) on a gateway of its own, or on
# $SANDBOX_API_URL with $SANDBOX_API_TOKEN when both are set.
example-offline: build examples/.venv/.installed
	SANDGATE_BIN=$(CURDIR)/$(BIN) examples/.venv/bin/python examples/offline.py

# E2B's SDKs, unchanged, against the real binary (compat-tests/e2b,
# docs/compat.md): e2b, e2b-code-interpreter and the OpenAI Agents SDK's
# E2BSandboxClient, pinned in .venv-e2b/; then the JS e2b and
# @e2b/code-interpreter from compat-tests/e2b/js's committed lockfile, run
# by node's test runner.
E2B_JS := compat-tests/e2b/js

.venv-e2b/.installed: compat-tests/e2b/requirements-e2b.txt sdk-python/pyproject.toml
	$(fill-venv)

$(E2B_JS)/node_modules/.installed: $(E2B_JS)/package-lock.json $(E2B_JS)/package.json
	cd $(E2B_JS) && $(NPM) ci --ignore-scripts --no-audit --no-fund
	@touch $@

test-e2b: build .venv-e2b/.installed $(E2B_JS)/node_modules/.installed
	SANDGATE_BIN=$(CURDIR)/$(BIN) .venv-e2b/bin/python -m pytest -q -p no:cacheprovider compat-tests/e2b --ignore=compat-tests/e2b/js
	cd $(E2B_JS) && SANDGATE_BIN=$(CURDIR)/$(BIN) $(NPM) test

# schemathesis over the built binary and the OpenAPI spec: a short run with a
# fixed seed; any 5xx, spec mismatch or logged error fails it.
test-schema: build .venv-schema/.installed
	api-spec/run-schemathesis $(CURDIR)/$(BIN) $(CURDIR)/.venv-schema/bin/schemathesis

# kube-apiserver for the Kubernetes tests (internal/kubetest), built from the
# Go module proxy by its own module (internal/kubetest/apiserver) into
# $(HOME)/.cache/sandgate; skipped when the binary is there.
.PHONY: kube-apiserver
kube-apiserver:
	internal/kubetest/apiserver/build >/dev/null

# The product module only; bench/ is its own module (make bench-check vets it).
vet:
	$(GO) vet ./...

# The client commands (proxy, ssh-config, the session CLI) run on a
# developer's Mac too: the binary must build there, and for FreeBSD.
CROSS_PLATFORMS ?= darwin/arm64 darwin/amd64 freebsd/amd64
cross-check:
	set -e; for p in $(CROSS_PLATFORMS); do \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -o /dev/null ./cmd/sandgate; \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet ./tunnel/; \
	done

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' ':!third_party/golang.org' 2>/dev/null || find . -name '*.go' -not -path './third_party/golang.org/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

check: vet fmt-check cross-check test-go

bench: build
	bench/run

# CI checks the benchmark module (vet, unit tests), that the harness builds
# and that its dry run starts both servers.
bench-check: build
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
	bench/run --quick --dry-run

# The Helm chart (deploy/helm/sandgate): helm lint and renders through the
# Helm SDK, and its default render applied to a real kube-apiserver
# (internal/kubetest; make kube-apiserver), and a node agent run with the
# render's arguments as its service account. Its own module
# (deploy/helm/charttest), so Helm stays out of the product's.
chart-check: build
	cd deploy/helm/charttest && $(GO) vet ./... && SANDGATE_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 ./...

# make proto: regenerate the Go code of envd's protobuf files (the E2B
# facade, rest/compat/e2b/envd/proto) with protoc (apt: protobuf-compiler)
# and the two plugins at the versions go.mod names, installed in bin/.
ENVD_PROTO := rest/compat/e2b/envd/proto
.PHONY: proto
proto:
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go
	GOBIN=$(CURDIR)/bin $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go
	cd $(ENVD_PROTO) && PATH=$(CURDIR)/bin:$$PATH protoc -I . \
		--go_out=../gen --go_opt=paths=source_relative \
		--connect-go_out=../gen --connect-go_opt=paths=source_relative \
		process/process.proto filesystem/filesystem.proto

clean:
	rm -rf bin bench/.bin
