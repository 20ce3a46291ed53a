# sandgate: `make build` installs nothing outside ./bin; `make test` runs every suite.
GO      ?= go
BIN     := bin/sandgate
PYTHON  ?= python3
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build test test-go test-python check vet fmt-check bench bench-check clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/sandgate

# The Go suites build and use the real binary (SANDGATE_BIN) for the OpenSSH tests.
test: build test-go test-python

test-go: build
	SANDGATE_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 20m ./...

# Installs the SDK's test dependencies (pinned) when they are missing.
test-python: build
	@$(PYTHON) -c "import requests, paramiko, pytest" 2>/dev/null || \
		$(PYTHON) -m pip install -q --disable-pip-version-check -r sdk-python/requirements-test.txt
	SANDGATE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q sdk-python/tests

# The product module only; bench/ is its own module (make bench-check vets it).
vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

check: vet fmt-check test-go

bench: build
	bench/run

# CI checks the benchmark module (vet, unit tests), that the harness builds
# and that its dry run starts both servers.
bench-check: build
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
	bench/run --quick --dry-run

clean:
	rm -rf bin bench/.bin
