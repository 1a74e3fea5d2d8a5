#!/usr/bin/env bash
# Does the Dockerfile's runtime stage install every Debian package whose
# shared libraries the built binaries load, and the package holding the data
# set? A missing one only shows when a container starts ("error while loading
# shared libraries"), so this resolves it offline: ldd of each binary in
# BIN_DIR -> owning Debian package (dpkg -S) -> must be named in the last
# stage's `apt-get install`, be a dependency of one named there, or be in the
# base image (Essential packages + apt). CUDA packages (versioned by ARG) are
# not on this machine and are listed as unchecked.
# usage: runtime-libs.sh Dockerfile BIN_DIR DATA_DIR
set -euo pipefail
dockerfile=$1 bin_dir=$2 data_dir=$3

# Packages named by `apt-get install` in the last stage.
listed=$(awk '/^FROM /{s=""} {s=s $0 "\n"} END{printf "%s", s}' "$dockerfile" |
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -o 'apt-get install[^&]*' |
  tr ' ' '\n' | grep -v -e '^-' -e '^$' -e '^apt-get$' -e '^install$' || true)
unchecked=$(grep '\${' <<<"$listed" || true)
listed=$(grep -v '\${' <<<"$listed" || true)
[ -n "$listed" ] || { echo "FAIL $dockerfile: no apt-get install in the runtime stage"; exit 1; }

# Dependency closure over the installed packages (dpkg's database, read once).
declare -A deps=() have=()
while IFS=$'\t' read -r p d; do deps[$p]=$d; done < <(
  dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Depends}, ${Pre-Depends}\n' | awk -F'\t' '$1 ~ /^ii/ {print $2 "\t" $3}')
add_closure() {
  local queue=("$@") p
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[-1]}; unset 'queue[-1]'
    [ -n "${have[$p]:-}" ] || [ -z "${deps[$p]+x}" ] && continue
    have[$p]=1
    # "libc6 (>= 2.34), libx | liby" -> libc6 libx liby
    for d in $(sed -e 's/([^)]*)//g; s/:any//g; s/[,|]/ /g' <<<"${deps[$p]}"); do queue+=("$d"); done
  done
}
# shellcheck disable=SC2046
add_closure apt $(dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" {print $1}')
for p in $listed; do [ -n "${deps[$p]+x}" ] || unchecked+=$'\n'$p; done
# shellcheck disable=SC2086
add_closure $listed

# Needs: library -> owning package, for every binary; the data set's package.
bins=()
for b in ps-server ps-worker psctl; do
  if [ -x "$bin_dir/$b" ]; then bins+=("$bin_dir/$b")
  elif [ $b != psctl ]; then echo "FAIL $bin_dir/$b not built"; exit 1; fi
done
status=0
libs=$(for b in "${bins[@]}"; do ldd "$b" | awk -v b="${b##*/}" '/=>/ {print b, $1, $3}'; done)
if grep ' not$' <<<"$libs"; then echo "     (not found by the loader)"; status=1; fi
# dpkg knows a library by the path its package shipped: the loader's path,
# its symlink target, or that target without/with the merged /usr prefix.
declare -A owner=()
candidates() { local r; r=$(readlink -f "$1"); printf '%s\n' "$1" "$r" "${r#/usr}" "/usr$r"; }
paths=$(awk '$3 ~ /^\// && $3 !~ /^\/usr\/local\/cuda/ {print $3}' <<<"$libs" | sort -u)  # CUDA: from its packages
while IFS=: read -r pkg path; do owner[${path# }]=$pkg; done < <(
  for p in $paths; do candidates "$p"; done | sort -u | xargs -r dpkg -S 2>/dev/null | sed 's/:[a-z0-9]*:/:/')
declare -A need=()
while read -r b lib path; do
  [ "$path" = not ] || [[ $path == /usr/local/cuda* ]] && continue
  pkg=
  for c in $(candidates "$path"); do pkg=${owner[$c]:-}; [ -n "$pkg" ] && break; done
  [ -n "$pkg" ] || { echo "     $b: $path belongs to no Debian package"; status=1; continue; }
  need[$pkg]="${need[$pkg]:-$b: $lib}"
done <<<"$libs"
data_pkg=$(dpkg -S "$data_dir" 2>/dev/null | head -1 | cut -d: -f1 || true)
if [ -n "$data_pkg" ]; then need[$data_pkg]=$data_dir; else echo "     $data_dir belongs to no Debian package"; status=1; fi
for p in "${!need[@]}"; do
  [ -n "${have[$p]:-}" ] || { echo "     missing $p (for ${need[$p]})"; status=1; }
done

if [ $status -ne 0 ]; then echo "FAIL $dockerfile runtime stage lacks packages (above)"; exit 1; fi
echo "ok   $dockerfile runtime stage provides all ${#need[@]} packages that ${bins[*]##*/} and $data_dir need"
[ -z "$unchecked" ] || echo "     not checked here (not Debian packages on this machine): $(xargs <<<"$unchecked")"
