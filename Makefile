# sluice: make test runs every test; make bench the benchmarks.
GO ?= go
STATICCHECK ?= $(shell command -v staticcheck 2>/dev/null || echo $(HOME)/go/bin/staticcheck)

.PHONY: all build test lint vet staticcheck bench run tools

all: build

build:
	$(GO) build -o bin/sluice ./cmd/sluice

tools:
	@test -x "$(STATICCHECK)" || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	$(GO) vet ./...

staticcheck: tools
	$(STATICCHECK) ./...

lint: vet staticcheck
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

test: lint
	$(GO) test -race -count=1 -timeout 9m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	cd bench && $(GO) test -run '^$$' -bench . -benchmem ./...

run: build
	./bin/sluice serve --config examples/sluice.yaml
