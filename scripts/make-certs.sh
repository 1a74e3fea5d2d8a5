#!/usr/bin/env bash
# Makes what a secured shardtrain cluster needs, in DIR: a private CA
# (ca.pem, ca.key), a shard certificate (server.pem, server.key) for
# 127.0.0.1, localhost and any NAMES given (usable as a client certificate
# too, for the shards' forwards to each other), a worker/psctl client
# certificate (client.pem, client.key) and a random auth token (token).
# For trying TLS locally and for the tests; a production cluster would use
# certificates from its own CA (e.g. cert-manager).
#
#   scripts/make-certs.sh DIR [NAME...]
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$1; shift
command -v openssl >/dev/null || { echo "make-certs.sh needs openssl" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
umask 077
days=30
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days "$days" \
  -subj "/CN=shardtrain CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# sign NAME USAGE SAN: NAME.key + NAME.pem signed by the CA.
sign() {
  openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=shardtrain $1" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$3" "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -out "$1.pem" -days "$days" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

san="IP:127.0.0.1,DNS:localhost"
for name in "$@"; do san="$san,DNS:$name"; done
# serverAuth and clientAuth: with --replicas > 1 a shard presents this same
# certificate as a client when it forwards to the next shard of its chain.
sign server serverAuth,clientAuth "$san"
sign client clientAuth "DNS:shardtrain-client"
rm -f ca.srl
openssl rand -hex 32 >token
chmod 644 ca.pem server.pem client.pem
echo "$dir: ca.pem server.pem/.key client.pem/.key token"
