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

.PHONY: help services services-down run test fuzz bench bench-quick bench-path bench-inbox lint fmt compose-check rules-test chart-test chaos chaos-ci swarm swarm-ci swarm-proof

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

services: ## start Kafka + PostgreSQL + a schema registry (Apicurio, 127.0.0.1:8081) (idempotent), or reuse the ones another checkout started on their ports; prints KAFKA_BROKERS, DATABASE_URL and SCHEMA_REGISTRY_URL; KAFKA_NODES=3 starts a three-node Kafka cluster (docs/guarantees-cluster.md)
	@bash scripts/services.sh up

services-down: ## stop what `make services` started in this checkout, one broker or three, and the registry (services it reused keep running; CLEAN=1 also deletes .state)
	@bash scripts/services.sh down

# The failure console `make run` starts beside the demo (loopback only, no login).
CONSOLE_ADDR ?= 127.0.0.1:8088
# CONSOLE_WAIT=0 stops the console when the demo ends instead of keeping it up until Ctrl-C.
CONSOLE_WAIT ?= 1

run: services ## run the payments example's demo against the local services, with the failure console (idem console) beside it at CONSOLE_ADDR
	@mkdir -p $(STATE) && $(GO) build -o bin/idem ./cmd/idem
	@$(WITH_ENV) set -m; ./bin/idem console --insecure-no-auth --listen $(CONSOLE_ADDR) --topic-refresh 2s > $(STATE)/console.log 2>&1 & cpid=$$!; \
	trap 'kill -INT $$cpid 2>/dev/null; wait $$cpid 2>/dev/null' EXIT; \
	for i in $$(seq 1 100); do grep -q 'idem console:' $(STATE)/console.log 2>/dev/null && break; \
	  kill -0 $$cpid 2>/dev/null || { cat $(STATE)/console.log; exit 1; }; sleep 0.1; done; \
	echo "failure console: http://$(CONSOLE_ADDR)/ (log: $(STATE)/console.log)"; \
	$(GO) run ./examples/payments-consumer demo; rc=$$?; \
	if [ $$rc -ne 0 ] || [ "$(CONSOLE_WAIT)" = 0 ]; then exit $$rc; fi; \
	echo "the demo is done; the failure console still runs at http://$(CONSOLE_ADDR)/ (Ctrl-C stops it)"; \
	wait $$cpid

# Fuzz targets (package:Target), each run for FUZZTIME executions by `make fuzz`
# (a count, not a duration: Go 1.26's fuzz coordinator can fail a duration run
# with "context deadline exceeded" at the -fuzztime boundary on a loaded
# machine, golang/go#75804, fixed in Go 1.27; CI hit it once);
# their committed seed corpora also run in every plain `go test`.
FUZZ_TARGETS = ./consumer:FuzzKeyExtraction ./consumer:FuzzJSONField ./internal/wire:FuzzDecode ./dlq:FuzzRecord ./internal/keyorder:FuzzParkRoundTrip ./internal/expiry:FuzzParseDeadline ./serde:FuzzAvroRecordDecoder
FUZZTIME ?= 20000x

test: services ## go vet + staticcheck + all tests with -race against real Kafka and PostgreSQL (the consumer core tests run in every pipeline mode as subtests), alert rule tests, a short fuzz run, the short chaos run, the CI swarm
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@$(MAKE) --no-print-directory rules-test
	@$(MAKE) --no-print-directory chart-test
	@$(WITH_ENV) IDEM_REQUIRE_REAL_KAFKA=1 $(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) ./...
	@$(MAKE) --no-print-directory fuzz
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd kafkaauth/awsmsk && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./... && $(GO) test -race -count=1 ./...
	cd deploy/dashshot && $(GO) vet ./...
	@$(MAKE) --no-print-directory chaos-ci
	@$(MAKE) --no-print-directory swarm-ci

# The chaos run (internal/testing/tools/chaos) starts its own broker and PostgreSQL on
# CHAOS_PORTS' ports (it kills, restarts and freezes them), never the shared ones.
# CHAOS_BROKERS=3 runs it on a three-node cluster of its own (19092/19094/19096,
# controllers 19093/19095/19097) with the cluster's faults (docs/guarantees-cluster.md).
CHAOSARGS ?=
CHAOS_BROKERS ?= 1
CHAOS_PORTS = -kafka-port 19092 -controller-port 19093 -pg-port 15432 -brokers $(CHAOS_BROKERS)

chaos: ## fault injection, every mode: 50,000 payments each while members are SIGKILLed, PostgreSQL and the broker restart, the broker freezes, the group resizes; then the history checker (CHAOSARGS='-h' lists the flags; CHAOS_BROKERS=3: on three nodes, with leader, coordinator and rolling-restart faults)
	@$(GO) build -o bin/idem-chaos ./internal/testing/tools/chaos && ./bin/idem-chaos $(CHAOS_PORTS) $(CHAOSARGS)

chaos-ci: ## the short chaos run `make test` ends with: 2,000 payments per mode, every fault kind and every mode, then the per-message, lanes and ordering modes with Config.Transactions (read_committed: one copy per hop), ~11 min
	@$(GO) build -o bin/idem-chaos ./internal/testing/tools/chaos && ./bin/idem-chaos -ci $(CHAOS_PORTS) $(CHAOSARGS) && \
	  ./bin/idem-chaos -ci -transactions -modes per-message,lanes,ordering $(CHAOS_PORTS) $(CHAOSARGS)

