# mooncake-go: two commands on a fresh machine.
#   make run    the main job: the all-in-one store (embedded etcd, an HA master, two
#               storage node processes) replays the FAST'25 conversation trace
#               (replay-out/: Parquet, PNG and SVG, and nodes.log, the storage nodes' log);
#               bench-te is the Transfer Engine benchmark
#   make test   everything CI checks: deps, gofmt, vet, staticcheck, Go tests with -race,
#               the deploy checks (deploy/: Helm chart, image, dashboard), the C ABI
#               suite, the C++ SDK suite, the Python suite and the framework suites (e2e/)
SHELL := /bin/bash
GO    ?= go
BIN   := bin/mooncake
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: image deploy-test faults-table all build run bench-te bench-vllm demo test deps lint unit capi-test cxx-test python-test e2e install fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/mooncake

# run is the main job: the all-in-one store (embedded etcd, an HA master,
# two storage node processes) replaying the FAST'25 conversation trace.
run: build
	$(BIN) bench trace --out replay-out

bench-te: build
	$(BIN) bench te --transport tcp --op write --block-size 1MiB --batch-size 64 --threads 2 --duration 3s
	$(BIN) bench te --transport tcp --op read  --block-size 1MiB --batch-size 64 --threads 2 --duration 3s
	$(BIN) bench te --transport shm --op write --block-size 1MiB --batch-size 64 --threads 2 --duration 3s

# deps installs what the tests need beyond the toolchains: Debian libraries
# for the official Mooncake wheel, and that wheel in a private venv
# (.venv-official) for the interoperability tests.
deps:
	bash scripts/test-deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# The network-fault tests (internal/netlab, internal/faults) build hosts in
# network namespaces, which needs root: as root they must run, never skip.
NETLAB_REQUIRE := $(shell [ "$$(id -u)" = 0 ] && echo 1)

# unit runs the Go tests with -race (scripts/test-go.sh: a failure's tests
# are named again at the end of the output).
unit:
	MC_NETLAB_REQUIRE=$(NETLAB_REQUIRE) GO=$(GO) bash scripts/test-go.sh

# faults-table runs the network-fault scenarios (root) and writes their
# table, with the figures of this run, to docs/faults.md.
faults-table:
	MC_NETLAB_REQUIRE=1 MC_FAULT_TABLE=$(CURDIR)/docs/faults.md $(GO) test -count=1 -v ./internal/faults/

# The C ABI (libmooncake.so) against its C test suite, in two processes and
# with a store started for it; then again built with GOEXPERIMENT=cgocheck2
# (into build/cgocheck2), which checks every Go pointer written to C memory.
capi-test:
	bash scripts/test-capi.sh
	GOEXPERIMENT=cgocheck2 CAPI_OUT=build/cgocheck2 bash scripts/test-capi.sh

# The C/C++ SDK as installed (scripts/install.sh into a temporary, then
# moved, prefix): pkg-config and find_package(mooncake) consumers, and the
# GoogleTest suite of connectors/trtllm (mooncake.hpp, TensorRT-LLM's
# Mooncake agent sequence on transfer_engine_c.h) across two processes.
cxx-test:
	bash scripts/test-trtllm.sh

# install: the SDK tree TensorRT-LLM (MOONCAKE_ROOT) and NIXL
# (find_library('transfer_engine')) build against: lib/, include/, a CMake
# package and pkg-config files; relocatable.
PREFIX ?= /usr/local
install:
	bash scripts/install.sh $(PREFIX)

# The Python package: a wheel built with the local Go toolchain, installed in
# .venv-py, and its pytest suite (native API, the compat modules driven as
# the connectors drive them, interop with the official wheel); then the
# suite once more on the library built with GOEXPERIMENT=cgocheck2.
python-test:
	bash scripts/test-python.sh
	GOEXPERIMENT=cgocheck2 bash scripts/build-capi.sh build/cgocheck2
	MOONCAKE_GO_LIBRARY=$(CURDIR)/build/cgocheck2/libmooncake.so bash scripts/test-python.sh

# The real frameworks (vLLM, SGLang, LMCache, NIXL), their own code unchanged,
# against this checkout's package, library and `mooncake up`. Each installs
# into a cached venv (~/.cache/mooncake-go/e2e) from a pinned lock; the first
# run downloads several GB of wheels (see e2e/README.md). E2E=vllm,nixl picks
# suites.
e2e:
	bash e2e/run.sh $(subst $(comma), ,$(E2E))

comma := ,

# demo: Mooncake's architecture with real vLLM (the e2e vLLM venv): `mooncake
# up`, a prefill and a decode instance with our connector, `mooncake
# conductor` routing on their KV events; a multi-turn replay printing, per
# request, the instances, the prefix reused (local, store, none) and TTFT.
demo:
	bash e2e/py.sh vllm e2e/vllm/demo.py

# bench-vllm: time to first token with real vLLM: our connector vs vLLM's
# built-in MooncakeConnector vs no disaggregation, and the store tier vs
# recompute (build/bench/vllm-ttft.json).
bench-vllm:
	bash e2e/py.sh vllm e2e/vllm/bench_ttft.py

test: deps lint unit deploy-test capi-test cxx-test python-test e2e

# image: the container image of the one static binary (CGO_ENABLED=0),
# assembled offline from scratch (no base image) as an OCI image-layout
# archive by deploy/image; load it with skopeo or podman (deploy/README.md).
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o build/image/mooncake ./cmd/mooncake
	cd deploy && $(GO) run ./image -binary ../build/image/mooncake -out ../build/mooncake-image.oci.tar

# deploy-test: the Helm chart rendered for each of its value sets and every
# object decoded strictly into the Kubernetes API types, the image
# assembler; a nested module (deploy/go.mod), so Helm stays out of ours.
deploy-test:
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

# Short fuzzing pass over every network decoder (not part of `make test`).
fuzz:
	bash scripts/fuzz.sh 30s

clean:
	rm -rf bin build
