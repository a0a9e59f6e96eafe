//! quicsdn-transport
