# podwire — build, test and install the CNI plugins.

GO          ?= go
BIN_DIR     ?= bin
CNI_BIN_DIR ?= /opt/cni/bin
DESTDIR     ?=
# The release semver is in VERSION; builds between releases add git describe's -N-gHASH
# (.ci/version says how). `make VERSION=x` overrides it.
VERSION     ?= $(shell bash .ci/version)
ifeq ($(VERSION),)
$(error no version: .ci/version failed (see above); VERSION must hold a semver such as 0.1.0)
endif
PLUGINS     := $(notdir $(wildcard plugins/main/* plugins/ipam/* plugins/meta/*))
# The sources every plugin is built from: plugins built from the same sources run each
# other in-process (bridge runs host-local without a second process; see pkg/cniplumb).
BUILD_STAMP := podwire-build:$(shell cat go.mod go.sum $$(find pkg plugins -name '*.go' ! -name '*_test.go' | LC_ALL=C sort) | sha256sum | cut -c1-16)
LDFLAGS     := -s -w -buildid= -X github.com/podwire/podwire/pkg/cniplumb.Version=$(VERSION) -X github.com/podwire/podwire/pkg/cniplumb.BuildStamp=$(BUILD_STAMP)
# 2 cores: keep test parallelism sane.
TEST_FLAGS  ?= -count=1 -p 2 -timeout 20m
# make test's go test -json logs: one directory per checkout, emptied by each run.
TEST_LOG_DIR ?= /tmp/podwire-test-logs$(subst /,-,$(CURDIR))
TESTLOG     = $(GO) run ./tools/testlog run

DIST_DIR    ?= dist
# Commands built besides the plugins (podwire, podwire-agent, podwire-init); dist ships plugins only.
CMDS        ?= $(wildcard cmd/*)
GOARCH      ?= $(shell $(GO) env GOARCH)
IMAGE_NAME  ?= docker.io/podwire/podwire-agent:$(VERSION)
IMAGE_TAR   ?= $(DIST_DIR)/podwire-agent-$(VERSION)-linux-$(GOARCH).oci.tar
# The reference's release architectures (arm is GOARM=7, the Go default the reference's
# cross-builds get); the GO<arch> levels are pinned so an environment cannot change bytes.
DIST_ARCHES ?= amd64 arm64 arm ppc64le s390x riscv64
DIST_GOFLAGS ?= -mod=readonly
DIST_GOENV  = CGO_ENABLED=0 GOOS=linux GOFLAGS="$(DIST_GOFLAGS)" GOAMD64=v1 GOARM=7 GOARM64=v8.0 GOPPC64=power8 GORISCV64=rva20u64
# Every file in the tarballs gets the commit's time (reproducible-builds.org's variable).
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: all build test unit-test integration-test vet install clean bench bench-quick bench-agent dist notice image fuzz stress demo cluster cluster-down cluster-check conformance bench-startup bench-upgrade

all: build

## build: every plugin and command (podwire, podwire-agent, podwire-init) into bin/, stripped, with the version
build:
	@mkdir -p $(BIN_DIR)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/ $(addprefix ./,$(wildcard plugins/main/* plugins/ipam/* plugins/meta/*))
	$(if $(CMDS),CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/ $(addprefix ./,$(CMDS)))

## test: gofmt, vet, unit tests and the root-only integration tests (they skip without root,
## and fail under CI=true)
## (unit packages first, in parallel; then the integration tests alone, so traffic-shaping
## measurements do not share the 2 cores with other test binaries). The go test runs'
## whole output (-json) goes to $(TEST_LOG_DIR); stdout gets each test's result line and
## the output of failed ones; `go run ./tools/testlog skips $(TEST_LOG_DIR)/*.json` lists
## the skips (.ci/run does).
test: vet
	@mkdir -p $(TEST_LOG_DIR) && rm -f $(TEST_LOG_DIR)/*.json && echo "test logs: $(TEST_LOG_DIR)"
	$(TESTLOG) -log $(TEST_LOG_DIR)/unit.json -- $(GO) test -json $(TEST_FLAGS) $$($(GO) list ./... | grep -v /integration)
	$(TESTLOG) -log $(TEST_LOG_DIR)/integration.json -- $(GO) test -json -count=1 -p 1 -timeout 40m ./integration/...
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
	bash .ci/spdx --check
	$(GO) vet ./...

## install: the plugins into $(DESTDIR)$(CNI_BIN_DIR) (default /opt/cni/bin)
install: build
	install -d $(DESTDIR)$(CNI_BIN_DIR)
	for p in $(PLUGINS); do install -m 0755 $(BIN_DIR)/$$p $(DESTDIR)$(CNI_BIN_DIR)/$$p; done

## dist: release tarballs podwire-<version>-linux-<arch>.tgz for every DIST_ARCHES, each
## with .sha256 and .sha512 beside it (sha256sum -c format), laid out like the reference
## release archives (plugin binaries at the top level, LICENSE, README.md, NOTICE), so
## existing install scripts work. Byte-reproducible for one commit and Go toolchain.
dist:
	rm -rf $(DIST_DIR)/stage && mkdir -p $(DIST_DIR)/stage
	for a in $(DIST_ARCHES); do \
	  $(DIST_GOENV) GOARCH=$$a $(MAKE) --no-print-directory build CMDS= VERSION='$(VERSION)' BIN_DIR=$(DIST_DIR)/stage/$$a || exit 1; \
	done
	$(GO) run ./tools/release pack -version '$(VERSION)' -mtime '$(SOURCE_DATE_EPOCH)' \
	  -stage $(DIST_DIR)/stage -out $(DIST_DIR) -docs LICENSE,README.md,NOTICE $(DIST_ARCHES)
	rm -rf $(DIST_DIR)/stage

## notice: regenerate NOTICE from the Go modules compiled into the plugins
notice:
	$(GO) run ./tools/release notice > NOTICE.new && mv NOTICE.new NOTICE

## stress: the long reliability churn (600 attachments, SIGKILLs, GC, leak check)
stress:
	PODWIRE_STRESS=1 $(GO) test -count=1 -p 1 -timeout 30m -run 'TestChurn' -v ./integration/

## demo: two pods through the kubenet conf-example, end to end, in a private node netns
demo:
	$(GO) run ./integration/demo

## bench: podwire vs the reference plugins vs a no-op floor; writes BENCHMARKS.md (~10 min)
bench:
	PODWIRE_BENCH=full $(GO) test -count=1 -p 1 -timeout 30m -run TestBench -v ./integration/bench/

## bench-agent: podwire-agent with 2,000 Nodes on a real kube-apiserver (3 agents, 60 s windows, a churn of
## 200 status patches/s); writes its own section of BENCHMARKS.md (~5 min, root; TestAgentScale bounded in go test)
bench-agent:
	PODWIRE_AGENT_BENCH_NODES=$${NODES:-2000} PODWIRE_AGENT_BENCH_AGENTS=$${AGENTS:-3} PODWIRE_AGENT_BENCH_WINDOW=$${WINDOW:-60} \
	PODWIRE_AGENT_BENCH_OUT=$(CURDIR)/BENCHMARKS.md $(GO) test -count=1 -p 1 -timeout 30m -run 'TestAgentScale$$' -v ./integration/

## bench-upgrade: issue 28's "under change" on the running lab (make cluster first, NODES=2 for the cross-node
## figures): the agent rolled out to a second build under a pod churn, the API server stopped for OUTAGE (60s),
## the rollback with the first new agent SIGKILLed mid-install; writes its section of BENCHMARKS.md (~8 min, root).
## CI runs the same test (TestAgentUpgrade, 20s outage) in its own lab (make test).
bench-upgrade:
	PODWIRE_LAB=$(LAB_DIR) PODWIRE_UPGRADE_OUTAGE=$${OUTAGE:-60s} PODWIRE_UPGRADE_OUT=$(CURDIR)/BENCHMARKS.md \
	  $(GO) test -count=1 -p 1 -timeout 40m -run 'TestAgentUpgrade$$' -v ./integration/cluster/

## bench-quick: a ~1 minute subset of bench
bench-quick:
	PODWIRE_BENCH=quick $(GO) test -count=1 -p 1 -timeout 10m -run TestBench -v ./integration/bench/

## image: podwire-agent's OCI image tarball (init + agent + plugins + Debian's iptables from
## this machine behind tools/iptables-wrapper, which picks the host's nft or legacy mode),
## no container daemon needed; load it with `ctr -n k8s.io images import $(IMAGE_TAR)`
image:
	rm -rf $(DIST_DIR)/image-bin $(DIST_DIR)/image-tools
	$(MAKE) build BIN_DIR=$(DIST_DIR)/image-bin
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(DIST_DIR)/image-tools/iptables-wrapper ./tools/iptables-wrapper
	@mkdir -p $(DIST_DIR)
	$(GO) run ./hack/mkimage -agent $(DIST_DIR)/image-bin/podwire-agent -init $(DIST_DIR)/image-bin/podwire-init -plugins $(DIST_DIR)/image-bin -iptables-wrapper $(DIST_DIR)/image-tools/iptables-wrapper -name $(IMAGE_NAME) -o $(IMAGE_TAR)
	rm -rf $(DIST_DIR)/image-bin $(DIST_DIR)/image-tools

## cluster: a two-node Kubernetes lab on podwire (kubelet, kube-proxy, CoreDNS; see
## integration/cluster). PROXY_MODE=iptables|nftables, NODES=1|2, LAB_DIR (default
## /tmp/podwire-lab), RUNTIMES=containerd,crio (a runtime per node; default containerd). The first run builds the Kubernetes binaries (~1 CPU-hour), later
## ones reuse .cache/kube. Ends with the exports for kubectl; stays up until cluster-down.
PROXY_MODE  ?= iptables
NODES       ?= 2
LAB_DIR     ?= /tmp/podwire-lab
LAB_ENV      = PROXY_MODE=$(PROXY_MODE) NODES=$(NODES) LAB_DIR=$(LAB_DIR)
cluster:
	$(LAB_ENV) $(GO) run ./integration/cluster/lab up

## cluster-down: remove the lab and everything it made on the machine
cluster-down:
	$(LAB_ENV) $(GO) run ./integration/cluster/lab down

## cluster-check: podwire's own checks against a running lab (make cluster first)
cluster-check:
	PODWIRE_LAB=$(LAB_DIR) $(GO) test -count=1 -p 1 -timeout 30m -v ./integration/cluster/

## bench-startup: 30 pods at once on a running lab (make cluster), create→Ready with podwire's
## plugins and with the reference ones, 3 interleaved rounds; writes its section of BENCHMARKS.md
bench-startup:
	PODWIRE_LAB_BENCH=1 PODWIRE_LAB=$(LAB_DIR) $(GO) test -count=1 -p 1 -timeout 30m -v -run 'TestPodStartup$$' ./integration/cluster/

## conformance: e2e.test's [sig-network] specs against a running lab in three passes ([Conformance];
## [Serial]; the other HostPort, Services, DNS and Conntrack specs; CONFORMANCE_PASSES picks), once
## per kube-proxy mode (CONFORMANCE_MODES=iptables,nftables); the tables go to
## $(LAB_DIR)/conformance.md, logs and JUnit under $(LAB_DIR)/conformance/<mode>/<pass>/
conformance:
	$(LAB_ENV) $(GO) run ./integration/cluster/lab conformance > $(LAB_DIR)/conformance.md

clean:
	rm -rf $(BIN_DIR) $(DIST_DIR)
