#!/usr/bin/env bash
# Suite embed: a program built against the installed library (docs/embedding.md).
# Installs the build into a temporary DESTDIR, compiles examples/embed/train_embed.c
# with the flags pkg-config gives for cdphybrid, and runs it: this process alone,
# the same plan as 2 stages refused there, and as 2 ranks of a 2-stage layout under
# mpirun, which must train to the one-rank result.
#   embed.sh SOURCE_ROOT BUILD_ROOT CC SANITIZE
set -euo pipefail
src=$1 build=$2 cc=$3 sanitize=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cdp-embed-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "embed: $*" >&2; exit 1; }
# meson test points LD_LIBRARY_PATH at the build tree; the program must find the installed library
unset LD_LIBRARY_PATH

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null
pc=$(find "$tmp/root" -name cdphybrid.pc | head -n 1)
[ -n "$pc" ] || fail "meson install wrote no cdphybrid.pc under $tmp/root"
# The .pc names the configured prefix; point it at the DESTDIR copy (pkg-config's
# --define-prefix guesses wrong for a multiarch libdir, and PKG_CONFIG_SYSROOT_DIR
# would move the system packages cdphybrid requires too).
prefix=$(sed -n 's/^prefix=//p' "$pc")
mkdir -p "$tmp/pc"
sed "s|^prefix=.*|prefix=$tmp/root$prefix|" "$pc" > "$tmp/pc/cdphybrid.pc"
flags=$(PKG_CONFIG_PATH="$tmp/pc" pkg-config --cflags --libs cdphybrid)
libdir=$(PKG_CONFIG_PATH="$tmp/pc" pkg-config --variable=libdir cdphybrid)
case "$flags" in *"$tmp/root"*) ;; *) fail "pkg-config gives no flag inside the install: $flags" ;; esac
san=()
[ "$sanitize" = none ] || san=("-fsanitize=$sanitize")
# -I only the installed headers: the source tree is not on the path
"$cc" -std=c11 -Wall -Wextra -Werror "${san[@]}" "$src/examples/embed/train_embed.c" $flags -lm \
    -Wl,-rpath,"$libdir" -o "$tmp/train_embed"
libs=$(ldd "$tmp/train_embed")
grep -q "$libdir/libcdphybrid" <<< "$libs" || fail "the program does not load the installed library"

# docs/embedding.md shows the program as it is
sed -n '/^<!-- example: examples\/embed\/train_embed.c -->$/,/^<!-- \/example -->$/p' "$src/docs/embedding.md" \
    | sed '1,2d;$d' | sed '$d' > "$tmp/doc.c"
cmp -s "$tmp/doc.c" "$src/examples/embed/train_embed.c" || fail "docs/embedding.md's program differs from examples/embed/train_embed.c"

plan="$src/examples/embed/mlp.json"
cd "$tmp"
./train_embed "$plan" > one.txt || { cat one.txt; fail "one-rank run failed"; }
cat one.txt
grep -q '^planned: 1 stages x 1 replicas' one.txt || fail "no planned line"
grep -q '^simulated: step [0-9.]* ms' one.txt || fail "no simulated line"
grep -q '^trained: 30 steps' one.txt || fail "no trained line"

# a 2-stage layout is two processes: alone it is refused, naming the ranks
if ./train_embed "$plan" --stages 2 > self2.txt 2> self2.err; then fail "a 2-rank layout trained alone"; fi
grep -q 'the layout has 2 ranks' self2.err || { cat self2.err; fail "the refusal does not name the ranks"; }

if ! command -v mpirun >/dev/null 2>&1 || ! grep -q 'CDP_HAVE_MPI 1' "$tmp/root$prefix/include/cdp/cdp_config.h"; then
    echo "embed: no mpirun or no MPI in this build: the 2-rank run is not checked"
    exit 0
fi
timeout 120 mpirun -np 2 ./train_embed "$plan" --stages 2 --mpi > two.txt 2>&1 || { cat two.txt; fail "2-rank run failed"; }
cat two.txt
[ "$(grep -c '^planned: 2 stages x 1 replicas' two.txt)" = 2 ] || fail "both ranks should plan 2 stages"
[ "$(grep -c '^trained: 30 steps' two.txt)" = 2 ] || fail "both ranks should train 30 steps"
# the losses (everything before the rate) equal the one-rank run's on both ranks
want=$(grep '^trained:' one.txt | sed 's/, [0-9]* samples\/s$//')
while read -r line; do
    [ "${line%, * samples/s}" = "$want" ] || fail "2 ranks: '$line', one rank: '$want'"
done < <(grep '^trained:' two.txt)
echo "embed: one rank and 2 ranks of a 2-stage layout train to the same losses"
