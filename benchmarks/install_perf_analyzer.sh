#!/bin/bash
# Install ONLY Triton's perf_analyzer 2.60.0 under /tmp/anchors, exactly as steps 1b of
# ../shared/bench/setup_anchors.sh do (same paths, so that script stays idempotent with it):
#   /tmp/anchors/pa260/perf_analyzer/bin/perf_analyzer   (from the manylinux_2_38 wheel)
#   /tmp/anchors/apt-trixie/root/...                     (Debian 13 libc/libstdc++, extracted, not installed)
#   /tmp/anchors/perf_analyzer                           (wrapper running it through that libc)
# Needs: pip (any Python 3.11 pip; only `pip download` is used), apt-get, dpkg-deb, unzip.
set -euo pipefail
A=/tmp/anchors
PIP=${PIP:-"python3 -m pip"}
mkdir -p $A/dl

if [ ! -x $A/pa260/perf_analyzer/bin/perf_analyzer ]; then
  $PIP download --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
      --python-version 3.11 -d $A/dl perf-analyzer==2.60.0
  mkdir -p $A/pa260 && (cd $A/pa260 && unzip -o -q $A/dl/perf_analyzer-2.60.0-py3-none-manylinux_2_38_x86_64.whl)
  chmod +x $A/pa260/perf_analyzer/bin/perf_analyzer
fi
T=$A/apt-trixie
if [ ! -e $T/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 ]; then
  mkdir -p $T/etc $T/state/lists/partial $T/cache/archives/partial $T/debs $T/root
  uris=$(grep -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources)
  printf 'Types: deb\n%s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uris" > $T/etc/trixie.sources
  APTOPTS="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$T/etc -o Dir::State=$T/state -o Dir::State::status=/dev/null -o Dir::Cache=$T/cache -o Debug::NoLocking=1"
  apt-get $APTOPTS update
  (cd $T/debs && apt-get $APTOPTS download libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g)
  for d in $T/debs/*.deb; do dpkg-deb -x "$d" $T/root; done
fi
R=$T/root/usr/lib/x86_64-linux-gnu
cat > $A/perf_analyzer <<W
#!/bin/sh
exec $R/ld-linux-x86-64.so.2 --library-path $R $A/pa260/perf_analyzer/bin/perf_analyzer "\$@"
W
chmod +x $A/perf_analyzer
$A/perf_analyzer --version 2>/dev/null || $A/perf_analyzer --help 2>&1 | head -3 || true
echo "perf_analyzer installed: $A/perf_analyzer"
