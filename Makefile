# kiln: the README's commands.
#   make run    - install what serving needs, build the kiln binary alone, then serve the
#                 built-in demo model on http://127.0.0.1:8000 (MODEL=, PORT=, ARGS= change it)
#   make check  - install dependencies, build, run the test suite (what CI runs)
# KILN_CUDA=OFF (or ON) on either decides whether the CUDA backend is built; unset, CMake
# builds it wherever nvcc is found (CMakeLists.txt).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
MODEL ?=
PORT ?=
ARGS ?=
cuda_flag = $(if $(KILN_CUDA),-DKILN_CUDA=$(KILN_CUDA))

.PHONY: all build test check run deps deps-serve asan tsan clean

all: build

# Configured every time (seconds on an existing build directory) so that KILN_TESTS is ON
# here even where `make run` configured the directory without tests.
build:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) $(cuda_flag) -DKILN_TESTS=ON
	cmake --build $(BUILD) -j $(JOBS)

# CPU tests (GPU tests carry the label "gpu" and run on the GPU machine).
test: build
	ctest --test-dir $(BUILD) -L cpu -LE gpu --output-on-failure -j $(JOBS)

deps:
	scripts/install-deps

deps-serve:
	scripts/install-deps --serve

check: deps test

# A new build directory is configured without tests (GoogleTest is not needed to serve);
# an existing one keeps its setting. Only the kiln target is built.
run: deps-serve
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) $(cuda_flag) $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DKILN_TESTS=OFF)
	cmake --build $(BUILD) -j $(JOBS) --target kiln
	$(BUILD)/bin/kiln serve $(if $(MODEL),--model $(MODEL)) $(if $(PORT),--port $(PORT)) $(ARGS)

# The whole suite under AddressSanitizer + UBSan (docs/TESTING.md).
asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DKILN_ASAN=ON"

# The multi-rank code (ranks as threads over the in-process communicator: TP / PP / EP,
# micro-batches, the watchdog; kiln serve at TP2 and TP2 x PP2 through the e2e test) under ThreadSanitizer,
# CPU backend (docs/TESTING.md; build-tsan/, about an hour on 2 cores).
tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_CUDA=OFF -DKILN_TSAN=ON -DKILN_TESTS=ON
	cmake --build build-tsan -j $(JOBS) --target kiln_test_server comm_tests runtime_tests model_tests
	scripts/tsan-check build-tsan

clean:
	rm -rf $(BUILD) build-asan build-tsan