# The swarm (internal/testing/tools/swarm, issue 28) draws a configuration, a workload and
# a fault schedule from each seed and checks the history; like the chaos run it
# starts its own broker and PostgreSQL on SWARM_PORTS' ports (the chaos ports by
# default: do not run both at once). SEED=N runs seed N (a failing seed prints
# its rerun command), SHRINK=1 shrinks SEED's failing draw, DURATION=1h is the
# soak; SWARMARGS='-h' lists the flags.
SWARMARGS ?=
SWARM_BROKERS ?= 1
SWARM_PORTS ?= -kafka-port 19092 -controller-port 19093 -pg-port 15432 -brokers $(SWARM_BROKERS)
SEED ?=
SHRINK ?=
DURATION ?=

swarm: ## swarm testing: one seed's draw (SEED=N; default from the clock), SHRINK=1 its smallest failing draw, DURATION=1h the soak; ends with the table of features drawn together, faults and violations
	@$(GO) build -o bin/idem-swarm ./internal/testing/tools/swarm && ./bin/idem-swarm $(SWARM_PORTS) \
	  $(if $(SEED),-seed $(SEED)) $(if $(SHRINK),-shrink) $(if $(DURATION),-duration $(DURATION)) $(SWARMARGS)

# The CI form draws the same seeds in every run, from SWARM_CI_SEED: a CI
# failure then reruns as it happened, and a pass means the same crossings
# passed; fresh draws are the soak's (make swarm DURATION=1h) and make swarm's,
# whose seeds come from the clock. SWARM_CI_SEED= (empty) draws from the clock.
SWARM_CI_SEED ?= 1796380740133312708
swarm-ci: ## the CI swarm `make test` ends with: short draws with -race members from SWARM_CI_SEED, as many seeds as fit in 8 minutes, every feature and fault kind drawn at least once
	@$(GO) build -o bin/idem-swarm ./internal/testing/tools/swarm && ./bin/idem-swarm -ci -race -budget 8m $(if $(SWARM_CI_SEED),-seed $(SWARM_CI_SEED)) $(SWARM_PORTS) $(SWARMARGS)

# The checker's own proof (issue 28, item 5): each mechanism an invariant guards
# switched off in turn (internal/mutate, members built with -tags idem_mutate),
# and seeds from SEED (default 1) until the swarm finds the breach, at most
# PROOF_SEEDS each; ends with the table docs/guarantees.md keeps.
PROOF_SEEDS ?= 3
swarm-proof: ## the checker's own proof: each invariant's mechanism switched off in turn, the seeds the swarm takes to find each breach (SEED, PROOF_SEEDS, SWARMARGS='-proof inbox,park' for some)
	@$(GO) build -o bin/idem-swarm ./internal/testing/tools/swarm && ./bin/idem-swarm -ci -seed $(or $(SEED),1) -proof-seeds $(PROOF_SEEDS) \
	  $(if $(findstring -proof ,$(SWARMARGS) ),,-proof all) $(SWARM_PORTS) $(SWARMARGS)

fuzz: ## a short run of every fuzz target (FUZZTIME executions each, default 20000x)
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}"; \
	done

BENCHARGS  ?=
BENCHFLAGS ?=

bench: services ## the benchmark harness (bench/, own module): idem beside raw sarama, raw franz-go (kgo), Watermill and a naive loop; table, JSON and PNG in bench/out. BENCHARGS='-h' lists its flags; BENCHFLAGS='-bench X' runs the go test benchmarks instead
	@if [ -n "$(BENCHFLAGS)" ]; then \
		$(WITH_ENV) $(GO) test -run '^$$' -bench . -benchmem $(BENCHFLAGS) ./...; \
	else \
		(cd bench && $(GO) build -o ../bin/idem-bench .) && $(WITH_ENV) ./bin/idem-bench $(BENCHARGS); \
	fi

bench-quick: services ## a short pass of the harness: 200,000 records, one run, 3 s of latency per scenario
	@(cd bench && $(GO) build -o ../bin/idem-bench .) && $(WITH_ENV) ./bin/idem-bench -records 200000 -runs 1 -latency-duration 3s $(BENCHARGS)

INBOXARGS ?=

bench-path: ## idem's own cost of a record from fetched to marked, no Kafka (consumer's BenchmarkRecordToMark: memory store, no-op handler; allocs/op is allocations a record, goal 0)
	@$(GO) test -run '^$$' -bench RecordToMark -benchmem -count 3 ./consumer/

bench-inbox: services ## the inbox at scale (bench/inbox): 50 M rows plain beside partitioned by day and by week, sweep (DELETE vs DROP: time, WAL, dead tuples), inserts and lookups; an hour or more and ~25 GB of disk. INBOXARGS='-rows 1000000' for a quick pass, '-h' for the flags
	@(cd bench && $(GO) build -o ../bin/idem-bench-inbox ./inbox) && $(WITH_ENV) ./bin/idem-bench-inbox $(INBOXARGS)

lint: ## go vet + staticcheck
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fmt: ## gofmt the tree
	gofmt -s -w $$(git ls-files '*.go')

rules-test: ## check the Prometheus config and alert rules, and run their unit tests (promtool, Debian package prometheus)
	promtool check config deploy/prometheus/prometheus.yml
	cd deploy/prometheus && promtool test rules alerts_test.yml

chart-test: ## lint, render and validate the Helm chart deploy/helm/idem-service for every value set (helm from the Go module proxy, objects decoded strictly into their Go API types; no cluster; docs/kubernetes.md)
	cd deploy/helm/chartcheck && $(GO) vet ./... && $(GO) test -count=1 -timeout 30m ./...

compose-check: ## validate docker-compose.yml (no engine needed)
	docker-compose -f docker-compose.yml config -q
