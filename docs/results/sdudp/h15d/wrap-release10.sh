#!/bin/sh
# The engines' old release delay, 10 ms (baseline for the acknowledgement change).
exec /tmp/h15d-bin/quicsdn-sdudp "$@" --release-delay 10ms
