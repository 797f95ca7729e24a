# podwire — build, test and install the CNI plugins.

GO          ?= go
BIN_DIR     ?= bin
CNI_BIN_DIR ?= /opt/cni/bin
DESTDIR     ?=
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PLUGINS     := $(notdir $(wildcard plugins/main/* plugins/ipam/* plugins/meta/*))
# The sources every plugin is built from: plugins built from the same sources run each
# other in-process (bridge runs host-local without a second process; see pkg/cniplumb).
BUILD_STAMP := podwire-build:$(shell cat go.mod go.sum $$(find pkg plugins -name '*.go' ! -name '*_test.go' | LC_ALL=C sort) | sha256sum | cut -c1-16)
LDFLAGS     := -s -w -X github.com/podwire/podwire/pkg/cniplumb.Version=$(VERSION) -X github.com/podwire/podwire/pkg/cniplumb.BuildStamp=$(BUILD_STAMP)
# 2 cores: keep test parallelism sane.
TEST_FLAGS  ?= -count=1 -p 2 -timeout 20m

DIST_DIR    ?= dist
# Commands built besides the plugins (podwire-agent); dist ships plugins only.
CMDS        ?= $(wildcard cmd/*)
IMAGE_NAME  ?= docker.io/podwire/podwire-agent:$(VERSION)
IMAGE_TAR   ?= $(DIST_DIR)/podwire-agent-$(VERSION)-linux-$(GOARCH).oci.tar
GOARCH      ?= $(shell $(GO) env GOARCH)
TARBALL     := podwire-$(VERSION)-linux-$(GOARCH).tgz

.PHONY: image all build test unit-test integration-test vet install clean bench bench-quick dist fuzz stress demo

all: build

## build: every plugin into bin/, stripped, with the git version
build:
	@mkdir -p $(BIN_DIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/ $(addprefix ./,$(wildcard plugins/main/* plugins/ipam/* plugins/meta/*))
	$(if $(CMDS),CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/ $(addprefix ./,$(CMDS)))

## test: gofmt, vet, unit tests and the root-only integration tests (they skip without root)
## (unit packages first, in parallel; then the integration tests alone, so traffic-shaping
## measurements do not share the 2 cores with other test binaries)
test: vet
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v /integration)
	$(GO) test -count=1 -p 1 -timeout 40m ./integration/...
	FUZZTIME=$(FUZZTIME) bash .ci/fuzz

## fuzz: every fuzz target for FUZZTIME (make fuzz FUZZTIME=1m)
FUZZTIME ?= 3s
fuzz:
	FUZZTIME=$(FUZZTIME) bash .ci/fuzz

unit-test:
	$(GO) test $(TEST_FLAGS) ./pkg/... ./plugins/...

integration-test:
	$(GO) test $(TEST_FLAGS) -v ./integration/...

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

## install: the plugins into $(DESTDIR)$(CNI_BIN_DIR) (default /opt/cni/bin)
install: build
	install -d $(DESTDIR)$(CNI_BIN_DIR)
	for p in $(PLUGINS); do install -m 0755 $(BIN_DIR)/$$p $(DESTDIR)$(CNI_BIN_DIR)/$$p; done

## dist: release tarball podwire-<version>-linux-<arch>.tgz, laid out like the reference
## release archives (plugin binaries at the top level), so existing install scripts work
dist:
	rm -rf $(DIST_DIR)/stage && mkdir -p $(DIST_DIR)/stage
	$(MAKE) build BIN_DIR=$(DIST_DIR)/stage CMDS=
	cp LICENSE README.md $(DIST_DIR)/stage/
	tar -C $(DIST_DIR)/stage --owner=0 --group=0 --numeric-owner --sort=name -czf $(DIST_DIR)/$(TARBALL) .
	rm -rf $(DIST_DIR)/stage
	@echo $(DIST_DIR)/$(TARBALL)

## stress: the long reliability churn (600 attachments, SIGKILLs, GC, leak check)
stress:
	PODWIRE_STRESS=1 $(GO) test -count=1 -p 1 -timeout 30m -run 'TestChurn' -v ./integration/

## demo: two pods through the kubenet conf-example, end to end, in a private node netns
demo:
	$(GO) run ./integration/demo

## bench: podwire vs the reference plugins vs a no-op floor; writes BENCHMARKS.md (~10 min)
bench:
	PODWIRE_BENCH=full $(GO) test -count=1 -p 1 -timeout 30m -run TestBench -v ./integration/bench/

## bench-quick: a ~1 minute subset of bench
bench-quick:
	PODWIRE_BENCH=quick $(GO) test -count=1 -p 1 -timeout 10m -run TestBench -v ./integration/bench/

## image: podwire-agent's OCI image tarball (agent + plugins), no container daemon needed;
## load it with `ctr -n k8s.io images import $(IMAGE_TAR)`
image:
	rm -rf $(DIST_DIR)/image-bin
	$(MAKE) build BIN_DIR=$(DIST_DIR)/image-bin
	@mkdir -p $(DIST_DIR)
	$(GO) run ./hack/mkimage -agent $(DIST_DIR)/image-bin/podwire-agent -plugins $(DIST_DIR)/image-bin -name $(IMAGE_NAME) -o $(IMAGE_TAR)
	rm -rf $(DIST_DIR)/image-bin

clean:
	rm -rf $(BIN_DIR) $(DIST_DIR)
