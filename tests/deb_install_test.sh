#!/usr/bin/env bash
# The Debian package in a clean Debian root filesystem:
#  1. cpack makes the .debs from BUILD_DIR;
#  2. a bookworm root (mmdebstrap --variant=apt) with the Depends and
#     Recommends of shardtrain_<version>_<arch>.deb installed, so that
#  3. `apt install ./shardtrain_<version>_<arch>.deb` there has nothing to
#     download (the root keeps no package lists: a dependency the root lacks
#     fails it), which proves the Depends complete;
#  4. there ps-server, psctl, shardtrain-run and `import shardtrain.torch`
#     with /usr/bin/python3 work: shardtrain-run runs
#     tests/install/tiny_job.py (2 sync workers, 2 shards, psctl status);
#  5. `apt-get purge shardtrain` leaves none of its files.
# The root runs in its own mount and PID namespaces (unshare): its mounts
# and every process started in it end with it.
#
# The root's tarball is cached per dependency list and apt sources in
# $SHARDTRAIN_CACHE_DIR (default /var/cache/shardtrain as root, else
# ${XDG_CACHE_HOME:-~/.cache}/shardtrain); the first run downloads the
# packages from this machine's apt sources (about 300 MB), later runs reuse
# it. Needs root, mmdebstrap, unshare and dpkg-deb; exits 77 (skipped)
# without them.
#
#   tests/deb_install_test.sh SOURCE_DIR BUILD_DIR      (KEEP=1 keeps the scratch directory)
set -euo pipefail
root=$1
build=$2
suite=bookworm

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (chroot and mount namespaces)"
for tool in mmdebstrap unshare chroot dpkg-deb cpack; do
  command -v "$tool" >/dev/null || skip "needs $tool (Debian package mmdebstrap, util-linux, dpkg, cmake)"
done

out=$(mktemp -d -t shardtrain-deb-test.XXXXXX)
cleanup() {
  if [ -n "${KEEP:-}" ]; then echo "kept $out"; return; fi
  # The root's mounts live in the namespace that ended with it; never
  # delete through one that did not.
  if grep -qF " $out/" /proc/self/mountinfo; then
    echo "WARNING: something is mounted under $out; left in place" >&2
    return
  fi
  rm -rf --one-file-system "$out"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* (${SECONDS} s)"; }

step "cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$out/pkg") >"$out/cpack.log" 2>&1 ||
  { tail -n 30 "$out/cpack.log"; fail "cpack failed"; }
debs=("$out"/pkg/shardtrain_*.deb)
[ -f "${debs[0]}" ] || { cat "$out/cpack.log"; fail "no shardtrain_*.deb"; }
deb=${debs[0]}
[ -f "$(ls "$out"/pkg/shardtrain-dev_*.deb)" ] || fail "no shardtrain-dev_*.deb"
dpkg-deb --field "$deb"
dpkg-deb --contents "$deb" | grep -q ' \./usr/lib/python3/dist-packages/shardtrain/torch\.py$' ||
  fail "the package lacks /usr/lib/python3/dist-packages/shardtrain/torch.py"

# The packages the root needs: each Depends and Recommends entry (the first
# of alternatives), without versions.
mapfile -t packages < <(dpkg-deb --field "$deb" Depends Recommends |
  sed 's/^[A-Za-z-]*://' | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/[[:space:]]//g' |
  grep -v '^$' | sort -u)
echo "dependencies: ${packages[*]}"

# This machine's apt sources, for the root (and the cache key).
sources=()
for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$file" ] && grep -q '^[^#]' "$file" && sources+=("$file")
done
# Without documentation, and without byte-compiling the Python packages
# (py3compile is moved aside while they install; their postinst scripts
# skip it then): that halves the time; Python compiles what it imports.
mmdebstrap_args=(--variant=apt --mode=root --format=tar
  --aptopt='APT::Install-Recommends "false"' --dpkgopt=force-unsafe-io
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --essential-hook='chroot "$1" dpkg-divert --local --rename --divert /usr/bin/py3compile.real --add /usr/bin/py3compile'
  --customize-hook='chroot "$1" dpkg-divert --local --rename --remove /usr/bin/py3compile'
  --include="$(IFS=,; echo "${packages[*]}")")
