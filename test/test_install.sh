#!/usr/bin/env bash
# Installs hcomm into a temporary prefix, then builds examples/quickstart.c against it with
# find_package(hcomm) and with pkg-config, and checks that nothing installed can clash with
# Huawei CANN's own hcomm (lib64/libhcomm.so, include/hcomm/hcomm_res.h, HcommResult, ...).
set -euo pipefail
. "$(dirname "$0")/common.sh" # grep_all
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
prefix=$tmp/prefix
lib=$(find "$prefix" -name 'libhcomm-c.so.0' | head -n 1)
[ -n "$lib" ] || fail "libhcomm-c.so.0 not installed"
[ -z "$(find "$prefix" -name 'libhcomm.so*' -o -name 'libhcomm.a')" ] || fail "installed a libhcomm.so, which CANN owns"
for h in hcomm_res.h hcomm_primitives.h; do
    [ ! -e "$prefix/include/hcomm/$h" ] || fail "installed include/hcomm/$h, which CANN owns"
done
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[ "$soname" = "libhcomm-c.so.0" ] || fail "SONAME is '$soname', expected libhcomm-c.so.0"
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBR]/ && $3 !~ /^hcomm_/ && $3 !~ /^_/ {print $3}')
[ -z "$bad" ] || fail "exported symbols without the hcomm_ prefix: $bad"
if grep -rE 'HcommResult|HcommTeamCreate|HCOMM_TEAM_|HCOMM_CHANNEL_' "$prefix/include"; then
    fail "a public header defines a name CANN uses"
fi
nm -D --defined-only "$lib" | grep_all ' hcomm__' && fail "internal hcomm__ symbols are exported"

# A sanitized hcomm needs sanitized consumers (the runtime must come first).
san=${HCOMM_SANITIZE:+-fsanitize=$HCOMM_SANITIZE}

# Consumer 1: CMake package.
mkdir -p "$tmp/app"
cp "$src/examples/quickstart.c" "$tmp/app/"
cat > "$tmp/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(app C)
find_package(hcomm REQUIRED)
add_executable(app quickstart.c)
target_link_libraries(app PRIVATE hcomm::hcomm)
CM
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" > "$tmp/app.log" || { cat "$tmp/app.log"; fail "find_package(hcomm) failed"; }
cmake --build "$tmp/app/build" >> "$tmp/app.log" 2>&1 || { cat "$tmp/app.log"; fail "consumer build failed"; }
out=$(LD_LIBRARY_PATH="$(dirname "$lib")" HCOMM_BACKEND=local "$tmp/app/build/app")
echo "$out"
echo "$out" | grep_all "rank 0 gathered row 1: 10 11 12 13 14 15" || fail "quickstart output wrong: $out"

# Consumer 2: pkg-config, built as the README says; it must start without LD_LIBRARY_PATH
# (the .pc file's rpath finds the library in this non-system prefix).
export PKG_CONFIG_PATH="$(dirname "$lib")/pkgconfig"
cc -std=c11 $san "$src/examples/quickstart.c" -o "$tmp/app-pc" $(pkg-config --cflags --libs hcomm) || fail "pkg-config build failed"
out=$(env -u LD_LIBRARY_PATH HCOMM_BACKEND=local "$tmp/app-pc" 2>&1) || fail "the pkg-config binary did not start without LD_LIBRARY_PATH: $out"
echo "$out" | grep_all "rank 0 gathered row 1: 10 11 12 13 14 15" || fail "pkg-config binary output: $out"
# ldd's whole output first: grep -q closing the pipe early would fail it under pipefail.
deps=$(ldd "$tmp/app-pc")
echo "$deps" | grep_all "libhcomm-c.so.0 => $prefix" || fail "the binary does not load the installed library: $(echo "$deps" | grep hcomm)"

# The version: headers, library and tools agree with CMake's project version; LICENSE and the
# package metadata say MIT.
want=$(sed -n 's/^project(hcomm VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
cat > "$tmp/ver.c" <<'C'
#include <hcomm/api.h>
#include <stdio.h>
int main(void) {
    int a, b, c;
    const char *backends;
    if (hcomm_version(&a, &b, &c, &backends) != HCOMM_OK) return 1;
    printf("%d.%d.%d %d.%d.%d %s [%s]\n", HCOMM_VERSION_MAJOR, HCOMM_VERSION_MINOR, HCOMM_VERSION_PATCH,
           a, b, c, HCOMM_VERSION_STRING, backends);
    return 0;
}
C
cc -std=c11 $san "$tmp/ver.c" -o "$tmp/ver" $(pkg-config --cflags --libs hcomm) || fail "version consumer did not build"
out=$(env -u LD_LIBRARY_PATH "$tmp/ver")
case "${HCOMM_WITH_MPI:-ON}" in ON) backends="local mpi" ;; *) backends="local" ;; esac
[ "$out" = "$want $want $want [$backends]" ] || fail "version: '$out', expected '$want $want $want [$backends]'"
[ "$(pkg-config --modversion hcomm)" = "$want" ] || fail "pkg-config --modversion: $(pkg-config --modversion hcomm)"
grep -q "^License: MIT" "$PKG_CONFIG_PATH/hcomm.pc" || fail "hcomm.pc has no License: MIT"
grep -q "^MIT License" "$prefix/share/licenses/hcomm/LICENSE" || fail "LICENSE not installed"
for tool in hcomm-train hcomm-bench; do
    v=$("$prefix/bin/$tool" --version)
    [ "$v" = "$tool $want (hcomm library $want; backends: $backends)" ] || fail "$tool --version: '$v'"
done
echo "version $want, backends '$backends': headers, library, pkg-config and tools agree"
echo "install test passed"
