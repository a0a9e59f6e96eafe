#!/bin/sh
# Fig. 10 sensitivity run: the edge engines' accumulation wait raised from 5 to 20 ms.
if [ "$1" = "edge" ]; then exec /tmp/h15c-bin/quicsdn-sdudp "$@" --accumulate-wait 20ms; fi
exec /tmp/h15c-bin/quicsdn-sdudp "$@"
