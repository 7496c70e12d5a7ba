# sluice: make test runs every test; make bench the benchmarks.
GO ?= go
# VERSION names the build: the git tag or commit, "-dirty" when modified.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
STATICCHECK ?= $(shell command -v staticcheck 2>/dev/null || echo $(HOME)/go/bin/staticcheck)

.PHONY: all build test lint fmt vet staticcheck lint-deploy bench bench-compare bench-gwtail run tools deps deps-compose test-compose fuzz flood flood-rlqs soak-pool soak-regions static image image-test

all: build

# build writes bin/sluice. The first build (or go run) downloads the
# modules into the module cache, which takes a minute on a slow link; later
# builds are offline. -buildvcs=auto records the git revision even where
# GOFLAGS turns it off; `bin/sluice --version` prints it.
build:
	$(GO) build -buildvcs=auto -ldflags "-X main.version=$(VERSION)" -o bin/sluice ./cmd/sluice
	@echo "built bin/sluice: $$(./bin/sluice --version)"

# tools installs staticcheck; the module proxy sometimes drops a stream, so
# the install is tried up to three times.
tools:
	@test -x "$(STATICCHECK)" || for i in 1 2 3; do \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2 && break; \
		[ $$i = 3 ] && exit 1; echo "retrying staticcheck install"; sleep 5; done

# RACE builds the library's packages for vet and staticcheck as go test
# -race builds them (GOFLAGS reaches staticcheck's go list), so that make
# test compiles them once, not twice: vet and staticcheck need the export
# data of every dependency, which is most of a cold build.
RACE_GOFLAGS = $(strip $(shell $(GO) env GOFLAGS) -race)

vet:
	GOFLAGS="$(RACE_GOFLAGS)" $(GO) vet ./...
	cd bench && $(GO) vet ./...

staticcheck: tools
	GOFLAGS="$(RACE_GOFLAGS)" $(STATICCHECK) ./...
	cd bench && $(STATICCHECK) ./...

# deploy/test is not vetted nor staticchecked by make test: both would
# analyse Kubernetes and Helm, some 5 CPU-minutes from a cold cache, for
# test code only; its go test runs go vet's default checks on it.
# lint-deploy runs both in full.
lint-deploy: tools
	cd deploy/test && $(GO) vet ./... && $(STATICCHECK) ./...

lint: fmt vet staticcheck

fmt:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

# deps installs what the tests need: redis-server and redis-cli. No
# container tool: make test neither needs nor installs one.
deps:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server redis-tools; }

# deps-compose installs Debian's docker-compose (1.29) and podman-compose
# (1.0.3, which pulls in podman), which deploy/test's TestComposeTools runs
# over the Compose quickstart; test-compose runs it. Best effort: without
# them TestComposeTools skips and says so (as it does in make test).
deps-compose:
	@command -v docker-compose >/dev/null && command -v podman-compose >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq docker-compose podman-compose >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq docker-compose podman-compose >/dev/null; } || \
		echo "make deps-compose: docker-compose/podman-compose not installed; TestComposeTools will skip"; }

test-compose: deps-compose
	cd deploy/test && $(GO) test -count=1 -run '^TestComposeTools$$' -v ./...

