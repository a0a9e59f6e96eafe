//! quicsdn-lanes
