#!/bin/sh
# Remakes the certificates of this directory: a node certificate as `openssl x509 -req` makes
# it from a request with a subject alternative name but no `-copy_extensions copy`: X.509 v1,
# with no extensions, so its SAN (DNS:1.id.busway) is lost. busway must say so, not only
# "UnsupportedCertVersion" (issue #28, point 9). Valid 100 years: the tests read them as is.
set -e
cd "$(dirname "$0")"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.pem -subj /CN=openssl-test-ca -days 36500
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout 1.key -out 1.csr \
    -subj /CN=node1 -addext subjectAltName=DNS:1.id.busway
openssl x509 -req -in 1.csr -CA ca.pem -CAkey ca.key -set_serial 1 -out 1.pem -days 36500
rm -f 1.csr ca.key