# Three test binaries at once: most of them wait on real Redis servers,
# timers and sockets, and two left a 2-core machine a third idle.
# SLOW_PKGS are named first: go test builds and runs packages in the order
# given (./... then adds the rest once each), so the longest test binaries
# (region's three-region worlds, 150 s under -race) start first instead of
# last, where region, alphabetically late, left the run waiting on it alone.
SLOW_PKGS = ./region/ ./internal/server/ ./internal/gateway/ ./guard/ ./internal/envoyrls/ ./redisstore/ ./internal/batch/ ./internal/rlqs/ ./lease/
# make test checks what make lint does, but overlaps it with the tests:
# go test -vet=all runs go vet's full set of checks on every package it
# tests (beside the other packages' test runs, which mostly wait on Redis
# and timers), go vet itself only the packages with no test files, and
# staticcheck runs in the background while the tests do, its verdict read
# at the end. From a cold cache the separate vet and staticcheck passes
# took some three of bash .ci/run's ten minutes on 2 cores.
NOTEST_PKGS = $(shell $(GO) list -f '{{if not (or .TestGoFiles .XTestGoFiles)}}{{.ImportPath}}{{end}}' ./...)
test: deps tools fmt
	GOFLAGS="$(RACE_GOFLAGS)" $(GO) vet $(NOTEST_PKGS)
	cd bench && $(GO) vet ./... && $(STATICCHECK) ./...
	@sc=$$(mktemp); GOFLAGS="$(RACE_GOFLAGS)" $(STATICCHECK) ./... >$$sc 2>&1 & pid=$$!; \
	$(GO) test -race -vet=all -count=1 -p 3 -timeout 9m $(SLOW_PKGS) ./...; rc=$$?; \
	wait $$pid; src=$$?; cat $$sc; rm -f $$sc; \
	if [ $$src != 0 ]; then echo "staticcheck found problems (above)"; fi; \
	[ $$rc = 0 ] && [ $$src = 0 ]
	# deploy/: compose, Kubernetes manifests, Helm chart and the release
	# config, decoded strictly (its own module: k8s.io and Helm stay out
	# of the library's imports).
	cd deploy/test && $(GO) test -count=1 -timeout 5m ./...

# bench-compare BASE=<commit> builds the hot paths' benchmarks (core,
# Redis store, lease, Envoy) at HEAD and at BASE and runs them interleaved
# in one sitting, printing benchstat's old/new ratios: the figure a change
# to a hot path states in its commit (bench/compare.sh; COUNT, BENCHTIME).
bench-compare:
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<commit>"; exit 2; }
	bash bench/compare.sh $(BASE)

# bench runs every benchmark and report; each prints its figures beside a
# baseline measured in the same run. It takes about five minutes and wants a
# quiet machine. docs/BENCHMARKS.md records the latest figures. ERL_BIN, the
# path of an envoyproxy/ratelimit binary built from its source (never part
# of this repository), adds it to bench-envoy-cold.sh; unset, it is skipped.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./algo ./clock ./memstore
	cd bench && $(GO) run ./cmd/corebench -rounds 5
	bash bench/redis.sh
	bash internal/loadtest/bench-service.sh 10s
	bash internal/loadtest/bench-envoy.sh 10s
	bash internal/loadtest/bench-envoy-lease.sh 10s
	bash internal/loadtest/bench-envoy-cold.sh 10s 3
	$(GO) test -run '^$$' -bench GroupCommit -benchtime 200000x -count 3 ./redisstore/
	$(GO) test -run '^$$' -bench 'AddedLatency|ServeHTTP' -benchtime=10000x ./internal/gateway/
	$(GO) test -run '^$$' -bench TailRatio -benchtime=8000x ./internal/gateway/
	$(MAKE) bench-gwtail
	$(GO) test -run '^$$' -bench OverheadRatio -benchtime 5x ./internal/batch/
	$(GO) test -run '^$$' -bench Memory100k -benchtime 1x ./internal/batch/
	$(GO) test -run '^$$' -bench PauseOverAdmission -benchtime 3x ./guard/
	$(GO) test -run '^$$' -bench PoolRouting -benchtime 2000x -count 3 ./internal/gateway/
	$(GO) test -run '^$$' -bench PoolLease -benchtime 20000x -count 2 ./internal/upstream/

# bench-gwtail is the gateway tail check as separate processes: a
# redis-server, a fake upstream, a bare httputil.ReverseProxy and one
# `sluice gateway` per store, at 64 connections and at 1 (bench/cmd/gwtail).
bench-gwtail:
	$(GO) build -o bench/.gwtail-sluice ./cmd/sluice
	cd bench && $(GO) run ./cmd/gwtail -sluice ./.gwtail-sluice -runs 3
	cd bench && $(GO) run ./cmd/gwtail -sluice ./.gwtail-sluice -runs 3 -conns 1 -n 3000
	rm -f bench/.gwtail-sluice

# flood sends 10,000,000 distinct keys through a memory store at its default
# bounds and prints the RSS and heap against store.max_bytes every million
# keys (docs/redis.md, Memory store). Minutes; not part of make test.
# SLUICE_FLOOD_MAX_BYTES sets another bound.
flood:
	SLUICE_FLOOD_KEYS=10000000 $(GO) test -count=1 -v -timeout 60m -run '^TestFloodRSS$$' ./memstore/

