#!/bin/sh
# Accumulation wait 20 ms at the edges (release delay: the new default, 100 ms).
if [ "$1" = "edge" ]; then exec /tmp/h15d-bin/quicsdn-sdudp "$@" --accumulate-wait 20ms; fi
exec /tmp/h15d-bin/quicsdn-sdudp "$@"
