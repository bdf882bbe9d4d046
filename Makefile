# HAN realtime gateway. The README's two commands: `make dev` and `make test`.
# Extra arguments: make test ARGS='-run TestSend ./restapi/'
#                  make loadtest ARGS='run broadcast -h'

SHELL := /bin/bash
GO    ?= go
ARGS  ?=

.PHONY: dev check test build lint bench fuzz loadtest clean

## dev: the local stack (private PostgreSQL + Redis under .data/, demo data, gateway with the web client)
dev:
	bash scripts/dev.sh

## check: bring the local stack up, do a message round trip, shut it down (exit 0/1)
check:
	bash scripts/dev.sh --check

## test: go vet, gofmt check and the whole suite with -race on private servers
test:
	bash scripts/test.sh $(ARGS)

## build: the binaries into ./bin
build:
	$(GO) build -o bin/ ./cmd/...

## lint: go vet, gofmt, deadcode (scripts/deadcode.sh) and the JavaScript SDK's type check
lint:
	$(GO) vet ./...
	@source scripts/lib.sh && files="$$(han_gofmt_unformatted)" && \
	if [ -n "$$files" ]; then echo "gofmt: not formatted (run gofmt -w):"; echo "$$files"; exit 1; fi
	bash scripts/deadcode.sh
	@HAN_SCRIPT=make source scripts/lib.sh && han_sdk_deps
	cd web/sdk && node_modules/.bin/tsc -p jsconfig.json

## bench: every benchmark, on a private PostgreSQL cluster
bench:
	$(GO) run ./internal/testenv/cmd/withpg -- $(GO) test -run '^$$' -bench . -benchmem $(or $(ARGS),./...)

## fuzz: every network-facing decoder's fuzz target briefly (FUZZTIME=5m make fuzz for longer)
fuzz:
	scripts/fuzz.sh

## loadtest: smoke load test against the REAL gateway of the local stack (scripts/loadtest-smoke.sh:
##           starts scripts/dev.sh, < 60 s of scenarios, non-zero exit when delivery breaks);
##           ARGS='run SCENARIO …' runs anything else with han-loadtest
loadtest:
	$(if $(ARGS),$(GO) run ./cmd/han-loadtest $(ARGS),bash scripts/loadtest-smoke.sh)

## clean: remove .data/ and bin/ (stops nothing: stop `make dev` first)
clean:
	rm -rf .data bin
