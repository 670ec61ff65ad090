# CI runs `make lint` and `make test` (see .ci/run); the other targets are
# for people.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The Go that Debian-based machines here have outside PATH too.
GO ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
GOFMT ?= $(dir $(GO))gofmt
export PATH := $(dir $(GO)):$(PATH)

# Where `go install` puts tools, which need not be in PATH.
GOTOOLBIN = $(or $(shell $(GO) env GOBIN),$(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin)
# 2026.2.x: the first staticcheck release line built for and checking Go 1.26+.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK = $(GOTOOLBIN)/staticcheck

SERVICES := scripts/services.sh
PKG ?= ./...
BENCH ?= .
TESTFLAGS ?=
FUZZTIME ?= 10s
FUZZ ?= .
ARGS ?=

.PHONY: help run demo services services-down services-status test test-faults test-clusters bench bench-peers lint staticcheck fuzz

help:
	@echo "make run              go run ./examples/closeorder (ARGS=...)"
	@echo "make demo             the closeorder demo runner (ARGS=...)"
	@echo "make services         start the test servers ($(SERVICES) up)"
	@echo "make services-down    stop the test servers that make services started"
	@echo "make services-status  which test servers answer"
	@echo "make test             services, then go test -race over PKG=$(PKG) (TESTFLAGS=...), and the benchmarks module's tests"
	@echo "make test-faults      services, then the fenced-counter workload under kill -9, SIGSTOP, partitions and restarts, every backend"
	@echo "make test-clusters    3-member etcd, 3-server ZooKeeper, a 3x2 Redis Cluster and 3 Consul servers (scripts/clusters.sh), faults while locks are held"
	@echo "make bench            services, then benchmarks BENCH=$(BENCH) over PKG=$(PKG)"
	@echo "make bench-peers      services, then warden beside its peers: writes benchmarks/BENCHMARKS.md and its chart (about 45 minutes)"
	@echo "make lint             gofmt, go vet, staticcheck $(STATICCHECK_VERSION), the benchmarks module too"
	@echo "make fuzz             each fuzz target for FUZZTIME=$(FUZZTIME) (FUZZ=regexp)"

run:
	$(GO) run ./examples/closeorder $(ARGS)

demo:
	$(GO) run ./examples/closeorder/demo $(ARGS)

services:
	$(SERVICES) up

services-down:
	$(SERVICES) down

services-status:
	$(SERVICES) status

# WARDEN_REQUIRE_SERVERS=1: a backend whose server is missing fails instead of
# skipping, so a green run means every backend was exercised.
test: services
	# -count=1: a result cached from an earlier run says nothing about the
	# servers this run talks to.
	eval "$$($(SERVICES) env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) $(PKG)
	# The many-locks tests measure whether renewals keep up on a loaded
	# machine, which the race detector's slowdown would decide instead: they
	# skip themselves under -race and run here without it.
	eval "$$($(SERVICES) env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -count=1 -timeout 30m -run 'HoldMany' $(TESTFLAGS) $(PKG)
ifeq ($(PKG),./...)
	# The benchmark's own module (bench-peers), whose tests include a quick
	# run of every group against the servers; without the race detector,
	# whose slowdown of the measuring processes would decide whether its
	# peers keep their locks.
	eval "$$($(SERVICES) env)" && cd benchmarks && WARDEN_REQUIRE_SERVERS=1 $(GO) test -count=1 -timeout 20m $(TESTFLAGS) ./...
endif

bench: services
	eval "$$($(SERVICES) env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(TESTFLAGS) $(PKG)

# The fault suite starts its own servers for the faults that stop one, and
# uses the shared ones for the rest. -v prints its table of figures.
test-faults: services
	eval "$$($(SERVICES) env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -tags faults -count=1 -timeout 20m -v $(TESTFLAGS) ./internal/faults/

# Real 3-node topologies on ports of their own (scripts/clusters.sh), with
# leaders killed and frozen, masters failed over and slots migrated while
# locks are held and contended. -v prints the table of figures.
test-clusters:
	scripts/clusters.sh up
	eval "$$(scripts/clusters.sh env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -tags clusters -count=1 -timeout 20m -v $(TESTFLAGS) ./internal/clusters/
	# Fenced writes on the Redis Cluster (fence and data keys in one slot).
	eval "$$(scripts/clusters.sh env)" && WARDEN_REQUIRE_SERVERS=1 $(GO) test -race -tags clusters -count=1 -timeout 10m -run 'Cluster' ./backends/redislock/

# Its own module, so that warden's users never download the peers.
bench-peers: services
	eval "$$($(SERVICES) env)" && cd benchmarks && WARDEN_REQUIRE_SERVERS=1 $(GO) run ./cmd/bench-peers -out . $(ARGS)

lint: staticcheck
	@echo "gofmt -l ."
	@unformatted="$$($(GOFMT) -l .)"; \
	if [[ -n "$$unformatted" ]]; then \
		echo "gofmt: these files are not gofmt-formatted (fix with gofmt -w):"; \
		echo "$$unformatted"; \
		exit 1; \
	fi
	$(GO) vet $(PKG)
	$(STATICCHECK) $(PKG)
ifeq ($(PKG),./...)
	cd benchmarks && $(GO) vet ./...
	cd benchmarks && $(STATICCHECK) ./...
endif

# Installed (again) unless the pinned version is already there.
staticcheck:
	@if ! "$(STATICCHECK)" -version 2>/dev/null | grep -F "($(patsubst v%,%,$(STATICCHECK_VERSION)))" >/dev/null; then \
		echo "installing staticcheck $(STATICCHECK_VERSION) into $(GOTOOLBIN)"; \
		GOBIN="$(GOTOOLBIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	fi

fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZ='$(FUZZ)' scripts/fuzz.sh
