# idem — developer commands. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

STATE   ?= .state
ENVFILE := $(STATE)/services.env
# Recipes that talk to Kafka/PostgreSQL read the values `make services` wrote;
# values already in the environment were written there by it too, so they win.
WITH_ENV = set -a; [ -f $(ENVFILE) ] && . ./$(ENVFILE); set +a;
GO      ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: help services services-down run test bench bench-quick lint fmt compose-check

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

services: ## start Kafka + PostgreSQL (idempotent); prints KAFKA_BROKERS and DATABASE_URL
	@bash scripts/services.sh up

services-down: ## stop what `make services` started (CLEAN=1 also deletes .state)
	@bash scripts/services.sh down

run: services ## run the payments example's demo against the local services
	@$(WITH_ENV) $(GO) run ./examples/payments-consumer demo

test: services ## go vet + all tests with -race against real Kafka and PostgreSQL
	$(GO) vet ./...
	@$(WITH_ENV) IDEM_REQUIRE_REAL_KAFKA=1 $(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) ./...

BENCHARGS  ?=
BENCHFLAGS ?=

bench: services ## the benchmark harness (bench/, own module): idem beside raw sarama, Watermill and a naive loop; table, JSON and PNG in bench/out. BENCHARGS='-h' lists its flags; BENCHFLAGS='-bench X' runs the go test benchmarks instead
	@if [ -n "$(BENCHFLAGS)" ]; then \
		$(WITH_ENV) $(GO) test -run '^$$' -bench . -benchmem $(BENCHFLAGS) ./...; \
	else \
		(cd bench && $(GO) build -o ../bin/idem-bench .) && $(WITH_ENV) ./bin/idem-bench $(BENCHARGS); \
	fi

bench-quick: services ## a short pass of the harness: 200,000 records, one run, 3 s of latency per scenario
	@(cd bench && $(GO) build -o ../bin/idem-bench .) && $(WITH_ENV) ./bin/idem-bench -records 200000 -runs 1 -latency-duration 3s $(BENCHARGS)

lint: ## go vet + staticcheck
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fmt: ## gofmt the tree
	gofmt -s -w $$(git ls-files '*.go')

compose-check: ## validate docker-compose.yml (no engine needed)
	docker-compose -f docker-compose.yml config -q
