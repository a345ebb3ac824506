# kiln: the README's commands.
#   make run    - build, then serve the built-in demo model on http://127.0.0.1:8000
#   make check  - install dependencies, build, run the test suite (what CI runs)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all build test check run deps asan clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# CPU tests (GPU tests carry the label "gpu" and run on the GPU machine).
test: build
	ctest --test-dir $(BUILD) -L cpu -LE gpu --output-on-failure -j $(JOBS)

deps:
	scripts/install-deps

check: deps test

run: build
	$(BUILD)/bin/kiln serve

# The whole suite under AddressSanitizer + UBSan (docs/TESTING.md).
asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DKILN_ASAN=ON"

clean:
	rm -rf $(BUILD) build-asan
