#!/usr/bin/env bash
# The README, checked as a new user meets it:
#   readme_test.sh examples SOURCE_DIR  its Python and C++ examples are
#       examples/readme.py and examples/readme.cpp, which the suite runs;
#   readme_test.sh links SOURCE_DIR  every relative link of README.md and
#       docs/*.md names a file of the tree, and a #fragment a heading of it;
#   readme_test.sh snippets SOURCE_DIR BUILD_DIR CXX [PYTHON]  every ```cpp
#       block of README.md and docs/*.md compiles against the public headers,
#       links libkiln and runs (a block without main() is main's body), and
#       every ```python block runs with the built package (when PYTHON is given);
#   readme_test.sh quickstart SOURCE_DIR BUILD_DIR  the commands marked
#       `<!-- readme-test` run as written, from a copy of the tree's layout
#       (build/ and examples/ linked), and give a trained model that labels
#       the quick start's images as their names say.
set -euo pipefail
what=$1
src=$(cd "$2" && pwd)
readme=$src/README.md
# The first fenced block after the first line matching $1 (a fence or a marker).
block() {
  awk -v start="$1" '
    !on && index($0, start) == 1 { on = 1; if ($0 ~ /^```/) { inside = 1; next } }
    on && !inside && /^```/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }' "$readme"
}
case "$what" in
  examples)
    for pair in "python:readme.py" "cpp:readme.cpp"; do
      lang=${pair%%:*} file=$src/examples/${pair#*:}
      if ! diff -u <(block '```'"$lang") "$file"; then
        echo "README.md: its first \`\`\`$lang block differs from $file (above); they must be the same" >&2
        exit 1
      fi
    done
    echo "README.md: the Python and C++ examples are examples/readme.py and examples/readme.cpp"
    ;;
  links)
    bad=0
    for md in "$readme" "$src"/docs/*.md; do
      # [text](target), outside code blocks and spans; http(s) and mailto links
      # are not checked.
      while IFS= read -r target; do
        case "$target" in http://* | https://* | mailto:*) continue ;; esac
        file=${target%%#*} frag=
        [ "$file" != "$target" ] && frag=${target#*#}
        path=$(dirname "$md")/$file
        [ -z "$file" ] && path=$md
        if [ ! -e "$path" ]; then
          echo "${md#"$src"/}: the link ($target) names ${file}, which is not in the tree" >&2
          bad=1
        elif [ -n "$frag" ]; then
          # GitHub's anchors: headings lower-cased, punctuation but - and _ dropped, spaces to -.
          if ! grep -E '^#+ ' "$path" | sed -E 's/^#+ //' | tr 'A-Z' 'a-z' |
              sed -E 's/[^a-z0-9 _-]//g; s/ /-/g' | grep -qx -- "$frag"; then
            echo "${md#"$src"/}: the link ($target): ${file:-this page} has no heading #$frag" >&2
            bad=1
          fi
        fi
      done < <(awk '/^```/ { code = !code; next } !code' "$md" | sed 's/`[^`]*`//g' |
        grep -o '\]([^)]*)' | sed 's/^](//; s/)$//')
    done
    [ "$bad" = 0 ] || exit 1
    echo "README.md and docs/: every relative link resolves"
    ;;
  snippets)
    build=$(cd "$3" && pwd) cxx=$4 py=${5:-}
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    for md in "$readme" "$src"/docs/*.md; do
      name=$(basename "$md" .md)
      awk -v dir="$work" -v name="$name" '
        /^```(cpp|python)$/ { ext = ($0 ~ /cpp/) ? "cpp" : "py"; n++; start = NR
                              file = dir "/" name "-" n "-line" NR + 1 "." ext; next }
        /^```/ && file { close(file); file = ""; next }
        file { print > file }' "$md"
    done
    count=0
    for f in "$work"/*.cpp; do
      [ -e "$f" ] || continue
      what=$(basename "$f" .cpp)
      if ! grep -q 'int main' "$f"; then  # the body of main(), its includes above it
        { grep -E '^(#include|using namespace)' "$f"; echo "int main() {";
          grep -vE '^(#include|using namespace)' "$f"; echo "}"; } > "$f.main.cpp"
        mv "$f.main.cpp" "$f"
      fi
      if ! "$cxx" -std=c++20 -O1 -fopenmp -I"$src/include" "$f" -o "${f%.cpp}" -L"$build" -lkiln \
          -Wl,-rpath,"$build" 2> "$f.err"; then
        echo "${what%%-*}.md: the C++ block at line ${what##*-line} does not compile:" >&2
        head -n 30 "$f.err" >&2
        exit 1
      fi
      "${f%.cpp}" > "$f.out" 2>&1 ||
        { echo "${what%%-*}.md: the C++ block at line ${what##*-line} fails:" >&2; cat "$f.out" >&2; exit 1; }
      count=$((count + 1))
    done
    for f in "$work"/*.py; do
      [ -e "$f" ] && [ -n "$py" ] || continue
      what=$(basename "$f" .py)
      (cd "$work" && PYTHONPATH="$build/python" "$py" "$f") > "$f.out" 2>&1 ||
        { echo "${what%%-*}.md: the Python block at line ${what##*-line} fails:" >&2; cat "$f.out" >&2; exit 1; }
      count=$((count + 1))
    done
    echo "README.md and docs/: $count code blocks compiled and run"
    ;;
  quickstart)
    build=$(cd "$3" && pwd)
    commands=$(block '<!-- readme-test')
    [ -n "$commands" ] || { echo "README.md: no block after a '<!-- readme-test' line" >&2; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    ln -s "$build" "$work/build"
    ln -s "$src/examples" "$work/examples"
    cd "$work"
    printf '%s\n' "$commands"
    bash -euo pipefail -c "$commands" 2>&1 | tee log.txt
    acc=$(sed -n 's/.* accuracy \([0-9.]*\)%.*/\1/p' log.txt | tail -n 1)
    awk -v a="${acc:-0}" 'BEGIN { exit !(a > 80) }' ||
      { echo "quick start: the evaluated accuracy is '${acc}'%, expected above 80%" >&2; exit 1; }
    # kiln predict: a line per image, "FILE: LABEL (score), ..." best first; the
    # file's name says the class. Each class among its image's top two, and
    # at least three of the four first.
    first=0
    for name in ankle-boot trouser bag sneaker; do
      want=$(echo "$name" | tr '-' ' ')
      labels=$(grep "/$name-[0-9]*\.png: " log.txt | sed 's/^[^:]*: //') ||
        { echo "quick start: kiln predict printed no line for $name" >&2; exit 1; }
      top=$(echo "$labels" | sed 's/ (.*//')
      second=$(echo "$labels" | sed 's/^[^)]*), //; s/ (.*//')
      if echo "$top" | grep -qix "$want"; then
        first=$((first + 1))
      elif ! echo "$second" | grep -qix "$want"; then
        echo "quick start: $name's top labels are '$top' and '$second', expected $want" >&2
        exit 1
      fi
    done
    [ "$first" -ge 3 ] ||
      { echo "quick start: $first of the 4 images labelled right first, expected 3 or more" >&2; exit 1; }
    echo "quick start: trained, evaluated (accuracy $acc%) and labelled $first of the 4 images right"
    ;;
  *) echo "readme_test.sh: unknown check '$what' (examples, links, snippets or quickstart)" >&2; exit 2 ;;
esac
