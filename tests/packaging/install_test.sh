#!/usr/bin/env bash
# Installs a built asgd into a temporary prefix, moves the prefix elsewhere
# (the package must be relocatable), checks that no installed text file names
# a path of the build, then configures, builds and runs tests/packaging/consumer
# against it with nothing but CMAKE_PREFIX_PATH, and builds the project
# docs/getting-started.md gives (its section 5) the same way. Exit 77 (ctest: skipped)
# comes from the consumer when $ASGD_DATA_DIR is unset.
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER [LAUNCHER [CXX_FLAGS [LINKER_FLAGS]]]
# CXX_FLAGS and LINKER_FLAGS are the build's own: a consumer of a library
# built with sanitizers must link their runtimes too (scripts/sanitize).
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
generator=$3
cxx=$4
launcher=${5:-}
cxx_flags=${6:-}
linker_flags=${7:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/asgd-packaging.XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/installed" >"$work/install.log"
mv "$work/installed" "$work/prefix"
prefix="$work/prefix"

# Binaries may carry source file names (assert messages); text files must not
# carry any absolute path of this machine's build.
if leaks=$(grep -rIlF -e "$build" -e "$source" -e "$work/installed" "$prefix"); then
  echo "install_test: installed files name build-machine paths:" >&2
  echo "$leaks" >&2
  exit 1
fi
for f in bin/asgd include/asgd/job.hpp include/asgd/status.hpp lib/cmake/asgd/asgdConfig.cmake \
         lib/cmake/asgd/asgdConfigVersion.cmake lib/cmake/asgd/asgdTargets.cmake lib/cmake/asgd/FindCAF.cmake; do
  [[ -e "$prefix/$f" ]] || { echo "install_test: $f was not installed" >&2; exit 1; }
done
"$prefix/bin/asgd" --help >/dev/null

configure=(cmake -S "$source/tests/packaging/consumer" -B "$work/consumer" -G "$generator"
           -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix")
if [[ -n "$launcher" ]]; then configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"); fi
if [[ -n "$cxx_flags" ]]; then configure+=(-DCMAKE_CXX_FLAGS="$cxx_flags"); fi
if [[ -n "$linker_flags" ]]; then configure+=(-DCMAKE_EXE_LINKER_FLAGS="$linker_flags"); fi
"${configure[@]}" >"$work/configure.log" || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/consumer" || exit 1

# The project docs/getting-started.md ("5. Embed it") gives, built as given.
docs_app="$work/docs_app"
mkdir -p "$docs_app"
python3 - "$source/docs/getting-started.md" "$docs_app" <<'PY' || exit 1
import re, sys
text = open(sys.argv[1]).read()
start = text.find("## 5. Embed it")
if start < 0:
    sys.exit("install_test: getting-started.md has no section '5. Embed it'")
end = text.find("\n## ", start + 1)
section = text[start:] if end < 0 else text[start:end]
for lang, name in (("cmake", "CMakeLists.txt"), ("cpp", "main.cpp")):
    block = re.search(r"```" + lang + r"\n(.*?)```", section, re.S)
    if not block:
        sys.exit(f"install_test: no {lang} block in getting-started.md's section 5")
    open(f"{sys.argv[2]}/{name}", "w").write(block.group(1))
PY
"${configure[0]}" -S "$docs_app" -B "$docs_app/build" "${configure[@]:5}" >"$work/docs_configure.log" ||
  { cat "$work/docs_configure.log" >&2; exit 1; }
cmake --build "$docs_app/build" || { echo "install_test: getting-started.md's project does not build" >&2; exit 1; }

"$work/consumer/consumer"
