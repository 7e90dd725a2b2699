#!/bin/bash
# Writes the MLIR (`--emit=mlir`) of every example, test model and conformance model under ten
# settings, and their compile reports, into DIR: run it before and after a change to the
# lowering and `diff -r` the two folders to see every byte of generated code the change moved.
#   scripts/emit-all.sh /tmp/before; (change, cargo build --release); scripts/emit-all.sh /tmp/after
set -u
out=${1:?usage: scripts/emit-all.sh DIR}
mkdir -p "$out"
PPC=${PPC:-target/release/ppc}
for f in examples/*.ppc tests/models/*.ppc tests/conformance/*.ppc; do
  n=$(basename "$f" .ppc)
  for v in "" "--train" "--ranks 2" "--target cuda" "--target cuda --train" "--dtype bf16" "--exact" \
           "--train --remat none" "--repeats 2" "--train --dtype bf16"; do
    tag=$(echo "$v" | tr -d ' -'); tag=${tag:-plain}
    # Models some settings do not fit write their diagnostic instead, which is compared too.
    $PPC compile "$f" --emit=mlir $v >"$out/$n.$tag.mlir" 2>"$out/$n.$tag.err" || echo "rc=$?" >>"$out/$n.$tag.err"
  done
  $PPC compile "$f" --report=json >"$out/$n.report.json" 2>&1
  $PPC compile "$f" --train --report=json >"$out/$n.trainreport.json" 2>&1
done
