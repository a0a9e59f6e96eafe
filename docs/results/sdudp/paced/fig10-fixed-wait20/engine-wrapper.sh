#!/bin/sh
# The accumulator fix (remainder waits from its own arrival), edge wait 20 ms.
if [ "$1" = "edge" ]; then exec /tmp/h15c-bin/fixed/quicsdn-sdudp "$@" --accumulate-wait 20ms; fi
exec /tmp/h15c-bin/fixed/quicsdn-sdudp "$@"
