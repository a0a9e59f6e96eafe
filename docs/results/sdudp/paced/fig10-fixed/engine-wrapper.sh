#!/bin/sh
# The accumulator fix, default 5 ms wait (QUICSDN_SDUDP_BIN pointed at this build).
exec /tmp/h15c-bin/fixed/quicsdn-sdudp "$@"