if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/shardtrain; else default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/shardtrain; fi
cache=${SHARDTRAIN_CACHE_DIR:-$default_cache}
mkdir -p "$cache"
key=$({ echo "$suite ${mmdebstrap_args[*]}"; cat "${sources[@]}" /dev/null; } | sha256sum | cut -c1-16)
tarball=$cache/deb-test-$suite-$key.tar
if [ -s "$tarball" ]; then
  step "root filesystem from the cache: $tarball"
else
  step "mmdebstrap $suite (once per dependency list; cached in $tarball)"
  mmdebstrap "${mmdebstrap_args[@]}" "$suite" "$out/root.tar" "${sources[@]}" \
    >"$out/mmdebstrap.log" 2>&1 || { tail -n 30 "$out/mmdebstrap.log"; fail "mmdebstrap failed"; }
  # Other dependency lists' roots are stale: keep one.
  find "$cache" -maxdepth 1 -name "deb-test-$suite-*.tar" -delete
  mv "$out/root.tar" "$tarball.tmp.$$" && mv "$tarball.tmp.$$" "$tarball"
fi
mkdir "$out/root"
tar -C "$out/root" --numeric-owner -xf "$tarball"
cp "$deb" "$out/root/tmp/"
cp "$root/tests/install/tiny_job.py" "$out/root/tmp/tiny_job.py"
deb_name=$(basename "$deb")

cat >"$out/root/tmp/inside.sh" <<EOF
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 HOME=/root
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset PYTHONPATH BUILD_DIR
cd /tmp
echo "== apt-get install /tmp/$deb_name"
apt-get install -y /tmp/$deb_name
for tool in ps-server ps-worker psctl shardtrain-run; do command -v \$tool; done
ps-server --help >/dev/null
# ps-worker must start without CUDA (a CUDA build puts its CUDA half,
# ps-worker-cuda, in the shardtrain-cuda package).
ps-worker --help >/dev/null
psctl --help >/dev/null
/usr/bin/python3 -c 'import shardtrain, shardtrain.torch; print("import shardtrain.torch OK:", shardtrain.__file__)'
echo "== shardtrain-run: tiny job"
timeout 300 shardtrain-run --workers 2 --shards 2 --mode sync --optimizer sgd --lr 0.1 \
  --stop-timeout 5 -- /tmp/tiny_job.py --psctl psctl
echo "== apt-get purge shardtrain"
apt-get purge -y shardtrain
left=\$(find /usr/bin/ps-server /usr/bin/shardtrain-run /usr/lib/python3/dist-packages/shardtrain 2>/dev/null || true)
[ -z "\$left" ] || { echo "left after purge: \$left"; exit 1; }
echo "deb install OK"
EOF

step "in the root: apt-get install, ps-server, psctl, shardtrain-run, import shardtrain.torch"
# Own mount and PID namespaces: the mounts and every process of the root
# go when its shell (PID 1 there) exits, or is killed with unshare.
rc=0
timeout 900 unshare --mount --pid --fork --kill-child --propagation private -- bash -c '
  set -e
  mount --rbind /dev "$1/dev"
  mount -t proc proc "$1/proc"
  mount -t tmpfs tmpfs "$1/run"
  exec chroot "$1" /bin/bash /tmp/inside.sh
' _ "$out/root" >"$out/inside.log" 2>&1 || rc=$?
grep -v '^\[shard [01]\]' "$out/inside.log" | grep -v '^\(Selecting\|Preparing\|Unpacking\|Setting up\|(Reading\)' || true
[ "$rc" = 0 ] && grep -q '^deb install OK$' "$out/inside.log" ||
  fail "the package did not work in a clean root (exit status $rc, above)"
step "deb OK"
