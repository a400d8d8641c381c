#!/bin/bash
# check_excerpts.sh DOC...: the code a document shows must be the code that
# builds. Every fenced block that follows a line
#   <!-- excerpt: PATH -->
# must appear in PATH (relative to the repository root): its lines in order
# and contiguous, except that a line "// ..." (alone, any indentation) stands
# for source lines left out. Trailing whitespace is ignored. A DOC with no
# such block fails too, so losing the markers cannot make the test pass.
set -euo pipefail
status=0
for doc in "$@"; do
  awk -v doc="$doc" '
    function rtrim(s) { sub(/[ \t\r]+$/, "", s); return s }
    function elision(s) { return s ~ /^[ \t]*\/\/ \.\.\.$/ }
    function load(path,   line, n) {
      if (path in count) return
      n = 0
      while ((getline line < path) > 0) src[path, ++n] = rtrim(line)
      close(path)
      count[path] = n
    }
    function check(path, first_line,   i, j, k, m, pos, found) {
      load(path)
      if (count[path] == 0) {
        printf "%s:%d: %s is missing or empty\n", doc, first_line, path
        bad = 1
        return
      }
      pos = 1
      i = 1
      while (i <= n) {
        if (elision(block[i])) { i++; continue }
        j = i
        while (j <= n && !elision(block[j])) j++
        found = 0
        for (k = pos; k + (j - i) - 1 <= count[path]; k++) {
          m = 0
          while (m < j - i && src[path, k + m] == block[i + m]) m++
          if (m == j - i) { found = 1; pos = k + m; break }
        }
        if (!found) {
          printf "%s:%d-%d: these lines are not in %s (in this order):\n", \
              doc, first_line + i, first_line + j - 1, path
          for (m = i; m < j; m++) printf "  | %s\n", block[m]
          bad = 1
          return
        }
        i = j
      }
      checked++
    }
    /^<!-- excerpt: .* -->$/ {
      path = $0
      sub(/^<!-- excerpt: /, "", path)
      sub(/ -->$/, "", path)
      want = 1
      next
    }
    want == 1 {
      if ($0 !~ /^```/) {
        printf "%s:%d: an excerpt marker must be followed by a code fence\n", doc, NR
        bad = 1
        want = 0
        next
      }
      want = 2; n = 0; start = NR
      next
    }
    want == 2 {
      if ($0 ~ /^```$/) { check(path, start); want = 0; next }
      block[++n] = rtrim($0)
      next
    }
    END {
      if (checked == 0 && !bad) {
        printf "%s: no excerpt blocks found\n", doc
        bad = 1
      }
      if (!bad) printf "%s: %d excerpts match their sources\n", doc, checked
      exit bad
    }' "$doc" || status=1
done
exit "$status"