# flood-rlqs is #36's abuse from 4 and 16 client addresses at the caps
# against the RLQS door, peak RSS asserted within the shipped pod's 256
# MiB; without the race detector (whose shadow memory alone is 461 MiB),
# so make test, which runs -race, skips it.
flood-rlqs:
	$(GO) test -count=1 -v -timeout 5m -run '^TestAbuseMemory$$' ./internal/rlqs/

# soak-pool is #29's run at a real minute: three fake upstreams enforcing
# their own RPM (a bucket as OpenAI, a sliding and a fixed window), three
# gateway replicas on one Redis at the default routing margin, 1.3x the
# pooled capacity for 60 s; it prints what each upstream took and fails on
# any provider 429, any minute over a limit or under 95% of the capacity.
soak-pool:
	SLUICE_SOAK=1 $(GO) test -race -count=1 -v -timeout 10m -run '^TestPoolFleetSoak$$' ./internal/gateway/

# soak-regions is #40's runs at their real lengths: three regions, each its
# own redis-server and two instances, linked by 40/80/150 ms delay proxies;
# each traffic split for a minute and one region partitioned for 60 s, in
# the exact and the async mode. It fails on any admission past the bound
# or use under the floors.
soak-regions:
	SLUICE_REGIONS_SOAK=1 $(GO) test -race -count=1 -v -timeout 40m -run '^(TestGlobalBound|TestGlobalPartition|TestAsyncBound|TestAsyncPartition)$$' ./region/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseLimit -fuzztime 30s .
	$(GO) test -run '^$$' -fuzz FuzzLimitInvariant -fuzztime 30s ./algo
	$(GO) test -run '^$$' -fuzz '^FuzzChargeNeverFrees$$' -fuzztime 30s ./algo
	$(GO) test -run '^$$' -fuzz FuzzMatchesAlgo -fuzztime 30s ./memstore
	$(GO) test -run '^$$' -fuzz '^FuzzAuthz$$' -fuzztime 30s ./internal/server
	$(GO) test -run '^$$' -fuzz '^FuzzResolve$$' -fuzztime 30s ./internal/server
	$(GO) test -run '^$$' -fuzz '^FuzzReservation$$' -fuzztime 30s ./internal/gateway
	$(GO) test -run '^$$' -fuzz '^FuzzParseBody$$' -fuzztime 30s ./internal/gateway
	$(GO) test -run '^$$' -fuzz '^FuzzEnvoyDescriptors$$' -fuzztime 30s ./internal/envoyrls
	$(GO) test -run '^$$' -fuzz '^FuzzHeaders$$' -fuzztime 30s ./httplimit
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeaders$$' -fuzztime 30s ./aiclient

# SLUICE_IMAGE names the container image, the one name everything uses:
# make image builds it, deploy/kubernetes and the Helm chart (repository +
# appVersion) run it, the Compose quickstart reads the same variable. Push
# elsewhere with SLUICE_IMAGE=registry.example/sluice:v1 make image, then
# `kustomize edit set image localhost/sluice=registry.example/sluice:v1`,
# `helm --set image.repository=registry.example/sluice,image.tag=v1`, or
# SLUICE_IMAGE=... docker compose. The image's version label is $(VERSION).
SLUICE_IMAGE ?= localhost/sluice:dev
IMAGE ?= $(SLUICE_IMAGE)

# static builds bin/sluice-static, the binary the container image runs.
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/sluice-static ./cmd/sluice

# image builds $(IMAGE) FROM scratch with buildah (apt-get install buildah):
# no registry pull. The Dockerfile builds the same image where a registry
# is reachable. image-test runs `sluice version` and `sluice config check`
# inside it (buildah run, chroot isolation; needs root or a user namespace,
# so it is not part of `make test`).
image: static
	bash deploy/image/build.sh bin/sluice-static $(IMAGE) $(VERSION)

image-test: image
	bash deploy/image/test.sh $(IMAGE) $(VERSION)

run: build
	./bin/sluice serve --config examples/sluice.yaml
