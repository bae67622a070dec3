# Two commands do all set-up: `make demo` and `make test`. Both create .venv and install the project.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# uv installs the virtualenv's packages (pip took 171 s for what uv installs in 66 s, bytecode compiled as pip
# does, both from a warm cache); pip, pinned like uv in constraints.txt, installs uv. --native-tls: the
# system's certificates (a registry behind a proxy with its own CA), as pip uses them.
UV_INSTALL := $(VENV)/bin/uv pip install --quiet --native-tls --python $(PY)

.PHONY: demo test test-fast lint bench install check-java pulsar-standalone kafka delta-spark clean docs docs-serve constraints

# Apache Pulsar standalone for the Pulsar tests: the jars of the pinned pom, resolved once from Maven Central
# into a cache outside the repo. The stamp's name is keyed on the pom's content, so later runs skip Maven
# entirely, and an edited pom resolves again. cdc.servers.pulsar.standalone finds the jars the same way.
PULSAR_POM := cdc/servers/pulsar/apache-pulsar/pom.xml
PULSAR_VERSION := $(shell sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' $(PULSAR_POM))
PULSAR_POM_KEY := $(shell (sha256sum $(PULSAR_POM) 2>/dev/null || shasum -a 256 $(PULSAR_POM)) | cut -c1-16)
CDC_PULSAR_HOME ?= $(HOME)/.cache/cdc-tunnel/pulsar-$(PULSAR_VERSION)
CDC_MAVEN_REPO ?= $(HOME)/.cache/cdc-tunnel/m2
PULSAR_STAMP := $(CDC_PULSAR_HOME)/resolved-$(PULSAR_POM_KEY)

# Apache Kafka (KRaft broker and Kafka Connect), Debezium's PostgreSQL connector as a Connect plugin, and Spark's own
# Kafka source, for the Kafka tests, `cdc server kafka` and examples/kafka_debezium_to_delta.py: three pinned poms
# (cdc/servers/kafka/*/pom.xml), each resolved once into its own lib/ under the cache; the stamp's name is keyed
# on the three poms' content, so later runs skip Maven and an edited pom resolves again.
# cdc.servers.kafka.standalone finds the jars the same way.
KAFKA_POMS := $(sort $(wildcard cdc/servers/kafka/*/pom.xml))
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' cdc/servers/kafka/apache-kafka/pom.xml)
KAFKA_POM_KEY := $(shell cat $(KAFKA_POMS) | (sha256sum 2>/dev/null || shasum -a 256) | cut -c1-16)
CDC_KAFKA_HOME ?= $(HOME)/.cache/cdc-tunnel/kafka-$(KAFKA_VERSION)
KAFKA_STAMP := $(CDC_KAFKA_HOME)/resolved-$(KAFKA_POM_KEY)

# The io.delta jars of the delta-spark engine, the same way: a pinned pom, resolved once into a cache keyed on
# the pom's content; sinks.delta.session finds them there (or under $CDC_DELTA_HOME) for spark.jars.
DELTA_POM := sinks/delta/delta-spark/pom.xml
DELTA_VERSION := $(shell sed -n 's:.*<delta.version>\(.*\)</delta.version>.*:\1:p' $(DELTA_POM))
DELTA_POM_KEY := $(shell (sha256sum $(DELTA_POM) 2>/dev/null || shasum -a 256 $(DELTA_POM)) | cut -c1-16)
CDC_DELTA_HOME ?= $(HOME)/.cache/cdc-tunnel/delta-$(DELTA_VERSION)
DELTA_STAMP := $(CDC_DELTA_HOME)/resolved-$(DELTA_POM_KEY)
# delta-spark's Python package (PyPI) declares pyspark<=4.2.0 while we run pyspark 4.2.1 (the jars support
# 4.2): it is installed without its dependency check, pinned to the jars' version.
DELTA_PY_STAMP := $(VENV)/.delta-spark-$(DELTA_VERSION)-stamp

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: Java 17 is required (Spark runs on the JVM) and 'java' is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless"; \
	  echo "       macOS: brew install openjdk@17; or set JAVA_HOME to a JDK 17."; \
	  exit 1; }

# The official tablestore SDK is a test-only interop check (its client against the local server): cdc-tunnel
# speaks the protocol itself and does not depend on it. The SDK declares protobuf<6 while Spark Connect's client
# needs protobuf 6, so it goes into the test virtualenv without its declared dependencies (its others are in
# the dev extra); it works on protobuf 6.33. `pip check` of .venv reports that conflict and delta-spark's.
TABLESTORE_SDK := tablestore==6.4.8

# PySpark is published as a source distribution only: its 450 MB wheel is built at install. The registry sends
# no caching headers, so uv downloaded and built it again on every fresh install and kept each build in its
# cache (0.5-1.4 GB a run). The wheel is built once, by pip, into a cache outside the repo named by the pinned
# version (built in a folder of its own, then moved: an interrupted build leaves no wheel), and uv takes it from
# there (--find-links: uv prefers that wheel to the sdist of the same version).
PYSPARK_VERSION := $(shell sed -n 's/^pyspark==//p' constraints.txt)
CDC_WHEELS ?= $(HOME)/.cache/cdc-tunnel/wheels
PYSPARK_WHEEL := $(CDC_WHEELS)/pyspark-$(PYSPARK_VERSION)-py2.py3-none-any.whl

$(STAMP): pyproject.toml Makefile constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --upgrade pip uv
	@test -f $(PYSPARK_WHEEL) || { rm -rf $(CDC_WHEELS)/.build && \
	  $(PY) -m pip wheel --quiet --disable-pip-version-check --no-deps -w $(CDC_WHEELS)/.build 'pyspark==$(PYSPARK_VERSION)' && \
	  mv $(CDC_WHEELS)/.build/pyspark-$(PYSPARK_VERSION)-*.whl $(PYSPARK_WHEEL) && rm -rf $(CDC_WHEELS)/.build; }
	$(UV_INSTALL) --compile-bytecode -c constraints.txt --find-links $(CDC_WHEELS) -e '.[dev]'  # dev = every extra ([all]), the docs and the test tools
	$(UV_INSTALL) --no-deps '$(TABLESTORE_SDK)'
	$(PY) tests/precompiled_pyspark.py  # every Python process Spark starts imports PySpark without compiling it
	@touch $(STAMP)

$(DELTA_PY_STAMP): $(STAMP) $(DELTA_POM)
	$(UV_INSTALL) --no-deps 'delta-spark==$(DELTA_VERSION)'
	@touch $@

install: check-java $(STAMP) $(DELTA_PY_STAMP) delta-spark

# constraints.txt: the versions of the development virtualenv, from a fresh `make install` (delta-spark and the
# Tablestore SDK are pinned above, installed without their dependencies).
constraints: $(STAMP)
	{ sed -n '1,3p' constraints.txt; $(PY) -m pip freeze --all --exclude-editable | grep -v -i -E '^(delta[-_]spark|tablestore|setuptools)=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

pulsar-standalone: check-java $(PULSAR_STAMP)

$(PULSAR_STAMP):
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: Maven ('mvn') is required to fetch Apache Pulsar for the tests, and it is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y maven; macOS: brew install maven."; \
	  exit 1; }
	rm -rf '$(CDC_PULSAR_HOME)/lib' '$(CDC_PULSAR_HOME)'/resolved-*
	mkdir -p '$(CDC_PULSAR_HOME)'
	cp $(PULSAR_POM) '$(CDC_PULSAR_HOME)/pom.xml'
	mvn -B --no-transfer-progress -f '$(CDC_PULSAR_HOME)/pom.xml' -Dmaven.repo.local='$(CDC_MAVEN_REPO)' package
	@touch '$@'

kafka: check-java $(KAFKA_STAMP)

$(KAFKA_STAMP):
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: Maven ('mvn') is required to fetch Apache Kafka and Debezium for the tests, and it is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y maven; macOS: brew install maven."; \
	  exit 1; }
	rm -rf '$(CDC_KAFKA_HOME)' && mkdir -p '$(CDC_KAFKA_HOME)'
	for pom in $(KAFKA_POMS); do \
	  name=$$(basename $$(dirname $$pom)); mkdir -p '$(CDC_KAFKA_HOME)'/$$name; cp $$pom '$(CDC_KAFKA_HOME)'/$$name/pom.xml; \
	  mvn -B --no-transfer-progress -q -f '$(CDC_KAFKA_HOME)'/$$name/pom.xml -Dmaven.repo.local='$(CDC_MAVEN_REPO)' package || exit 1; \
	done
	@touch '$@'

delta-spark: check-java $(DELTA_STAMP)

$(DELTA_STAMP):
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: Maven ('mvn') is required to fetch the io.delta jars (engine='delta-spark'), and it is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y maven; macOS: brew install maven."; \
	  exit 1; }
	rm -rf '$(CDC_DELTA_HOME)/lib' '$(CDC_DELTA_HOME)'/resolved-*
	mkdir -p '$(CDC_DELTA_HOME)'
	cp $(DELTA_POM) '$(CDC_DELTA_HOME)/pom.xml'
	mvn -B --no-transfer-progress -f '$(CDC_DELTA_HOME)/pom.xml' -Dmaven.repo.local='$(CDC_MAVEN_REPO)' package
	@touch '$@'

demo: install
	$(PY) examples/orders_demo.py

# The suite runs on TEST_WORKERS pytest-xdist workers (one per core here); ``--dist loadgroup`` keeps the tests
# of each heavy server on one worker (see tests/conftest.py). TEST_WORKERS=0 runs it in this process.
# PYTEST_ARGS passes more, e.g. PYTEST_ARGS=--durations=0 for tests/folder_times.py.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

test: install pulsar-standalone kafka
	$(PY) -m ruff check cdc sinks udfs tests examples benchmarks docs
	$(PY) -m mypy
	$(MAKE) docs
	$(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-fast: install pulsar-standalone kafka
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow"

lint: install
	$(PY) -m ruff check cdc sinks udfs tests examples benchmarks docs
	$(PY) -m mypy

# The documentation site (mkdocs.yml), built strictly: a broken link, a missing page, a macro that fails
# (an option table, the CLI reference, an error class without a troubleshooting entry) fails the build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: install
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: install
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

bench: install
	$(PY) benchmarks/source_overhead.py

# The official Node.js Tablestore SDK, pinned by its lock file, for tests/sdks/test_node_sdk.py. The stamp
# skips an up-to-date install; npm's cache makes a reinstall offline.
NODE_SDK := tests/sdks/node
NODE_SDK_STAMP := $(NODE_SDK)/node_modules/.installed-stamp

.PHONY: node-sdk
node-sdk: $(NODE_SDK_STAMP)

$(NODE_SDK_STAMP): $(NODE_SDK)/package.json $(NODE_SDK)/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  echo "error: Node.js 18+ and npm are required (the Node.js SDK interop test) and 'npm' is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y nodejs npm; macOS: brew install node"; \
	  exit 1; }
	cd $(NODE_SDK) && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund
	@touch $@

test test-fast: node-sdk

# The official Java Tablestore SDK's TunnelWorker (pinned in tests/sdks/java/pom.xml), compiled into
# tests/sdks/java/target for tests/sdks/test_java_sdk.py (a slow test, so `make test` only); jars resolved
# into the Pulsar target's Maven repository. The stamp's name is keyed on the pom and the sources, so an
# up-to-date build skips Maven, and an edited pom or source builds again; a build is kept in the cache under
# that key, so a fresh clone copies it instead of running Maven.
JAVA_SDK := tests/sdks/java
JAVA_SDK_SOURCES := $(JAVA_SDK)/pom.xml $(sort $(shell find $(JAVA_SDK)/src -name '*.java' 2>/dev/null))
JAVA_SDK_KEY := $(shell cat $(JAVA_SDK_SOURCES) | (sha256sum 2>/dev/null || shasum -a 256) | cut -c1-16)
JAVA_SDK_STAMP := $(JAVA_SDK)/target/built-$(JAVA_SDK_KEY)
JAVA_SDK_CACHE := $(HOME)/.cache/cdc-tunnel/java-sdk-$(JAVA_SDK_KEY)

.PHONY: java-sdk
java-sdk: check-java $(JAVA_SDK_STAMP)

$(JAVA_SDK_STAMP):
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: Maven ('mvn') is required to build the Java SDK interop test, and it is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y maven; macOS: brew install maven."; \
	  exit 1; }
	@command -v javac >/dev/null 2>&1 || { \
	  echo "error: a JDK 17 ('javac') is required to build the Java SDK interop test; only a JRE was found."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless; macOS: brew install openjdk@17."; \
	  exit 1; }
	rm -rf '$(JAVA_SDK)/target'
	if [ -d '$(JAVA_SDK_CACHE)' ]; then cp -R '$(JAVA_SDK_CACHE)' '$(JAVA_SDK)/target'; else \
	  mvn -B --no-transfer-progress -q -f '$(JAVA_SDK)/pom.xml' -Dmaven.repo.local='$(CDC_MAVEN_REPO)' package && \
	  mkdir -p '$(dir $(JAVA_SDK_CACHE))' && rm -rf '$(JAVA_SDK_CACHE).tmp' && \
	  cp -R '$(JAVA_SDK)/target' '$(JAVA_SDK_CACHE).tmp' && mv '$(JAVA_SDK_CACHE).tmp' '$(JAVA_SDK_CACHE)'; fi
	@touch '$@'

test: java-sdk

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info cdc/backends/tablestore/_plainbuffer*.so

# The compiled PlainBuffer reader and record layout (native/). The install builds it; this rebuilds it after an
# edit of the C source (or of its build), with the virtualenv's setuptools. The stamp skips an up-to-date one.
NATIVE_STAMP := $(VENV)/.native-plainbuffer-stamp

.PHONY: native
native: $(NATIVE_STAMP)

$(NATIVE_STAMP): $(wildcard native/*.c native/*.h) native/build.py setup.py | $(STAMP)
	$(PY) native/build.py
	@touch $@

test test-fast demo bench: native

# Debezium's embedded engine with its PostgreSQL connector, for tests/debezium (real Debezium events): built
# in tests/debezium/engine/target, jars resolved into the Pulsar target's Maven repository. The stamp's name
# is keyed on the pom and the sources, so an up-to-date build skips Maven, and an edited one builds again
# (kept in the cache under that key, as the Java SDK's build is).
DEBEZIUM_ENGINE := tests/debezium/engine
DEBEZIUM_ENGINE_SOURCES := $(DEBEZIUM_ENGINE)/pom.xml $(sort $(shell find $(DEBEZIUM_ENGINE)/src -name '*.java' 2>/dev/null))
DEBEZIUM_ENGINE_KEY := $(shell cat $(DEBEZIUM_ENGINE_SOURCES) | (sha256sum 2>/dev/null || shasum -a 256) | cut -c1-16)
DEBEZIUM_ENGINE_STAMP := $(DEBEZIUM_ENGINE)/target/built-$(DEBEZIUM_ENGINE_KEY)
DEBEZIUM_ENGINE_CACHE := $(HOME)/.cache/cdc-tunnel/debezium-engine-$(DEBEZIUM_ENGINE_KEY)

.PHONY: debezium-engine
debezium-engine: check-java $(DEBEZIUM_ENGINE_STAMP)

$(DEBEZIUM_ENGINE_STAMP):
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: Maven ('mvn') is required to build the Debezium engine for tests/debezium, and it is not on PATH."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y maven; macOS: brew install maven."; \
	  exit 1; }
	@command -v javac >/dev/null 2>&1 || { \
	  echo "error: a JDK 17 ('javac') is required to build the Debezium engine; only a JRE was found."; \
	  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless; macOS: brew install openjdk@17."; \
	  exit 1; }
	rm -rf '$(DEBEZIUM_ENGINE)/target'
	if [ -d '$(DEBEZIUM_ENGINE_CACHE)' ]; then cp -R '$(DEBEZIUM_ENGINE_CACHE)' '$(DEBEZIUM_ENGINE)/target'; else \
	  mvn -B --no-transfer-progress -q -f '$(DEBEZIUM_ENGINE)/pom.xml' -Dmaven.repo.local='$(CDC_MAVEN_REPO)' package && \
	  mkdir -p '$(dir $(DEBEZIUM_ENGINE_CACHE))' && rm -rf '$(DEBEZIUM_ENGINE_CACHE).tmp' && \
	  cp -R '$(DEBEZIUM_ENGINE)/target' '$(DEBEZIUM_ENGINE_CACHE).tmp' && \
	  mv '$(DEBEZIUM_ENGINE_CACHE).tmp' '$(DEBEZIUM_ENGINE_CACHE)'; fi
	@touch '$@'

test: debezium-engine
